package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/jsii-runtime-go"

	"github.com/reaper-k8s/reaper/infra/cdktest"
	"github.com/reaper-k8s/reaper/infra/iamcheck"
	"github.com/reaper-k8s/reaper/infra/iamsim"
)

func TestMain(m *testing.M) { cdktest.Main(m) }

func appWith(t *testing.T, ctx map[string]any) awscdk.App {
	ctx["buildDir"] = cdktest.BuildDir()
	return cdktest.NewApp(t, ctx)
}

// TestContextKnobs sets every knob the way `-c key=value` does (strings)
// or cdk.json may (booleans, numbers, lists) and finds each in the template.
func TestContextKnobs(t *testing.T) {
	var stack awscdk.Stack
	cdktest.Must(t, func() {
		var err error
		stack, _, err = newStack(appWith(t, map[string]any{
			"stackName":                "ReaperStaging",
			"kubeconfigSecretArn":      "arn:aws:secretsmanager:eu-west-1:123456789012:secret:reaper/kubeconfig-AbCdEf",
			"clusterName":              "staging",
			"tableName":                "reaper-staging",
			"tableRemovalPolicy":       "destroy",
			"exitLogGroup":             "/staging/reaper/exits",
			"exitLogRetentionDays":     "7",
			"functionLogRetentionDays": 90.0,
			"exitWait":                 "5m",
			"orphanGrace":              "1h",
			"powerOffGrace":            "20s",
			"terminateStopped":         "false",
			"dryRun":                   true,
			"logLevel":                 "warn",
			"tagManaged":               "example.com/reaped",
			"tagCluster":               "example.com/cluster",
			"tagPodNamespace":          "example.com/ns",
			"tagPodName":               "example.com/pod",
			"tagPodUid":                "example.com/uid",
			"tagClusterUid":            "example.com/cluster-uid",
			"tagExitToken":             "example.com/exit-token",
			"tagPodWritten":            "example.com:pod-written",
			"memoryMb":                 "512",
			"reconcilerMemoryMb":       "1769",
			"reservedConcurrency":      10.0,
			"sweepRate":                "2m",
			"maxEventAge":              "30m",
			"includeRunning":           "true",
			"maxReceiveCount":          "8",
			"reconcilerBatchSize":      2000.0,
			"reconcilerBatchingWindow": "30s",
			"reconcilerMaxConcurrency": "6",
			"ec2Share":                 0.25,
			"queueAgeAlarm":            "15m",
			"orphanCap":                0.05,
			"metricsNamespace":         "Staging/Reaper",
			"terminateLatencyAlarm":    "90s",
			"alarmEmail":               "oncall@example.com",
			"subnetIds":                "subnet-0123456789abcdef0, subnet-0fedcba9876543210",
			"securityGroupIds":         []any{"sg-0123456789abcdef0"},
			"redriveRoles":             "arn:aws:iam::123456789012:role/ops-redrive",
		}))
		if err != nil {
			t.Fatal(err)
		}
	})
	if *stack.StackName() != "ReaperStaging" {
		t.Errorf("stack name %s", *stack.StackName())
	}
	tmpl := cdktest.Template(t, stack)
	cdktest.Must(t, func() {
		tmpl.HasResourceProperties(jsii.String("AWS::DynamoDB::Table"), map[string]any{"TableName": "reaper-staging"})
		tmpl.HasResource(jsii.String("AWS::DynamoDB::Table"), map[string]any{"DeletionPolicy": "Delete"})
		tmpl.HasResourceProperties(jsii.String("AWS::Logs::LogGroup"), map[string]any{"LogGroupName": "/staging/reaper/exits", "RetentionInDays": 7})
		tmpl.ResourcePropertiesCountIs(jsii.String("AWS::Logs::LogGroup"), map[string]any{"RetentionInDays": 90}, jsii.Number(4))
		// The functions that do not talk to Kubernetes.
		tmpl.ResourcePropertiesCountIs(jsii.String("AWS::Lambda::Function"), map[string]any{
			"Environment": map[string]any{"Variables": assertions.Match_ObjectLike(&map[string]any{"REAPER_KUBECONFIG_SECRET": assertions.Match_Absent()})},
		}, jsii.Number(2))
		tmpl.HasResourceProperties(jsii.String("AWS::Lambda::Function"), map[string]any{
			"Environment": map[string]any{"Variables": assertions.Match_ObjectLike(&map[string]any{
				"REAPER_KUBECONFIG_SECRET": assertions.Match_AnyValue(), "REAPER_EC2_SHARE": "0.25", "REAPER_RECONCILER_CONCURRENCY": "6",
			})},
		})
		tmpl.ResourcePropertiesCountIs(jsii.String("AWS::Lambda::Function"), map[string]any{
			"Environment": map[string]any{"Variables": assertions.Match_ObjectLike(&map[string]any{
				"REAPER_KUBECONFIG_SECRET": assertions.Match_AnyValue(), "REAPER_ORPHAN_CAP": "0.05",
			})},
		}, jsii.Number(2))
		tmpl.ResourcePropertiesCountIs(jsii.String("AWS::Lambda::Function"), map[string]any{
			"Environment": map[string]any{"Variables": assertions.Match_ObjectLike(&map[string]any{
				"REAPER_TAG_POD_WRITTEN": "example.com:pod-written", "REAPER_POWER_OFF_GRACE": "20s",
			})},
		}, jsii.Number(1))
		tmpl.HasResourceProperties(jsii.String("AWS::Lambda::EventSourceMapping"), map[string]any{
			"BatchSize": 2000, "MaximumBatchingWindowInSeconds": 30, "ScalingConfig": map[string]any{"MaximumConcurrency": 6},
			"FunctionResponseTypes": []any{"ReportBatchItemFailures"},
		})
		tmpl.HasResourceProperties(jsii.String("AWS::SQS::Queue"), map[string]any{
			"RedrivePolicy": assertions.Match_ObjectLike(&map[string]any{"maxReceiveCount": 8}),
		})
		tmpl.HasResourceProperties(jsii.String("AWS::SQS::QueuePolicy"), map[string]any{
			"PolicyDocument": assertions.Match_ObjectLike(&map[string]any{"Statement": assertions.Match_ArrayWith(&[]any{
				assertions.Match_ObjectLike(&map[string]any{"Sid": "SendOnlyFromReaperFunctions", "Condition": map[string]any{
					"ArnNotEquals": map[string]any{"aws:PrincipalArn": assertions.Match_ArrayWith(&[]any{"arn:aws:iam::123456789012:role/ops-redrive"})}}}),
			})}),
		})
		tmpl.HasResourceProperties(jsii.String("AWS::CloudWatch::Alarm"), map[string]any{
			"MetricName": "ApproximateAgeOfOldestMessage", "Threshold": 900,
		})
		// The sweeper's reserved concurrency is fixed: one sweep at a time.
		tmpl.ResourcePropertiesCountIs(jsii.String("AWS::Lambda::Function"), map[string]any{"ReservedConcurrentExecutions": 10}, jsii.Number(3))
		tmpl.ResourcePropertiesCountIs(jsii.String("AWS::Lambda::Function"), map[string]any{"ReservedConcurrentExecutions": 1}, jsii.Number(1))
		tmpl.ResourcePropertiesCountIs(jsii.String("AWS::Lambda::Function"), map[string]any{"MemorySize": 512}, jsii.Number(3))
		tmpl.ResourcePropertiesCountIs(jsii.String("AWS::Lambda::Function"), map[string]any{"MemorySize": 1769}, jsii.Number(1))
		tmpl.AllResourcesProperties(jsii.String("AWS::Lambda::Function"), map[string]any{
			"VpcConfig":     map[string]any{"SubnetIds": []any{"subnet-0123456789abcdef0", "subnet-0fedcba9876543210"}, "SecurityGroupIds": []any{"sg-0123456789abcdef0"}},
			"LoggingConfig": map[string]any{"LogFormat": "JSON", "ApplicationLogLevel": "WARN", "SystemLogLevel": "INFO", "LogGroup": map[string]any{"Ref": assertions.Match_AnyValue()}},
			"Environment": map[string]any{"Variables": assertions.Match_ObjectLike(&map[string]any{
				"REAPER_TABLE":             map[string]any{"Ref": assertions.Match_AnyValue()},
				"REAPER_QUEUE_URL":         map[string]any{"Ref": assertions.Match_AnyValue()},
				"REAPER_CLUSTER":           "staging",
				"REAPER_EXIT_WAIT":         "5m0s",
				"REAPER_ORPHAN_GRACE":      "1h0m0s",
				"REAPER_TERMINATE_STOPPED": "false",
				"REAPER_DRY_RUN":           "true",
				"REAPER_LOG_LEVEL":         "warn",
				"REAPER_TAG_MANAGED":       "example.com/reaped",
				"REAPER_TAG_CLUSTER":       "example.com/cluster",
				"REAPER_TAG_POD_NAMESPACE": "example.com/ns",
				"REAPER_TAG_POD_NAME":      "example.com/pod",
				"REAPER_TAG_POD_UID":       "example.com/uid",
				"REAPER_TAG_CLUSTER_UID":   "example.com/cluster-uid",
				"REAPER_TAG_EXIT_TOKEN":    "example.com/exit-token",
				"REAPER_METRICS_NAMESPACE": "Staging/Reaper",
			})},
		})
		tmpl.ResourcePropertiesCountIs(jsii.String("AWS::Lambda::Function"), map[string]any{
			"Environment": map[string]any{"Variables": assertions.Match_ObjectLike(&map[string]any{
				"REAPER_KUBECONFIG_SECRET": "arn:aws:secretsmanager:eu-west-1:123456789012:secret:reaper/kubeconfig-AbCdEf",
			})},
		}, jsii.Number(2))
		tmpl.HasResourceProperties(jsii.String("AWS::CloudWatch::Alarm"), map[string]any{
			"Metrics": assertions.Match_ArrayWith(&[]any{assertions.Match_ObjectLike(&map[string]any{"MetricStat": map[string]any{
				"Metric": map[string]any{"Namespace": "Staging/Reaper", "MetricName": "FinishToTerminated"}, "Stat": "p99",
			}})}),
			"Threshold": 90000,
		})
		// The sweeper's is fixed: a minute.
		tmpl.ResourcePropertiesCountIs(jsii.String("AWS::Lambda::EventInvokeConfig"), map[string]any{"MaximumEventAgeInSeconds": 1800}, jsii.Number(2))
		tmpl.HasResourceProperties(jsii.String("AWS::Events::Rule"), map[string]any{"ScheduleExpression": "rate(2 minutes)"})
		tmpl.HasResourceProperties(jsii.String("AWS::SNS::Subscription"), map[string]any{"Protocol": "email", "Endpoint": "oncall@example.com"})
		tmpl.ResourceCountIs(jsii.String("AWS::SNS::Topic"), jsii.Number(1))
		for _, out := range []string{"LedgerTable", "ExitLogGroup", "AgentPolicyArn", "FailureQueueUrl", "WorkQueueUrl", "DeadLetterQueueUrl", "DashboardName", "SweeperRoleArn", "ReconcilerRoleArn"} {
			tmpl.HasOutput(jsii.String(out), map[string]any{})
		}
	})
	// The evaluator: the reconciler terminates and tags only instances
	// carrying the knobs' keys for the knobs' cluster, not the default
	// keys, nor another cluster's.
	askIAM(t, cdktest.JSON(t, tmpl), iamsim.Env{Partition: "aws", Region: "eu-west-1", Account: "123456789012", Stack: "ReaperStaging"},
		iamsim.Fleet{ManagedKey: "example.com/reaped", ClusterKey: "example.com/cluster", Cluster: "staging"}, "example.com:pod-written", "/staging/reaper/exits")
}

