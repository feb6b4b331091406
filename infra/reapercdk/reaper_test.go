package reapercdk_test

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/jsii-runtime-go"

	"github.com/reaper-k8s/reaper/infra/cdktest"
	"github.com/reaper-k8s/reaper/infra/iamcheck"
	"github.com/reaper-k8s/reaper/infra/iamsim"
	"github.com/reaper-k8s/reaper/infra/reapercdk"
	"github.com/reaper-k8s/reaper/pkg/config"
	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/model"
)

func TestMain(m *testing.M) { cdktest.Main(m) }

// newStack returns a Reaper in a fresh app and stack; customize may add to
// the stack before synthesis.
func newStack(t *testing.T, props reapercdk.Props, customize func(awscdk.Stack, *reapercdk.Reaper)) assertions.Template {
	t.Helper()
	app := cdktest.NewApp(t, nil)
	var stack awscdk.Stack
	cdktest.Must(t, func() {
		stack = awscdk.NewStack(app, jsii.String("Test"), nil)
		props.BuildDir = cdktest.BuildDir()
		r := reapercdk.New(stack, "Reaper", &props)
		if customize != nil {
			customize(stack, r)
		}
	})
	return cdktest.Template(t, stack)
}

// The default stack is synthesized once per test binary: a synth takes
// seconds.
var (
	defaultOnce sync.Once
	defaultTmpl assertions.Template
	defaultJSON map[string]any
)

func defaults(t *testing.T) (assertions.Template, map[string]any) {
	t.Helper()
	defaultOnce.Do(func() {
		defaultTmpl = newStack(t, reapercdk.Props{EKSCluster: "demo"}, nil)
		defaultJSON = cdktest.JSON(t, defaultTmpl)
	})
	if defaultJSON == nil {
		t.Fatal("the default stack did not synthesize (see the first failing test)")
	}
	return defaultTmpl, defaultJSON
}

func has(t *testing.T, tmpl assertions.Template, typ string, props map[string]any) {
	t.Helper()
	cdktest.Must(t, func() { tmpl.HasResourceProperties(jsii.String(typ), props) })
}

func TestLedgerTable(t *testing.T) {
	tmpl, m := defaults(t)
	has(t, tmpl, "AWS::DynamoDB::Table", map[string]any{
		"KeySchema": []any{map[string]any{"AttributeName": "instanceId", "KeyType": "HASH"}},
		"AttributeDefinitions": []any{
			map[string]any{"AttributeName": "instanceId", "AttributeType": "S"},
			map[string]any{"AttributeName": "pending", "AttributeType": "S"},
		},
		"GlobalSecondaryIndexes": []any{map[string]any{
			"IndexName":  "pending",
			"KeySchema":  []any{map[string]any{"AttributeName": "pending", "KeyType": "HASH"}},
			"Projection": map[string]any{"ProjectionType": "ALL"},
		}},
		"BillingMode":                      "PAY_PER_REQUEST",
		"TimeToLiveSpecification":          map[string]any{"AttributeName": "expiresAt", "Enabled": true},
		"PointInTimeRecoverySpecification": map[string]any{"PointInTimeRecoveryEnabled": true},
		"TableName":                        assertions.Match_Absent(),
	})
	_, table := cdktest.Only(t, m, "AWS::DynamoDB::Table")
	if table["DeletionPolicy"] != "Retain" || table["UpdateReplacePolicy"] != "Retain" {
		t.Errorf("table policies %v/%v, want Retain", table["DeletionPolicy"], table["UpdateReplacePolicy"])
	}
}

// functionIDs are the functions' construct ids, in the order of
// reapercdk.FunctionNames.
var functionIDs = []string{"ExitRecorder", "StateChange", "Sweeper", "Reconciler"}

// byID finds the resource of a type whose construct id under the Reaper is
// id: its logical id is "Reaper", id and an 8-digit hash.
func byID(t *testing.T, m map[string]any, typ, id string) (string, map[string]any) {
	t.Helper()
	want := regexp.MustCompile(`^Reaper` + id + `[0-9A-F]{8}$`)
	for logical, r := range cdktest.Resources(m, typ) {
		if want.MatchString(logical) {
			return logical, r
		}
	}
	t.Fatalf("no %s %s", typ, id)
	return "", nil
}

// fn finds a function by its construct id (see functionIDs).
func fn(t *testing.T, m map[string]any, id string) (string, map[string]any) {
	t.Helper()
	return byID(t, m, "AWS::Lambda::Function", id)
}

// queue finds a queue by its construct id: Work, WorkDeadLetters or
// Failures.
func queue(t *testing.T, m map[string]any, id string) (string, map[string]any) {
	t.Helper()
	return byID(t, m, "AWS::SQS::Queue", id)
}

// roleOf is the logical id of a function's role.
func roleOf(t *testing.T, m map[string]any, id string) string {
	t.Helper()
	_, f := fn(t, m, id)
	return cdktest.Props(f)["Role"].(map[string]any)["Fn::GetAtt"].([]any)[0].(string)
}

func getAtt(id, attr string) map[string]any { return map[string]any{"Fn::GetAtt": []any{id, attr}} }

func TestFunctions(t *testing.T) {
	tmpl, m := defaults(t)
	if n := len(cdktest.Resources(m, "AWS::Lambda::Function")); n != 4 {
		t.Fatalf("%d functions, want 4", n)
	}
	if got := reapercdk.FunctionNames(); !slices.Equal(got, []string{"exitrecorder", "statechange", "sweeper", "reconciler"}) {
		t.Errorf("FunctionNames %v", got)
	}
	tableID, _ := cdktest.Only(t, m, "AWS::DynamoDB::Table")
	workID, _ := queue(t, m, "Work")
	dlqID, _ := queue(t, m, "WorkDeadLetters")
	for id, timeout := range map[string]float64{"ExitRecorder": 60, "StateChange": 60, "Sweeper": 300, "Reconciler": 300} {
		// The reconciler has two vCPUs for a burst's writes; the others
		// make a call or two an event.
		memory := 256
		if id == "Reconciler" {
			memory = 3538
		}
		env := map[string]any{
			"REAPER_TABLE":             map[string]any{"Ref": tableID},
			"REAPER_CLUSTER":           "demo",
			"REAPER_EXIT_WAIT":         "3m0s",
			"REAPER_ORPHAN_GRACE":      "15m0s",
			"REAPER_TERMINATE_STOPPED": "true",
			"REAPER_DRY_RUN":           "false",
			"REAPER_LOG_LEVEL":         "info",
			"REAPER_METRICS_NAMESPACE": "Reaper/demo",
			"REAPER_QUEUE_URL":         map[string]any{"Ref": workID},
			"GOGC":                     "400",
		}
		// Only the functions that talk to Kubernetes learn how; they also
		// decide terminations, with the construct's power-off grace, not
		// the functions' default (none).
		env["REAPER_POWER_OFF_GRACE"] = assertions.Match_Absent()
		if id == "Sweeper" || id == "Reconciler" {
			env["REAPER_EKS_CLUSTER"] = "demo"
			env["REAPER_POWER_OFF_GRACE"] = reapercdk.DefaultPowerOffGrace.String()
		}
		if id == "Reconciler" {
			env["REAPER_DEAD_LETTER_QUEUE_URL"] = map[string]any{"Ref": dlqID}
			env["REAPER_EC2_SHARE"] = "0.5"
			env["REAPER_RECONCILER_CONCURRENCY"] = "2"
		}
		// One sweep at a time; the others are unreserved by default.
		var reserved any = assertions.Match_Absent()
		if id == "Sweeper" {
			reserved = 1
		}
		cdktest.Must(t, func() {
			tmpl.HasResource(jsii.String("AWS::Lambda::Function"), map[string]any{
				"Properties": map[string]any{
					"Runtime":       "provided.al2023",
					"Architectures": []any{"arm64"},
					"Handler":       "bootstrap",
					"MemorySize":    memory,
					"Timeout":       timeout,
					"LoggingConfig": map[string]any{
						"LogFormat": "JSON", "ApplicationLogLevel": "INFO", "SystemLogLevel": "INFO",
						"LogGroup": assertions.Match_ObjectLike(&map[string]any{"Ref": assertions.Match_StringLikeRegexp(jsii.String("^Reaper" + id + "Logs"))}),
					},
					"Environment":                  map[string]any{"Variables": env},
					"ReservedConcurrentExecutions": reserved,
					"VpcConfig":                    assertions.Match_Absent(),
				},
			})
		})
	}
	// Every function has its own log group with a retention.
	if n := len(cdktest.Resources(m, "AWS::Logs::LogGroup")); n != 5 {
		t.Errorf("%d log groups, want 5 (exit lines + one per function)", n)
	}
	has(t, tmpl, "AWS::Logs::LogGroup", map[string]any{"RetentionInDays": 30, "LogGroupName": assertions.Match_Absent()})
}

// TestEnvironmentIsValidConfig feeds each function's environment to the
// handlers' own configuration parser. The functions that do not talk to
// Kubernetes get no access to it: they are read with a stand-in KUBECONFIG,
// which they never use.
func TestEnvironmentIsValidConfig(t *testing.T) {
	_, m := defaults(t)
	for _, id := range functionIDs {
		_, f := fn(t, m, id)
		vars := cdktest.Props(f)["Environment"].(map[string]any)["Variables"].(map[string]any)
		kube := vars["REAPER_EKS_CLUSTER"] != nil || vars["REAPER_KUBECONFIG_SECRET"] != nil
		if want := id == "Sweeper" || id == "Reconciler"; kube != want {
			t.Errorf("%s: Kubernetes access in its environment %v, want %v", id, kube, want)
		}
		cfg, err := config.Read(func(name string) string {
			switch v := vars[name].(type) {
			case string:
				return v
			case nil:
				if name == "KUBECONFIG" && !kube {
					return "/nonexistent/kubeconfig"
				}
				return ""
			default: // a reference CloudFormation resolves
				return "resolved-" + name
			}
		}, config.Needs{Ledger: true, Kube: true})
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		if cfg.ExitWait != config.DefaultExitWait || cfg.OrphanGrace != config.DefaultOrphanGrace || !cfg.TerminateStopped ||
			cfg.DryRun || cfg.Cluster != "demo" || (kube && cfg.Kube.EKSCluster != "demo") || cfg.Tags != model.DefaultTagKeys() {
			t.Fatalf("%s: config %+v", id, cfg)
		}
	}
}

