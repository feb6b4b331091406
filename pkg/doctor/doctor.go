// Package doctor checks a Reaper deployment from the operator's seat: the
// stack and its functions, Reaper's rights in the cluster, the admission
// policy and the FlowSchema, the launch tags of the running instances
// (the exit-token tag under the key the deployment reads), the exit lines
// arriving, and the queues where failed work waits. Each check
// gives a Result that says what it found and, when something is wrong, how
// to fix it. It only reads: nothing it does changes the deployment.
//
// `reaper doctor` (cmd/reaper) runs it with the operator's AWS credentials
// and kubeconfig.
package doctor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/cloudformation"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatchlogs"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"k8s.io/client-go/kubernetes"

	"github.com/reaper-k8s/reaper/pkg/model"
)

// Status is how a check came out.
type Status int

// The statuses, from best to worst but Skip, which is neither: a check is
// skipped when what it needs failed in an earlier check, which already
// counts.
const (
	Pass Status = iota
	Warn
	Fail
	Skip
)

func (s Status) String() string {
	switch s {
	case Pass:
		return "PASS"
	case Warn:
		return "WARN"
	case Fail:
		return "FAIL"
	}
	return "SKIP"
}

// Result is what one check found.
type Result struct {
	// Check names what was checked, e.g. "function reconciler".
	Check  string
	Status Status
	// Detail says what was found.
	Detail string
	// Fix says what to do about a warning or a failure.
	Fix string
}

// Options say which deployment to check and how.
type Options struct {
	// StackName is the CloudFormation stack of the deployment.
	StackName string
	// Cluster is the deployment's REAPER_CLUSTER. Empty: the one the
	// stack's functions run with. Set, the functions must run with it.
	Cluster string
	// Identity is who Reaper is in the cluster.
	Identity Identity
	// ProviderNodes is a label selector of the provider's Nodes, the ones
	// the admission policy must let Reaper write the Pods of
	// (DefaultProviderNodes).
	ProviderNodes string
	// LinesWithin is how far back an exit line counts as recent
	// (DefaultLinesWithin).
	LinesWithin time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Identity is who Reaper is in the cluster: the subjects of the RBAC
// binding, which the admission policy and the FlowSchema cover too.
type Identity struct {
	// Group is the Kubernetes group the functions' IAM roles map to, or
	// the organisation of a client certificate.
	Group string
	// ServiceAccountNamespace and ServiceAccount name the ServiceAccount
	// a kubeconfig's token authenticates as.
	ServiceAccountNamespace, ServiceAccount string
}

// DefaultIdentity is the identity of deploy/rbac.yaml and of the chart's
// default values.
var DefaultIdentity = Identity{Group: "reaper", ServiceAccountNamespace: "reaper", ServiceAccount: "reaper"}

// DefaultProviderNodes selects the Nodes of a virtual-kubelet provider:
// virtual-kubelet labels its node type=virtual-kubelet.
const DefaultProviderNodes = "type=virtual-kubelet"

// DefaultLinesWithin is how far back the exit-line check looks by default.
const DefaultLinesWithin = 24 * time.Hour

// Clients reach the deployment. Kube is nil when the cluster cannot be
// reached, KubeErr saying why; the Kubernetes checks then fail with it.
type Clients struct {
	AWS     aws.Config
	Kube    kubernetes.Interface
	KubeErr error
}

// Run runs every check, in the order of the deployment's layers: the stack
// and its functions first, whose settings (the cluster name, the tag keys,
// the log group, the queues) the later checks use.
func Run(ctx context.Context, c Clients, opts Options) []Result {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.ProviderNodes == "" {
		opts.ProviderNodes = DefaultProviderNodes
	}
	if opts.LinesWithin <= 0 {
		opts.LinesWithin = DefaultLinesWithin
	}
	if opts.Identity == (Identity{}) {
		opts.Identity = DefaultIdentity
	}
	if c.Kube == nil && c.KubeErr == nil {
		c.KubeErr = errors.New("no Kubernetes client")
	}
	r := &run{
		opts:   opts,
		cfn:    cloudformation.NewFromConfig(c.AWS),
		lambda: lambda.NewFromConfig(c.AWS),
		logs:   cloudwatchlogs.NewFromConfig(c.AWS),
		ec2:    ec2.NewFromConfig(c.AWS),
		sqs:    sqs.NewFromConfig(c.AWS),
		kube:   c.Kube, kubeErr: c.KubeErr,
		cluster: opts.Cluster,
		tags:    model.DefaultTagKeys(),
	}
	r.checkStack(ctx)
	r.checkFunctions(ctx)
	r.checkPermissions(ctx)
	r.checkAdmission(ctx)
	r.checkFlowSchema(ctx)
	r.checkInstances(ctx)
	r.checkExitTokens()
	r.checkExitLines(ctx)
	r.checkQueue(ctx, "dead-letter queue", outputDeadLetterQueue, deadLetterFix)
	r.checkQueue(ctx, "failure queue", outputFailureQueue, failureQueueFix)
	return r.results
}

// run is one doctor run: the clients, and what earlier checks learned.
type run struct {
	opts    Options
	cfn     *cloudformation.Client
	lambda  *lambda.Client
	logs    *cloudwatchlogs.Client
	ec2     *ec2.Client
	sqs     *sqs.Client
	kube    kubernetes.Interface
	kubeErr error

	// outputs are the stack's outputs; nil when the stack was not read.
	outputs map[string]string
	// functions are the functions found, by name (metrics.Function*).
	functions map[string]function
	// cluster and tags are the deployment's, from its functions'
	// environment (or Options.Cluster and the defaults).
	cluster string
	tags    model.TagKeys
	// clusterUID is the UID of the cluster's kube-system namespace; ""
	// when it could not be read.
	clusterUID string
	// managedRunning counts the running instances of the cluster; -1
	// when they could not be listed.
	managedRunning int
	// tokens sorts them by their exit-token tag; nil when they could not
	// be listed.
	tokens *tokenTags

	results []Result
}

func (r *run) add(check string, status Status, detail, fix string) {
	r.results = append(r.results, Result{Check: check, Status: status, Detail: detail, Fix: fix})
}

// Failed counts the failed results.
func Failed(results []Result) int {
	n := 0
	for _, res := range results {
		if res.Status == Fail {
			n++
		}
	}
	return n
}

// Write prints results as a list, one check a line with the fix of a
// warning or a failure below it, then a summary line.
func Write(w io.Writer, results []Result) error {
	var b strings.Builder
	counts := map[Status]int{}
	for _, res := range results {
		counts[res.Status]++
		fmt.Fprintf(&b, "%s  %s: %s\n", res.Status, res.Check, res.Detail)
		if res.Fix != "" && (res.Status == Warn || res.Status == Fail) {
			fmt.Fprintf(&b, "      fix: %s\n", res.Fix)
		}
	}
	fmt.Fprintf(&b, "\n%d checks: %d failed, %d warnings, %d passed, %d skipped\n",
		len(results), counts[Fail], counts[Warn], counts[Pass], counts[Skip])
	_, err := io.WriteString(w, b.String())
	return err
}
