package config

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/reaper-k8s/reaper/pkg/model"
)

func env(kv ...string) func(string) string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) string { return m[k] }
}

func TestDefaults(t *testing.T) {
	c, err := readAll(env("REAPER_TABLE", "ledger", "REAPER_CLUSTER", "prod", "KUBECONFIG", "/k", "REAPER_QUEUE_URL", "http://q"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Cluster != "prod" || c.Tags.Cluster != "reaper.io/cluster" || c.MetricsNamespace != "Reaper" || c.ExitWait != 3*time.Minute || c.OrphanGrace != 15*time.Minute || !c.TerminateStopped || c.DryRun ||
		c.Tags.Managed != "reaper.io/managed" || c.Tags.PodUID != "reaper.io/pod-uid" || c.Kube.Kubeconfig != "/k" ||
		c.OrphanCap != 0.1 || c.PowerOffGrace != DefaultPowerOffGrace || c.Tags.ClusterUID != "reaper.io/cluster-uid" || c.Tags.ExitToken != "reaper.io/exit-token-sha256" {
		t.Fatalf("defaults %+v", c)
	}
}

func TestOverrides(t *testing.T) {
	c, err := readAll(env("REAPER_TABLE", "ledger", "REAPER_CLUSTER", "prod", "REAPER_EKS_CLUSTER", "prod", "REAPER_DRY_RUN", "true",
		"REAPER_QUEUE_URL", "http://q", "REAPER_EC2_SHARE", "0.8", "REAPER_RECONCILER_CONCURRENCY", "4", "REAPER_EC2_LIMITS", "terminate-instances=5000/100",
		"REAPER_TAG_CLUSTER", "example.com/cluster", "REAPER_METRICS_NAMESPACE", "Reaper/prod",
		"REAPER_EXIT_WAIT", "90s", "REAPER_ORPHAN_GRACE", "1h", "REAPER_TERMINATE_STOPPED", "false",
		"REAPER_TAG_MANAGED", "example.com/reap", "REAPER_LOG_LEVEL", "debug",
		"REAPER_ORPHAN_CAP", "0.25", "REAPER_POWER_OFF_GRACE", "30s", "REAPER_TAG_CLUSTER_UID", "example.com/cluster-uid",
		"REAPER_TAG_POD_WRITTEN", "example.com:pod-written", "REAPER_TAG_EXIT_TOKEN", "example.com/exit-token"))
	if err != nil {
		t.Fatal(err)
	}
	if c.OrphanCap != 0.25 || c.PowerOffGrace != 30*time.Second || c.Tags.ClusterUID != "example.com/cluster-uid" || c.Tags.PodWritten != "example.com:pod-written" ||
		c.Tags.ExitToken != "example.com/exit-token" {
		t.Fatalf("orphan cap, power-off grace, identity tag: %+v", c)
	}
	if !c.DryRun || c.ExitWait != 90*time.Second || c.OrphanGrace != time.Hour || c.TerminateStopped ||
		c.Tags.Managed != "example.com/reap" || c.Tags.Cluster != "example.com/cluster" || c.MetricsNamespace != "Reaper/prod" || c.Kube.EKSCluster != "prod" || c.LogLevel.String() != "DEBUG" ||
		c.ReconcilerBudget() != (model.Budget{Describe: model.Bucket{Capacity: 20, Refill: 4}, Terminate: model.Bucket{Capacity: 20, Refill: 1}, TerminateInstances: model.Bucket{Capacity: 1000, Refill: 20},
			CreateTags: model.Bucket{Capacity: 10, Refill: 1}}) {
		t.Fatalf("overrides %+v", c)
	}
}

// Every bad setting is reported at once, on one line.
func TestBadSettings(t *testing.T) {
	_, err := readAll(env("REAPER_DRY_RUN", "maybe", "REAPER_EXIT_WAIT", "-1m", "REAPER_ORPHAN_GRACE", "soon",
		"REAPER_EKS_CLUSTER", "a", "REAPER_KUBECONFIG_SECRET", "b", "REAPER_EC2_SHARE", "2", "REAPER_EC2_LIMITS", "describe=many",
		"REAPER_ORPHAN_CAP", "0", "REAPER_POWER_OFF_GRACE", "1h"))
	if err == nil {
		t.Fatal("accepted")
	}
	msg := err.Error()
	for _, want := range []string{"REAPER_TABLE is not set", "REAPER_CLUSTER is not set", `REAPER_DRY_RUN="maybe"`, `REAPER_EXIT_WAIT="-1m": must be positive`,
		`REAPER_ORPHAN_GRACE="soon"`, "only one of REAPER_EKS_CLUSTER and REAPER_KUBECONFIG_SECRET",
		`REAPER_ORPHAN_CAP="0": must be more than 0`, `REAPER_POWER_OFF_GRACE="1h": must be from 0 to 15m`} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not mention %q", msg, want)
		}
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("error spans lines: %q", msg)
	}
	if _, err := readAll(env("REAPER_TABLE", "t", "REAPER_CLUSTER", "c", "REAPER_QUEUE_URL", "q")); err == nil || !strings.Contains(err.Error(), "no Kubernetes access") {
		t.Errorf("missing Kubernetes access: %v", err)
	}
	// The Pod-written tag is read through the instance metadata, and only
	// a grace gives the host time to read it.
	base := []string{"REAPER_TABLE", "t", "REAPER_CLUSTER", "c", "REAPER_QUEUE_URL", "q", "KUBECONFIG", "/k"}
	for _, tc := range []struct{ extra []string }{
		{[]string{"REAPER_TAG_POD_WRITTEN", "reaper.io/pod-written", "REAPER_POWER_OFF_GRACE", "10s"}},
		{[]string{"REAPER_TAG_POD_WRITTEN", "reaper.io:pod-written", "REAPER_POWER_OFF_GRACE", "0s"}},
	} {
		if _, err := readAll(env(append(slices.Clone(base), tc.extra...)...)); err == nil || !strings.Contains(err.Error(), "REAPER_TAG_POD_WRITTEN") {
			t.Errorf("%v: %v", tc.extra, err)
		}
	}
	// A function that only enqueues needs neither the ledger nor Kubernetes.
	if _, err := Read(env("REAPER_CLUSTER", "c", "REAPER_QUEUE_URL", "q"), Needs{}); err != nil {
		t.Errorf("statechange's settings: %v", err)
	}
}

// readAll reads the configuration of a function that needs everything.
func readAll(getenv func(string) string) (Config, error) {
	return Read(getenv, Needs{Ledger: true, Kube: true})
}