func TestAsyncInvokeAndFailureQueue(t *testing.T) {
	tmpl, m := defaults(t)
	queueID, failures := queue(t, m, "Failures")
	if p := cdktest.Props(failures); p["SqsManagedSseEnabled"] != true || p["MessageRetentionPeriod"] != float64(14*24*3600) || p["RedrivePolicy"] != nil {
		t.Errorf("failure queue %v", p)
	}
	// The functions Lambda invokes asynchronously; the work queue's event
	// source mapping invokes the reconciler, which has no invoke config.
	configs := cdktest.Resources(m, "AWS::Lambda::EventInvokeConfig")
	var configured []string
	for _, c := range configs {
		configured = append(configured, compact(cdktest.Props(c)["FunctionName"]))
	}
	sort.Strings(configured)
	var want []string
	for _, id := range []string{"ExitRecorder", "StateChange", "Sweeper"} {
		logical, _ := fn(t, m, id)
		want = append(want, compact(map[string]any{"Ref": logical}))
	}
	sort.Strings(want)
	if !slices.Equal(configured, want) {
		t.Fatalf("invoke configs for %v, want %v", configured, want)
	}
	// The event-driven functions retry and then keep what failed; the
	// sweeper does neither: a sweep that failed or could not start within
	// a minute is replaced by the next one.
	sweeper, _ := fn(t, m, "Sweeper")
	for _, c := range configs {
		got := cdktest.Props(c)
		want := map[string]any{
			"FunctionName":             got["FunctionName"],
			"Qualifier":                "$LATEST",
			"MaximumRetryAttempts":     2.0,
			"MaximumEventAgeInSeconds": 3600.0,
			"DestinationConfig":        map[string]any{"OnFailure": map[string]any{"Destination": getAtt(queueID, "Arn")}},
		}
		if compact(got["FunctionName"]) == compact(map[string]any{"Ref": sweeper}) {
			want["MaximumRetryAttempts"], want["MaximumEventAgeInSeconds"] = 0.0, 60.0
			delete(want, "DestinationConfig")
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("invoke config\n got %s\nwant %s", compact(got), compact(want))
		}
	}
	// The queue refuses plain HTTP and accepts EventBridge's dead letters.
	has(t, tmpl, "AWS::SQS::QueuePolicy", map[string]any{
		"Queues": []any{map[string]any{"Ref": queueID}},
		"PolicyDocument": map[string]any{"Statement": assertions.Match_ArrayWith(&[]any{
			assertions.Match_ObjectLike(&map[string]any{"Effect": "Deny", "Condition": map[string]any{"Bool": map[string]any{"aws:SecureTransport": "false"}}}),
			assertions.Match_ObjectLike(&map[string]any{"Effect": "Allow", "Action": "sqs:SendMessage", "Principal": map[string]any{"Service": "events.amazonaws.com"}}),
		})},
	})
}

// TestWorkQueue checks the queue between the functions that find work and
// the reconciler: encrypted, TLS only, unnamed, a visibility timeout six
// times the reconciler's, a dead-letter queue after MaxReceiveCount
// receives, and the event source mapping that feeds the reconciler.
func TestWorkQueue(t *testing.T) {
	tmpl, m := defaults(t)
	if n := len(cdktest.Resources(m, "AWS::SQS::Queue")); n != 3 {
		t.Fatalf("%d queues, want 3 (work, its dead letters, failures)", n)
	}
	workID, work := queue(t, m, "Work")
	dlqID, dlq := queue(t, m, "WorkDeadLetters")
	_, reconciler := fn(t, m, "Reconciler")
	timeout := cdktest.Props(reconciler)["Timeout"].(float64)
	if timeout != reapercdk.ReconcilerTimeout.Seconds() {
		t.Errorf("reconciler timeout %v", timeout)
	}
	want := map[string]any{
		"SqsManagedSseEnabled":   true,
		"MessageRetentionPeriod": float64(4 * 24 * 3600),
		"VisibilityTimeout":      6 * timeout,
		"RedrivePolicy":          map[string]any{"deadLetterTargetArn": getAtt(dlqID, "Arn"), "maxReceiveCount": 5.0},
	}
	if got := cdktest.Props(work); !reflect.DeepEqual(got, want) {
		t.Errorf("work queue\n got %s\nwant %s", compact(got), compact(want))
	}
	want = map[string]any{"SqsManagedSseEnabled": true, "MessageRetentionPeriod": float64(14 * 24 * 3600)}
	if got := cdktest.Props(dlq); !reflect.DeepEqual(got, want) {
		t.Errorf("dead-letter queue\n got %s\nwant %s", compact(got), compact(want))
	}
	// Both refuse plain HTTP. The work queue takes messages only from the
	// functions' roles, whoever else IAM lets send: a forged work item
	// would have the reconciler act on it. The dead-letter queue takes
	// only the reconciler's: SQS moves the work queue's failed messages
	// itself, and the reconciler sends there the work it could not finish
	// in workqueue.MaxAttempts batches. Only sending is denied, so administrators
	// still manage, read and purge both.
	tls := func(id string) map[string]any {
		return map[string]any{
			"Effect": "Deny", "Action": "sqs:*", "Principal": map[string]any{"AWS": "*"},
			"Condition": map[string]any{"Bool": map[string]any{"aws:SecureTransport": "false"}},
			"Resource":  getAtt(id, "Arn"),
		}
	}
	var roles []any
	for _, id := range functionIDs {
		roles = append(roles, getAtt(roleOf(t, m, id), "Arn"))
	}
	for id, sends := range map[string]map[string]any{
		workID: {
			"Sid": "SendOnlyFromReaperFunctions", "Effect": "Deny", "Action": "sqs:SendMessage", "Principal": "*",
			"Condition": map[string]any{"ArnNotEquals": map[string]any{"aws:PrincipalArn": roles}},
			"Resource":  getAtt(workID, "Arn"),
		},
		dlqID: {
			"Sid": "SendOnlyFromReconciler", "Effect": "Deny", "Action": "sqs:SendMessage", "Principal": "*",
			"Condition": map[string]any{"ArnNotEquals": map[string]any{"aws:PrincipalArn": []any{getAtt(roleOf(t, m, "Reconciler"), "Arn")}}},
			"Resource":  getAtt(dlqID, "Arn"),
		},
	} {
		has(t, tmpl, "AWS::SQS::QueuePolicy", map[string]any{
			"Queues":         []any{map[string]any{"Ref": id}},
			"PolicyDocument": map[string]any{"Statement": []any{tls(id), sends}, "Version": "2012-10-17"},
		})
	}

	reconcilerID, _ := fn(t, m, "Reconciler")
	_, esm := cdktest.Only(t, m, "AWS::Lambda::EventSourceMapping")
	want = map[string]any{
		"FunctionName":                   map[string]any{"Ref": reconcilerID},
		"EventSourceArn":                 getAtt(workID, "Arn"),
		"BatchSize":                      10000.0,
		"MaximumBatchingWindowInSeconds": 1.0,
		"ScalingConfig":                  map[string]any{"MaximumConcurrency": 2.0},
		"FunctionResponseTypes":          []any{"ReportBatchItemFailures"},
	}
	if got := cdktest.Props(esm); !reflect.DeepEqual(got, want) {
		t.Errorf("event source mapping\n got %s\nwant %s", compact(got), compact(want))
	}
}

func TestTriggers(t *testing.T) {
	tmpl, m := defaults(t)
	exitRecorder, _ := fn(t, m, "ExitRecorder")
	stateChange, _ := fn(t, m, "StateChange")
	sweeper, _ := fn(t, m, "Sweeper")
	queueID, _ := queue(t, m, "Failures")
	exitGroup := ""
	for id, r := range cdktest.Resources(m, "AWS::Logs::LogGroup") {
		if cdktest.Props(r)["LogGroupName"] == "/reaper/demo/exits" {
			exitGroup = id
			if cdktest.Props(r)["RetentionInDays"] != 30.0 {
				t.Errorf("exit log group retention %v", cdktest.Props(r)["RetentionInDays"])
			}
		}
	}
	if exitGroup == "" {
		t.Fatal("no /reaper/demo/exits log group")
	}
	has(t, tmpl, "AWS::Logs::SubscriptionFilter", map[string]any{
		"LogGroupName":   map[string]any{"Ref": exitGroup},
		"FilterPattern":  `{ $.reaper = "container-exit" }`,
		"DestinationArn": getAtt(exitRecorder, "Arn"),
	})
	has(t, tmpl, "AWS::Lambda::Permission", map[string]any{
		"FunctionName": getAtt(exitRecorder, "Arn"), "Principal": "logs.amazonaws.com", "SourceArn": getAtt(exitGroup, "Arn"),
	})
	target := func(fnID string, retries, age int) map[string]any {
		return map[string]any{"Targets": []any{assertions.Match_ObjectLike(&map[string]any{
			"Arn":              getAtt(fnID, "Arn"),
			"DeadLetterConfig": map[string]any{"Arn": getAtt(queueID, "Arn")},
			"RetryPolicy":      map[string]any{"MaximumRetryAttempts": retries, "MaximumEventAgeInSeconds": age},
		})}}
	}
	rule := target(stateChange, 2, 3600)
	rule["EventPattern"] = map[string]any{
		"source":      []any{"aws.ec2"},
		"detail-type": []any{"EC2 Instance State-change Notification"},
		"detail":      map[string]any{"state": []any{"stopping", "stopped", "shutting-down", "terminated"}},
	}
	has(t, tmpl, "AWS::Events::Rule", rule)
	// A sweep is not retried: the next one is due within a minute.
	schedule := target(sweeper, 0, 60)
	schedule["ScheduleExpression"] = "rate(1 minute)"
	has(t, tmpl, "AWS::Events::Rule", schedule)
	for _, id := range []string{stateChange, sweeper} {
		has(t, tmpl, "AWS::Lambda::Permission", map[string]any{"FunctionName": getAtt(id, "Arn"), "Principal": "events.amazonaws.com"})
	}
}

