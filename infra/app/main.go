// Command app is Reaper's default CDK app: one stack holding the Reaper
// construct, configured from CDK context (`cdk deploy -c key=value`, or the
// "context" of cdk.json). The knobs: docs/reference.md, "CDK context knobs".
package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslogs"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"

	"github.com/reaper-k8s/reaper/infra/reapercdk"
)

func main() {
	defer jsii.Close()
	app := awscdk.NewApp(nil)
	if _, _, err := newStack(app); err != nil {
		jsii.Close()
		fmt.Fprintf(os.Stderr, "reaper: %v\n", err)
		os.Exit(1)
	}
	app.Synth(nil)
}

// StackNamePrefix starts the stack's default name, "Reaper-<cluster>": one
// stack per cluster, so that deployments for two clusters sit side by side
// in one account and region. The stackName knob overrides it.
const StackNamePrefix = "Reaper"

// defaultStackName is the stack name for a cluster. CloudFormation allows
// letters, digits and hyphens, 128 at most; anything else in a cluster name
// becomes a hyphen.
func defaultStackName(cluster string) string {
	name := StackNamePrefix + "-" + strings.Map(func(r rune) rune {
		if r < utf8.RuneSelf && (unicode.IsLetter(r) || unicode.IsDigit(r)) {
			return r
		}
		return '-'
	}, cluster)
	return name[:min(len(name), 128)]
}

// newStack adds the Reaper stack to app, configured from its context.
//
// The CLI bundles only the stacks it may deploy (cdk deploy, synth, diff),
// and none for cdk destroy or cdk list: then the stack needs no function
// code, and the functions get placeholder bootstraps, so that removing
// Reaper works from a checkout that was never built.
func newStack(app awscdk.App) (awscdk.Stack, *reapercdk.Reaper, error) {
	props, err := propsFromContext(app.Node())
	if err != nil {
		return nil, nil, err
	}
	if props.EKSCluster == "" && props.KubeconfigSecretArn == "" {
		return nil, nil, errors.New("no Kubernetes access: cdk deploy and cdk destroy both take the deployment's knobs, " +
			"-c eksCluster=<cluster>, or -c kubeconfigSecretArn=<secret ARN> -c clusterName=<cluster> (and -c stackName=<name> if the deploy set it)")
	}
	name := defaultStackName(props.Cluster())
	if v, ok := contextValue(app.Node(), "stackName"); ok {
		name = v
	}
	stack := awscdk.NewStack(app, jsii.String(name), &awscdk.StackProps{
		Description: jsii.String("Reaper: terminal Pod status and instance cleanup for one-Pod-per-instance Kubernetes providers"),
	})
	if !*stack.BundlingRequired() {
		dir, err := placeholderBuild(*app.Outdir())
		if err != nil {
			return nil, nil, err
		}
		props.BuildDir = dir
	}
	if err := props.Validate(); err != nil {
		return nil, nil, err
	}
	r := reapercdk.New(stack, "Reaper", &props)

	output := func(id, description string, value *string) {
		awscdk.NewCfnOutput(stack, jsii.String(id), &awscdk.CfnOutputProps{Description: jsii.String(description), Value: value})
	}
	output("LedgerTable", "Ledger table (REAPER_TABLE)", r.Table.TableName())
	output("ExitLogGroup", "Log group the hosts' CloudWatch agent writes exit lines to", r.ExitLogGroup.LogGroupName())
	output("AgentPolicyArn", "Managed policy to attach to the provider's instance role", r.AgentPolicy.ManagedPolicyArn())
	output("FailureQueueUrl", "Events that failed every retry", r.FailureQueue.QueueUrl())
	output("WorkQueueUrl", "Work queue from the other functions to the reconciler (REAPER_QUEUE_URL)", r.WorkQueue.QueueUrl())
	output("DeadLetterQueueUrl", "Work the reconciler failed MaxReceiveCount times, to inspect and redrive (with a role of RedriveRoles)", r.DeadLetterQueue.QueueUrl())
	output("DashboardName", "CloudWatch dashboard of the deployment's metrics and alarms", r.Dashboard.DashboardName())
	// Only the sweeper and the reconciler talk to Kubernetes.
	for _, fn := range []struct {
		id   string
		role *string
	}{
		{"SweeperRoleArn", r.Sweeper.Role().RoleArn()},
		{"ReconcilerRoleArn", r.Reconciler.Role().RoleArn()},
	} {
		output(fn.id, "Function role to map to the Kubernetes group of deploy/rbac.yaml", fn.role)
	}
	return stack, r, nil
}

