package lambdaserver_test

import (
	"errors"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/lambda/types"
	"github.com/aws/smithy-go"

	"github.com/reaper-k8s/reaper/internal/lambdaserver"
)

func client(srv *lambdaserver.Server) *lambda.Client {
	return lambda.New(lambda.Options{
		Region:       lambdaserver.Region,
		Credentials:  credentials.NewStaticCredentialsProvider("AKIDTEST", "secret", ""),
		BaseEndpoint: aws.String(srv.URL()),
	})
}

// The real SDK reads a function by name, full ARN and partial ARN: its ARN,
// state and environment.
func TestGetFunction(t *testing.T) {
	srv := lambdaserver.New()
	defer srv.Close()
	fn := srv.PutFunction(lambdaserver.Function{Name: "Reaper-prod-ReconcilerAB12-xyz", Environment: map[string]string{"REAPER_CLUSTER": "prod"}})
	srv.PutFunction(lambdaserver.Function{Name: "broken", State: "Failed", StateReason: "bad image"})
	for _, ref := range []string{fn.Name, fn.ARN(), lambdaserver.AccountID + ":function:" + fn.Name, fn.ARN() + ":$LATEST"} {
		out, err := client(srv).GetFunction(t.Context(), &lambda.GetFunctionInput{FunctionName: aws.String(ref)})
		if err != nil {
			t.Fatalf("GetFunction(%s): %v", ref, err)
		}
		c := out.Configuration
		if aws.ToString(c.FunctionArn) != fn.ARN() || c.State != types.StateActive || c.LastUpdateStatus != types.LastUpdateStatusSuccessful ||
			c.Environment == nil || c.Environment.Variables["REAPER_CLUSTER"] != "prod" {
			t.Errorf("GetFunction(%s): arn %s, state %s, update %s, environment %+v", ref, aws.ToString(c.FunctionArn), c.State, c.LastUpdateStatus, c.Environment)
		}
	}
	out, err := client(srv).GetFunction(t.Context(), &lambda.GetFunctionInput{FunctionName: aws.String("broken")})
	if err != nil {
		t.Fatal(err)
	}
	if out.Configuration.State != types.StateFailed || aws.ToString(out.Configuration.StateReason) != "bad image" || out.Configuration.Environment != nil {
		t.Errorf("GetFunction(broken): %+v", out.Configuration)
	}
}

// A missing function, a deleted one, one of another account and a version
// are Lambda's ResourceNotFoundException, the SDK's typed error.
func TestFunctionNotFound(t *testing.T) {
	srv := lambdaserver.New()
	defer srv.Close()
	srv.PutFunction(lambdaserver.Function{Name: "gone"})
	srv.DeleteFunction("gone")
	srv.PutFunction(lambdaserver.Function{Name: "here"})
	for _, in := range []*lambda.GetFunctionInput{
		{FunctionName: aws.String("gone")},
		{FunctionName: aws.String("999999999999:function:here")},
		{FunctionName: aws.String("here"), Qualifier: aws.String("3")},
	} {
		_, err := client(srv).GetFunction(t.Context(), in)
		var nf *types.ResourceNotFoundException
		if !errors.As(err, &nf) {
			t.Errorf("GetFunction(%s, %s): %v, want ResourceNotFoundException", aws.ToString(in.FunctionName), aws.ToString(in.Qualifier), err)
		}
	}
	_, err := client(srv).ListFunctions(t.Context(), &lambda.ListFunctionsInput{})
	var ae smithy.APIError
	if !errors.As(err, &ae) || ae.ErrorCode() != "UnknownOperationException" {
		t.Errorf("ListFunctions: %v, want UnknownOperationException", err)
	}
}
