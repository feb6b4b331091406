// Package config reads Reaper's settings from the environment. A bad or
// missing setting is one clear error at init, never a surprise later.
package config

import (
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/model"
)

// Config is every knob, with its environment variable in the comment.
type Config struct {
	// Table is the ledger table (REAPER_TABLE, required).
	Table string
	// Cluster names the cluster this deployment serves (REAPER_CLUSTER,
	// required): only instances tagged with it are Reaper's.
	Cluster string
	// DryRun decides and logs, changes nothing (REAPER_DRY_RUN, default false).
	DryRun bool
	// ExitWait is how long after an instance is gone a late exit line still
	// wins (REAPER_EXIT_WAIT, default 3m).
	ExitWait time.Duration
	// OrphanGrace is how old a managed instance with no live Pod must be
	// before the sweep terminates it (REAPER_ORPHAN_GRACE, default 15m).
	OrphanGrace time.Duration
	// PowerOffGrace is how long after Reaper received the exit that ended
	// its Pod (or its sidecars' grace ended; with REAPER_TAG_POD_WRITTEN:
	// after Reaper's write of the Pod, if later) a running instance is
	// left to power itself off before Reaper terminates it
	// (REAPER_POWER_OFF_GRACE, default DefaultPowerOffGrace; 0: at once;
	// at most 15m).
	PowerOffGrace time.Duration
	// OrphanCap is the most a sweep terminates as orphans, as a part of the
	// owned instances running (REAPER_ORPHAN_CAP, default 0.1, in (0, 1]):
	// a wrong Kubernetes endpoint makes every instance look orphaned.
	OrphanCap float64
	// TerminateStopped terminates managed instances that stop
	// (REAPER_TERMINATE_STOPPED, default true).
	TerminateStopped bool
	// Tags are the instance tag keys (REAPER_TAG_MANAGED, REAPER_TAG_CLUSTER,
	// REAPER_TAG_POD_NAMESPACE, REAPER_TAG_POD_NAME, REAPER_TAG_POD_UID,
	// REAPER_TAG_CLUSTER_UID, REAPER_TAG_EXIT_TOKEN, and
	// REAPER_TAG_POD_WRITTEN, which has no default and needs
	// REAPER_POWER_OFF_GRACE).
	Tags model.TagKeys
	// Kube says how to reach the Kubernetes API: exactly one of
	// REAPER_EKS_CLUSTER, REAPER_KUBECONFIG_SECRET or KUBECONFIG.
	Kube KubeAccess
	// LogLevel is debug, info, warn or error (REAPER_LOG_LEVEL, default info).
	LogLevel slog.Level
	// MetricsNamespace is the CloudWatch namespace of the metrics
	// (REAPER_METRICS_NAMESPACE, default Reaper).
	MetricsNamespace string
	// QueueURL is the work queue (REAPER_QUEUE_URL, required).
	QueueURL string
	// DeadLetterURL is the work queue's dead-letter queue
	// (REAPER_DEAD_LETTER_QUEUE_URL), where the reconciler sends work it
	// could not finish.
	DeadLetterURL string
	// EC2Budget is the account's EC2 token buckets (REAPER_EC2_LIMITS,
	// "describe=100/20,terminate=100/5,terminate-instances=1000/20" to
	// override the published defaults for an account with raised limits).
	EC2Budget model.Budget
	// EC2Share is the part of each bucket the reconciler may spend
	// (REAPER_EC2_SHARE, default 0.5, in (0, 1]).
	EC2Share float64
	// ReconcilerConcurrency is how many reconcilers run at once, the event
	// source mapping's maximum concurrency (REAPER_RECONCILER_CONCURRENCY,
	// default 2): each paces itself at EC2Share / ReconcilerConcurrency.
	ReconcilerConcurrency int
}

// ReconcilerBudget is what one reconciler may spend of EC2's buckets.
func (c Config) ReconcilerBudget() model.Budget {
	return c.EC2Budget.Share(c.EC2Share / float64(c.ReconcilerConcurrency))
}

// KubeAccess is how to reach the Kubernetes API.
type KubeAccess struct {
	// EKSCluster is an EKS cluster name: endpoint and CA from
	// DescribeCluster, an IAM token for auth.
	EKSCluster string
	// KubeconfigSecret is a Secrets Manager id holding a kubeconfig.
	KubeconfigSecret string
	// Kubeconfig is a kubeconfig file path (local runs).
	Kubeconfig string
}

// Defaults of the optional settings.
const (
	DefaultExitWait    = 3 * time.Minute
	DefaultOrphanGrace = 15 * time.Minute
	DefaultEC2Share    = 0.5
	DefaultOrphanCap   = 0.1
	// DefaultPowerOffGrace outlasts the default user-data's power-off after
	// the exit, and a burst's first batches, so that Reaper's
	// TerminateInstances names only the hosts that do not power off; why
	// this value, measured: docs/concepts.md, "How long a grace". The one
	// default: a function run bare (sam local invoke) and the stack's
	// construct both take it.
	DefaultPowerOffGrace         = 30 * time.Second
	DefaultReconcilerConcurrency = 2
)

// Needs are the settings a function cannot run without, beyond those every
// function needs (REAPER_CLUSTER, REAPER_QUEUE_URL).
type Needs struct {
	// Ledger: REAPER_TABLE.
	Ledger bool
	// Kube: a way to reach the Kubernetes API.
	Kube bool
}

