package cfnserver_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/cloudformation"
	"github.com/aws/smithy-go"

	"github.com/reaper-k8s/reaper/internal/cfnserver"
)

func client(srv *cfnserver.Server) *cloudformation.Client {
	return cloudformation.New(cloudformation.Options{
		Region:       cfnserver.Region,
		Credentials:  credentials.NewStaticCredentialsProvider("AKIDTEST", "secret", ""),
		BaseEndpoint: aws.String(srv.URL()),
	})
}

// The real SDK reads a stack by name and by id, its status and outputs,
// and every stack when no name is given.
func TestDescribeStacks(t *testing.T) {
	srv := cfnserver.New()
	defer srv.Close()
	cfn := client(srv)
	st := srv.PutStack(cfnserver.Stack{Name: "Reaper-prod", Outputs: map[string]string{"LedgerTable": "t1", "ExitLogGroup": "/reaper/prod/exits"}})
	srv.PutStack(cfnserver.Stack{Name: "Other", Status: "UPDATE_ROLLBACK_COMPLETE"})
	if !strings.HasPrefix(st.ID, "arn:aws:cloudformation:us-east-1:123456789012:stack/Reaper-prod/") {
		t.Errorf("stack id %s", st.ID)
	}
	for _, name := range []string{"Reaper-prod", st.ID} {
		out, err := cfn.DescribeStacks(t.Context(), &cloudformation.DescribeStacksInput{StackName: aws.String(name)})
		if err != nil {
			t.Fatal(err)
		}
		if len(out.Stacks) != 1 {
			t.Fatalf("DescribeStacks(%s): %d stacks", name, len(out.Stacks))
		}
		got := out.Stacks[0]
		outputs := map[string]string{}
		for _, o := range got.Outputs {
			outputs[aws.ToString(o.OutputKey)] = aws.ToString(o.OutputValue)
		}
		if aws.ToString(got.StackId) != st.ID || got.StackStatus != "CREATE_COMPLETE" || got.CreationTime == nil ||
			fmt.Sprint(outputs) != "map[ExitLogGroup:/reaper/prod/exits LedgerTable:t1]" {
			t.Errorf("DescribeStacks(%s): id %s, status %s, outputs %v", name, aws.ToString(got.StackId), got.StackStatus, outputs)
		}
	}
	all, err := cfn.DescribeStacks(t.Context(), &cloudformation.DescribeStacksInput{})
	if err != nil {
		t.Fatal(err)
	}
	if len(all.Stacks) != 2 || all.Stacks[1].StackStatus != "UPDATE_ROLLBACK_COMPLETE" {
		t.Errorf("DescribeStacks(): %+v", all.Stacks)
	}
}

// A missing stack is CloudFormation's ValidationError, which is how a
// client tells it apart; so is a deleted one.
func TestMissingStack(t *testing.T) {
	srv := cfnserver.New()
	defer srv.Close()
	cfn := client(srv)
	srv.PutStack(cfnserver.Stack{Name: "gone"})
	srv.DeleteStack("gone")
	for _, call := range []func() error{
		func() error {
			_, err := cfn.DescribeStacks(t.Context(), &cloudformation.DescribeStacksInput{StackName: aws.String("gone")})
			return err
		},
		func() error {
			_, err := cfn.ListStackResources(t.Context(), &cloudformation.ListStackResourcesInput{StackName: aws.String("gone")})
			return err
		},
	} {
		var ae smithy.APIError
		if err := call(); !errors.As(err, &ae) || ae.ErrorCode() != "ValidationError" || ae.ErrorMessage() != "Stack with id gone does not exist" {
			t.Errorf("missing stack: %v, want ValidationError", err)
		}
	}
	_, err := cfn.DeleteStack(t.Context(), &cloudformation.DeleteStackInput{StackName: aws.String("gone")})
	var ae smithy.APIError
	if !errors.As(err, &ae) || ae.ErrorCode() != "InvalidAction" {
		t.Errorf("DeleteStack: %v, want InvalidAction", err)
	}
}

// ListStackResources pages by 100, and the SDK's paginator follows the
// tokens through every resource in order.
func TestListStackResources(t *testing.T) {
	srv := cfnserver.New()
	defer srv.Close()
	cfn := client(srv)
	var res []cfnserver.Resource
	for i := range 250 {
		res = append(res, cfnserver.Resource{LogicalID: fmt.Sprintf("R%03d", i), PhysicalID: fmt.Sprintf("p-%d", i), Type: "AWS::SQS::Queue"})
	}
	res[7].Status = "UPDATE_FAILED"
	srv.PutStack(cfnserver.Stack{Name: "big", Resources: res})
	pages, n := 0, 0
	p := cloudformation.NewListStackResourcesPaginator(cfn, &cloudformation.ListStackResourcesInput{StackName: aws.String("big")})
	for p.HasMorePages() {
		page, err := p.NextPage(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		pages++
		for _, r := range page.StackResourceSummaries {
			want := res[n]
			if aws.ToString(r.LogicalResourceId) != want.LogicalID || aws.ToString(r.PhysicalResourceId) != want.PhysicalID ||
				aws.ToString(r.ResourceType) != want.Type || (n == 7) != (r.ResourceStatus == "UPDATE_FAILED") {
				t.Errorf("resource %d: %s %s %s %s", n, aws.ToString(r.LogicalResourceId), aws.ToString(r.PhysicalResourceId), aws.ToString(r.ResourceType), r.ResourceStatus)
			}
			n++
		}
	}
	if pages != 3 || n != 250 {
		t.Errorf("%d pages, %d resources; want 3 pages of 250", pages, n)
	}
}
