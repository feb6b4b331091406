package ec2server_test

import (
	"context"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/reaper-k8s/reaper/internal/callrecord"
	"github.com/reaper-k8s/reaper/internal/ec2server"
)

// EC2 takes "i-" and 8 or 17 hex digits. Any other length named by
// InstanceIds fails the whole request with InvalidInstanceID.Malformed,
// naming the id, whatever else it names; as an instance-id filter value it
// simply matches nothing.
func TestMalformedIDLengths(t *testing.T) {
	ctx := context.Background()
	client, srv := newClient(t)
	known := srv.AddInstance(ec2server.Instance{}).ID
	short := srv.AddInstance(ec2server.Instance{ID: "i-0123abcd"}).ID
	for n := 9; n <= 16; n++ {
		bad := "i-" + "0123456789abcdef"[:n]
		_, err := client.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{known, bad}})
		if code := callrecord.APIErrorCode(t, err); code != "InvalidInstanceID.Malformed" || !strings.Contains(err.Error(), bad) {
			t.Errorf("describe by id %s: code %s (%v), want InvalidInstanceID.Malformed naming it", bad, code, err)
		}
		_, err = client.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{known, bad}})
		if code := callrecord.APIErrorCode(t, err); code != "InvalidInstanceID.Malformed" {
			t.Errorf("terminate %s: code %s, want InvalidInstanceID.Malformed", bad, code)
		}
		out, err := client.DescribeInstances(ctx, &ec2.DescribeInstancesInput{Filters: []types.Filter{{Name: aws.String("instance-id"), Values: []string{known, bad, short}}}})
		if err != nil {
			t.Fatalf("describe by filter with %s: %v", bad, err)
		}
		var got []string
		for _, r := range out.Reservations {
			for _, i := range r.Instances {
				got = append(got, aws.ToString(i.InstanceId))
			}
		}
		if len(got) != 2 || got[0] != known || got[1] != short {
			t.Errorf("describe by filter with %s: %v, want %s and %s", bad, got, known, short)
		}
	}
	if inst, _ := srv.Instance(known); inst.State != ec2server.Running {
		t.Errorf("the known instance is %s after terminates naming a malformed id", inst.State)
	}
}
