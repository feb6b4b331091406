// Package reapercdk is the Reaper CDK construct: the ledger table, the four
// Lambda functions and their triggers, the exit-line log group, the work
// queue between the functions that find work and the one that does it, a
// failure queue, a dashboard and alarms, with least-privilege IAM. Any Go
// CDK app can add it to a stack:
//
//	reapercdk.New(stack, "Reaper", &reapercdk.Props{EKSCluster: "prod"})
package reapercdk

import (
	"fmt"
	"path/filepath"
	"strconv"
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatch"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatchactions"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsdynamodb"
	"github.com/aws/aws-cdk-go/awscdk/v2/awseks"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsevents"
	"github.com/aws/aws-cdk-go/awscdk/v2/awseventstargets"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambdadestinations"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambdaeventsources"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslogs"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslogsdestinations"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssns"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssnssubscriptions"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssqs"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"

	"github.com/reaper-k8s/reaper/pkg/exitline"
	"github.com/reaper-k8s/reaper/pkg/ledger"
	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/model"
)

// ExitFilterPattern selects exit lines in the exit-line log group.
var ExitFilterPattern = fmt.Sprintf(`{ $.reaper = %q }`, exitline.Kind)

// EndStates are the EC2 states after which an instance no longer runs its
// Pod: the states statechange always receives.
var EndStates = []string{model.StateStopping, model.StateStopped, model.StateShuttingDown, model.StateTerminated}

// function describes one of the four Lambdas: what it needs, from which
// its permissions, environment and trigger follow. Its name is also the
// value of the Function dimension of the metrics it records.
//
// exitrecorder, statechange and sweeper find work and send it to the work
// queue; the reconciler, the queue's only consumer, does it. Only the
// reconciler may terminate instances, and only it and the sweeper talk to
// Kubernetes.
type function struct {
	name, id, description string
	timeout               time.Duration
	// ledger: reads and updates records one at a time (GetItem, UpdateItem).
	ledger bool
	// batchReads: reads batches of records (BatchGetItem).
	batchReads bool
	// sweeps: reads the pending index (Query); it never scans the table.
	sweeps bool
	// describes: lists and reads instances (ec2:DescribeInstances).
	describes bool
	// terminates: ec2:TerminateInstances, on owned instances only.
	terminates bool
	// orphans: finds or terminates orphans, as many per sweep as
	// REAPER_ORPHAN_CAP allows (Props.OrphanCap), and decides when to
	// terminate (REAPER_POWER_OFF_GRACE, Props.PowerOffGrace).
	orphans bool
	// kube: reads or writes Pods: the access entry, eks:DescribeCluster or
	// the kubeconfig secret, and the variables that name them.
	kube bool
	// produces: sends work to the work queue (sqs:SendMessage).
	produces bool
	// consumes: the work queue's event source mapping invokes it,
	// synchronously. The others are invoked asynchronously, with retries
	// and the failure queue.
	consumes bool
	// scheduled: a schedule invokes it, and each run redoes what the last
	// one left. One runs at a time (reserved concurrency 1), with no
	// retries and no failure queue: a run that fails, or cannot start
	// within ScheduledMaxEventAge, is replaced by the next one. Lambda
	// keeps a throttled asynchronous event and tries it again until its
	// maximum age (https://docs.aws.amazon.com/lambda/latest/dg/invocation-async-error-handling.html),
	// so the age, not the retry count, bounds how long a sweep waits.
	scheduled bool
}

var functions = []function{
	{
		name: metrics.FunctionExitRecorder, id: "ExitRecorder", timeout: time.Minute,
		description: "Reaper: queues the container exits the hosts report, for the reconciler to check",
		produces:    true,
	},
	{
		name: metrics.FunctionStateChange, id: "StateChange", timeout: time.Minute,
		description: "Reaper: queues managed instances that stop or terminate",
		produces:    true,
	},
	{
		name: metrics.FunctionSweeper, id: "Sweeper", timeout: 5 * time.Minute,
		description: "Reaper: on a schedule, queues pending work and managed instances without a live Pod",
		ledger:      true, batchReads: true, sweeps: true, describes: true, kube: true, produces: true, scheduled: true, orphans: true,
	},
	{
		name: metrics.FunctionReconciler, id: "Reconciler", timeout: ReconcilerTimeout,
		description: "Reaper: from the work queue, writes Pods' terminal status and terminates their instances",
		ledger:      true, batchReads: true, describes: true, terminates: true, kube: true, produces: true, consumes: true, orphans: true,
	},
}

// ReconcilerTimeout is the reconciler's timeout; the work queue's
// visibility timeout is WorkQueueVisibilityFactor times it, as Lambda
// advises for a queue a function consumes, so that a batch is not
// delivered again while a reconciler, or Lambda's retry of a throttled
// batch, still works on it.
const (
	ReconcilerTimeout         = 5 * time.Minute
	WorkQueueVisibilityFactor = 6
)