// askIAM asks the evaluator what every Reaper deployment must answer as
// designed (iamsim.StackQuestions) of a template of the app, and checks
// with iamcheck what the evaluator cannot see.
func askIAM(t *testing.T, m map[string]any, env iamsim.Env, fleet iamsim.Fleet, podWritten, exitLogGroup string) {
	t.Helper()
	reconciler, err := iamsim.FunctionRole(m, "ReaperReconciler")
	if err != nil {
		t.Fatal(err)
	}
	agent, err := iamsim.OnlyManagedPolicy(m)
	if err != nil {
		t.Fatal(err)
	}
	qs, err := iamsim.StackQuestions(iamsim.Stack{Template: m, Env: env, Fleet: fleet, Terminator: reconciler, PodWritten: podWritten, AgentPolicy: agent, ExitLogGroup: exitLogGroup})
	if err != nil {
		t.Fatal(err)
	}
	iamsim.Ask(t, qs)
	if f := iamcheck.Unreadable(m); len(f) != 0 {
		t.Errorf("grants the evaluator cannot see: %v", f)
	}
}

// TestNag runs cdk-nag's AwsSolutions checks on the default stack and on
// the one the README's deploy command makes: no error or warning is left
// but the suppressions the README lists.
func TestNag(t *testing.T) {
	for name, ctx := range map[string]map[string]any{
		"default": {"eksCluster": "demo"},
		"readme":  {"eksCluster": "prod", "eksAccessEntryGroup": "reaper", "alarmEmail": "ops@example.com"},
	} {
		t.Run(name, func(t *testing.T) {
			var stack awscdk.Stack
			cdktest.Must(t, func() {
				var err error
				if stack, _, err = newStack(appWith(t, ctx)); err != nil {
					t.Fatal(err)
				}
			})
			cluster := ctx["eksCluster"].(string)
			cdktest.NagClean(t, stack, cdktest.ReaperNagSuppressions(*stack.StackName(), "Reaper", "/reaper/"+cluster+"/exits"))
		})
	}
}

