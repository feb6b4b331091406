package cdktest_test

import (
	"os"
	"strings"
	"testing"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsdynamodb"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/jsii-runtime-go"

	"github.com/reaper-k8s/reaper/infra/cdktest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	jsii.Close()
	os.Exit(code)
}

// TestNagReports checks that Nag reports what the pack finds: a warning,
// which leaves the synthesis intact, and an error, which fails it.
func TestNagReports(t *testing.T) {
	for name, tc := range map[string]struct {
		add  func(awscdk.Stack)
		want string
	}{
		"warning": {func(stack awscdk.Stack) {
			awsdynamodb.NewTable(stack, jsii.String("NoRecovery"), &awsdynamodb.TableProps{
				PartitionKey: &awsdynamodb.Attribute{Name: jsii.String("id"), Type: awsdynamodb.AttributeType_STRING},
			})
		}, "Nag/NoRecovery/Resource: AwsSolutions-DDB3:"},
		"error": {func(stack awscdk.Stack) {
			role := awsiam.NewRole(stack, jsii.String("Wide"), &awsiam.RoleProps{AssumedBy: awsiam.NewServicePrincipal(jsii.String("lambda.amazonaws.com"), nil)})
			role.AddToPrincipalPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
				Actions: jsii.Strings("s3:GetObject"), Resources: jsii.Strings("*"),
			}))
		}, "Nag/Wide/DefaultPolicy/Resource: AwsSolutions-IAM5[Resource::*]:"},
	} {
		t.Run(name, func(t *testing.T) {
			var stack awscdk.Stack
			cdktest.Must(t, func() {
				stack = awscdk.NewStack(cdktest.NewApp(t, nil), jsii.String("Nag"), nil)
				tc.add(stack)
			})
			r := cdktest.Nag(t, stack)
			if len(r.Findings) != 1 || !strings.HasPrefix(r.Findings[0], tc.want) {
				t.Errorf("findings %q, want one starting with %q", r.Findings, tc.want)
			}
			if len(r.Suppressed) != 0 {
				t.Errorf("suppressed %v", r.Suppressed)
			}
		})
	}
}
