package config

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/model"
)

// Vars lists exactly the variables Read reads: a variable read without its
// row would have no default and no line in the configuration reference.
func TestVarsAreWhatReadReads(t *testing.T) {
	read := map[string]bool{}
	getenv := func(name string) string {
		read[name] = true
		return ""
	}
	_, _ = readAll(getenv)
	var listed []string
	for _, v := range Vars {
		if v.Name == "" || v.Doc == "" {
			t.Errorf("%+v: every variable needs a name and a doc", v)
		}
		listed = append(listed, v.Name)
	}
	slices.Sort(listed)
	if got := slices.Sorted(maps.Keys(read)); !slices.Equal(got, listed) {
		t.Errorf("Read reads %v\nVars lists %v", got, listed)
	}
}

// The defaults written in Vars read back as the constants the rest of the
// code (the CDK construct among it) uses.
func TestDefaultsFromVars(t *testing.T) {
	c, err := readAll(env("REAPER_TABLE", "t", "REAPER_CLUSTER", "c", "REAPER_QUEUE_URL", "q", "KUBECONFIG", "/k"))
	if err != nil {
		t.Fatal(err)
	}
	if c.ExitWait != DefaultExitWait || c.OrphanGrace != DefaultOrphanGrace || c.OrphanCap != DefaultOrphanCap ||
		c.EC2Share != DefaultEC2Share || c.ReconcilerConcurrency != DefaultReconcilerConcurrency {
		t.Errorf("durations and numbers %+v", c)
	}
	if c.EC2Budget != model.PublishedBudget() {
		t.Errorf("EC2 budget %+v, want the published %+v (default %q)", c.EC2Budget, model.PublishedBudget(), lookup(env(), "REAPER_EC2_LIMITS"))
	}
	if c.Tags != model.DefaultTagKeys() || c.MetricsNamespace != metrics.DefaultNamespace || !c.TerminateStopped || c.DryRun {
		t.Errorf("tags, namespace, switches %+v", c)
	}
}

// Required says which functions fail to start without a variable, as Read
// checks it.
func TestRequiredAsReadChecks(t *testing.T) {
	full := map[string]string{"REAPER_TABLE": "t", "REAPER_CLUSTER": "c", "REAPER_QUEUE_URL": "q", "KUBECONFIG": "/k"}
	without := func(name string) func(string) string {
		return func(k string) string {
			if k == name {
				return ""
			}
			return full[k]
		}
	}
	for _, v := range Vars {
		_, errQueueing := Read(without(v.Name), Needs{})
		_, errKube := readAll(without(v.Name))
		switch v.Required {
		case requiredByAll:
			if errQueueing == nil || !strings.Contains(errQueueing.Error(), v.Name) {
				t.Errorf("%s unset: the queueing functions start (%v)", v.Name, errQueueing)
			}
		case requiredByKube:
			if errQueueing != nil || errKube == nil || !strings.Contains(errKube.Error(), v.Name) {
				t.Errorf("%s unset: queueing %v, sweeper and reconciler %v", v.Name, errQueueing, errKube)
			}
		case oneOfKube:
			// Any one of the three is enough; none is an error.
			only := func(k string) string {
				if k == "KUBECONFIG" || k == "REAPER_EKS_CLUSTER" || k == "REAPER_KUBECONFIG_SECRET" {
					if k == v.Name {
						return "x"
					}
					return ""
				}
				return full[k]
			}
			if _, err := readAll(only); err != nil {
				t.Errorf("%s alone: %v", v.Name, err)
			}
		case "":
			if errQueueing != nil || errKube != nil {
				t.Errorf("%s is optional, yet unset: %v, %v", v.Name, errQueueing, errKube)
			}
		default:
			t.Errorf("%s: Required %q is none of the known cases", v.Name, v.Required)
		}
	}
	none := func(k string) string {
		if k == "KUBECONFIG" {
			return ""
		}
		return full[k]
	}
	if _, err := readAll(none); err == nil || !strings.Contains(err.Error(), "no Kubernetes access") {
		t.Errorf("no Kubernetes access at all: %v", err)
	}
}

func TestBudgetTextRoundTrips(t *testing.T) {
	b := model.Budget{Describe: model.Bucket{Capacity: 7, Refill: 0.5}, Terminate: model.Bucket{Capacity: 1, Refill: 2},
		TerminateInstances: model.Bucket{Capacity: 3000, Refill: 60}, CreateTags: model.Bucket{Capacity: 9, Refill: 1.25}}
	got, err := model.ParseBudget(budgetText(b))
	if err != nil || got != b {
		t.Fatalf("%q parses as %+v, %v; want %+v", budgetText(b), got, err, b)
	}
}