func TestBadKnobs(t *testing.T) {
	var err error
	cdktest.Must(t, func() {
		_, _, err = newStack(appWith(t, map[string]any{
			"eksCluster":            "demo",
			"exitWait":              "soon",
			"dryRun":                "maybe",
			"memoryMb":              "lots",
			"exitLogRetentionDays":  "10",
			"tableRemovalPolicy":    "snapshot",
			"terminateLatencyAlarm": "0s",
			"ec2Share":              "half",
			"reconcilerBatchSize":   "all",
			"queueAgeAlarm":         "-1m",
			"orphanCap":             "ten percent",
			"powerOffGrace":         "-5s",
		}))
	})
	for _, want := range []string{`exitWait="soon"`, `dryRun="maybe"`, `memoryMb="lots"`, `exitLogRetentionDays="10": CloudWatch Logs keeps [1 3 5 7 14 30`, `tableRemovalPolicy="snapshot"`, `terminateLatencyAlarm="0s": must be positive`,
		`ec2Share="half"`, `reconcilerBatchSize="all"`, `queueAgeAlarm="-1m": must be positive`, `orphanCap="ten percent"`, `powerOffGrace="-5s": use 0 (terminate at once) or a positive duration`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v, want it to mention %s", err, want)
		}
	}
	cdktest.Must(t, func() { _, _, err = newStack(appWith(t, map[string]any{})) })
	if err == nil || !strings.Contains(err.Error(), "no Kubernetes access: cdk deploy and cdk destroy both take the deployment's knobs") {
		t.Errorf("without access: %v", err)
	}
	cdktest.Must(t, func() {
		_, _, err = newStack(appWith(t, map[string]any{"kubeconfigSecretArn": "arn:aws:secretsmanager:eu-west-1:123456789012:secret:k-AbCdEf"}))
	})
	if err == nil || !strings.Contains(err.Error(), "ClusterName is required") {
		t.Errorf("kubeconfig without clusterName: %v", err)
	}
}