// FunctionNames are the functions' names: build/<name>/bootstrap.
func FunctionNames() []string {
	names := make([]string, len(functions))
	for i, fn := range functions {
		names[i] = fn.name
	}
	return names
}

// Actions the functions use; no table or queue admin.
var (
	// Ledger item actions (see pkg/ledger).
	ledgerActions    = []string{"dynamodb:GetItem", "dynamodb:UpdateItem"}
	batchReadActions = []string{"dynamodb:BatchGetItem"}
	// The sweeper reads the pending index, never the whole table.
	sweepIndexActions = []string{"dynamodb:Query"}
	// produceActions send work (see pkg/workqueue): sqs:SendMessage also
	// authorizes SendMessageBatch. The reconciler's consumer rights are
	// its event source mapping's (queue.GrantConsumeMessages).
	produceActions = []string{"sqs:SendMessage"}
	// vpcActions let Lambda attach a function in a VPC to its subnets.
	vpcActions = []string{
		"ec2:CreateNetworkInterface", "ec2:DescribeNetworkInterfaces", "ec2:DescribeSubnets",
		"ec2:DeleteNetworkInterface", "ec2:AssignPrivateIpAddresses", "ec2:UnassignPrivateIpAddresses",
	}
)

// Reaper is the deployed Reaper. Add further constructs under it with
// r.Construct as their scope (jsii cannot take the Go wrapper itself).
type Reaper struct {
	constructs.Construct

	// Table is the ledger (partition key instanceId, TTL expiresAt).
	Table awsdynamodb.Table
	// ExitLogGroup receives the hosts' exit lines.
	ExitLogGroup awslogs.LogGroup
	// AgentPolicy lets a provider's instance role write to ExitLogGroup and
	// nothing else; attach it to the role of the instances Reaper manages.
	AgentPolicy awsiam.ManagedPolicy
	// ExitRecorder, StateChange and Sweeper find work and queue it; the
	// Reconciler does it.
	ExitRecorder, StateChange, Sweeper, Reconciler awslambda.Function
	// WorkQueue carries one message per instance from the other functions
	// to the Reconciler, through an event source mapping.
	WorkQueue awssqs.Queue
	// DeadLetterQueue holds work the Reconciler failed Props.MaxReceiveCount
	// times.
	DeadLetterQueue awssqs.Queue
	// FailureQueue holds asynchronous events that failed every retry.
	FailureQueue awssqs.Queue
	// AlarmTopic receives the alarms; nil when no notification was asked for.
	AlarmTopic awssns.ITopic
	// Alarms are the functions' error and throttle alarms, the failure
	// queue's, the dead-letter queue's and the work queue's age alarms, and
	// the alarms on Reaper's own metrics (rejected lines, orphans found and
	// held back, cluster identity mismatches, refused terminations); and,
	// notifying nobody, the two that TerminateLatency combines.
	Alarms []awscloudwatch.Alarm
	// TerminateLatency alarms when instances bill on after their Pod ended
	// longer than the reconciler's pacing explains: its p99 latency alarm
	// while its pacing alarm is OK (metricAlarms says why).
	TerminateLatency awscloudwatch.CompositeAlarm
	// Dashboard shows Reaper's metrics, the functions' and the queues', and
	// the alarms.
	Dashboard awscloudwatch.Dashboard
	// Props are the settings in effect, defaults filled in.
	Props Props
}

// Functions returns the four functions in a fixed order (that of
// FunctionNames).
func (r *Reaper) Functions() []awslambda.Function {
	return []awslambda.Function{r.ExitRecorder, r.StateChange, r.Sweeper, r.Reconciler}
}

