package reaper

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/reaper-k8s/reaper/internal/fakes"
	"github.com/reaper-k8s/reaper/pkg/instances"
	"github.com/reaper-k8s/reaper/pkg/ledger"
	"github.com/reaper-k8s/reaper/pkg/model"
	"github.com/reaper-k8s/reaper/pkg/workqueue"
)

// Each rule of the sweep on a small world: what it queues and what it
// records.
func TestSweepRules(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	old := now.Add(-time.Hour)
	w := &fakes.World{Pods: map[model.PodRef]bool{podOf(5): true}, Instances: map[string]instances.Instance{}}
	core, l, q := newBatchCore(w)
	exit := &model.Exit{Container: "main"}
	// 1: a terminal exit whose Pod write failed; 2: gone past the window;
	// 3: gone inside it; 4: owned and gone, unknown to the ledger;
	// 5: owned, running, its Pod alive; 6: owned, running, its Pod gone;
	// 7: another cluster's, running, its Pod gone.
	l.Recs[instanceOf(1)] = ledger.Record{InstanceID: instanceOf(1), Pod: podOf(1), Exits: exitsOf(*exit), Pending: "1"}
	l.Recs[instanceOf(2)] = ledger.Record{InstanceID: instanceOf(2), Pod: podOf(2), Gone: &model.Gone{State: "terminated", At: now.Add(-2 * time.Minute)}, Pending: "1"}
	l.Recs[instanceOf(3)] = ledger.Record{InstanceID: instanceOf(3), Pod: podOf(3), Gone: &model.Gone{State: "terminated", At: now.Add(-10 * time.Second)}, Pending: "1"}
	for n, state := range map[int]string{4: model.StateTerminated, 5: model.StateRunning, 6: model.StateRunning} {
		i := owned(instanceOf(n), podOf(n))
		i.State, i.LaunchTime = state, old
		w.Instances[i.ID] = i
	}
	w.Instances[instanceOf(7)] = instances.Instance{ID: instanceOf(7), State: model.StateRunning, Managed: true, Cluster: "staging", Pod: podOf(7), LaunchTime: old}
	sum, err := core.Sweep(t.Context(), 15*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Records != 3 || sum.ManagedInstances != 3 || sum.MissedGone != 1 || sum.Queued != 2 || sum.Orphans != 1 || sum.WaitingExit != 2 {
		t.Fatalf("summary %+v", sum)
	}
	var got []string
	for _, m := range q.Sent[0].Msgs {
		b, _ := json.Marshal(m)
		got = append(got, string(b))
	}
	want := []string{}
	for _, m := range []workqueue.Message{workqueue.Sweep(instanceOf(1)), workqueue.Sweep(instanceOf(2)), workqueue.Orphan(instanceOf(6), 2)} {
		b, _ := json.Marshal(m)
		want = append(want, string(b))
	}
	slices.Sort(got)
	slices.Sort(want)
	if len(q.Sent) != 1 || !slices.Equal(got, want) {
		t.Fatalf("queued %v, want %v", got, want)
	}
	if r := l.Recs[instanceOf(4)]; r.Gone == nil || r.Gone.State != model.StateTerminated || r.Pod != podOf(4) {
		t.Fatalf("missed gone state not recorded: %+v", r)
	}
}

// A record a reconciler batch wrote lately, whose work was due then, has
// that work on the queue already: the sweep does not queue it again. Work
// that fell due since the write (an exit-wait window closing) is queued.
func TestSweepSkipsWorkInFlight(t *testing.T) {
	now := testNow()
	w := fakes.NewWorld()
	core, l, q := newBatchCore(w)
	exit := &model.Exit{Container: "main"}
	l.Recs[instanceOf(1)] = ledger.Record{InstanceID: instanceOf(1), Pod: podOf(1), Exits: exitsOf(*exit), Pending: "1", UpdatedAt: now.Add(-time.Minute)}
	l.Recs[instanceOf(2)] = ledger.Record{InstanceID: instanceOf(2), Pod: podOf(2), Exits: exitsOf(*exit), Pending: "1", UpdatedAt: now.Add(-requeueAfter)}
	gone := now.Add(-90 * time.Second) // the test policy's window is 1 min
	l.Recs[instanceOf(3)] = ledger.Record{InstanceID: instanceOf(3), Pod: podOf(3), Gone: &model.Gone{State: model.StateTerminated, At: gone}, Pending: "1", UpdatedAt: gone}
	sum, err := core.Sweep(t.Context(), 15*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range q.Sent[0].Msgs {
		got = append(got, m.InstanceID)
	}
	slices.Sort(got)
	if want := []string{instanceOf(2), instanceOf(3)}; sum.InFlight != 1 || sum.Queued != 2 || !slices.Equal(got, want) {
		t.Fatalf("summary %+v, queued %v, want %v", sum, got, want)
	}
}

// EC2 lists an instance running an hour after Reaper's terminate of it was
// accepted (the terminate did not take): the sweep hands it to the
// reconciler, which describes it again and terminates it again. One
// terminated a minute ago is left to EC2.
func TestSweepStillRunning(t *testing.T) {
	w := fakes.NewWorld()
	core, l, q := newBatchCore(w)
	exit := &model.Exit{Container: "main"}
	for n, terminated := range map[int]time.Duration{1: time.Hour, 2: time.Minute} {
		inst := owned(instanceOf(n), podOf(n))
		inst.LaunchTime = testNow().Add(-2 * time.Hour)
		w.Instances[inst.ID] = inst
		w.Pods[podOf(n)] = true
		l.Recs[inst.ID] = ledger.Record{InstanceID: inst.ID, Pod: podOf(n), Exits: exitsOf(*exit), PodSynced: "exit/0", Terminated: testNow().Add(-terminated), Version: 1}
	}
	sum, err := core.Sweep(t.Context(), 15*time.Minute)
	if err != nil || sum.StillRunning != 1 {
		t.Fatalf("sweep %+v, %v: want one instance still running", sum, err)
	}
	if got := sweepMsgs(t, q); !slices.Equal(got, []string{"still-running " + instanceOf(1)}) {
		t.Fatalf("queued %v", got)
	}
	if _, err := core.HandleQueueEvent(t.Context(), redeliver(t, q)); err != nil {
		t.Fatal(err)
	}
	if want := []string{"terminate [" + instanceOf(1) + "]"}; !slices.Equal(w.Log, want) {
		t.Fatalf("steps %q, want %q", w.Log, want)
	}
}