// TestInvokePermissions checks every resource policy statement of the
// functions: each is invoked only by its own trigger, in the stack's
// account. The exitrecorder by CloudWatch Logs for the exit-line group,
// statechange and the sweeper by EventBridge for their rules; the
// reconciler by nobody (its event source mapping polls with its role). No
// function URL, no other principal.
func TestInvokePermissions(t *testing.T) {
	_, m := defaults(t)
	exitGroup := ""
	for id, r := range cdktest.Resources(m, "AWS::Logs::LogGroup") {
		if cdktest.Props(r)["LogGroupName"] == "/reaper/demo/exits" {
			exitGroup = id
		}
	}
	stateChanges, _ := byID(t, m, "AWS::Events::Rule", "StateChanges")
	sweep, _ := byID(t, m, "AWS::Events::Rule", "Sweep")
	permission := func(fnID, principal, source string) string {
		logical, _ := fn(t, m, fnID)
		return compact(map[string]any{
			"Action":        "lambda:InvokeFunction",
			"FunctionName":  getAtt(logical, "Arn"),
			"Principal":     principal,
			"SourceArn":     getAtt(source, "Arn"),
			"SourceAccount": map[string]any{"Ref": "AWS::AccountId"},
		})
	}
	want := []string{
		permission("ExitRecorder", "logs.amazonaws.com", exitGroup),
		permission("StateChange", "events.amazonaws.com", stateChanges),
		permission("Sweeper", "events.amazonaws.com", sweep),
	}
	var got []string
	for _, p := range cdktest.Resources(m, "AWS::Lambda::Permission") {
		got = append(got, compact(cdktest.Props(p)))
	}
	sort.Strings(got)
	sort.Strings(want)
	if !slices.Equal(got, want) {
		t.Errorf("invoke permissions\n got %s\nwant %s", strings.Join(got, "\n     "), strings.Join(want, "\n     "))
	}
	if n := len(cdktest.Resources(m, "AWS::Lambda::Url")); n != 0 {
		t.Errorf("%d function URLs", n)
	}
}

func TestAlarms(t *testing.T) {
	tmpl, m := defaults(t)
	if n := len(cdktest.Resources(m, "AWS::CloudWatch::Alarm")); n != 18 {
		t.Fatalf("%d metric alarms, want 18 (errors and throttles per function, failure queue, dead letters, work queue age, rejected lines, "+
			"orphans found, orphans held back, cluster identity mismatches, refused terminations, and the terminate latency's p99 and pacing)", n)
	}
	if n := len(cdktest.Resources(m, "AWS::CloudWatch::CompositeAlarm")); n != 1 {
		t.Fatalf("%d composite alarms, want 1 (terminate latency)", n)
	}
	for _, id := range functionIDs {
		logical, _ := fn(t, m, id)
		for _, metric := range []string{"Errors", "Throttles"} {
			has(t, tmpl, "AWS::CloudWatch::Alarm", map[string]any{
				"Namespace": "AWS/Lambda", "MetricName": metric, "Statistic": "Sum", "Period": 300,
				"Dimensions":         []any{map[string]any{"Name": "FunctionName", "Value": map[string]any{"Ref": logical}}},
				"ComparisonOperator": "GreaterThanThreshold", "Threshold": 0, "EvaluationPeriods": 1,
				"TreatMissingData": "notBreaching", "AlarmActions": assertions.Match_Absent(),
			})
		}
	}
	// A throttled sweep is one that waited for the previous sweep, not a
	// concurrency limit to raise.
	sweeper, _ := fn(t, m, "Sweeper")
	has(t, tmpl, "AWS::CloudWatch::Alarm", map[string]any{
		"MetricName":       "Throttles",
		"Dimensions":       []any{map[string]any{"Name": "FunctionName", "Value": map[string]any{"Ref": sweeper}}},
		"AlarmDescription": assertions.Match_StringLikeRegexp(jsii.String("a run outlasted SweepRate")),
	})
	// Any message in the failure queue or the work dead-letter queue, and
	// work older than QueueAgeAlarm (in seconds, as SQS reports it).
	for _, q := range []struct {
		id, metric string
		threshold  float64
	}{
		{"Failures", "ApproximateNumberOfMessagesVisible", 0},
		{"WorkDeadLetters", "ApproximateNumberOfMessagesVisible", 0},
		{"Work", "ApproximateAgeOfOldestMessage", 300},
	} {
		queueID, _ := queue(t, m, q.id)
		has(t, tmpl, "AWS::CloudWatch::Alarm", map[string]any{
			"Namespace": "AWS/SQS", "MetricName": q.metric, "Statistic": "Maximum", "Period": 300,
			"Dimensions":         []any{map[string]any{"Name": "QueueName", "Value": getAtt(queueID, "QueueName")}},
			"ComparisonOperator": "GreaterThanThreshold", "Threshold": q.threshold, "EvaluationPeriods": 1,
			"TreatMissingData": "notBreaching", "AlarmActions": assertions.Match_Absent(),
		})
	}
	if n := len(cdktest.Resources(m, "AWS::SNS::Topic")); n != 0 {
		t.Errorf("%d topics without an alarm email or topic", n)
	}

	// Reaper's own metrics: one period over the threshold alarms, and no
	// data (nothing happened) does not.
	once := func(props map[string]any) map[string]any {
		props["ComparisonOperator"] = "GreaterThanThreshold"
		props["EvaluationPeriods"] = 1
		props["TreatMissingData"] = "notBreaching"
		props["AlarmActions"] = assertions.Match_Absent()
		return props
	}
	// Any rejected line, whichever function and reason.
	has(t, tmpl, "AWS::CloudWatch::Alarm", once(map[string]any{
		"Metrics": []any{map[string]any{
			"Expression": `SELECT SUM(LinesRejected) FROM SCHEMA("Reaper/demo", Function, Reason)`,
			"Period":     300, "ReturnData": true,
		}},
		"Threshold": 0,
	}))
	// The p99 of container finish to terminate of the one function that
	// terminates, and the reconciler's pacing within the last 30 minutes,
	// which notify nobody: TerminateLatency combines them (its behaviour:
	// TestTerminateLatencyFiresOnFaultsNotLoad).
	p99 := func(function string) map[string]any {
		return map[string]any{"Id": function, "ReturnData": false, "MetricStat": map[string]any{
			"Metric": map[string]any{
				"Namespace": "Reaper/demo", "MetricName": "FinishToTerminated",
				"Dimensions": []any{map[string]any{"Name": "Function", "Value": function}},
			},
			"Stat": "p99", "Period": 300,
		}}
	}
	has(t, tmpl, "AWS::CloudWatch::Alarm", once(map[string]any{
		"Metrics": []any{
			map[string]any{"Expression": "MAX(METRICS())", "ReturnData": true},
			p99("reconciler"),
		},
		"Threshold": 120000,
	}))
	reconciler := func(id, metric, stat string) map[string]any {
		return map[string]any{"Id": id, "ReturnData": false, "MetricStat": map[string]any{
			"Metric": map[string]any{
				"Namespace": "Reaper/demo", "MetricName": metric,
				"Dimensions": []any{map[string]any{"Name": "Function", "Value": "reconciler"}},
			},
			"Stat": stat, "Period": 300,
		}}
	}
	paced := once(map[string]any{
		"Metrics": []any{
			map[string]any{"Expression": "FILL(deferred, 0) + FILL(waited, 0)", "ReturnData": true},
			reconciler("deferred", "WorkItemsDeferred", "Sum"),
			reconciler("waited", "EC2PacingWait", "Maximum"),
		},
		"Threshold": 0, "DatapointsToAlarm": 1,
	})
	paced["EvaluationPeriods"] = 6
	has(t, tmpl, "AWS::CloudWatch::Alarm", paced)
	_, composite := cdktest.Only(t, m, "AWS::CloudWatch::CompositeAlarm")
	if rule := compact(cdktest.Props(composite)["AlarmRule"]); !strings.Contains(rule, `"(ALARM(\"",{"Fn::GetAtt":["ReaperTerminateLatencyP99`) ||
		!strings.Contains(rule, `"\") AND (NOT (ALARM(\"",{"Fn::GetAtt":["ReaperReconcilerPaced`) {
		t.Errorf("TerminateLatency's rule %s, want the p99 alarm and not the pacing alarm", rule)
	}
	if a := cdktest.Props(composite)["AlarmActions"]; a != nil {
		t.Errorf("TerminateLatency notifies %v without an alarm topic", a)
	}
	// Any orphan the sweep finds; any held back beyond the cap, by the
	// sweep or a reconciler batch.
	has(t, tmpl, "AWS::CloudWatch::Alarm", once(map[string]any{
		"Metrics": []any{map[string]any{"ReturnData": true, "MetricStat": map[string]any{
			"Metric": map[string]any{
				"Namespace": "Reaper/demo", "MetricName": "OrphansFound",
				"Dimensions": []any{map[string]any{"Name": "Function", "Value": "sweeper"}},
			},
			"Stat": "Sum", "Period": 300,
		}}},
		"Threshold": 0,
	}))
	has(t, tmpl, "AWS::CloudWatch::Alarm", once(map[string]any{
		"Metrics": []any{map[string]any{
			"Expression": `SELECT SUM(OrphansHeldBack) FROM SCHEMA("Reaper/demo", Function)`,
			"Label":      "OrphansHeldBack",
			"Period":     300, "ReturnData": true,
		}},
		"Threshold": 0,
	}))
	// Any instance of another cluster identity, whichever function (the
	// sweeper, the reconciler) found it.
	has(t, tmpl, "AWS::CloudWatch::Alarm", once(map[string]any{
		"Metrics": []any{map[string]any{
			"Expression": `SELECT SUM(ClusterIdentityMismatch) FROM SCHEMA("Reaper/demo", Function)`,
			"Label":      "ClusterIdentityMismatch",
			"Period":     300, "ReturnData": true,
		}},
		"Threshold":        0,
		"AlarmDescription": assertions.Match_StringLikeRegexp(jsii.String("cluster identity")),
	}))
	// Any termination EC2 refused, whatever its error code.
	has(t, tmpl, "AWS::CloudWatch::Alarm", once(map[string]any{
		"Metrics": []any{map[string]any{
			"Expression": `SELECT SUM(TerminationsRefused) FROM SCHEMA("Reaper/demo", Function, Reason)`,
			"Label":      "TerminationsRefused",
			"Period":     300, "ReturnData": true,
		}},
		"Threshold":        0,
		"AlarmDescription": assertions.Match_StringLikeRegexp(jsii.String("OperationNotPermitted")),
	}))
}

// dashboardBody decodes a dashboard body, writing each reference as
// <logical id> or <logical id.attribute>.
func dashboardBody(t *testing.T, body any) map[string]any {
	t.Helper()
	var text strings.Builder
	join, _ := body.(map[string]any)["Fn::Join"].([]any)
	if len(join) != 2 {
		t.Fatalf("dashboard body %v", body)
	}
	for _, part := range join[1].([]any) {
		switch p := part.(type) {
		case string:
			text.WriteString(p)
		case map[string]any:
			if ref, ok := p["Ref"].(string); ok {
				text.WriteString("<" + ref + ">")
			} else if att, ok := p["Fn::GetAtt"].([]any); ok {
				text.WriteString(fmt.Sprintf("<%s.%s>", att[0], att[1]))
			} else {
				t.Fatalf("dashboard body part %v", p)
			}
		}
	}
	var out map[string]any
	if err := json.Unmarshal([]byte(text.String()), &out); err != nil {
		t.Fatalf("dashboard body: %v\n%s", err, text.String())
	}
	return out
}