// New adds a Reaper to scope. It panics on invalid props (see Validate).
func New(scope constructs.Construct, id string, props *Props) *Reaper {
	if props == nil {
		props = &Props{}
	}
	if err := props.Validate(); err != nil {
		panic(fmt.Sprintf("reapercdk: %v", err))
	}
	p := props.withDefaults()
	r := &Reaper{Construct: constructs.NewConstruct(scope, jsii.String(id)), Props: p}
	stack := awscdk.Stack_Of(r.Construct)

	r.Table = awsdynamodb.NewTable(r.Construct, jsii.String("Ledger"), &awsdynamodb.TableProps{
		TableName:           optional(p.TableName),
		PartitionKey:        &awsdynamodb.Attribute{Name: jsii.String(ledger.KeyAttribute), Type: awsdynamodb.AttributeType_STRING},
		BillingMode:         awsdynamodb.BillingMode_PAY_PER_REQUEST,
		TimeToLiveAttribute: jsii.String(ledger.TTLAttribute),
		PointInTimeRecoverySpecification: &awsdynamodb.PointInTimeRecoverySpecification{
			PointInTimeRecoveryEnabled: jsii.Bool(true),
		},
		RemovalPolicy: p.TableRemovalPolicy,
	})
	r.Table.AddGlobalSecondaryIndex(&awsdynamodb.GlobalSecondaryIndexProps{
		IndexName:      jsii.String(ledger.PendingIndex),
		PartitionKey:   &awsdynamodb.Attribute{Name: jsii.String(ledger.PendingAttribute), Type: awsdynamodb.AttributeType_STRING},
		ProjectionType: awsdynamodb.ProjectionType_ALL,
	})

	// DESTROY: the name is fixed, so a retained group would make the next
	// deploy after a `cdk destroy` fail; the ledger keeps what matters.
	r.ExitLogGroup = awslogs.NewLogGroup(r.Construct, jsii.String("ExitLines"), &awslogs.LogGroupProps{
		LogGroupName:  jsii.String(p.ExitLogGroupName),
		Retention:     p.ExitLogRetention,
		RemovalPolicy: awscdk.RemovalPolicy_DESTROY,
	})
	r.AgentPolicy = r.agentPolicy(stack)

	r.FailureQueue = awssqs.NewQueue(r.Construct, jsii.String("Failures"), &awssqs.QueueProps{
		Encryption:      awssqs.QueueEncryption_SQS_MANAGED,
		EnforceSSL:      jsii.Bool(true),
		RetentionPeriod: seconds(FailureRetention),
	})
	r.workQueue()

	fns := make([]awslambda.Function, len(functions))
	for i, spec := range functions {
		fns[i] = r.function(stack, spec)
	}
	r.ExitRecorder, r.StateChange, r.Sweeper, r.Reconciler = fns[0], fns[1], fns[2], fns[3]

	// The reconciler reports the messages it could not handle
	// (events.SQSEventResponse): only those come back, after the
	// visibility timeout, and go to the dead-letter queue after
	// MaxReceiveCount receives. The source grants the consumer rights.
	r.Reconciler.AddEventSource(awslambdaeventsources.NewSqsEventSource(r.WorkQueue, &awslambdaeventsources.SqsEventSourceProps{
		BatchSize:               jsii.Number(p.ReconcilerBatchSize),
		MaxBatchingWindow:       seconds(p.ReconcilerBatchingWindow),
		MaxConcurrency:          jsii.Number(p.ReconcilerMaxConcurrency),
		ReportBatchItemFailures: jsii.Bool(true),
	}))

	awslogs.NewSubscriptionFilter(r.Construct, jsii.String("ExitSubscription"), &awslogs.SubscriptionFilterProps{
		LogGroup:      r.ExitLogGroup,
		FilterName:    jsii.String("reaper-exits"),
		FilterPattern: awslogs.FilterPattern_Literal(jsii.String(ExitFilterPattern)),
		Destination:   awslogsdestinations.NewLambdaDestination(r.ExitRecorder, nil),
	})

	states := append([]string(nil), EndStates...)
	if p.IncludeRunning {
		states = append(states, model.StateRunning)
	}
	awsevents.NewRule(r.Construct, jsii.String("StateChanges"), &awsevents.RuleProps{
		Description: jsii.String("Reaper: EC2 instance state changes to statechange"),
		EventPattern: &awsevents.EventPattern{
			Source:     jsii.Strings(model.StateChangeSource),
			DetailType: jsii.Strings(model.StateChangeDetailType),
			Detail:     &map[string]any{"state": jsii.Strings(states...)},
		},
		Targets: &[]awsevents.IRuleTarget{r.target(r.StateChange)},
	})
	awsevents.NewRule(r.Construct, jsii.String("Sweep"), &awsevents.RuleProps{
		Description: jsii.String("Reaper: sweeper schedule"),
		Schedule:    awsevents.Schedule_Rate(awscdk.Duration_Minutes(jsii.Number(p.SweepRate.Minutes()))),
		// A sweep EventBridge cannot hand to Lambda at once is not worth
		// retrying: the next one is a minute away. One it cannot hand over
		// at all still goes to the failure queue, and its alarm.
		Targets: &[]awsevents.IRuleTarget{awseventstargets.NewLambdaFunction(r.Sweeper, &awseventstargets.LambdaFunctionProps{
			DeadLetterQueue: r.FailureQueue,
			RetryAttempts:   jsii.Number(0),
			MaxEventAge:     seconds(ScheduledMaxEventAge),
		})},
	})

	r.onlyFunctionsSendWork(p.RedriveRoles)
	r.onlyTriggersInvoke(stack)

	r.alarms()
	r.metricAlarms()
	r.dashboard()
	r.suppressNagFindings()
	return r
}