// TestNoPowerOffGrace sets `-c powerOffGrace=0`, for hosts that leave their
// end to Reaper: the two functions that weigh a grace get 0s, the others
// none; the Pod-written tag, whose hosts need a grace, is refused with it.
func TestNoPowerOffGrace(t *testing.T) {
	var (
		stack awscdk.Stack
		err   error
	)
	cdktest.Must(t, func() {
		stack, _, err = newStack(appWith(t, map[string]any{"eksCluster": "demo", "powerOffGrace": "0"}))
	})
	if err != nil {
		t.Fatalf("powerOffGrace=0: %v", err)
	}
	tmpl := cdktest.Template(t, stack)
	cdktest.Must(t, func() {
		for v, n := range map[any]float64{"0s": 2, assertions.Match_Absent(): 2} {
			tmpl.ResourcePropertiesCountIs(jsii.String("AWS::Lambda::Function"), map[string]any{
				"Environment": map[string]any{"Variables": assertions.Match_ObjectLike(&map[string]any{"REAPER_POWER_OFF_GRACE": v})},
			}, jsii.Number(n))
		}
	})
	cdktest.Must(t, func() {
		_, _, err = newStack(appWith(t, map[string]any{"eksCluster": "demo", "powerOffGrace": "0", "tagPodWritten": "reaper.io:pod-written"}))
	})
	if err == nil || !strings.Contains(err.Error(), "Tags.PodWritten needs a PowerOffGrace") {
		t.Errorf("powerOffGrace=0 with tagPodWritten: %v, want the tag refused without a grace", err)
	}
}

