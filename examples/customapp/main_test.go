package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/jsii-runtime-go"

	"github.com/reaper-k8s/reaper/infra/cdktest"
	"github.com/reaper-k8s/reaper/infra/iamcheck"
	"github.com/reaper-k8s/reaper/infra/iamsim"
	"github.com/reaper-k8s/reaper/infra/reapercdk"
)

func TestMain(m *testing.M) { cdktest.Main(m) }

// TestCustomApp builds this app's stack and finds its non-default settings
// in the template.
func TestCustomApp(t *testing.T) {
	stack, r := newStack(cdktest.NewApp(t, nil), cdktest.BuildDir())
	tmpl := cdktest.Template(t, stack)
	secret := "arn:aws:secretsmanager:eu-west-1:123456789012:secret:gpu-pods/kubeconfig-AbCdEf"
	cdktest.Must(t, func() {
		tmpl.HasResourceProperties(jsii.String("AWS::DynamoDB::Table"), map[string]any{"TableName": "gpu-pods-ledger"})
		tmpl.HasResourceProperties(jsii.String("AWS::Logs::LogGroup"), map[string]any{"LogGroupName": "/gpu-pods/exits"})
		tmpl.HasResourceProperties(jsii.String("AWS::Logs::SubscriptionFilter"), map[string]any{"FilterPattern": `{ $.reaper = "container-exit" }`})
		// MemoryMB sets every function's memory but the reconciler's, which
		// keeps its default (ReconcilerMemoryMB).
		tmpl.ResourcePropertiesCountIs(jsii.String("AWS::Lambda::Function"), map[string]any{"MemorySize": 512}, jsii.Number(3))
		tmpl.ResourcePropertiesCountIs(jsii.String("AWS::Lambda::Function"), map[string]any{"MemorySize": reapercdk.DefaultReconcilerMemoryMB}, jsii.Number(1))
		tmpl.AllResourcesProperties(jsii.String("AWS::Lambda::Function"), map[string]any{
			"LoggingConfig": assertions.Match_ObjectLike(&map[string]any{"ApplicationLogLevel": "DEBUG"}),
			"Environment": map[string]any{"Variables": assertions.Match_ObjectLike(&map[string]any{
				"REAPER_TABLE":             map[string]any{"Ref": assertions.Match_AnyValue()},
				"REAPER_CLUSTER":           "gpu-pods",
				"REAPER_QUEUE_URL":         map[string]any{"Ref": assertions.Match_AnyValue()},
				"REAPER_EXIT_WAIT":         "5m0s",
				"REAPER_ORPHAN_GRACE":      "30m0s",
				"REAPER_TERMINATE_STOPPED": "false",
				"REAPER_DRY_RUN":           "true",
				"REAPER_LOG_LEVEL":         "debug",
				"REAPER_TAG_MANAGED":       "gpu-pods.example.com/managed",
				"REAPER_TAG_CLUSTER":       "gpu-pods.example.com/cluster",
				"REAPER_TAG_POD_NAMESPACE": "gpu-pods.example.com/namespace",
				"REAPER_TAG_POD_NAME":      "gpu-pods.example.com/pod",
				"REAPER_TAG_POD_UID":       "gpu-pods.example.com/uid",
				"REAPER_METRICS_NAMESPACE": "GpuPods/Reaper",
			})},
		})
		// The functions that talk to Kubernetes read the kubeconfig secret.
		tmpl.ResourcePropertiesCountIs(jsii.String("AWS::Lambda::Function"), map[string]any{
			"Environment": map[string]any{"Variables": assertions.Match_ObjectLike(&map[string]any{"REAPER_KUBECONFIG_SECRET": secret})},
		}, jsii.Number(2))
		tmpl.HasResourceProperties(jsii.String("AWS::CloudWatch::Alarm"), map[string]any{
			"Metrics": assertions.Match_ArrayWith(&[]any{assertions.Match_ObjectLike(&map[string]any{"MetricStat": map[string]any{
				"Metric": map[string]any{"Namespace": "GpuPods/Reaper", "MetricName": "FinishToTerminated"}, "Stat": "p99",
			}})}),
			"Threshold": 300000,
		})
		tmpl.HasResourceProperties(jsii.String("AWS::CloudWatch::Dashboard"), map[string]any{"DashboardName": "Reaper-gpu-pods"})
		// The event-driven functions keep their events for the app's 3 h;
		// a sweep is replaced by the next one after a minute.
		tmpl.ResourcePropertiesCountIs(jsii.String("AWS::Lambda::EventInvokeConfig"), map[string]any{"MaximumEventAgeInSeconds": 3 * 3600}, jsii.Number(2))
		tmpl.ResourcePropertiesCountIs(jsii.String("AWS::Lambda::EventInvokeConfig"), map[string]any{"MaximumEventAgeInSeconds": 60, "MaximumRetryAttempts": 0}, jsii.Number(1))
		tmpl.HasResourceProperties(jsii.String("AWS::Events::Rule"), map[string]any{"ScheduleExpression": "rate(5 minutes)"})
		tmpl.HasResourceProperties(jsii.String("AWS::SNS::Subscription"), map[string]any{"Protocol": "email", "Endpoint": "gpu-oncall@example.com"})
		// Secrets Manager access instead of EKS.
		tmpl.HasResourceProperties(jsii.String("AWS::IAM::Policy"), map[string]any{"PolicyDocument": map[string]any{
			"Statement": assertions.Match_ArrayWith(&[]any{assertions.Match_ObjectLike(&map[string]any{
				"Action": "secretsmanager:GetSecretValue", "Resource": secret,
			})}),
		}})
		// The app's own role carries the construct's agent policy.
		tmpl.HasResourceProperties(jsii.String("AWS::IAM::Role"), map[string]any{
			"AssumeRolePolicyDocument": assertions.Match_ObjectLike(&map[string]any{"Statement": []any{assertions.Match_ObjectLike(&map[string]any{
				"Principal": map[string]any{"Service": "ec2.amazonaws.com"},
			})}}),
			"ManagedPolicyArns": []any{stack.Resolve(r.AgentPolicy.ManagedPolicyArn())},
		})
	})
	m := cdktest.JSON(t, tmpl)
	for id, p := range cdktest.Resources(m, "AWS::IAM::Policy") {
		if b, _ := json.Marshal(p); strings.Contains(string(b), "eks:") {
			t.Errorf("%s grants EKS access although the app reads a kubeconfig secret", id)
		}
	}
	// The evaluator: only the reconciler terminates, and only instances
	// carrying the app's own tag keys for its cluster (not the default
	// keys); the app's instance role, holding the agent policy, writes
	// exit lines only.
	reconciler, err := iamsim.FunctionRole(m, "ReaperReconciler")
	if err != nil {
		t.Fatal(err)
	}
	agent, err := iamsim.OnlyManagedPolicy(m)
	if err != nil {
		t.Fatal(err)
	}
	qs, err := iamsim.StackQuestions(iamsim.Stack{
		Template: m, Env: iamsim.TestEnv("GpuPods"), Terminator: reconciler,
		Fleet:       iamsim.Fleet{ManagedKey: "gpu-pods.example.com/managed", ClusterKey: "gpu-pods.example.com/cluster", Cluster: "gpu-pods"},
		AgentPolicy: agent, ExitLogGroup: "/gpu-pods/exits",
	})
	if err != nil {
		t.Fatal(err)
	}
	iamsim.Ask(t, qs)
	if f := iamcheck.Unreadable(m); len(f) != 0 {
		t.Errorf("grants the evaluator cannot see: %v", f)
	}
}

// TestNag runs cdk-nag's AwsSolutions checks on this app's stack: the
// construct's suppressions cover it (the app's own role raises nothing).
func TestNag(t *testing.T) {
	stack, _ := newStack(cdktest.NewApp(t, nil), cdktest.BuildDir())
	cdktest.NagClean(t, stack, cdktest.ReaperNagSuppressions("GpuPods", "Reaper", "/gpu-pods/exits"))
}