// agentPolicy is the managed policy for the provider's instance role: the
// CloudWatch agent may write to the exit-line group and nothing else, and
// read nothing. It does not tie a stream's name to the writing instance
// (IAM cannot): a line written into another instance's stream is refused
// when that instance carries the exit-token tag, for want of its token.
//
// Not logs:DescribeLogStreams, which would let every host list the
// group's streams, the instance ids of the other hosts. The agent does not
// call it: its log sender's client is PutLogEvents, CreateLogStream,
// CreateLogGroup, PutRetentionPolicy and DescribeLogGroups only, and on
// ResourceNotFoundException it creates the stream, taking
// ResourceAlreadyExistsException as success
// (https://github.com/aws/amazon-cloudwatch-agent/blob/main/plugins/outputs/cloudwatchlogs/internal/pusher/sender.go,
// .../internal/pusher/target.go); the agents of the sequence-token era
// learned the token from InvalidSequenceTokenException, not from
// DescribeLogStreams (.../plugins/outputs/cloudwatchlogs/pusher.go before
// the internal/pusher package). CloudWatchAgentServerPolicy grants it, for
// every log group: it is not a sign the agent needs it here.
func (r *Reaper) agentPolicy(stack awscdk.Stack) awsiam.ManagedPolicy {
	group := stack.FormatArn(&awscdk.ArnComponents{
		Service:      jsii.String("logs"),
		Resource:     jsii.String("log-group"),
		ResourceName: jsii.String(r.Props.ExitLogGroupName),
		ArnFormat:    awscdk.ArnFormat_COLON_RESOURCE_NAME,
	})
	return awsiam.NewManagedPolicy(r.Construct, jsii.String("AgentPolicy"), &awsiam.ManagedPolicyProps{
		Description: jsii.String("Reaper: lets the CloudWatch agent on managed instances write exit lines to " + r.Props.ExitLogGroupName),
		Statements: &[]awsiam.PolicyStatement{awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
			Sid:       jsii.String("WriteExitLines"),
			Actions:   jsii.Strings("logs:CreateLogStream", "logs:PutLogEvents"),
			Resources: jsii.Strings(*group, *group+":log-stream:*"),
		})},
	})
}

// workQueue creates the work queue and its dead-letter queue. Both are
// unnamed: CloudFormation names them after the stack, so deployments for
// two clusters in one account never clash.
func (r *Reaper) workQueue() {
	p := r.Props
	r.DeadLetterQueue = awssqs.NewQueue(r.Construct, jsii.String("WorkDeadLetters"), &awssqs.QueueProps{
		Encryption:      awssqs.QueueEncryption_SQS_MANAGED,
		EnforceSSL:      jsii.Bool(true),
		RetentionPeriod: seconds(FailureRetention),
	})
	r.WorkQueue = awssqs.NewQueue(r.Construct, jsii.String("Work"), &awssqs.QueueProps{
		Encryption:        awssqs.QueueEncryption_SQS_MANAGED,
		EnforceSSL:        jsii.Bool(true),
		RetentionPeriod:   seconds(WorkRetention),
		VisibilityTimeout: seconds(WorkQueueVisibilityFactor * ReconcilerTimeout),
		DeadLetterQueue: &awssqs.DeadLetterQueue{
			Queue:           r.DeadLetterQueue,
			MaxReceiveCount: jsii.Number(p.MaxReceiveCount),
		},
	})
}

// onlyFunctionsSendWork keeps forged work off the queues: whatever IAM
// grants elsewhere (an administrator's sqs:*, another team's role), the
// work queue accepts messages only from the roles of the functions that
// produce work, and the dead-letter queue only from the reconciler's. An
// explicit Deny in the queue policy overrides any Allow in the sender's own
// policies. SQS moves the work queue's failed messages to the dead-letter
// queue itself, without a SendMessage; the reconciler sends there, with
// its reason, the work it could not finish in workqueue.MaxAttempts
// batches. Only the send action
// is denied, which also covers SendMessageBatch: administrators still read,
// purge and reconfigure both queues, this policy included.
//
// A dead-letter redrive needs sqs:SendMessage on its destination for
// whoever starts it: the roles of Props.RedriveRoles may send too. An exit
// claim in the dead-letter queue is the only record of its exit, so
// redriving it is how that exit still reaches its Pod.
func (r *Reaper) onlyFunctionsSendWork(redrivers []string) {
	var producers, consumers []*string
	for i, fn := range r.Functions() {
		if functions[i].produces {
			producers = append(producers, fn.Role().RoleArn())
		}
		if functions[i].consumes {
			consumers = append(consumers, fn.Role().RoleArn())
		}
	}
	producers = append(producers, *jsii.Strings(redrivers...)...)
	deny := func(sid string, q awssqs.Queue, conditions *map[string]any) {
		q.AddToResourcePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
			Sid:        jsii.String(sid),
			Effect:     awsiam.Effect_DENY,
			Principals: &[]awsiam.IPrincipal{awsiam.NewStarPrincipal()},
			Actions:    jsii.Strings(produceActions...),
			Resources:  &[]*string{q.QueueArn()},
			Conditions: conditions,
		}))
	}
	// aws:PrincipalArn is a role's ARN for any of its sessions. Any other
	// principal, a service or an anonymous caller included, matches
	// ArnNotEquals (a negated operator also matches a missing key).
	deny("SendOnlyFromReaperFunctions", r.WorkQueue, &map[string]any{"ArnNotEquals": map[string]any{"aws:PrincipalArn": producers}})
	deny("SendOnlyFromReconciler", r.DeadLetterQueue, &map[string]any{"ArnNotEquals": map[string]any{"aws:PrincipalArn": consumers}})
}