// TestStackPerCluster deploys the default app twice, once per cluster, into
// one account and region: the stacks get their own names and claim no name
// in common.
func TestStackPerCluster(t *testing.T) {
	claimed := map[string]string{}
	for cluster, ctx := range map[string]map[string]any{
		"staging": {"eksCluster": "staging"},
		"prod":    {"kubeconfigSecretArn": "arn:aws:secretsmanager:eu-west-1:123456789012:secret:prod/kubeconfig-AbCdEf", "clusterName": "prod", "alarmEmail": "oncall@example.com"},
	} {
		var stack awscdk.Stack
		cdktest.Must(t, func() {
			var err error
			if stack, _, err = newStack(appWith(t, ctx)); err != nil {
				t.Fatal(err)
			}
		})
		if want := "Reaper-" + cluster; *stack.StackName() != want {
			t.Errorf("stack name %s, want %s", *stack.StackName(), want)
		}
		m := cdktest.JSON(t, cdktest.Template(t, stack))
		for _, name := range cdktest.PhysicalNames(t, *stack.StackName(), m) {
			if other, ok := claimed[name]; ok {
				t.Errorf("the %s and %s stacks both claim %s", other, cluster, name)
			}
			claimed[name] = cluster
		}
	}
	for cluster, want := range map[string]string{
		"team_a.gpu":             "Reaper-team-a-gpu",
		"prod-1":                 "Reaper-prod-1",
		strings.Repeat("x", 200): "Reaper-" + strings.Repeat("x", 121),
	} {
		if got := defaultStackName(cluster); got != want {
			t.Errorf("defaultStackName(%q) = %s, want %s", cluster, got, want)
		}
	}
}

// TestCDKSynth runs the real CDK CLI on cdk.json, offline and without AWS
// credentials, and checks what `sam local invoke` and `cdk deploy` need.
func TestCDKSynth(t *testing.T) {
	cdk := os.Getenv("REAPER_CDK")
	if cdk == "" {
		t.Fatal(`REAPER_CDK is not set: run eval "$(hack/setup.sh)" first (it installs the CDK CLI)`)
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, cdk, "synth", "--quiet", "--no-lookups", "--output", out,
		"-c", "eksCluster=demo", "-c", "buildDir="+cdktest.BuildDir())
	cmd.Dir = root
	cmd.Env = offlineEnv()
	start := time.Now()
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("cdk synth: %v\n%s", err, b)
	}
	t.Logf("cdk synth took %s", time.Since(start).Round(time.Second))

	raw, err := os.ReadFile(filepath.Join(out, "Reaper-demo.template.json"))
	if err != nil {
		t.Fatal(err)
	}
	var tmpl map[string]any
	if err := json.Unmarshal(raw, &tmpl); err != nil {
		t.Fatal(err)
	}
	fns := cdktest.Resources(tmpl, "AWS::Lambda::Function")
	if len(fns) != 4 {
		t.Fatalf("%d functions in the synthesized template", len(fns))
	}
	for id, fn := range fns {
		meta, _ := fn["Metadata"].(map[string]any)
		path, _ := meta["aws:asset:path"].(string)
		if path == "" || meta["aws:asset:property"] != "Code" {
			t.Errorf("%s: asset metadata %v, sam local invoke needs aws:asset:path and aws:asset:property=Code", id, meta)
			continue
		}
		info, err := os.Stat(filepath.Join(out, path, "bootstrap"))
		if err != nil || info.Mode()&0o111 == 0 {
			t.Errorf("%s: asset %s has no executable bootstrap: %v", id, path, err)
		}
	}
	if n := len(cdktest.Resources(tmpl, "AWS::CDK::Metadata")); n != 0 {
		t.Errorf("version reporting is on (%d metadata resources): cdk.json was not honored", n)
	}
	for id, fn := range fns {
		vars, _ := cdktest.Props(fn)["Environment"].(map[string]any)["Variables"].(map[string]any)
		if vars["REAPER_CLUSTER"] != "demo" {
			t.Errorf("%s: REAPER_CLUSTER %v, want demo", id, vars["REAPER_CLUSTER"])
		}
	}
	// The policies cdk synth wrote, evaluated.
	askIAM(t, tmpl, iamsim.TestEnv("Reaper-demo"), iamsim.DefaultFleet("demo"), "", "/reaper/demo/exits")
	if _, err := os.Stat(filepath.Join(out, "manifest.json")); err != nil {
		t.Error(err)
	}
}