// placeholderBuild writes a build directory of placeholder bootstraps
// under dir, for a stack the CLI will not deploy in this run.
func placeholderBuild(dir string) (string, error) {
	build := filepath.Join(dir, "reaper-no-build")
	for _, name := range reapercdk.FunctionNames() {
		if err := os.MkdirAll(filepath.Join(build, name), 0o755); err != nil {
			return "", err
		}
		script := "#!/bin/sh\necho 'reaper: a placeholder for " + name + ", synthesized for cdk destroy or cdk list: run make build and cdk deploy' >&2\nexit 1\n"
		if err := os.WriteFile(filepath.Join(build, name, "bootstrap"), []byte(script), 0o755); err != nil {
			return "", err
		}
	}
	return build, nil
}

// knob is one context key and how it sets the props.
type knob struct {
	name  string
	apply func(p *reapercdk.Props, v string) error
}

var knobs = []knob{
	{"eksCluster", str(func(p *reapercdk.Props) *string { return &p.EKSCluster })},
	{"kubeconfigSecretArn", str(func(p *reapercdk.Props) *string { return &p.KubeconfigSecretArn })},
	{"eksAccessEntryGroup", str(func(p *reapercdk.Props) *string { return &p.EKSAccessEntryGroup })},
	{"clusterName", str(func(p *reapercdk.Props) *string { return &p.ClusterName })},
	{"buildDir", str(func(p *reapercdk.Props) *string { return &p.BuildDir })},
	{"tableName", str(func(p *reapercdk.Props) *string { return &p.TableName })},
	{"tableRemovalPolicy", func(p *reapercdk.Props, v string) error {
		switch strings.ToLower(v) {
		case "retain":
			p.TableRemovalPolicy = awscdk.RemovalPolicy_RETAIN
		case "destroy":
			p.TableRemovalPolicy = awscdk.RemovalPolicy_DESTROY
		default:
			return errors.New("use retain or destroy")
		}
		return nil
	}},
	{"exitLogGroup", str(func(p *reapercdk.Props) *string { return &p.ExitLogGroupName })},
	{"exitLogRetentionDays", retention(func(p *reapercdk.Props) *awslogs.RetentionDays { return &p.ExitLogRetention })},
	{"functionLogRetentionDays", retention(func(p *reapercdk.Props) *awslogs.RetentionDays { return &p.FunctionLogRetention })},
	{"exitWait", duration(func(p *reapercdk.Props) *time.Duration { return &p.ExitWait })},
	{"orphanGrace", duration(func(p *reapercdk.Props) *time.Duration { return &p.OrphanGrace })},
	{"terminateStopped", func(p *reapercdk.Props, v string) error {
		b, err := strconv.ParseBool(v)
		p.TerminateStopped = &b
		return err
	}},
	{"dryRun", boolean(func(p *reapercdk.Props) *bool { return &p.DryRun })},
	{"logLevel", str(func(p *reapercdk.Props) *string { return &p.LogLevel })},
	{"tagManaged", str(func(p *reapercdk.Props) *string { return &p.Tags.Managed })},
	{"tagCluster", str(func(p *reapercdk.Props) *string { return &p.Tags.Cluster })},
	{"tagPodNamespace", str(func(p *reapercdk.Props) *string { return &p.Tags.PodNamespace })},
	{"tagPodName", str(func(p *reapercdk.Props) *string { return &p.Tags.PodName })},
	{"tagPodUid", str(func(p *reapercdk.Props) *string { return &p.Tags.PodUID })},
	{"tagClusterUid", str(func(p *reapercdk.Props) *string { return &p.Tags.ClusterUID })},
	{"tagExitToken", str(func(p *reapercdk.Props) *string { return &p.Tags.ExitToken })},
	{"tagPodWritten", str(func(p *reapercdk.Props) *string { return &p.Tags.PodWritten })},
	{"memoryMb", integer(func(p *reapercdk.Props) *int { return &p.MemoryMB })},
	{"reconcilerMemoryMb", integer(func(p *reapercdk.Props) *int { return &p.ReconcilerMemoryMB })},
	{"reservedConcurrency", integer(func(p *reapercdk.Props) *int { return &p.ReservedConcurrency })},
	{"sweepRate", duration(func(p *reapercdk.Props) *time.Duration { return &p.SweepRate })},
	{"maxEventAge", duration(func(p *reapercdk.Props) *time.Duration { return &p.MaxEventAge })},
	{"includeRunning", boolean(func(p *reapercdk.Props) *bool { return &p.IncludeRunning })},
	{"maxReceiveCount", integer(func(p *reapercdk.Props) *int { return &p.MaxReceiveCount })},
	{"reconcilerBatchSize", integer(func(p *reapercdk.Props) *int { return &p.ReconcilerBatchSize })},
	{"reconcilerBatchingWindow", duration(func(p *reapercdk.Props) *time.Duration { return &p.ReconcilerBatchingWindow })},
	{"reconcilerMaxConcurrency", integer(func(p *reapercdk.Props) *int { return &p.ReconcilerMaxConcurrency })},
	{"ec2Share", number(func(p *reapercdk.Props) *float64 { return &p.EC2Share })},
	{"queueAgeAlarm", duration(func(p *reapercdk.Props) *time.Duration { return &p.QueueAgeAlarm })},
	{"orphanCap", func(p *reapercdk.Props, v string) error {
		f, err := strconv.ParseFloat(v, 64)
		p.OrphanCap = &f
		return err
	}},
	{"powerOffGrace", func(p *reapercdk.Props, v string) error {
		g, err := time.ParseDuration(v)
		switch {
		case err != nil:
			return err
		case g < 0:
			return errors.New("use 0 (terminate at once) or a positive duration")
		case g == 0:
			// The props' zero is the construct's default grace.
			g = reapercdk.NoPowerOffGrace
		}
		p.PowerOffGrace = g
		return nil
	}},
	{"metricsNamespace", str(func(p *reapercdk.Props) *string { return &p.MetricsNamespace })},
	{"terminateLatencyAlarm", duration(func(p *reapercdk.Props) *time.Duration { return &p.TerminateLatencyAlarm })},
	{"alarmEmail", str(func(p *reapercdk.Props) *string { return &p.AlarmEmail })},
	{"alarmTopicArn", str(func(p *reapercdk.Props) *string { return &p.AlarmTopicArn })},
	{"subnetIds", list(func(p *reapercdk.Props) *[]string { return &p.SubnetIDs })},
	{"redriveRoles", list(func(p *reapercdk.Props) *[]string { return &p.RedriveRoles })},
	{"securityGroupIds", list(func(p *reapercdk.Props) *[]string { return &p.SecurityGroupIDs })},
}