// onlyTriggersInvoke adds the stack's account to every permission that
// lets a service invoke a function. The subscription filter's
// LambdaDestination and the rules' LambdaFunction targets each add one,
// for their principal (logs.amazonaws.com, events.amazonaws.com) and with
// their log group's or rule's ARN as SourceArn, but without SourceAccount,
// the confused-deputy guard AWS advises alongside it: it still holds if a
// SourceArn is ever widened or taken from elsewhere. There are no other
// permissions: no function URL, no other principal; the reconciler's event
// source mapping polls with its role and needs none.
//
// A resource policy cannot deny: principals of the account whose own IAM
// policies grant lambda:InvokeFunction on a function can still invoke it.
func (r *Reaper) onlyTriggersInvoke(stack awscdk.Stack) {
	for _, c := range *r.Node().FindAll(constructs.ConstructOrder_PREORDER) {
		if p, ok := c.(awslambda.CfnPermission); ok && p.SourceAccount() == nil {
			p.SetSourceAccount(stack.Account())
		}
	}
}

// environment is a function's configuration (see pkg/config).
func (r *Reaper) environment(spec function) map[string]*string {
	p := r.Props
	env := map[string]*string{
		"REAPER_TABLE":             r.Table.TableName(),
		"REAPER_CLUSTER":           jsii.String(p.ClusterName),
		"REAPER_EXIT_WAIT":         jsii.String(p.ExitWait.String()),
		"REAPER_ORPHAN_GRACE":      jsii.String(p.OrphanGrace.String()),
		"REAPER_TERMINATE_STOPPED": jsii.String(strconv.FormatBool(*p.TerminateStopped)),
		"REAPER_DRY_RUN":           jsii.String(strconv.FormatBool(p.DryRun)),
		"REAPER_LOG_LEVEL":         jsii.String(p.LogLevel),
		metrics.NamespaceEnv:       jsii.String(p.MetricsNamespace),
		// The Go heap stays under 8 MB; fewer collections while client-go
		// registers its API types cut cold-start init by about a quarter
		// (bench/REPORT.md).
		"GOGC":             jsii.String("400"),
		"REAPER_QUEUE_URL": r.WorkQueue.QueueUrl(),
	}
	switch {
	case !spec.kube:
	case p.EKSCluster != "":
		env["REAPER_EKS_CLUSTER"] = jsii.String(p.EKSCluster)
	default:
		env["REAPER_KUBECONFIG_SECRET"] = jsii.String(p.KubeconfigSecretArn)
	}
	if spec.consumes {
		env["REAPER_DEAD_LETTER_QUEUE_URL"] = r.DeadLetterQueue.QueueUrl()
		// Each execution environment paces itself at share/concurrency
		// of each EC2 token bucket: together they spend at most share.
		env["REAPER_EC2_SHARE"] = jsii.String(strconv.FormatFloat(p.EC2Share, 'g', -1, 64))
		env["REAPER_RECONCILER_CONCURRENCY"] = jsii.String(strconv.Itoa(p.ReconcilerMaxConcurrency))
	}
	if spec.orphans && p.OrphanCap != nil {
		env["REAPER_ORPHAN_CAP"] = jsii.String(strconv.FormatFloat(*p.OrphanCap, 'g', -1, 64))
	}
	if spec.orphans {
		env["REAPER_POWER_OFF_GRACE"] = jsii.String(max(p.PowerOffGrace, 0).String())
	}
	def := model.DefaultTagKeys()
	for _, t := range []struct{ name, key, def string }{
		{"REAPER_TAG_MANAGED", p.Tags.Managed, def.Managed},
		{"REAPER_TAG_CLUSTER", p.Tags.Cluster, def.Cluster},
		{"REAPER_TAG_POD_NAMESPACE", p.Tags.PodNamespace, def.PodNamespace},
		{"REAPER_TAG_POD_NAME", p.Tags.PodName, def.PodName},
		{"REAPER_TAG_POD_UID", p.Tags.PodUID, def.PodUID},
		{"REAPER_TAG_CLUSTER_UID", p.Tags.ClusterUID, def.ClusterUID},
		{"REAPER_TAG_EXIT_TOKEN", p.Tags.ExitToken, def.ExitToken},
	} {
		if t.key != t.def {
			env[t.name] = jsii.String(t.key)
		}
	}
	if spec.terminates && p.Tags.PodWritten != "" {
		env["REAPER_TAG_POD_WRITTEN"] = jsii.String(p.Tags.PodWritten)
	}
	return env
}