func TestDashboard(t *testing.T) {
	_, m := defaults(t)
	_, d := cdktest.Only(t, m, "AWS::CloudWatch::Dashboard")
	if name := cdktest.Props(d)["DashboardName"]; name != "Reaper-demo" {
		t.Errorf("dashboard name %v, want Reaper-demo", name)
	}
	body := dashboardBody(t, cdktest.Props(d)["DashboardBody"])
	var titles []string
	graphs := map[string]string{}
	for _, w := range body["widgets"].([]any) {
		props := w.(map[string]any)["properties"].(map[string]any)
		title := props["title"].(string)
		titles = append(titles, title)
		graphs[title] = compact(props)
	}
	// The alarms, then a graph for each metric of the contract, counts
	// first, in the contract's order: counts as sums, latencies as p50 and
	// p99, of every function (and dimension value) that records them.
	search := func(keys, metric, stat string) string {
		return compact(fmt.Sprintf(`SEARCH('{"Reaper/demo",%s} MetricName="%s"', '%s', 300)`, keys, metric, stat))
	}
	want := []string{"Alarms"}
	exprs := map[string][]string{}
	for _, unit := range []metrics.Unit{metrics.Count, metrics.Milliseconds} {
		for _, d := range metrics.Definitions {
			if d.Unit != unit {
				continue
			}
			title := d.Name + ": " + d.Title
			want = append(want, title)
			keys := "Function"
			if d.Dim != "" {
				keys += "," + d.Dim
			}
			if unit == metrics.Count {
				exprs[title] = []string{search(keys, d.Name, "Sum")}
			} else {
				exprs[title] = []string{search(keys, d.Name, "p50"), search(keys, d.Name, "p99")}
			}
		}
	}
	const (
		latencyGraph = "FinishToTerminated: Container finish to TerminateInstances accepted"
		workGraph    = "Work queue: instances waiting for the reconciler"
		failureGraph = "Failure queue: events that failed every retry"
	)
	want = append(want, "Lambda errors", "Lambda throttles", "Lambda duration", workGraph, failureGraph)
	if !slices.Equal(titles, want) {
		t.Fatalf("widgets\n got %q\nwant %q", titles, want)
	}
	// A few the contract must hold, whatever else it holds.
	for title, e := range map[string]string{
		"LinesRejected: Exit lines rejected, by reason":               search("Function,Reason", "LinesRejected", "Sum"),
		"PodStatusesWritten: Pod statuses written, by outcome":        search("Function,Outcome", "PodStatusesWritten", "Sum"),
		"OrphansHeldBack: Orphans held back by the cap":               search("Function", "OrphansHeldBack", "Sum"),
		"TerminationsRefused: Terminations refused by EC2, by reason": search("Function,Reason", "TerminationsRefused", "Sum"),
		latencyGraph: search("Function", "FinishToTerminated", "p99"),
	} {
		if !slices.Contains(exprs[title], e) {
			t.Errorf("the contract has no graph %q with %s", title, e)
		}
	}
	for title, es := range exprs {
		for _, e := range es {
			if !strings.Contains(graphs[title], `"expression":`+e) {
				t.Errorf("%s: no %s in %s", title, e, graphs[title])
			}
		}
	}
	if g := graphs[latencyGraph]; !strings.Contains(g, `"annotations":{"horizontal":[{"label":"alarm (p99)","value":120000,"yAxis":"left"}]}`) {
		t.Errorf("terminate latency graph without the alarm's threshold: %s", g)
	}

	for _, id := range functionIDs {
		logical, _ := fn(t, m, id)
		name := strings.ToLower(id)
		for title, metric := range map[string]string{
			"Lambda errors":    `["AWS/Lambda","Errors","FunctionName","<` + logical + `>",{"label":"` + name + `","stat":"Sum"}]`,
			"Lambda throttles": `["AWS/Lambda","Throttles","FunctionName","<` + logical + `>",{"label":"` + name + `","stat":"Sum"}]`,
			"Lambda duration":  `["AWS/Lambda","Duration","FunctionName","<` + logical + `>",{"label":"p99 ` + name + `","stat":"p99"}]`,
		} {
			if !strings.Contains(graphs[title], metric) {
				t.Errorf("%s: no %s in %s", title, metric, graphs[title])
			}
		}
	}
	sqs := func(queueID, metric, label string, right bool) string {
		axis := ""
		if right {
			axis = `,"yAxis":"right"`
		}
		return `["AWS/SQS","` + metric + `","QueueName","<` + queueID + `.QueueName>",{"label":"` + label + `","stat":"Maximum"` + axis + `}]`
	}
	workID, _ := queue(t, m, "Work")
	dlqID, _ := queue(t, m, "WorkDeadLetters")
	failuresID, _ := queue(t, m, "Failures")
	for title, series := range map[string][]string{
		workGraph: {
			sqs(workID, "ApproximateNumberOfMessagesVisible", "messages visible", false),
			sqs(workID, "ApproximateNumberOfMessagesNotVisible", "messages in flight", false),
			sqs(dlqID, "ApproximateNumberOfMessagesVisible", "dead letters visible", false),
			sqs(workID, "ApproximateAgeOfOldestMessage", "oldest message age", true),
			`"annotations":{"horizontal":[{"label":"alarm","value":300,"yAxis":"right"}]}`,
		},
		failureGraph: {
			sqs(failuresID, "ApproximateNumberOfMessagesVisible", "messages visible", false),
			sqs(failuresID, "ApproximateAgeOfOldestMessage", "oldest message age", true),
		},
	} {
		for _, metric := range series {
			if g := graphs[title]; !strings.Contains(g, metric) {
				t.Errorf("%s: no %s in %s", title, metric, g)
			}
		}
	}

	var alarms []string
	for _, typ := range []string{"AWS::CloudWatch::Alarm", "AWS::CloudWatch::CompositeAlarm"} {
		for id := range cdktest.Resources(m, typ) {
			alarms = append(alarms, "<"+id+".Arn>")
		}
	}
	sort.Strings(alarms)
	shown := strs(body["widgets"].([]any)[0].(map[string]any)["properties"].(map[string]any)["alarms"])
	sort.Strings(shown)
	if !slices.Equal(shown, alarms) {
		t.Errorf("alarm widget shows %v, want every alarm %v", shown, alarms)
	}
}

// statements returns the statements of every AWS::IAM::Policy attached to
// the role.
func statements(m map[string]any, roleID string) []map[string]any {
	var out []map[string]any
	for _, p := range cdktest.Resources(m, "AWS::IAM::Policy") {
		props := cdktest.Props(p)
		if !slices.ContainsFunc(props["Roles"].([]any), func(r any) bool { return reflect.DeepEqual(r, map[string]any{"Ref": roleID}) }) {
			continue
		}
		for _, s := range props["PolicyDocument"].(map[string]any)["Statement"].([]any) {
			out = append(out, s.(map[string]any))
		}
	}
	return out
}

func strs(v any) []string {
	switch v := v.(type) {
	case string:
		return []string{v}
	case []any:
		var out []string
		for _, e := range v {
			out = append(out, e.(string))
		}
		return out
	}
	return nil
}

// compact is v as JSON, with < and > as they are.
func compact(v any) string {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
	return strings.TrimSuffix(b.String(), "\n")
}

// TestFunctionPermissions checks each function's grants, by what they
// apply to: the ledger item actions and the pending index only where the
// code uses them, ec2:TerminateInstances for the reconciler alone,
// Kubernetes for the sweeper and the reconciler, sqs:SendMessage and
// nothing else on the work queue for the producers, the consumer rights
// for the reconciler and sqs:SendMessage on the work dead-letter queue,
// where it sends the work it could not finish, and the failure queue for
// the functions invoked
// asynchronously by events (not the sweeper, whose failed runs the next
// one replaces).
func TestFunctionPermissions(t *testing.T) {
	_, m := defaults(t)
	tableID, _ := cdktest.Only(t, m, "AWS::DynamoDB::Table")
	workID, _ := queue(t, m, "Work")
	failuresID, _ := queue(t, m, "Failures")
	deadLettersID, _ := queue(t, m, "WorkDeadLetters")
	var (
		batch    = []string{"dynamodb:BatchGetItem", "dynamodb:GetItem", "dynamodb:UpdateItem"}
		produce  = []string{"sqs:SendMessage"}
		failures = []string{"sqs:GetQueueAttributes", "sqs:GetQueueUrl", "sqs:SendMessage"}
		// queue.GrantConsumeMessages, for the event source mapping; the
		// reconciler also sends deferred work back.
		consume = []string{"sqs:ChangeMessageVisibility", "sqs:DeleteMessage", "sqs:GetQueueAttributes", "sqs:GetQueueUrl", "sqs:ReceiveMessage", "sqs:SendMessage"}
		logs    = []string{"logs:CreateLogStream", "logs:PutLogEvents"}
	)
	for id, want := range map[string]map[string][]string{
		"ExitRecorder": {"logs": logs, "work": produce, "failures": failures},
		"StateChange":  {"logs": logs, "work": produce, "failures": failures},
		"Sweeper": {"logs": logs, "table": batch, "index": {"dynamodb:Query"}, "*": {"ec2:DescribeInstances"},
			"cluster": {"eks:DescribeCluster"}, "work": produce},
		"Reconciler": {"logs": logs, "table": batch, "*": {"ec2:DescribeInstances"}, "instance": {"ec2:TerminateInstances"},
			"cluster": {"eks:DescribeCluster"}, "work": consume, "dead letters": produce},
	} {
		roleID := roleOf(t, m, id)
		role := cdktest.Resources(m, "AWS::IAM::Role")[roleID]
		if mp := cdktest.Props(role)["ManagedPolicyArns"]; mp != nil {
			t.Errorf("%s role attaches managed policies %v", id, mp)
		}
		got := map[string][]string{}
		for _, s := range statements(m, roleID) {
			if s["Effect"] != "Allow" {
				t.Errorf("%s: unexpected statement %v", id, s)
			}
			acts := strs(s["Action"])
			resource := compact(s["Resource"])
			var on string
			switch {
			case resource == `"*"`:
				on = "*"
			case resource == compact(getAtt(tableID, "Arn")):
				on = "table"
			case strings.Contains(resource, tableID) && strings.Contains(resource, "/index/pending"):
				on = "index"
			case resource == compact(getAtt(workID, "Arn")):
				on = "work"
			case resource == compact(getAtt(failuresID, "Arn")):
				on = "failures"
			case resource == compact(getAtt(deadLettersID, "Arn")):
				on = "dead letters"
			case strings.Contains(resource, `:instance/*`):
				on = "instance"
				if compact(s["Condition"]) != `{"StringEquals":{"aws:ResourceTag/reaper.io/cluster":"demo","aws:ResourceTag/reaper.io/managed":"true"}}` {
					t.Errorf("%s terminate statement %s", id, compact(s))
				}
			case strings.Contains(resource, `:cluster/demo"`):
				on = "cluster"
			case strings.Contains(resource, "Reaper"+id+"Logs"):
				on = "logs"
			default:
				t.Errorf("%s: statement on an unexpected resource: %s", id, compact(s))
				continue
			}
			got[on] = append(got[on], acts...)
		}
		for on := range got {
			sort.Strings(got[on])
			got[on] = slices.Compact(got[on])
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s grants\n got %v\nwant %v", id, got, want)
		}
	}
}