// propsFromContext reads every knob that is set; all bad values are
// reported together.
func propsFromContext(node constructs.Node) (reapercdk.Props, error) {
	var (
		p    reapercdk.Props
		errs []error
	)
	for _, k := range knobs {
		v, ok := contextValue(node, k.name)
		if !ok {
			continue
		}
		if err := k.apply(&p, v); err != nil {
			errs = append(errs, fmt.Errorf("context %s=%q: %v", k.name, v, err))
		}
	}
	return p, errors.Join(errs...)
}

// contextValue returns a context value as text: `-c key=value` gives
// strings, cdk.json may give booleans, numbers or lists.
func contextValue(node constructs.Node, key string) (string, bool) {
	switch v := node.TryGetContext(jsii.String(key)).(type) {
	case nil:
		return "", false
	case string:
		return strings.TrimSpace(v), v != ""
	case []any:
		parts := make([]string, len(v))
		for i, e := range v {
			parts[i] = fmt.Sprint(e)
		}
		return strings.Join(parts, ","), true
	default:
		return fmt.Sprint(v), true
	}
}

func str(field func(*reapercdk.Props) *string) func(*reapercdk.Props, string) error {
	return func(p *reapercdk.Props, v string) error { *field(p) = v; return nil }
}

func boolean(field func(*reapercdk.Props) *bool) func(*reapercdk.Props, string) error {
	return func(p *reapercdk.Props, v string) (err error) { *field(p), err = strconv.ParseBool(v); return err }
}