// function creates one Lambda with its own role and log group and, unless
// the work queue invokes it, its asynchronous invoke configuration.
func (r *Reaper) function(stack awscdk.Stack, spec function) awslambda.Function {
	p := r.Props
	logs := awslogs.NewLogGroup(r.Construct, jsii.String(spec.id+"Logs"), &awslogs.LogGroupProps{
		Retention:     p.FunctionLogRetention,
		RemovalPolicy: awscdk.RemovalPolicy_DESTROY,
	})
	// An explicit role instead of the default one: the default attaches
	// AWSLambdaBasicExecutionRole, which may write to every log group.
	role := awsiam.NewRole(r.Construct, jsii.String(spec.id+"Role"), &awsiam.RoleProps{
		AssumedBy:   awsiam.NewServicePrincipal(jsii.String("lambda.amazonaws.com"), nil),
		Description: jsii.String("Reaper " + spec.name),
	})
	for _, s := range r.statements(stack, spec, logs) {
		role.AddToPrincipalPolicy(s)
	}
	if spec.kube && p.EKSAccessEntryGroup != "" {
		awseks.NewCfnAccessEntry(r.Construct, jsii.String(spec.id+"AccessEntry"), &awseks.CfnAccessEntryProps{
			ClusterName:      jsii.String(p.EKSCluster),
			PrincipalArn:     role.RoleArn(),
			KubernetesGroups: jsii.Strings(p.EKSAccessEntryGroup),
			Type:             jsii.String("STANDARD"),
		})
	}

	var reserved *float64
	switch {
	case spec.scheduled:
		reserved = jsii.Number(1)
	case p.ReservedConcurrency > 0:
		reserved = jsii.Number(p.ReservedConcurrency)
	}
	env := r.environment(spec)
	memory := p.MemoryMB
	if spec.consumes {
		memory = p.ReconcilerMemoryMB
	}
	props := &awslambda.FunctionProps{
		Description:                  jsii.String(spec.description),
		Runtime:                      awslambda.Runtime_PROVIDED_AL2023(),
		Architecture:                 awslambda.Architecture_ARM_64(),
		Handler:                      jsii.String("bootstrap"),
		Code:                         awslambda.Code_FromAsset(jsii.String(filepath.Join(p.BuildDir, spec.name)), nil),
		MemorySize:                   jsii.Number(memory),
		Timeout:                      seconds(spec.timeout),
		ReservedConcurrentExecutions: reserved,
		Role:                         role,
		Environment:                  &env,
		LogGroup:                     logs,
		LoggingFormat:                awslambda.LoggingFormat_JSON,
		ApplicationLogLevelV2:        applicationLogLevel(p.LogLevel),
		// INFO keeps the REPORT lines: duration and memory per invocation.
		SystemLogLevelV2: awslambda.SystemLogLevel_INFO,
	}
	switch {
	case spec.scheduled:
		props.RetryAttempts = jsii.Number(0)
		props.MaxEventAge = seconds(ScheduledMaxEventAge)
	case !spec.consumes:
		props.RetryAttempts = jsii.Number(RetryAttempts)
		props.MaxEventAge = seconds(p.MaxEventAge)
		props.OnFailure = awslambdadestinations.NewSqsDestination(r.FailureQueue)
	}
	fn := awslambda.NewFunction(r.Construct, jsii.String(spec.id), props)
	if len(p.SubnetIDs) > 0 {
		// Plain ids rather than an IVpc: the app takes them from context
		// without a VPC lookup (which would need credentials at synth).
		fn.Node().DefaultChild().(awslambda.CfnFunction).SetVpcConfig(&awslambda.CfnFunction_VpcConfigProperty{
			SubnetIds:        jsii.Strings(p.SubnetIDs...),
			SecurityGroupIds: jsii.Strings(p.SecurityGroupIDs...),
		})
	}
	return fn
}