func TestAgentPolicy(t *testing.T) {
	tmpl, m := defaults(t)
	_, p := cdktest.Only(t, m, "AWS::IAM::ManagedPolicy")
	doc := compact(cdktest.Props(p)["PolicyDocument"])
	want := `{"Statement":[{"Action":["logs:CreateLogStream","logs:PutLogEvents"],"Effect":"Allow","Resource":[` +
		`{"Fn::Join":["",["arn:",{"Ref":"AWS::Partition"},":logs:",{"Ref":"AWS::Region"},":",{"Ref":"AWS::AccountId"},":log-group:/reaper/demo/exits"]]},` +
		`{"Fn::Join":["",["arn:",{"Ref":"AWS::Partition"},":logs:",{"Ref":"AWS::Region"},":",{"Ref":"AWS::AccountId"},":log-group:/reaper/demo/exits:log-stream:*"]]}],` +
		`"Sid":"WriteExitLines"}],"Version":"2012-10-17"}`
	if doc != want {
		t.Errorf("agent policy\n got %s\nwant %s", doc, want)
	}
	// It is attached to nothing: the provider's instance role takes it.
	has(t, tmpl, "AWS::IAM::ManagedPolicy", map[string]any{"Roles": assertions.Match_Absent()})

	// The docs show it as deployed, the account, region and cluster left
	// to fill in.
	env := iamsim.TestEnv("Test")
	deployed, err := iamsim.ManagedPolicies(m, env)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile("../../docs/provider.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(raw)
	i := strings.Index(text, "\n## IAM the instance needs\n")
	if i < 0 {
		t.Fatal("docs/provider.md: no section IAM the instance needs")
	}
	block := text[i:]
	block = block[strings.Index(block, "```json\n")+len("```json\n"):]
	block = block[:strings.Index(block, "```")]
	block = strings.NewReplacer("REGION", env.Region, "ACCOUNT", env.Account, "CLUSTER", "demo").Replace(block)
	var shown map[string]any
	if err := json.Unmarshal([]byte(block), &shown); err != nil {
		t.Fatalf("docs/provider.md's agent policy: %v\n%s", err, block)
	}
	for _, p := range deployed {
		if !reflect.DeepEqual(shown, p.Document) {
			t.Errorf("docs/provider.md shows the agent policy\n%s\nthe construct deploys\n%s", compact(shown), compact(p.Document))
		}
	}
}

// askIAM asks the evaluator the questions every deployment must answer as
// designed (iamsim.StackQuestions) about the template of a Reaper for
// cluster in the stack "Test", the reconciler being the one that may
// terminate and put the Pod-written tag podWritten ("" for none), and
// checks with iamcheck what the evaluator cannot see.
func askIAM(t *testing.T, m map[string]any, cluster, podWritten string) {
	t.Helper()
	agent, err := iamsim.OnlyManagedPolicy(m)
	if err != nil {
		t.Fatal(err)
	}
	qs, err := iamsim.StackQuestions(iamsim.Stack{
		Template: m, Env: iamsim.TestEnv("Test"), Fleet: iamsim.DefaultFleet(cluster),
		Terminator: roleOf(t, m, "Reconciler"), PodWritten: podWritten,
		AgentPolicy: agent, ExitLogGroup: "/reaper/" + cluster + "/exits",
	})
	if err != nil {
		t.Fatal(err)
	}
	iamsim.Ask(t, qs)
	if f := iamcheck.Unreadable(m); len(f) != 0 {
		t.Errorf("grants the evaluator cannot see: %v", f)
	}
}

// TestIAMEvaluated runs the default stack's policies through the
// evaluator: only the reconciler may terminate, only instances tagged
// managed for the stack's cluster; no function may tag; a host may only
// write exit lines to its cluster's exit log group.
func TestIAMEvaluated(t *testing.T) {
	_, m := defaults(t)
	askIAM(t, m, "demo", "")
	// Nor any wildcard action, which would grant actions AWS adds later.
	for id, p := range cdktest.Resources(m, "AWS::IAM::Policy") {
		for _, s := range cdktest.Props(p)["PolicyDocument"].(map[string]any)["Statement"].([]any) {
			for _, a := range strs(s.(map[string]any)["Action"]) {
				if strings.Contains(a, "*") {
					t.Errorf("%s grants wildcard action %s", id, a)
				}
			}
		}
	}
}

// TestEvaluatorCatchesWidenedPolicy widens a Reaper stack's IAM the ways a
// later change might, and expects the evaluator (and, for the AWS managed
// policy whose content the template does not show, iamcheck) to report
// each.
func TestEvaluatorCatchesWidenedPolicy(t *testing.T) {
	tmpl := newStack(t, reapercdk.Props{EKSCluster: "demo"}, func(stack awscdk.Stack, r *reapercdk.Reaper) {
		r.Sweeper.AddToRolePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
			Sid: jsii.String("Widened"), Actions: jsii.Strings("ec2:*"), Resources: jsii.Strings("*"),
		}))
		// The managed tag alone: any cluster's instances in the account.
		r.StateChange.AddToRolePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
			Sid: jsii.String("AnyCluster"), Actions: jsii.Strings("ec2:TerminateInstances"), Resources: jsii.Strings("*"),
			Conditions: &map[string]any{"StringEquals": map[string]any{"aws:ResourceTag/reaper.io/managed": "true"}},
		}))
		// The reconciler, for another cluster too.
		r.Reconciler.AddToRolePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
			Sid: jsii.String("OtherCluster"), Actions: jsii.Strings("ec2:TerminateInstances"), Resources: jsii.Strings("*"),
			Conditions: &map[string]any{"StringEquals": map[string]any{"aws:ResourceTag/reaper.io/managed": "true", "aws:ResourceTag/reaper.io/cluster": "prod"}},
		}))
		// A policy for others to attach, on a tag Reaper knows nothing of.
		awsiam.NewManagedPolicy(stack, jsii.String("WrongTag"), &awsiam.ManagedPolicyProps{
			Statements: &[]awsiam.PolicyStatement{awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
				Actions: jsii.Strings("ec2:TerminateInstances"), Resources: jsii.Strings("*"),
				Conditions: &map[string]any{"StringEquals": map[string]any{"aws:ResourceTag/team": "true"}},
			})},
		})
		r.ExitRecorder.Role().AddManagedPolicy(awsiam.ManagedPolicy_FromAwsManagedPolicyName(jsii.String("AmazonEC2FullAccess")))
	})
	m := cdktest.JSON(t, tmpl)
	principals, err := iamsim.Principals(m, iamsim.TestEnv("Test"))
	if err != nil {
		t.Fatal(err)
	}
	managed, err := iamsim.ManagedPolicies(m, iamsim.TestEnv("Test"))
	if err != nil {
		t.Fatal(err)
	}
	principals["role holding WrongTag"] = iamsim.Principal{ARN: "arn:aws:iam::123456789012:role/holding-WrongTag", Policies: []iamsim.Policy{managed["WrongTag"]}}
	qs := iamsim.TerminateQuestions(principals, roleOf(t, m, "Reconciler"), iamsim.DefaultFleet("demo"), iamsim.TestEnv("Test"))
	answers, err := iamsim.Evaluate(qs)
	if err != nil {
		t.Fatal(err)
	}
	wrong := map[string]bool{}
	for i, q := range qs {
		if !answers[i].Meets(q) {
			wrong[q.Name] = true
		}
	}
	for _, want := range []string{
		roleOf(t, m, "Sweeper") + " terminates an instance, whatever its tags",
		roleOf(t, m, "Sweeper") + " terminates an instance unmanaged",
		roleOf(t, m, "StateChange") + " terminates an instance, whatever its tags",
		roleOf(t, m, "StateChange") + " terminates an instance another cluster's",
		roleOf(t, m, "Reconciler") + " terminates an instance, whatever its tags",
		"role holding WrongTag terminates an instance, whatever its tags",
	} {
		if !wrong[want] {
			t.Errorf("the evaluator does not catch %q", want)
		}
	}
	if wrong[roleOf(t, m, "ExitRecorder")+" terminates an instance, whatever its tags"] {
		t.Errorf("the exitrecorder's own policies grant nothing wrong: AmazonEC2FullAccess is outside the template, iamcheck's")
	}
	f := iamcheck.Unreadable(m)
	if len(f) != 1 || !strings.Contains(f[0].String(), "AmazonEC2FullAccess") {
		t.Errorf("iamcheck findings %v, want the one attachment of AmazonEC2FullAccess", f)
	}
}

// allOptions turns on everything that is off by default.
func allOptions() reapercdk.Props {
	return reapercdk.Props{
		EKSCluster:            "prod",
		EKSAccessEntryGroup:   "reaper",
		TableName:             "reaper-ledger",
		TableRemovalPolicy:    awscdk.RemovalPolicy_DESTROY,
		MemoryMB:              512,
		ReconcilerMemoryMB:    1769,
		ReservedConcurrency:   5,
		SweepRate:             5 * time.Minute,
		MaxEventAge:           2 * time.Hour,
		IncludeRunning:        true,
		LogLevel:              "debug",
		AlarmTopicArn:         "arn:aws:sns:eu-west-1:123456789012:ops",
		AlarmEmail:            "oncall@example.com",
		SubnetIDs:             []string{"subnet-0123456789abcdef0", "subnet-0fedcba9876543210"},
		SecurityGroupIDs:      []string{"sg-0123456789abcdef0"},
		MetricsNamespace:      "Ops/Reaper-prod",
		TerminateLatencyAlarm: 5 * time.Minute,

		MaxReceiveCount:          3,
		ReconcilerBatchSize:      500,
		ReconcilerBatchingWindow: 20 * time.Second,
		ReconcilerMaxConcurrency: 4,
		EC2Share:                 0.8,
		QueueAgeAlarm:            10 * time.Minute,
		OrphanCap:                jsii.Number(0.25),
		RedriveRoles:             []string{"arn:aws:iam::123456789012:role/ops-redrive"},
		PowerOffGrace:            45 * time.Second,
	}
}

