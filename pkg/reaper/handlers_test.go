package reaper

import (
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/reaper-k8s/reaper/pkg/exitline"
	"github.com/reaper-k8s/reaper/pkg/instances"
	"github.com/reaper-k8s/reaper/pkg/ledger"
	"github.com/reaper-k8s/reaper/pkg/statechange"
	"github.com/reaper-k8s/reaper/pkg/workqueue"
)

var errBadLine = errors.New("not JSON")

func line(n int, restarts int32, willRestart bool) exitline.Line {
	pod := podOf(n)
	return exitline.Line{Reaper: exitline.Kind, V: exitline.Version, InstanceID: instanceOf(1), PodNamespace: pod.Namespace, PodName: pod.Name,
		PodUID: pod.UID, Container: "main", RestartCount: restarts, WillRestart: willRestart,
		StartedAt: time.Date(2026, 12, 1, 11, 0, 0, 0, time.UTC), FinishedAt: time.Date(2026, 12, 1, 11, 59, 0, 0, time.UTC)}
}

// The exitrecorder writes the latest exit, unverified, and queues the
// latest claim of each Pod the lines name; it calls neither EC2 nor
// Kubernetes.
func TestHandleExitsRecordsAndQueues(t *testing.T) {
	w := &world{instances: map[string]instances.Instance{}}
	core, l, q := newBatchCore(w)
	sum, err := core.HandleExits(t.Context(), exitline.Batch{InstanceID: instanceOf(1), Lines: []exitline.Line{
		line(1, 0, true), line(2, 5, false), line(1, 1, false),
	}, Rejected: []exitline.Rejection{{EventID: "e", Reason: ReasonUndecodable, Err: errBadLine}}})
	if err != nil {
		t.Fatal(err)
	}
	if sum.Lines != 4 || sum.Recorded != 3 || sum.Queued != 2 || sum.Rejected != 1 {
		t.Fatalf("summary %+v", sum)
	}
	r := l.recs[instanceOf(1)]
	if !r.Unverified || r.Pod != podOf(1) || r.Exit.RestartCount != 1 || r.Pending == "" {
		t.Fatalf("record %+v, want the latest line's exit, unverified", r)
	}
	if len(q.sent) != 1 || len(q.sent[0].msgs) != 2 {
		t.Fatalf("sent %+v", q.sent)
	}
	claims := map[string]int32{}
	for _, m := range q.sent[0].msgs {
		if m.Kind != workqueue.KindExit || m.InstanceID != instanceOf(1) {
			t.Fatalf("message %+v", m)
		}
		claims[m.Pod.Name] = m.Exit.RestartCount
	}
	if claims["job-1"] != 1 || claims["job-2"] != 5 {
		t.Fatalf("claims %v, want each Pod's latest", claims)
	}
	if len(w.describes) != 0 || len(w.log) != 0 {
		t.Fatalf("the exitrecorder called EC2 or Kubernetes: %v %q", w.describes, w.log)
	}
}

// A state change goes to the queue as it came.
func TestHandleStateChangeQueues(t *testing.T) {
	core, l, q := newBatchCore(&world{instances: map[string]instances.Instance{}})
	at := time.Date(2026, 12, 1, 11, 0, 0, 0, time.UTC)
	sum, err := core.HandleStateChange(t.Context(), statechange.Message{InstanceID: instanceOf(1), State: "terminated", Time: at})
	if err != nil || !sum.Queued {
		t.Fatalf("summary %+v, %v", sum, err)
	}
	if len(q.sent) != 1 || q.sent[0].msgs[0] != workqueue.State(instanceOf(1), "terminated", at) || len(l.recs) != 0 {
		t.Fatalf("sent %+v, ledger %v", q.sent, l.recs)
	}
}

// Each rule of the sweep on a small world: what it queues and what it
// records.
func TestSweepRules(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	old := now.Add(-time.Hour)
	w := &world{pods: map[ledger.PodRef]bool{podOf(5): true}, instances: map[string]instances.Instance{}}
	core, l, q := newBatchCore(w)
	exit := &ledger.Exit{Container: "main"}
	// 1: a terminal exit whose Pod write failed; 2: gone past the window;
	// 3: gone inside it; 4: owned and gone, unknown to the ledger;
	// 5: owned, running, its Pod alive; 6: owned, running, its Pod gone;
	// 7: another cluster's, running, its Pod gone.
	l.recs[instanceOf(1)] = ledger.Record{InstanceID: instanceOf(1), Pod: podOf(1), Exit: exit, Pending: "1"}
	l.recs[instanceOf(2)] = ledger.Record{InstanceID: instanceOf(2), Pod: podOf(2), Gone: &ledger.Gone{State: "terminated", At: now.Add(-2 * time.Minute)}, Pending: "1"}
	l.recs[instanceOf(3)] = ledger.Record{InstanceID: instanceOf(3), Pod: podOf(3), Gone: &ledger.Gone{State: "terminated", At: now.Add(-10 * time.Second)}, Pending: "1"}
	for n, state := range map[int]string{4: instances.Terminated, 5: instances.Running, 6: instances.Running} {
		i := owned(instanceOf(n), podOf(n))
		i.State, i.LaunchTime = state, old
		w.instances[i.ID] = i
	}
	w.instances[instanceOf(7)] = instances.Instance{ID: instanceOf(7), State: instances.Running, Managed: true, Cluster: "staging", Pod: podOf(7), LaunchTime: old}
	sum, err := core.Sweep(t.Context(), 15*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Records != 3 || sum.ManagedInstances != 3 || sum.MissedGone != 1 || sum.Queued != 2 || sum.Orphans != 1 || sum.WaitingExit != 2 {
		t.Fatalf("summary %+v", sum)
	}
	var got []string
	for _, m := range q.sent[0].msgs {
		b, _ := json.Marshal(m)
		got = append(got, string(b))
	}
	want := []string{}
	for _, m := range []workqueue.Message{workqueue.Sweep(instanceOf(1)), workqueue.Sweep(instanceOf(2)), workqueue.Orphan(instanceOf(6))} {
		b, _ := json.Marshal(m)
		want = append(want, string(b))
	}
	slices.Sort(got)
	slices.Sort(want)
	if len(q.sent) != 1 || !slices.Equal(got, want) {
		t.Fatalf("queued %v, want %v", got, want)
	}
	if r := l.recs[instanceOf(4)]; r.Gone == nil || r.Gone.State != instances.Terminated || r.Pod != podOf(4) {
		t.Fatalf("missed gone state not recorded: %+v", r)
	}
}