// statements are the function's permissions beyond the failure queue,
// which its OnFailure destination grants, and the work queue's consumer
// rights, which the reconciler's event source grants.
func (r *Reaper) statements(stack awscdk.Stack, spec function, logs awslogs.LogGroup) []awsiam.PolicyStatement {
	p := r.Props
	st := func(sid string, actions []string, resources ...*string) awsiam.PolicyStatement {
		return awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
			Sid: jsii.String(sid), Actions: jsii.Strings(actions...), Resources: &resources,
		})
	}
	instanceArn := stack.FormatArn(&awscdk.ArnComponents{
		Service: jsii.String("ec2"), Resource: jsii.String("instance"), ResourceName: jsii.String("*"),
	})
	// TerminateInstances is the only EC2 action that changes anything. The
	// same ownership test the code applies, enforced by IAM: nothing Reaper
	// decides can end an instance the provider did not tag for this
	// deployment's cluster, such as another cluster's in the same account.
	terminate := awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:       jsii.String("TerminateOwnedInstances"),
		Actions:   jsii.Strings("ec2:TerminateInstances"),
		Resources: &[]*string{instanceArn},
		Conditions: &map[string]any{"StringEquals": map[string]any{
			"aws:ResourceTag/" + p.Tags.Managed: "true",
			"aws:ResourceTag/" + p.Tags.Cluster: p.ClusterName,
		}},
	})
	out := []awsiam.PolicyStatement{
		st("Logs", []string{"logs:CreateLogStream", "logs:PutLogEvents"}, logs.LogGroupArn()),
	}
	if spec.ledger {
		out = append(out, st("Ledger", ledgerActions, r.Table.TableArn()))
	}
	if spec.batchReads {
		out = append(out, st("BatchReadLedger", batchReadActions, r.Table.TableArn()))
	}
	if spec.sweeps {
		out = append(out, st("SweepPending", sweepIndexActions, jsii.String(*r.Table.TableArn()+"/index/"+ledger.PendingIndex)))
	}
	if spec.describes {
		// DescribeInstances has no resource-level permissions.
		out = append(out, st("DescribeInstances", []string{"ec2:DescribeInstances"}, jsii.String("*")))
	}
	if spec.terminates {
		out = append(out, terminate)
	}
	if spec.terminates && p.Tags.PodWritten != "" {
		// The Pod-written tag, and no other key, on owned instances only:
		// the rights to end or to mark another cluster's instances stay
		// out of reach.
		out = append(out, awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
			Sid:       jsii.String("TagPodWritten"),
			Actions:   jsii.Strings("ec2:CreateTags"),
			Resources: &[]*string{instanceArn},
			Conditions: &map[string]any{
				"StringEquals": map[string]any{
					"aws:ResourceTag/" + p.Tags.Managed: "true",
					"aws:ResourceTag/" + p.Tags.Cluster: p.ClusterName,
				},
				"ForAllValues:StringEquals": map[string]any{"aws:TagKeys": []string{p.Tags.PodWritten}},
			},
		}))
	}
	if spec.produces {
		out = append(out, st("SendWork", produceActions, r.WorkQueue.QueueArn()))
	}
	if spec.consumes {
		out = append(out, st("SendDeadLetters", produceActions, r.DeadLetterQueue.QueueArn()))
	}
	if len(p.SubnetIDs) > 0 {
		// What AWSLambdaVPCAccessExecutionRole grants but its logs:* on
		// every log group. Lambda checks these when it creates the
		// function, which depends on the role's policy, so they exist by
		// then. CreateNetworkInterface and DescribeNetworkInterfaces work
		// only on "*"; the network interfaces' ids are not known before.
		out = append(out, st("NetworkInterfaces", vpcActions, jsii.String("*")))
	}
	switch {
	case !spec.kube:
	case p.EKSCluster != "":
		out = append(out, st("DescribeCluster", []string{"eks:DescribeCluster"}, stack.FormatArn(&awscdk.ArnComponents{
			Service: jsii.String("eks"), Resource: jsii.String("cluster"), ResourceName: jsii.String(p.EKSCluster),
		})))
	default:
		out = append(out, st("ReadKubeconfig", []string{"secretsmanager:GetSecretValue"}, jsii.String(p.KubeconfigSecretArn)))
	}
	return out
}

// target is an EventBridge target with the same retry budget as the
// function's own asynchronous invoke configuration, so an event that cannot
// even be delivered also ends up in the failure queue.
func (r *Reaper) target(fn awslambda.Function) awsevents.IRuleTarget {
	return awseventstargets.NewLambdaFunction(fn, &awseventstargets.LambdaFunctionProps{
		DeadLetterQueue: r.FailureQueue,
		RetryAttempts:   jsii.Number(RetryAttempts),
		MaxEventAge:     seconds(r.Props.MaxEventAge),
	})
}