func TestOptions(t *testing.T) {
	tmpl := newStack(t, allOptions(), nil)
	m := cdktest.JSON(t, tmpl)
	_, table := cdktest.Only(t, m, "AWS::DynamoDB::Table")
	if cdktest.Props(table)["TableName"] != "reaper-ledger" || table["DeletionPolicy"] != "Delete" {
		t.Errorf("table %v", table)
	}
	cdktest.Must(t, func() {
		// The sweeper keeps its reserved concurrency of 1.
		tmpl.ResourcePropertiesCountIs(jsii.String("AWS::Lambda::Function"), map[string]any{"ReservedConcurrentExecutions": 5}, jsii.Number(3))
		tmpl.ResourcePropertiesCountIs(jsii.String("AWS::Lambda::Function"), map[string]any{"ReservedConcurrentExecutions": 1}, jsii.Number(1))
		tmpl.ResourcePropertiesCountIs(jsii.String("AWS::Lambda::Function"), map[string]any{"MemorySize": 512}, jsii.Number(3))
		tmpl.ResourcePropertiesCountIs(jsii.String("AWS::Lambda::Function"), map[string]any{
			"MemorySize":  1769,
			"Environment": map[string]any{"Variables": assertions.Match_ObjectLike(&map[string]any{"REAPER_RECONCILER_CONCURRENCY": "4"})},
		}, jsii.Number(1))
		tmpl.AllResourcesProperties(jsii.String("AWS::Lambda::Function"), map[string]any{
			"VpcConfig":     map[string]any{"SubnetIds": []any{"subnet-0123456789abcdef0", "subnet-0fedcba9876543210"}, "SecurityGroupIds": []any{"sg-0123456789abcdef0"}},
			"LoggingConfig": assertions.Match_ObjectLike(&map[string]any{"ApplicationLogLevel": "DEBUG"}),
			"Environment": map[string]any{"Variables": assertions.Match_ObjectLike(&map[string]any{
				"REAPER_LOG_LEVEL": "debug", "REAPER_METRICS_NAMESPACE": "Ops/Reaper-prod",
			})},
		})
		tmpl.ResourcePropertiesCountIs(jsii.String("AWS::Lambda::Function"), map[string]any{
			"Environment": map[string]any{"Variables": assertions.Match_ObjectLike(&map[string]any{"REAPER_EKS_CLUSTER": "prod"})},
		}, jsii.Number(2))
		tmpl.HasResourceProperties(jsii.String("AWS::Lambda::Function"), map[string]any{
			"Environment": map[string]any{"Variables": assertions.Match_ObjectLike(&map[string]any{
				"REAPER_EC2_SHARE": "0.8", "REAPER_RECONCILER_CONCURRENCY": "4",
			})},
		})
		// The orphan cap and the power-off grace go to the functions that
		// decide terminations, the sweeper and the reconciler, and to no
		// other.
		tmpl.ResourcePropertiesCountIs(jsii.String("AWS::Lambda::Function"), map[string]any{
			"Environment": map[string]any{"Variables": assertions.Match_ObjectLike(&map[string]any{
				"REAPER_ORPHAN_CAP": "0.25", "REAPER_POWER_OFF_GRACE": "45s", "REAPER_EKS_CLUSTER": "prod",
			})},
		}, jsii.Number(2))
		tmpl.ResourcePropertiesCountIs(jsii.String("AWS::Lambda::Function"), map[string]any{
			"Environment": map[string]any{"Variables": assertions.Match_ObjectLike(&map[string]any{"REAPER_ORPHAN_CAP": assertions.Match_Absent()})},
		}, jsii.Number(2))
		// The redrive role may send to the work queue, besides the functions.
		tmpl.HasResourceProperties(jsii.String("AWS::SQS::QueuePolicy"), map[string]any{
			"PolicyDocument": assertions.Match_ObjectLike(&map[string]any{"Statement": assertions.Match_ArrayWith(&[]any{
				assertions.Match_ObjectLike(&map[string]any{
					"Sid":       "SendOnlyFromReaperFunctions",
					"Condition": map[string]any{"ArnNotEquals": map[string]any{"aws:PrincipalArn": assertions.Match_ArrayWith(&[]any{"arn:aws:iam::123456789012:role/ops-redrive"})}},
				}),
			})}),
		})
		tmpl.HasResourceProperties(jsii.String("AWS::Lambda::EventSourceMapping"), map[string]any{
			"BatchSize": 500, "MaximumBatchingWindowInSeconds": 20, "ScalingConfig": map[string]any{"MaximumConcurrency": 4},
			"FunctionResponseTypes": []any{"ReportBatchItemFailures"},
		})
		tmpl.HasResourceProperties(jsii.String("AWS::SQS::Queue"), map[string]any{
			"RedrivePolicy": assertions.Match_ObjectLike(&map[string]any{"maxReceiveCount": 3}), "VisibilityTimeout": 1800,
		})
		tmpl.HasResourceProperties(jsii.String("AWS::CloudWatch::Alarm"), map[string]any{
			"MetricName": "ApproximateAgeOfOldestMessage", "Threshold": 600,
		})
		// The network interface actions are the roles' own, not
		// AWSLambdaVPCAccessExecutionRole, which may write to any log group.
		tmpl.AllResourcesProperties(jsii.String("AWS::IAM::Role"), map[string]any{"ManagedPolicyArns": assertions.Match_Absent()})
		tmpl.ResourcePropertiesCountIs(jsii.String("AWS::Lambda::EventInvokeConfig"), map[string]any{"MaximumEventAgeInSeconds": 7200}, jsii.Number(2))
		tmpl.ResourcePropertiesCountIs(jsii.String("AWS::Lambda::EventInvokeConfig"), map[string]any{"MaximumEventAgeInSeconds": 60}, jsii.Number(1))
		tmpl.AllResourcesProperties(jsii.String("AWS::EKS::AccessEntry"), map[string]any{
			"ClusterName": "prod", "KubernetesGroups": []any{"reaper"}, "Type": "STANDARD",
			"PrincipalArn": map[string]any{"Fn::GetAtt": []any{assertions.Match_AnyValue(), "Arn"}},
		})
		// The existing topic gets the alarms and the email subscription.
		tmpl.ResourceCountIs(jsii.String("AWS::SNS::Topic"), jsii.Number(0))
		tmpl.HasResourceProperties(jsii.String("AWS::SNS::Subscription"), map[string]any{
			"Protocol": "email", "Endpoint": "oncall@example.com", "TopicArn": "arn:aws:sns:eu-west-1:123456789012:ops",
		})
		// Every alarm but the two parts of TerminateLatency notifies.
		notifies := map[string]any{
			"AlarmActions": []any{"arn:aws:sns:eu-west-1:123456789012:ops"},
			"OKActions":    []any{"arn:aws:sns:eu-west-1:123456789012:ops"},
		}
		tmpl.ResourcePropertiesCountIs(jsii.String("AWS::CloudWatch::Alarm"), notifies, jsii.Number(16))
		tmpl.ResourcePropertiesCountIs(jsii.String("AWS::CloudWatch::Alarm"), map[string]any{"AlarmActions": assertions.Match_Absent(), "OKActions": assertions.Match_Absent()}, jsii.Number(2))
		tmpl.AllResourcesProperties(jsii.String("AWS::CloudWatch::CompositeAlarm"), notifies)
		// A batching window of 20 s keeps the pacing lookback at 30 minutes.
		tmpl.HasResourceProperties(jsii.String("AWS::CloudWatch::Alarm"), map[string]any{
			"Metrics":           assertions.Match_ArrayWith(&[]any{assertions.Match_ObjectLike(&map[string]any{"Expression": "FILL(deferred, 0) + FILL(waited, 0)"})}),
			"EvaluationPeriods": 6,
		})
		tmpl.HasResourceProperties(jsii.String("AWS::Events::Rule"), map[string]any{"ScheduleExpression": "rate(5 minutes)"})
		tmpl.HasResourceProperties(jsii.String("AWS::Events::Rule"), map[string]any{"EventPattern": assertions.Match_ObjectLike(&map[string]any{
			"detail": map[string]any{"state": []any{"stopping", "stopped", "shutting-down", "terminated", "running"}},
		})})
		tmpl.HasResourceProperties(jsii.String("AWS::CloudWatch::Alarm"), map[string]any{
			"Metrics":   []any{map[string]any{"Expression": `SELECT SUM(LinesRejected) FROM SCHEMA("Ops/Reaper-prod", Function, Reason)`}},
			"Threshold": 0,
		})
		tmpl.HasResourceProperties(jsii.String("AWS::CloudWatch::Alarm"), map[string]any{
			"Metrics": assertions.Match_ArrayWith(&[]any{assertions.Match_ObjectLike(&map[string]any{"MetricStat": map[string]any{
				"Metric": map[string]any{"Namespace": "Ops/Reaper-prod", "MetricName": "FinishToTerminated"}, "Stat": "p99",
			}})}),
			"Threshold": 300000,
		})
		tmpl.HasResourceProperties(jsii.String("AWS::CloudWatch::Dashboard"), map[string]any{"DashboardName": "Reaper-prod"})
	})
	vpc := []string{
		"ec2:AssignPrivateIpAddresses", "ec2:CreateNetworkInterface", "ec2:DeleteNetworkInterface",
		"ec2:DescribeNetworkInterfaces", "ec2:DescribeSubnets", "ec2:UnassignPrivateIpAddresses",
	}
	// Only the functions that talk to Kubernetes are mapped into it.
	var mapped []string
	for _, e := range cdktest.Resources(m, "AWS::EKS::AccessEntry") {
		mapped = append(mapped, cdktest.Props(e)["PrincipalArn"].(map[string]any)["Fn::GetAtt"].([]any)[0].(string))
	}
	sort.Strings(mapped)
	if want := []string{roleOf(t, m, "Reconciler"), roleOf(t, m, "Sweeper")}; !slices.Equal(mapped, want) {
		t.Errorf("access entries for %v, want %v", mapped, want)
	}
	for _, id := range functionIDs {
		_, f := fn(t, m, id)
		roleID := roleOf(t, m, id)
		var got []string
		for _, st := range statements(m, roleID) {
			if st["Sid"] == "NetworkInterfaces" {
				if st["Resource"] != "*" {
					t.Errorf("%s: network interfaces on %v", id, st["Resource"])
				}
				got = strs(st["Action"])
			}
		}
		sort.Strings(got)
		if !slices.Equal(got, vpc) {
			t.Errorf("%s network interface actions %v, want %v", id, got, vpc)
		}
		// Lambda checks them when it creates the function.
		if deps := compact(f["DependsOn"]); !strings.Contains(deps, id+"RoleDefaultPolicy") {
			t.Errorf("%s does not depend on its role's policy: %s", id, deps)
		}
	}
	askIAM(t, m, "prod", "")
}

