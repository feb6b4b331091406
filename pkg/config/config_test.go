package config

import (
	"strings"
	"testing"
	"time"
)

func env(kv ...string) func(string) string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) string { return m[k] }
}

func TestDefaults(t *testing.T) {
	c, err := FromEnv(env("REAPER_TABLE", "ledger", "REAPER_CLUSTER", "prod", "KUBECONFIG", "/k"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Cluster != "prod" || c.Tags.Cluster != "reaper.io/cluster" || c.MetricsNamespace != "Reaper" || c.ExitWait != 3*time.Minute || c.OrphanGrace != 15*time.Minute || !c.TerminateStopped || c.DryRun ||
		c.Tags.Managed != "reaper.io/managed" || c.Tags.PodUID != "reaper.io/pod-uid" || c.Kube.Kubeconfig != "/k" {
		t.Fatalf("defaults %+v", c)
	}
}

func TestOverrides(t *testing.T) {
	c, err := FromEnv(env("REAPER_TABLE", "ledger", "REAPER_CLUSTER", "prod", "REAPER_EKS_CLUSTER", "prod", "REAPER_DRY_RUN", "true",
		"REAPER_TAG_CLUSTER", "example.com/cluster", "REAPER_METRICS_NAMESPACE", "Reaper/prod",
		"REAPER_EXIT_WAIT", "90s", "REAPER_ORPHAN_GRACE", "1h", "REAPER_TERMINATE_STOPPED", "false",
		"REAPER_TAG_MANAGED", "example.com/reap", "REAPER_LOG_LEVEL", "debug"))
	if err != nil {
		t.Fatal(err)
	}
	if !c.DryRun || c.ExitWait != 90*time.Second || c.OrphanGrace != time.Hour || c.TerminateStopped ||
		c.Tags.Managed != "example.com/reap" || c.Tags.Cluster != "example.com/cluster" || c.MetricsNamespace != "Reaper/prod" || c.Kube.EKSCluster != "prod" || c.LogLevel.String() != "DEBUG" {
		t.Fatalf("overrides %+v", c)
	}
}

// Every bad setting is reported at once, on one line.
func TestBadSettings(t *testing.T) {
	_, err := FromEnv(env("REAPER_DRY_RUN", "maybe", "REAPER_EXIT_WAIT", "-1m", "REAPER_ORPHAN_GRACE", "soon",
		"REAPER_EKS_CLUSTER", "a", "REAPER_KUBECONFIG_SECRET", "b"))
	if err == nil {
		t.Fatal("accepted")
	}
	msg := err.Error()
	for _, want := range []string{"REAPER_TABLE is not set", "REAPER_CLUSTER is not set", `REAPER_DRY_RUN="maybe"`, `REAPER_EXIT_WAIT="-1m": must be positive`,
		`REAPER_ORPHAN_GRACE="soon"`, "only one of REAPER_EKS_CLUSTER and REAPER_KUBECONFIG_SECRET"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not mention %q", msg, want)
		}
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("error spans lines: %q", msg)
	}
	if _, err := FromEnv(env("REAPER_TABLE", "t", "REAPER_CLUSTER", "c")); err == nil || !strings.Contains(err.Error(), "no Kubernetes access") {
		t.Errorf("missing Kubernetes access: %v", err)
	}
}