// alarms: any function error or throttle, any event in the failure queue
// or the dead-letter queue, and work older than QueueAgeAlarm in the work
// queue are worth a look; missing data (no invocations) is fine. The
// alarms on Reaper's own metrics are metricAlarms'.
func (r *Reaper) alarms() {
	p := r.Props
	switch {
	case p.AlarmTopicArn != "":
		r.AlarmTopic = awssns.Topic_FromTopicArn(r.Construct, jsii.String("AlarmTopic"), jsii.String(p.AlarmTopicArn))
	case p.AlarmEmail != "":
		r.AlarmTopic = awssns.NewTopic(r.Construct, jsii.String("AlarmTopic"), &awssns.TopicProps{
			DisplayName: jsii.String("Reaper alarms"),
			EnforceSSL:  jsii.Bool(true),
		})
	}
	if r.AlarmTopic != nil && p.AlarmEmail != "" {
		r.AlarmTopic.AddSubscription(awssnssubscriptions.NewEmailSubscription(jsii.String(p.AlarmEmail), nil))
	}

	sum := &awscloudwatch.MetricOptions{Period: seconds(alarmPeriod), Statistic: jsii.String("Sum")}
	for i, fn := range r.Functions() {
		spec := functions[i]
		retried := "it will be retried"
		throttled := "raise ReservedConcurrency or the account limit"
		switch {
		case spec.consumes:
			retried = "SQS delivers its batch again after the visibility timeout"
		case spec.scheduled:
			retried = "the next scheduled run redoes it"
			throttled = "a run outlasted SweepRate; the next waited for it, or was dropped after a minute and replaced by the one after: see the sweep lines' durationMs"
		}
		r.alarm(spec.id+"Errors", "Reaper "+spec.name+" failed an invocation ("+retried+"; see its logs)", fn.MetricErrors(sum), 0)
		r.alarm(spec.id+"Throttles", "Reaper "+spec.name+" was throttled ("+throttled+")", fn.MetricThrottles(sum), 0)
	}
	maximum := &awscloudwatch.MetricOptions{Period: seconds(alarmPeriod), Statistic: jsii.String("Maximum")}
	r.alarm("FailuresVisible", "Reaper events failed every retry and wait in the failure queue: inspect and replay them",
		r.FailureQueue.MetricApproximateNumberOfMessagesVisible(maximum), 0)
	r.alarm("DeadLettersVisible", fmt.Sprintf("Reaper work failed %d receives and waits in the work dead-letter queue: "+
		"its Pods may lack a terminal status and its instances may bill on until a sweep finds the work again; see the reconciler's logs and the messages "+
		"(an exit claim there is its exit's only record: once the cause is fixed, redrive with a role of RedriveRoles, the only other senders the work queue accepts)", p.MaxReceiveCount),
		r.DeadLetterQueue.MetricApproximateNumberOfMessagesVisible(maximum), 0)
	r.alarm("WorkQueueAge", fmt.Sprintf("Reaper work waited over %s in the work queue: the reconciler falls behind "+
		"(throttled, failing, or paced by its EC2 share); see its errors, throttles and EC2PacingWait", p.QueueAgeAlarm),
		r.WorkQueue.MetricApproximateAgeOfOldestMessage(maximum), p.QueueAgeAlarm.Seconds())
}

// alarmPeriod is the period every alarm evaluates, once.
const alarmPeriod = 5 * time.Minute

// alarm fires when one period of metric is above threshold, and notifies
// the alarm topic, if any, of that and of its return to OK.
func (r *Reaper) alarm(id, description string, metric awscloudwatch.IMetric, threshold float64) {
	a := awscloudwatch.NewAlarm(r.Construct, jsii.String(id), &awscloudwatch.AlarmProps{
		Metric:             metric,
		AlarmDescription:   jsii.String(description),
		Threshold:          jsii.Number(threshold),
		ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_THRESHOLD,
		EvaluationPeriods:  jsii.Number(1),
		TreatMissingData:   awscloudwatch.TreatMissingData_NOT_BREACHING,
	})
	if r.AlarmTopic != nil {
		action := awscloudwatchactions.NewSnsAction(r.AlarmTopic)
		a.AddAlarmAction(action)
		a.AddOkAction(action)
	}
	r.Alarms = append(r.Alarms, a)
}

func applicationLogLevel(level string) awslambda.ApplicationLogLevel {
	switch level {
	case "debug":
		return awslambda.ApplicationLogLevel_DEBUG
	case "warn":
		return awslambda.ApplicationLogLevel_WARN
	case "error":
		return awslambda.ApplicationLogLevel_ERROR
	}
	return awslambda.ApplicationLogLevel_INFO
}

func seconds(d time.Duration) awscdk.Duration {
	return awscdk.Duration_Seconds(jsii.Number(d.Seconds()))
}

func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
