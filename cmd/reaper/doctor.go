package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/reaper-k8s/reaper/internal/cli"
	"github.com/reaper-k8s/reaper/pkg/app"
	"github.com/reaper-k8s/reaper/pkg/doctor"
)

func init() {
	cli.Register("doctor", cli.Command{
		Summary: "check a deployment: the stack, Reaper's rights in the cluster, the instances' tags, the exit lines, the queues",
		Run:     runDoctor,
	})
}

const doctorUsage = `usage: reaper doctor -cluster NAME | -stack NAME [flags]

Checks a Reaper deployment from the operator's seat and prints one line per
check (PASS, WARN, FAIL or SKIP), with the fix below each warning and
failure. It exits 1 when a check fails. It only reads.

AWS: the SDK's usual credentials and region (AWS_PROFILE, AWS_REGION, ...);
it needs cloudformation:DescribeStacks and ListStackResources,
lambda:GetFunction, ec2:DescribeInstances, logs:DescribeSubscriptionFilters
and FilterLogEvents, and sqs:GetQueueAttributes.
Kubernetes: the current context of KUBECONFIG (or ~/.kube/config), as a
cluster administrator: it asks the apiserver what Reaper's identities may
do (SubjectAccessReviews) and reads the admission policy, the FlowSchema,
the Nodes and the kube-system namespace.

flags:
`

func runDoctor(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("doctor", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), doctorUsage)
		fs.PrintDefaults()
	}
	opts := doctor.Options{Identity: doctor.DefaultIdentity}
	var serviceAccount string
	fs.StringVar(&opts.Cluster, "cluster", os.Getenv("REAPER_CLUSTER"),
		"the deployment's cluster (its REAPER_CLUSTER; default $REAPER_CLUSTER); names the stack unless -stack does")
	fs.StringVar(&opts.StackName, "stack", "", "the deployment's CloudFormation stack (default "+doctor.StackNamePrefix+"-<cluster>, as the CDK app names it)")
	fs.StringVar(&opts.Identity.Group, "group", doctor.DefaultIdentity.Group, "the Kubernetes group Reaper's functions authenticate in (the RBAC binding's group)")
	fs.StringVar(&serviceAccount, "service-account", doctor.DefaultIdentity.ServiceAccountNamespace+"/"+doctor.DefaultIdentity.ServiceAccount,
		"NAMESPACE/NAME of the ServiceAccount a kubeconfig of Reaper's authenticates as (the RBAC binding's)")
	fs.StringVar(&opts.ProviderNodes, "provider-nodes", doctor.DefaultProviderNodes,
		"label selector of the provider's Nodes, whose names the admission policy's node prefix must match (virtual-kubelet labels its Nodes type=virtual-kubelet); "+
			"while none matches, the provider not started yet, the admission check warns")
	fs.DurationVar(&opts.LinesWithin, "lines-within", doctor.DefaultLinesWithin, "how far back an exit line counts as recent")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	ns, name, ok := strings.Cut(serviceAccount, "/")
	if !ok || ns == "" || name == "" {
		return fmt.Errorf("-service-account %q: want NAMESPACE/NAME", serviceAccount)
	}
	opts.Identity.ServiceAccountNamespace, opts.Identity.ServiceAccount = ns, name
	if opts.StackName == "" {
		if opts.Cluster == "" {
			return errors.New("name the deployment: -cluster (its REAPER_CLUSTER) or -stack (its CloudFormation stack)")
		}
		opts.StackName = doctor.DefaultStackName(opts.Cluster)
	}
	if sel, err := labels.Parse(opts.ProviderNodes); err != nil || sel.Empty() {
		return fmt.Errorf("-provider-nodes %q: want a label selector of the provider's Nodes, e.g. %s", opts.ProviderNodes, doctor.DefaultProviderNodes)
	}
	if opts.LinesWithin <= 0 {
		return fmt.Errorf("-lines-within %v: want a positive duration", opts.LinesWithin)
	}

	awsCfg, err := app.AWSConfig(ctx)
	if err != nil {
		return err
	}
	clients := doctor.Clients{AWS: awsCfg}
	clients.Kube, clients.KubeErr = kubeClient()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	results := doctor.Run(ctx, clients, opts)
	if err := doctor.Write(os.Stdout, results); err != nil {
		return err
	}
	switch n := doctor.Failed(results); n {
	case 0:
		return nil
	case 1:
		return errors.New("1 check failed")
	default:
		return fmt.Errorf("%d checks failed", n)
	}
}

// kubeClient is a client for the current context of the kubeconfig, found
// as kubectl finds it.
func kubeClient() (kubernetes.Interface, error) {
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(clientcmd.NewDefaultClientConfigLoadingRules(), &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, err
	}
	cfg.Timeout = 15 * time.Second
	cfg.UserAgent = "reaper-doctor"
	return kubernetes.NewForConfig(cfg)
}
