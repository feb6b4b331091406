package instances_test

import (
	"slices"
	"testing"

	"github.com/reaper-k8s/reaper/internal/ec2server"
	"github.com/reaper-k8s/reaper/pkg/instances"
	"github.com/reaper-k8s/reaper/pkg/model"
)

// TerminateInstances is all-or-nothing: an instance with termination
// protection, or one that vanished since the lookup, fails the call for
// all. Those instances cost themselves only: every other instance is
// terminated, in a few calls, and the refusals are reported with EC2's
// code.
func TestTerminateIsolatesRefusals(t *testing.T) {
	fleet, srv, ids := newFleet(t, 100, 1000)
	fleet.Pace(scaled(100).Share(0.5), nil) // a call that fails spends its tokens too
	known := describeAll(t, fleet, ids)
	keys := model.DefaultTagKeys()
	protected := []string{ids[10], ids[500], ids[999]}
	for _, id := range protected {
		srv.RemoveInstance(id)
		srv.AddInstance(ec2server.Instance{ID: id, DisableAPITermination: true, Tags: map[string]string{keys.Managed: "true", keys.Cluster: cluster}})
	}
	vanished := []string{ids[3], ids[700]}
	for _, id := range vanished {
		srv.RemoveInstance(id)
	}

	res := fleet.Terminate(t.Context(), ids, known)
	if len(res.Refusals) != len(protected) || len(res.Left) != 0 {
		t.Fatalf("%d refusals, %d left (%v): want the %d refusals, none left", len(res.Refusals), len(res.Left), firstLeft(res.Left), len(protected))
	}
	for _, id := range ids {
		want := instances.Terminating
		switch {
		case slices.Contains(protected, id):
			want = instances.Refused
			if res.Refusals[id] != "OperationNotPermitted" {
				t.Errorf("%s refused for %q", id, res.Refusals[id])
			}
		case slices.Contains(vanished, id):
			want = instances.AlreadyGone
		}
		if res.Outcome[id] != want {
			t.Fatalf("%s: %q, want %q", id, res.Outcome[id], want)
		}
	}
	for _, id := range protected {
		if i, _ := srv.Instance(id); i.State != ec2server.Running {
			t.Fatalf("protected instance %s is %s", id, i.State)
		}
	}
	// One call per 500 instances (the half share's burst), then one more
	// per refusal a message names.
	if n := srv.CallCount("TerminateInstances"); n > 2+len(protected)+len(vanished) {
		t.Fatalf("%d TerminateInstances calls to isolate %d refusals", n, len(protected)+len(vanished))
	}
}

// An error that names no instance (an IAM denial's encoded message) is
// isolated by halves: a call it no longer fails terminates its instances.
func TestTerminateBisectsAnUnnamedRefusal(t *testing.T) {
	fleet, srv, ids := newFleet(t, 100, 1000)
	fleet.Pace(scaled(100).Share(0.5), nil) // a call that fails spends its tokens too
	known := describeAll(t, fleet, ids)
	srv.FailNext("TerminateInstances", 1, "UnauthorizedOperation", 403)
	res := fleet.Terminate(t.Context(), ids, known)
	if len(res.Left) != 0 || len(res.Refusals) != 0 {
		t.Fatalf("%d left (%v), %d refused", len(res.Left), firstLeft(res.Left), len(res.Refusals))
	}
	for _, id := range ids {
		if res.Outcome[id] != instances.Terminating {
			t.Fatalf("%s: %q", id, res.Outcome[id])
		}
	}
	if n := srv.CallCount("TerminateInstances"); n != 4 {
		t.Fatalf("%d TerminateInstances calls, want two of 500 (the half share's burst) and the failed one's two halves", n)
	}
}

// Tag puts one tag on any number of instances, 1,000 ids a CreateTags,
// each call paced by the CreateTags bucket.
func TestTagChunksAndPaces(t *testing.T) {
	fleet, srv, ids := newFleet(t, 100, 2500)
	fleet.Pace(model.PublishedBudget().Share(0.5), nil)
	if left, err := fleet.Tag(t.Context(), ids, "reaper.io:pod-written", "2026-12-02T10:00:00Z"); err != nil || len(left) > 0 {
		t.Fatalf("tag: %d left, %v", len(left), err)
	}
	for _, id := range ids {
		if i, _ := srv.Instance(id); i.Tags["reaper.io:pod-written"] != "2026-12-02T10:00:00Z" {
			t.Fatalf("%s tags %v", id, i.Tags)
		}
	}
	if n := srv.CallCount("CreateTags"); n != 3 {
		t.Fatalf("%d CreateTags calls, want 3", n)
	}
	// One id EC2 does not know fails its call: the ids from that call on
	// come back with the error.
	srv.RemoveInstance(ids[1500])
	left, err := fleet.Tag(t.Context(), ids, "reaper.io:pod-written", "later")
	if err == nil || len(left) != 1500 || left[0] != ids[1000] {
		t.Fatalf("tag with an unknown id: %d left, %v", len(left), err)
	}
}