// TestNag runs cdk-nag's AwsSolutions checks on the construct with every
// option on (the default stack is checked in infra/app): no finding is
// left but the suppressed ones the README lists, for the reasons given.
func TestNag(t *testing.T) {
	app := cdktest.NewApp(t, nil)
	var stack awscdk.Stack
	cdktest.Must(t, func() {
		stack = awscdk.NewStack(app, jsii.String("Test"), nil)
		props := allOptions()
		props.BuildDir = cdktest.BuildDir()
		reapercdk.New(stack, "Reaper", &props)
	})
	r := cdktest.NagClean(t, stack, cdktest.ReaperNagSuppressionsInVPC("Test", "Reaper", "/reaper/prod/exits"))
	// In a VPC, Resource "*" also holds Lambda's network interface actions.
	for _, s := range r.Suppressed {
		if s.Finding == "Resource::*" && !strings.Contains(s.Reason, "ec2:CreateNetworkInterface") {
			t.Errorf("%s: the reason does not cover the network interface actions: %s", s, s.Reason)
		}
	}
}

// TestNagKnownAccount: in a stack whose account and region are known at
// synthesis, the ARNs in the findings are literals; the same suppressions
// still apply.
func TestNagKnownAccount(t *testing.T) {
	app := cdktest.NewApp(t, nil)
	var stack awscdk.Stack
	cdktest.Must(t, func() {
		stack = awscdk.NewStack(app, jsii.String("Test"), &awscdk.StackProps{
			Env: &awscdk.Environment{Account: jsii.String("123456789012"), Region: jsii.String("eu-west-1")},
		})
		reapercdk.New(stack, "Reaper", &reapercdk.Props{EKSCluster: "demo", BuildDir: cdktest.BuildDir()})
	})
	r := cdktest.Nag(t, stack)
	for _, f := range r.Findings {
		t.Errorf("cdk-nag: %s", f)
	}
	want := "AwsSolutions-IAM5[Resource::arn:aws:ec2:eu-west-1:123456789012:instance/*] Test/Reaper/ReconcilerRole/DefaultPolicy/Resource"
	if n := len(r.Suppressed); n != 5 || !slices.ContainsFunc(r.Suppressed, func(s cdktest.NagSuppressed) bool { return s.String() == want }) {
		t.Errorf("suppressed %v, want 5 with %s", r.Suppressed, want)
	}
}

func TestValidate(t *testing.T) {
	for name, tc := range map[string]struct {
		props reapercdk.Props
		want  string
	}{
		"no access":         {reapercdk.Props{}, "no Kubernetes access"},
		"both access":       {reapercdk.Props{EKSCluster: "a", KubeconfigSecretArn: "arn:aws:secretsmanager:x"}, "only one"},
		"secret not arn":    {reapercdk.Props{KubeconfigSecretArn: "my-secret"}, "is not an ARN"},
		"entry needs eks":   {reapercdk.Props{KubeconfigSecretArn: "arn:x", ClusterName: "c", EKSAccessEntryGroup: "reaper"}, "needs EKSCluster"},
		"secret, no name":   {reapercdk.Props{KubeconfigSecretArn: "arn:x"}, "ClusterName is required with KubeconfigSecretArn"},
		"name not eks":      {reapercdk.Props{EKSCluster: "a", ClusterName: "b"}, `ClusterName "b" differs from EKSCluster "a"`},
		"name not a tag":    {reapercdk.Props{KubeconfigSecretArn: "arn:x", ClusterName: "a$b"}, `ClusterName "a$b" is not a valid tag value`},
		"name not a group":  {reapercdk.Props{KubeconfigSecretArn: "arn:x", ClusterName: "on prem"}, `"/reaper/on prem/exits" derived from the cluster is not valid`},
		"bad group":         {reapercdk.Props{EKSCluster: "a", ExitLogGroupName: "/reaper/a:exits"}, `ExitLogGroupName "/reaper/a:exits"`},
		"same tag keys":     {reapercdk.Props{EKSCluster: "a", Tags: model.TagKeys{Cluster: "reaper.io/managed"}}, "the seven tag keys must differ"},
		"same token key":    {reapercdk.Props{EKSCluster: "a", Tags: model.TagKeys{ExitToken: "reaper.io/pod-uid"}}, "the seven tag keys must differ"},
		"system group":      {reapercdk.Props{EKSCluster: "a", EKSAccessEntryGroup: "system:masters"}, "system:"},
		"sweep seconds":     {reapercdk.Props{EKSCluster: "a", SweepRate: 90 * time.Second}, "SweepRate 1m30s"},
		"event age":         {reapercdk.Props{EKSCluster: "a", MaxEventAge: 7 * time.Hour}, "MaxEventAge 7h0m0s"},
		"memory":            {reapercdk.Props{EKSCluster: "a", MemoryMB: 64}, "MemoryMB 64"},
		"reconciler memory": {reapercdk.Props{EKSCluster: "a", ReconcilerMemoryMB: 20000}, "ReconcilerMemoryMB 20000"},
		"log level":         {reapercdk.Props{EKSCluster: "a", LogLevel: "loud"}, `LogLevel "loud"`},
		"subnets alone":     {reapercdk.Props{EKSCluster: "a", SubnetIDs: []string{"subnet-1"}}, "SubnetIDs and SecurityGroupIDs"},
		"removal snapshot":  {reapercdk.Props{EKSCluster: "a", TableRemovalPolicy: awscdk.RemovalPolicy_SNAPSHOT}, "RETAIN or DESTROY"},
		"aws namespace":     {reapercdk.Props{EKSCluster: "a", MetricsNamespace: "AWS/Reaper"}, `MetricsNamespace "AWS/Reaper"`},
		"quoted namespace":  {reapercdk.Props{EKSCluster: "a", MetricsNamespace: `Reaper"a`}, `MetricsNamespace "Reaper\"a"`},
		"name not a namespace": {
			reapercdk.Props{KubeconfigSecretArn: "arn:x", ClusterName: "gpu@prod", ExitLogGroupName: "/gpu/exits"},
			`the metrics namespace "Reaper/gpu@prod" derived from the cluster is not valid`,
		},
		"latency alarm":      {reapercdk.Props{EKSCluster: "a", TerminateLatencyAlarm: -time.Minute}, "TerminateLatencyAlarm must be positive"},
		"receive count":      {reapercdk.Props{EKSCluster: "a", MaxReceiveCount: 1001}, "MaxReceiveCount 1001: SQS allows 1 to 1000"},
		"receive count long": {reapercdk.Props{EKSCluster: "a", MaxReceiveCount: 193}, "MaxReceiveCount 193: the work queue keeps a message 96h0m0s, 192 receives"},
		"batch size":         {reapercdk.Props{EKSCluster: "a", ReconcilerBatchSize: 20000}, "ReconcilerBatchSize 20000"},
		"negative batch":     {reapercdk.Props{EKSCluster: "a", ReconcilerBatchSize: -1}, "ReconcilerBatchSize -1"},
		"window fraction":    {reapercdk.Props{EKSCluster: "a", ReconcilerBatchingWindow: 1500 * time.Millisecond}, "ReconcilerBatchingWindow 1.5s: use whole seconds"},
		"window below 1s":    {reapercdk.Props{EKSCluster: "a", ReconcilerBatchSize: 100, ReconcilerBatchingWindow: 500 * time.Millisecond}, "an SQS batch size above 10 needs at least 1s"},
		"window long":        {reapercdk.Props{EKSCluster: "a", ReconcilerBatchingWindow: 6 * time.Minute}, "ReconcilerBatchingWindow 6m0s"},
		"concurrency 1":      {reapercdk.Props{EKSCluster: "a", ReconcilerMaxConcurrency: 1}, "ReconcilerMaxConcurrency 1: an SQS event source allows 2 to 1000"},
		"concurrency high":   {reapercdk.Props{EKSCluster: "a", ReconcilerMaxConcurrency: 1001}, "ReconcilerMaxConcurrency 1001"},
		"reserved too small": {reapercdk.Props{EKSCluster: "a", ReservedConcurrency: 3, ReconcilerMaxConcurrency: 4}, "ReservedConcurrency 3 is below ReconcilerMaxConcurrency 4"},
		"share above 1":      {reapercdk.Props{EKSCluster: "a", EC2Share: 1.5}, "EC2Share 1.5"},
		"share negative":     {reapercdk.Props{EKSCluster: "a", EC2Share: -0.1}, "EC2Share -0.1"},
		"queue age":          {reapercdk.Props{EKSCluster: "a", QueueAgeAlarm: 30 * time.Second}, "QueueAgeAlarm 30s"},
		"orphan cap zero":    {reapercdk.Props{EKSCluster: "a", OrphanCap: jsii.Number(0)}, "OrphanCap 0: "},
		"orphan cap above 1": {reapercdk.Props{EKSCluster: "a", OrphanCap: jsii.Number(1.5)}, "OrphanCap 1.5: "},
		"orphan cap NaN":     {reapercdk.Props{EKSCluster: "a", OrphanCap: jsii.Number(math.NaN())}, "OrphanCap NaN: "},
		"redrive role":       {reapercdk.Props{EKSCluster: "a", RedriveRoles: []string{"ops-redrive"}}, `RedriveRoles "ops-redrive": give the ARN of an IAM role`},
		"power-off grace":    {reapercdk.Props{EKSCluster: "a", PowerOffGrace: 20 * time.Minute}, "PowerOffGrace 20m0s: use whole seconds up to 15m"},
		"negative grace":     {reapercdk.Props{EKSCluster: "a", PowerOffGrace: -5 * time.Second}, "PowerOffGrace -5s: use whole seconds up to 15m"},
		"fractional grace":   {reapercdk.Props{EKSCluster: "a", PowerOffGrace: 2500 * time.Millisecond}, "PowerOffGrace 2.5s: use whole seconds"},
		"pod-written slash": {reapercdk.Props{EKSCluster: "a", PowerOffGrace: 10 * time.Second, Tags: model.TagKeys{PodWritten: "reaper.io/pod-written"}},
			`Tags.PodWritten "reaper.io/pod-written": the hosts read it through the instance metadata`},
		"pod-written no grace": {reapercdk.Props{EKSCluster: "a", PowerOffGrace: reapercdk.NoPowerOffGrace, Tags: model.TagKeys{PodWritten: "reaper.io:pod-written"}}, "Tags.PodWritten needs a PowerOffGrace"},
		"no bootstrap":         {reapercdk.Props{EKSCluster: "a", BuildDir: t.TempDir()}, "exitrecorder/bootstrap is missing: run `make build`"},
	} {
		t.Run(name, func(t *testing.T) {
			if tc.props.BuildDir == "" {
				tc.props.BuildDir = cdktest.BuildDir()
			}
			err := tc.props.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to mention %q", err, tc.want)
			}
		})
	}
	for _, p := range []reapercdk.Props{
		{EKSCluster: "a"},
		{EKSCluster: "a", ClusterName: "a"},
		{KubeconfigSecretArn: "arn:x", ClusterName: "on prem", ExitLogGroupName: "/reaper/on-prem/exits"},
		{KubeconfigSecretArn: "arn:x", ClusterName: "gpu@prod", ExitLogGroupName: "/gpu/exits", MetricsNamespace: "GPU/prod"},
		{EKSCluster: "a", ReconcilerBatchSize: 10, ReconcilerBatchingWindow: 5 * time.Minute, ReconcilerMaxConcurrency: 1000, EC2Share: 1, MaxReceiveCount: 192},
		{EKSCluster: "a", ReservedConcurrency: 2, MaxReceiveCount: 1, QueueAgeAlarm: time.Minute},
		{EKSCluster: "a", OrphanCap: jsii.Number(1)},
		{EKSCluster: "a", OrphanCap: jsii.Number(0.001)},
	} {
		p.BuildDir = cdktest.BuildDir()
		if err := p.Validate(); err != nil {
			t.Fatalf("props %+v: %v", p, err)
		}
	}
	arm, amd := elfBuildDir(t, elf.EM_AARCH64), elfBuildDir(t, elf.EM_X86_64)
	if err := (reapercdk.Props{EKSCluster: "a", BuildDir: arm}).Validate(); err != nil {
		t.Fatalf("arm64 bundles: %v", err)
	}
	if err := (reapercdk.Props{EKSCluster: "a", BuildDir: amd}).Validate(); err == nil || !strings.Contains(err.Error(), "sweeper/bootstrap is built for EM_X86_64, the functions run on arm64") {
		t.Fatalf("amd64 bundles: %v", err)
	}
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "no Kubernetes access") {
			t.Fatalf("New with invalid props: %v", r)
		}
	}()
	reapercdk.New(awscdk.NewStack(cdktest.NewApp(t, nil), jsii.String("Bad"), nil), "Reaper", &reapercdk.Props{BuildDir: cdktest.BuildDir()})
}