func integer(field func(*reapercdk.Props) *int) func(*reapercdk.Props, string) error {
	return func(p *reapercdk.Props, v string) (err error) { *field(p), err = strconv.Atoi(v); return err }
}

func number(field func(*reapercdk.Props) *float64) func(*reapercdk.Props, string) error {
	return func(p *reapercdk.Props, v string) (err error) { *field(p), err = strconv.ParseFloat(v, 64); return err }
}

func duration(field func(*reapercdk.Props) *time.Duration) func(*reapercdk.Props, string) error {
	return func(p *reapercdk.Props, v string) (err error) {
		*field(p), err = time.ParseDuration(v)
		if err == nil && *field(p) <= 0 {
			err = errors.New("must be positive")
		}
		return err
	}
}

func list(field func(*reapercdk.Props) *[]string) func(*reapercdk.Props, string) error {
	return func(p *reapercdk.Props, v string) error {
		for _, s := range strings.Split(v, ",") {
			if s = strings.TrimSpace(s); s != "" {
				*field(p) = append(*field(p), s)
			}
		}
		return nil
	}
}

// retentionDays are the retentions CloudWatch Logs accepts, in days.
var retentionDays = map[int]awslogs.RetentionDays{
	1: awslogs.RetentionDays_ONE_DAY, 3: awslogs.RetentionDays_THREE_DAYS, 5: awslogs.RetentionDays_FIVE_DAYS,
	7: awslogs.RetentionDays_ONE_WEEK, 14: awslogs.RetentionDays_TWO_WEEKS, 30: awslogs.RetentionDays_ONE_MONTH,
	60: awslogs.RetentionDays_TWO_MONTHS, 90: awslogs.RetentionDays_THREE_MONTHS, 120: awslogs.RetentionDays_FOUR_MONTHS,
	150: awslogs.RetentionDays_FIVE_MONTHS, 180: awslogs.RetentionDays_SIX_MONTHS, 365: awslogs.RetentionDays_ONE_YEAR,
	400: awslogs.RetentionDays_THIRTEEN_MONTHS, 545: awslogs.RetentionDays_EIGHTEEN_MONTHS, 731: awslogs.RetentionDays_TWO_YEARS,
	1096: awslogs.RetentionDays_THREE_YEARS, 1827: awslogs.RetentionDays_FIVE_YEARS, 2192: awslogs.RetentionDays_SIX_YEARS,
	2557: awslogs.RetentionDays_SEVEN_YEARS, 2922: awslogs.RetentionDays_EIGHT_YEARS, 3288: awslogs.RetentionDays_NINE_YEARS,
	3653: awslogs.RetentionDays_TEN_YEARS,
}

func retention(field func(*reapercdk.Props) *awslogs.RetentionDays) func(*reapercdk.Props, string) error {
	return func(p *reapercdk.Props, v string) error {
		if strings.EqualFold(v, "infinite") {
			*field(p) = awslogs.RetentionDays_INFINITE
			return nil
		}
		days, err := strconv.Atoi(v)
		if r, ok := retentionDays[days]; err == nil && ok {
			*field(p) = r
			return nil
		}
		var valid []int
		for d := range retentionDays {
			valid = append(valid, d)
		}
		slices.Sort(valid)
		return fmt.Errorf("CloudWatch Logs keeps %v days, or infinite", valid)
	}
}