// Read reads the configuration through getenv (os.Getenv in handlers) and
// checks that what needs asks for is set.
func Read(getenv func(string) string, needs Needs) (Config, error) {
	// Every setting left unset takes its default from Vars.
	c := Config{
		Table:            getenv("REAPER_TABLE"),
		Cluster:          getenv("REAPER_CLUSTER"),
		MetricsNamespace: lookup(getenv, metrics.NamespaceEnv),
		QueueURL:         getenv("REAPER_QUEUE_URL"),
		DeadLetterURL:    getenv("REAPER_DEAD_LETTER_QUEUE_URL"),
		Kube: KubeAccess{
			EKSCluster:       getenv("REAPER_EKS_CLUSTER"),
			KubeconfigSecret: getenv("REAPER_KUBECONFIG_SECRET"),
			Kubeconfig:       getenv("KUBECONFIG"),
		},
	}
	var errs []error
	if c.Table == "" && needs.Ledger {
		errs = append(errs, errors.New("REAPER_TABLE is not set (the ledger table name)"))
	}
	if c.Cluster == "" {
		errs = append(errs, errors.New("REAPER_CLUSTER is not set (the cluster whose instances this deployment owns)"))
	}
	if c.QueueURL == "" {
		errs = append(errs, errors.New("REAPER_QUEUE_URL is not set (the work queue)"))
	}
	errs = append(errs,
		parse(getenv, "REAPER_EC2_LIMITS", &c.EC2Budget, model.ParseBudget),
		parse(getenv, "REAPER_EC2_SHARE", &c.EC2Share, share),
		parse(getenv, "REAPER_RECONCILER_CONCURRENCY", &c.ReconcilerConcurrency, positiveInt),
		parse(getenv, "REAPER_DRY_RUN", &c.DryRun, strconv.ParseBool),
		parse(getenv, "REAPER_TERMINATE_STOPPED", &c.TerminateStopped, strconv.ParseBool),
		parse(getenv, "REAPER_EXIT_WAIT", &c.ExitWait, positiveDuration),
		parse(getenv, "REAPER_ORPHAN_GRACE", &c.OrphanGrace, positiveDuration),
		parse(getenv, "REAPER_ORPHAN_CAP", &c.OrphanCap, share),
		parse(getenv, "REAPER_POWER_OFF_GRACE", &c.PowerOffGrace, grace),
		parse(getenv, "REAPER_LOG_LEVEL", &c.LogLevel, logLevel),
	)
	for _, t := range []struct {
		name string
		key  *string
	}{
		{"REAPER_TAG_MANAGED", &c.Tags.Managed},
		{"REAPER_TAG_CLUSTER", &c.Tags.Cluster},
		{"REAPER_TAG_POD_NAMESPACE", &c.Tags.PodNamespace},
		{"REAPER_TAG_POD_NAME", &c.Tags.PodName},
		{"REAPER_TAG_POD_UID", &c.Tags.PodUID},
		{"REAPER_TAG_CLUSTER_UID", &c.Tags.ClusterUID},
		{"REAPER_TAG_EXIT_TOKEN", &c.Tags.ExitToken},
		{"REAPER_TAG_POD_WRITTEN", &c.Tags.PodWritten},
	} {
		*t.key = lookup(getenv, t.name)
	}
	switch k := c.Tags.PodWritten; {
	case k == "":
	case !model.ValidMetadataTagKey(k):
		errs = append(errs, fmt.Errorf("REAPER_TAG_POD_WRITTEN=%q: the hosts read it through the instance metadata, whose tag keys hold only letters, digits and + - = . , _ : @ (no \"/\")", k))
	case c.PowerOffGrace == 0:
		errs = append(errs, errors.New("REAPER_TAG_POD_WRITTEN needs REAPER_POWER_OFF_GRACE: without a grace Reaper terminates an instance as soon as it has written its Pod, before its host can read the tag"))
	}
	switch n := count(c.Kube.EKSCluster, c.Kube.KubeconfigSecret); {
	case n > 1:
		errs = append(errs, errors.New("set only one of REAPER_EKS_CLUSTER and REAPER_KUBECONFIG_SECRET"))
	case n == 0 && c.Kube.Kubeconfig == "" && needs.Kube:
		errs = append(errs, errors.New("no Kubernetes access: set REAPER_EKS_CLUSTER, REAPER_KUBECONFIG_SECRET or KUBECONFIG"))
	}
	if err := errors.Join(errs...); err != nil {
		return Config{}, fmt.Errorf("configuration: %s", strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	return c, nil
}

// parse sets *dst from the variable, or from its default when it is unset.
func parse[T any](getenv func(string) string, name string, dst *T, conv func(string) (T, error)) error {
	raw := lookup(getenv, name)
	if raw == "" {
		return nil
	}
	v, err := conv(raw)
	if err != nil {
		return fmt.Errorf("%s=%q: %v", name, raw, err)
	}
	*dst = v
	return nil
}

func positiveDuration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err == nil && d <= 0 {
		err = errors.New("must be positive")
	}
	return d, err
}

// grace is a duration from 0 to 15m: a wake-up waits on the work queue,
// whose longest delay is 15 minutes.
func grace(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err == nil && (d < 0 || d > 15*time.Minute) {
		err = errors.New("must be from 0 to 15m")
	}
	return d, err
}

func share(s string) (float64, error) {
	f, err := strconv.ParseFloat(s, 64)
	if err == nil && (f <= 0 || f > 1) {
		err = errors.New("must be more than 0 and at most 1")
	}
	return f, err
}

func positiveInt(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err == nil && n < 1 {
		err = errors.New("must be at least 1")
	}
	return n, err
}

func logLevel(s string) (slog.Level, error) {
	var l slog.Level
	err := l.UnmarshalText([]byte(s))
	return l, err
}

func count(values ...string) int {
	n := 0
	for _, v := range values {
		if v != "" {
			n++
		}
	}
	return n
}