// elfBuildDir is a build directory whose bootstraps are ELF headers for the
// machine: enough for the architecture check.
func elfBuildDir(t *testing.T, machine elf.Machine) string {
	var buf bytes.Buffer
	h := elf.Header64{Type: uint16(elf.ET_EXEC), Machine: uint16(machine), Version: uint32(elf.EV_CURRENT), Ehsize: 64, Phentsize: 56, Shentsize: 64}
	copy(h.Ident[:], elf.ELFMAG)
	h.Ident[elf.EI_CLASS], h.Ident[elf.EI_DATA], h.Ident[elf.EI_VERSION] = byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT)
	if err := binary.Write(&buf, binary.LittleEndian, h); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, name := range reapercdk.FunctionNames() {
		if err := os.MkdirAll(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name, "bootstrap"), buf.Bytes(), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestTwoClustersInOneAccount deploys Reaper for two clusters side by side,
// one per access mode, in one account and region: nothing either stack
// names may clash with the other, and each acts only on its own cluster's
// instances.
func TestTwoClustersInOneAccount(t *testing.T) {
	app := cdktest.NewApp(t, nil)
	env := &awscdk.Environment{Account: jsii.String("123456789012"), Region: jsii.String("eu-west-1")}
	clusters := []struct {
		stack string
		props reapercdk.Props
	}{
		{"ReaperStaging", reapercdk.Props{EKSCluster: "staging", EKSAccessEntryGroup: "reaper"}},
		{"ReaperProd", reapercdk.Props{
			KubeconfigSecretArn: "arn:aws:secretsmanager:eu-west-1:123456789012:secret:prod/kubeconfig-AbCdEf",
			ClusterName:         "prod",
		}},
	}
	// The app synthesizes once, so both stacks exist before either template
	// is read.
	stacks := make([]awscdk.Stack, len(clusters))
	cdktest.Must(t, func() {
		for i, c := range clusters {
			stacks[i] = awscdk.NewStack(app, jsii.String(c.stack), &awscdk.StackProps{Env: env})
			c.props.BuildDir = cdktest.BuildDir()
			c.props.AlarmEmail = "oncall@example.com"
			reapercdk.New(stacks[i], "Reaper", &c.props)
		}
	})
	claimed := map[string]string{}
	for i, c := range clusters {
		m := cdktest.JSON(t, cdktest.Template(t, stacks[i]))
		cluster := c.props.Cluster()

		names := cdktest.PhysicalNames(t, c.stack, m)
		for _, name := range names {
			if other, ok := claimed[name]; ok {
				t.Errorf("%s and %s both claim %s", other, c.stack, name)
			}
			claimed[name] = c.stack
		}
		if group := "AWS::Logs::LogGroup /reaper/" + cluster + "/exits"; !slices.Contains(names, group) {
			t.Errorf("%s: no %s among %v", c.stack, group, names)
		}
		// The queues take the names CloudFormation generates from the
		// stack's.
		for _, name := range names {
			if strings.HasPrefix(name, "AWS::SQS::Queue ") {
				t.Errorf("%s names a queue: %s", c.stack, name)
			}
		}

		for id, f := range cdktest.Resources(m, "AWS::Lambda::Function") {
			vars := cdktest.Props(f)["Environment"].(map[string]any)["Variables"].(map[string]any)
			if vars["REAPER_CLUSTER"] != cluster {
				t.Errorf("%s %s: REAPER_CLUSTER %v, want %s", c.stack, id, vars["REAPER_CLUSTER"], cluster)
			}
			if ns := vars["REAPER_METRICS_NAMESPACE"]; ns != "Reaper/"+cluster {
				t.Errorf("%s %s: REAPER_METRICS_NAMESPACE %v, want Reaper/%s", c.stack, id, ns, cluster)
			}
		}
		// Graphs and alarms read the stack's own metrics only.
		for _, other := range clusters {
			if o := other.props.Cluster(); o != cluster && strings.Contains(compact(m), `Reaper/`+o) {
				t.Errorf("%s reads %s's metrics", c.stack, o)
			}
		}

		// The functions' invokers are this account's log group and rules.
		for id, p := range cdktest.Resources(m, "AWS::Lambda::Permission") {
			if a := cdktest.Props(p)["SourceAccount"]; a != "123456789012" {
				t.Errorf("%s %s: SourceAccount %v, want 123456789012", c.stack, id, a)
			}
		}

		terminates := 0
		want := fmt.Sprintf(`{"StringEquals":{"aws:ResourceTag/reaper.io/cluster":%q,"aws:ResourceTag/reaper.io/managed":"true"}}`, cluster)
		for id, p := range cdktest.Resources(m, "AWS::IAM::Policy") {
			for _, st := range cdktest.Props(p)["PolicyDocument"].(map[string]any)["Statement"].([]any) {
				st := st.(map[string]any)
				if !slices.Contains(strs(st["Action"]), "ec2:TerminateInstances") {
					continue
				}
				terminates++
				if got := compact(st["Condition"]); got != want {
					t.Errorf("%s %s: terminate condition %s, want %s", c.stack, id, got, want)
				}
			}
		}
		if terminates != 1 {
			t.Errorf("%s: %d terminate statements, want one, the reconciler's", c.stack, terminates)
		}
		// The evaluator: each stack's reconciler terminates its own
		// cluster's instances, not the other's.
		principals, err := iamsim.Principals(m, iamsim.TestEnv(c.stack))
		if err != nil {
			t.Fatal(err)
		}
		reconciler := principals[roleOf(t, m, "Reconciler")]
		for _, other := range clusters {
			o := other.props.Cluster()
			want := iamsim.Denied
			if o == cluster {
				want = iamsim.Allowed
			}
			own, _ := iamsim.DefaultFleet(o).Instances()
			iamsim.Ask(t, []iamsim.Question{{
				Name: c.stack + "'s reconciler terminates an instance of " + o, Principal: reconciler.ARN, Action: "ec2:TerminateInstances",
				Resource: own.ARN(iamsim.TestEnv(c.stack)), Context: own.Context(), Identity: reconciler.Policies, Want: want,
			}})
		}
	}
}

// With the Pod-written tag the reconciler, and no other function, gets
// REAPER_TAG_POD_WRITTEN and ec2:CreateTags of that key alone, on the
// instances this deployment owns.
func TestPodWrittenTag(t *testing.T) {
	tmpl := newStack(t, reapercdk.Props{EKSCluster: "demo", PowerOffGrace: 10 * time.Second, Tags: model.TagKeys{PodWritten: "reaper.io:pod-written"}}, nil)
	m := cdktest.JSON(t, tmpl)
	askIAM(t, m, "demo", "reaper.io:pod-written")
	cdktest.Must(t, func() {
		tmpl.ResourcePropertiesCountIs(jsii.String("AWS::Lambda::Function"), map[string]any{
			"Environment": map[string]any{"Variables": assertions.Match_ObjectLike(&map[string]any{"REAPER_TAG_POD_WRITTEN": "reaper.io:pod-written"})},
		}, jsii.Number(1))
	})
	for _, id := range []string{"ExitRecorder", "StateChange", "Sweeper", "Reconciler"} {
		var tagging []map[string]any
		for _, st := range statements(m, roleOf(t, m, id)) {
			if slices.Contains(strs(st["Action"]), "ec2:CreateTags") {
				tagging = append(tagging, st)
			}
		}
		if id != "Reconciler" {
			if len(tagging) > 0 {
				t.Errorf("%s may tag instances: %v", id, tagging)
			}
			continue
		}
		if len(tagging) != 1 {
			t.Fatalf("reconciler: %d statements grant ec2:CreateTags, want 1", len(tagging))
		}
		want := `{"ForAllValues:StringEquals":{"aws:TagKeys":["reaper.io:pod-written"]},"StringEquals":{"aws:ResourceTag/reaper.io/cluster":"demo","aws:ResourceTag/reaper.io/managed":"true"}}`
		if got := compact(tagging[0]["Condition"]); got != want {
			t.Errorf("CreateTags condition %s, want %s", got, want)
		}
		if strs(tagging[0]["Action"])[0] != "ec2:CreateTags" || len(strs(tagging[0]["Action"])) != 1 {
			t.Errorf("statement %v", tagging[0])
		}
	}
}