// TestDestroyNeedsNoBuild synthesizes the app as cdk destroy and cdk list
// do, with no bundling (the CLI's aws:cdk:bundling-stacks empty): the
// stack the knobs name, without the function bundles, which only a deploy
// needs (and still refuses to go without).
func TestDestroyNeedsNoBuild(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "never-built")
	for name, tc := range map[string]struct {
		bundling []any
		ok       bool
	}{
		"destroy": {[]any{}, true},
		"deploy":  {[]any{"**"}, false},
	} {
		var (
			stack awscdk.Stack
			err   error
		)
		cdktest.Must(t, func() {
			stack, _, err = newStack(cdktest.NewApp(t, map[string]any{"eksCluster": "demo", "buildDir": missing, "aws:cdk:bundling-stacks": tc.bundling}))
		})
		switch {
		case tc.ok && err != nil:
			t.Errorf("%s: %v", name, err)
		case tc.ok && *stack.StackName() != "Reaper-demo":
			t.Errorf("%s: stack %s, want Reaper-demo", name, *stack.StackName())
		case !tc.ok && (err == nil || !strings.Contains(err.Error(), "bootstrap is missing: run `make build` first")):
			t.Errorf("%s without a build: %v, want the bundles missing", name, err)
		}
	}
}

// TestCDKDestroy runs the operate page's cdk destroy with the real CDK CLI
// from a checkout that was never built, offline and without credentials:
// the app synthesizes, and the CLI goes on to destroy the stack the knobs
// name, which it can do no further than asking for the account.
func TestCDKDestroy(t *testing.T) {
	cdk := os.Getenv("REAPER_CDK")
	if cdk == "" {
		t.Fatal(`REAPER_CDK is not set: run eval "$(hack/setup.sh)" first (it installs the CDK CLI)`)
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, cdk, "destroy", "--force", "--output", t.TempDir(),
		"-c", "eksCluster=demo", "-c", "buildDir="+filepath.Join(t.TempDir(), "never-built"))
	cmd.Dir = root
	cmd.Env = offlineEnv()
	out, _ := cmd.CombinedOutput()
	if !strings.Contains(string(out), "Reaper-demo: destroying") || !strings.Contains(string(out), "Unable to resolve AWS account") ||
		strings.Contains(string(out), "reaper:") {
		t.Errorf("cdk destroy -c eksCluster=demo did not get past the app to destroying Reaper-demo:\n%s", out)
	}
}

// offlineEnv is the environment without AWS credentials or settings, and
// with everything that would reach the network turned off.
func offlineEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "AWS_") {
			env = append(env, kv)
		}
	}
	return append(env,
		"AWS_CONFIG_FILE="+os.DevNull,
		"AWS_SHARED_CREDENTIALS_FILE="+os.DevNull,
		"AWS_EC2_METADATA_DISABLED=true",
		"CDK_DISABLE_VERSION_CHECK=true",
		"JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION=20",
	)
}
