package config

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/model"
)

// Var is one environment variable the functions read.
type Var struct {
	Name string
	// Default is what Read takes when the variable is unset or empty, as
	// it would be written in the environment; "" when there is none.
	Default string
	// Required names the functions that cannot start without it; "" when
	// none does.
	Required string
	// Doc says what it does.
	Doc string
}

// Who needs what (Needs): the exitrecorder and statechange only queue work;
// the sweeper and the reconciler also read the ledger and Kubernetes.
const (
	requiredByAll  = "every function"
	requiredByKube = "the sweeper and the reconciler"
	oneOfKube      = requiredByKube + ": one of REAPER_EKS_CLUSTER, REAPER_KUBECONFIG_SECRET and KUBECONFIG"
)

// Vars are every variable Read reads, in the order the configuration
// reference (docs/reference.md) lists them. They are the one home of the
// defaults: Read falls back to them, and the reference prints them.
var Vars = []Var{
	{Name: "REAPER_CLUSTER", Required: requiredByAll,
		Doc: "The cluster this deployment serves: Reaper acts only on instances tagged `<REAPER_TAG_MANAGED>=true` and `<REAPER_TAG_CLUSTER>=<REAPER_CLUSTER>`. The construct sets it: the EKS cluster's name, or `clusterName`."},
	{Name: "REAPER_QUEUE_URL", Required: requiredByAll,
		Doc: "The work queue: the exitrecorder, statechange and the sweeper send work to it, the reconciler its deferred work."},
	{Name: "REAPER_DEAD_LETTER_QUEUE_URL",
		Doc: "The work queue's dead-letter queue: the reconciler sends there, with the reason, the work it could not finish in `workqueue.MaxAttempts` batches. The construct sets it. Unset: such work is returned as a batch item failure, and the queue's redrive policy moves it there after `maxReceiveCount` receives."},
	{Name: "REAPER_TABLE", Required: requiredByKube,
		Doc: "The ledger table's name."},
	{Name: "REAPER_EKS_CLUSTER", Required: oneOfKube,
		Doc: "EKS cluster name: endpoint and CA from DescribeCluster, a `k8s-aws-v1.` IAM token (presigned STS, refreshed before its 15 min expiry)."},
	{Name: "REAPER_KUBECONFIG_SECRET", Required: oneOfKube,
		Doc: "Secrets Manager id of a secret holding a kubeconfig (a token or client certificate, not an exec plugin)."},
	{Name: "KUBECONFIG", Required: oneOfKube,
		Doc: "A kubeconfig file (local runs)."},
	{Name: "REAPER_DRY_RUN", Default: "false",
		Doc: "Decide and log, change nothing: no Pod write, no terminate, no ledger write."},
	{Name: "REAPER_EXIT_WAIT", Default: durationText(DefaultExitWait),
		Doc: "The exit-wait window: how long after an instance is gone a late exit line still wins."},
	{Name: "REAPER_ORPHAN_GRACE", Default: durationText(DefaultOrphanGrace),
		Doc: "How old a managed instance with no live Pod must be before the sweep queues it as an orphan."},
	{Name: "REAPER_ORPHAN_CAP", Default: strconv.FormatFloat(DefaultOrphanCap, 'g', -1, 64),
		Doc: "The most one sweep hands to the reconciler as orphans, as a part of the running owned instances (more than 0 and at most 1), but never fewer than 5, so that a small fleet's orphans go in one sweep; the rest wait for the next sweep and count as `OrphansHeldBack`."},
	{Name: "REAPER_POWER_OFF_GRACE", Default: durationText(DefaultPowerOffGrace),
		Doc: "The power-off grace: how long after a terminal exit (with `REAPER_TAG_POD_WRITTEN`: after Reaper's write of its Pod, if later) an instance still running is left to power itself off before Reaper terminates it; 0 to 15m, 0: at once."},
	{Name: "REAPER_TERMINATE_STOPPED", Default: "true",
		Doc: "Terminate managed instances that stop: a stopped one-Pod instance does no work and still bills its volumes. With `false` they stay stopped; their Pod still ends after the exit-wait window."},
	{Name: "REAPER_EC2_LIMITS", Default: budgetText(model.PublishedBudget()),
		Doc: "The account's EC2 token buckets, `name=capacity/refill,…` (refill in tokens a second): `describe` (DescribeInstances requests), `terminate` (TerminateInstances requests), `terminate-instances` (instances named in them), `create-tags` (CreateTags requests, the bucket of mutating actions). The default is EC2's published limits; set it for an account whose limits AWS has raised; buckets not named keep the default."},
	{Name: "REAPER_EC2_SHARE", Default: strconv.FormatFloat(DefaultEC2Share, 'g', -1, 64),
		Doc: "The part of each of the account's EC2 token buckets the reconcilers may spend together; more than 0 and at most 1."},
	{Name: "REAPER_RECONCILER_CONCURRENCY", Default: strconv.Itoa(DefaultReconcilerConcurrency),
		Doc: "How many reconcilers run at once (the event source mapping's maximum concurrency): each paces itself at `REAPER_EC2_SHARE / REAPER_RECONCILER_CONCURRENCY` of each bucket."},
	{Name: "REAPER_TAG_MANAGED", Default: model.DefaultTagManaged,
		Doc: "Tag key (value `true`) marking the instances Reaper may terminate."},
	{Name: "REAPER_TAG_CLUSTER", Default: model.DefaultTagCluster,
		Doc: "Tag key whose value names the cluster an instance belongs to."},
	{Name: "REAPER_TAG_POD_NAMESPACE", Default: model.DefaultTagPodNamespace,
		Doc: "Tag key of the Pod's namespace."},
	{Name: "REAPER_TAG_POD_NAME", Default: model.DefaultTagPodName,
		Doc: "Tag key of the Pod's name."},
	{Name: "REAPER_TAG_POD_UID", Default: model.DefaultTagPodUID,
		Doc: "Tag key of the Pod's UID."},
	{Name: "REAPER_TAG_CLUSTER_UID", Default: model.DefaultTagClusterUID,
		Doc: "Tag key of the cluster identity (the UID of the cluster's `kube-system` namespace): an instance is an orphan only when it equals the identity of the apiserver Reaper reaches."},
	{Name: "REAPER_TAG_EXIT_TOKEN", Default: model.DefaultTagExitToken,
		Doc: "Tag key of the SHA-256 of each launch's [exit token](provider.md#the-exit-token)."},
	{Name: "REAPER_TAG_POD_WRITTEN",
		Doc: "Tag key Reaper puts on a running instance once its Pod carries its terminal exit, for hosts that power off when the Pod is written; needs `REAPER_POWER_OFF_GRACE` and a key the instance metadata can show (no `/`). Unset: Reaper tags nothing."},
	{Name: "REAPER_LOG_LEVEL", Default: "info",
		Doc: "`debug`, `info`, `warn` or `error` (JSON logs on stdout). Metrics are `info` lines, so `warn` and `error` drop them."},
	{Name: metrics.NamespaceEnv, Default: metrics.DefaultNamespace,
		Doc: "The CloudWatch namespace of the metrics (the construct sets `Reaper/<cluster>`)."},
}

// lookup is the variable's value, or its default when it is unset or
// empty.
func lookup(getenv func(string) string, name string) string {
	if v := getenv(name); v != "" {
		return v
	}
	for _, v := range Vars {
		if v.Name == name {
			return v.Default
		}
	}
	return ""
}

// durationText writes d as a Go duration without trailing zero units
// (3m, not 3m0s).
func durationText(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// budgetText writes b as REAPER_EC2_LIMITS takes it (model.ParseBudget).
func budgetText(b model.Budget) string {
	bucket := func(name string, k model.Bucket) string {
		return fmt.Sprintf("%s=%d/%s", name, k.Capacity, strconv.FormatFloat(k.Refill, 'g', -1, 64))
	}
	return strings.Join([]string{
		bucket("describe", b.Describe), bucket("terminate", b.Terminate),
		bucket("terminate-instances", b.TerminateInstances), bucket("create-tags", b.CreateTags),
	}, ",")
}
