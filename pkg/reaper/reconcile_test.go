package reaper

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/reaper-k8s/reaper/internal/fakes"
	"github.com/reaper-k8s/reaper/pkg/instances"
	"github.com/reaper-k8s/reaper/pkg/ledger"
	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/model"
	"github.com/reaper-k8s/reaper/pkg/workqueue"
)

// testNow is the fast tests' clock.
func testNow() time.Time { return time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC) }

// newBatchCore is a Reaper over in-memory fakes of the ledger, the queue
// and w (package fakes).
func newBatchCore(w *fakes.World) (*Reaper, *fakes.Ledger, *fakes.Queue) {
	l, q := fakes.NewLedger(testNow), &fakes.Queue{}
	core := &Reaper{
		Ledger: l, Pods: w, Fleet: w, Queue: q,
		Policy: Policy{ExitWait: time.Minute, TerminateStopped: true},
		Log:    slog.New(slog.NewTextHandler(io.Discard, nil)),
		Now:    testNow,
	}
	// EC2 answers at the core's time, whatever a test sets it to.
	w.Now = func() time.Time { return core.Now() }
	return core, l, q
}

const clusterName = "prod"

// owned is an instance of this deployment running pod.
func owned(id string, pod model.PodRef) instances.Instance {
	return instances.Instance{ID: id, State: model.StateRunning, Managed: true, Owned: true, Cluster: clusterName, ClusterUID: fakes.ClusterUID, Pod: pod}
}

var podOf, instanceOf = fakes.Pod, fakes.InstanceID

// batch encodes messages as the event source mapping delivers them.
func batch(t *testing.T, msgs ...workqueue.Message) events.SQSEvent {
	t.Helper()
	var ev events.SQSEvent
	for i, m := range msgs {
		m.V = workqueue.Version
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		ev.Records = append(ev.Records, events.SQSMessage{MessageId: fmt.Sprint("m", i), Body: string(b)})
	}
	return ev
}

func failures(resp events.SQSEventResponse) []string {
	var out []string
	for _, f := range resp.BatchItemFailures {
		out = append(out, f.ItemIdentifier)
	}
	return out
}

func exitMsg(n int, code int) workqueue.Message {
	return workqueue.Exit(instanceOf(n), podOf(n), model.Exit{Container: "main", ExitCode: code, FinishedAt: time.Date(2026, 12, 1, 11, 59, 0, 0, time.UTC)})
}

// Exits of several instances in one batch: one lookup for all, every Pod
// written, then one terminate naming them all.
func TestBatchCoalesces(t *testing.T) {
	w := &fakes.World{Pods: map[model.PodRef]bool{}, Instances: map[string]instances.Instance{}}
	for n := range 3 {
		w.Pods[podOf(n)], w.Instances[instanceOf(n)] = true, owned(instanceOf(n), podOf(n))
	}
	core, l, _ := newBatchCore(w)
	resp, err := core.HandleQueueEvent(t.Context(), batch(t, exitMsg(0, 0), exitMsg(1, 1), exitMsg(2, 0), exitMsg(1, 1)))
	if err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("failures %v, %v", failures(resp), err)
	}
	if len(w.Describes) != 1 || len(w.Describes[0]) != 3 {
		t.Fatalf("lookups %v, want one of the 3 instances", w.Describes)
	}
	want := []string{"pod jobs/job-0 exit/0", "pod jobs/job-1 exit/0", "pod jobs/job-2 exit/0", "terminate [" + instanceOf(0) + " " + instanceOf(1) + " " + instanceOf(2) + "]"}
	got := slices.Clone(w.Log)
	slices.Sort(got[:3]) // the Pod writes run in parallel
	if !slices.Equal(got, want) {
		t.Fatalf("steps %q, want %q", got, want)
	}
	for n := range 3 {
		if r := l.Recs[instanceOf(n)]; r.Latest() == nil || r.PodSynced != "exit/0" || r.Terminated.IsZero() {
			t.Fatalf("record %+v", r)
		}
	}
}

// Each row: what the batch says of one instance, what EC2 says, and what
// the reconciler must do.
func TestBatchDecisions(t *testing.T) {
	pod, other := podOf(1), podOf(2)
	id := instanceOf(1)
	for _, tc := range []struct {
		name string
		inst *instances.Instance // nil: EC2 does not know it
		rec  *ledger.Record      // the ledger before the batch
		msgs []workqueue.Message
		// want
		log      []string
		lookups  int
		settled  bool // the record left the pending index
		noRecord bool
	}{
		{name: "exit believed", inst: new(owned(id, pod)), msgs: []workqueue.Message{exitMsg(1, 0)},
			log: []string{"pod jobs/job-1 exit/0", "terminate [" + id + "]"}, lookups: 1, settled: true},
		{name: "claim naming another Pod", inst: new(owned(id, other)),
			msgs: []workqueue.Message{exitMsg(1, 0)}, lookups: 1, noRecord: true},
		{name: "another cluster's instance", inst: &instances.Instance{ID: id, State: model.StateRunning, Managed: true, Cluster: "staging", Pod: pod},
			msgs: []workqueue.Message{exitMsg(1, 0)}, lookups: 1, noRecord: true},
		{name: "unknown to EC2 and the ledger", msgs: []workqueue.Message{workqueue.State(id, "terminated", time.Now())}, lookups: 1, noRecord: true},
		{name: "not ours: state change", inst: &instances.Instance{ID: id, State: model.StateTerminated, Pod: pod},
			msgs: []workqueue.Message{workqueue.State(id, "terminated", time.Now())}, lookups: 1, noRecord: true},
		{name: "state change of a settled record: no lookup",
			rec:  &ledger.Record{InstanceID: id, Pod: pod, Exits: exitsOf(model.Exit{Container: "main"}), PodSynced: "exit/0", Terminated: time.Unix(1, 0), Version: 1},
			msgs: []workqueue.Message{workqueue.State(id, "shutting-down", time.Now()), workqueue.State(id, "terminated", time.Now())}, settled: true},
		{name: "wake-up of a settled record: no lookup",
			rec:  &ledger.Record{InstanceID: id, Pod: pod, Exits: exitsOf(model.Exit{Container: "main"}), PodSynced: "exit/0", Terminated: time.Unix(1, 0), Version: 1},
			msgs: []workqueue.Message{workqueue.Sweep(id)}, settled: true},
		{name: "sweep of a terminated record whose Pod is unwritten: no lookup",
			rec:  &ledger.Record{InstanceID: id, Pod: pod, Exits: exitsOf(model.Exit{Container: "main"}), Terminated: time.Unix(1, 0), Pending: "1", Version: 1},
			msgs: []workqueue.Message{workqueue.Sweep(id)}, log: []string{"pod jobs/job-1 exit/0"}, settled: true},
		{name: "still running long after its terminate: terminated again", inst: new(owned(id, pod)),
			rec:  &ledger.Record{InstanceID: id, Pod: pod, Exits: exitsOf(model.Exit{Container: "main"}), PodSynced: "exit/0", Terminated: testNow().Add(-time.Hour), Version: 1},
			msgs: []workqueue.Message{workqueue.StillRunning(id)}, log: []string{"terminate [" + id + "]"}, lookups: 1, settled: true},
		{name: "still running lately terminated: left to EC2", inst: new(owned(id, pod)),
			rec:  &ledger.Record{InstanceID: id, Pod: pod, Exits: exitsOf(model.Exit{Container: "main"}), PodSynced: "exit/0", Terminated: testNow().Add(-time.Minute), Version: 1},
			msgs: []workqueue.Message{workqueue.StillRunning(id)}, lookups: 1, settled: true},
		{name: "spot reclaim inside the window", inst: &instances.Instance{ID: id, State: model.StateTerminated, Managed: true, Owned: true, Pod: pod},
			msgs: []workqueue.Message{workqueue.State(id, "terminated", time.Date(2026, 12, 1, 11, 59, 30, 0, time.UTC))}, lookups: 1},
		{name: "orphan with its Pod gone", inst: new(owned(id, other)), msgs: []workqueue.Message{workqueue.Orphan(id, 1)},
			log: []string{"terminate [" + id + "]"}, lookups: 1, settled: true},
		{name: "orphan whose Pod is back", inst: new(owned(id, pod)), msgs: []workqueue.Message{workqueue.Orphan(id, 1)}, lookups: 1, noRecord: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &fakes.World{Pods: map[model.PodRef]bool{pod: true}, Instances: map[string]instances.Instance{}}
			if tc.inst != nil {
				w.Instances[id] = *tc.inst
			}
			core, l, _ := newBatchCore(w)
			if tc.rec != nil {
				l.Recs[id] = *tc.rec
			}
			resp, err := core.HandleQueueEvent(t.Context(), batch(t, tc.msgs...))
			if err != nil || len(resp.BatchItemFailures) != 0 {
				t.Fatalf("failures %v, %v", failures(resp), err)
			}
			if !slices.Equal(w.Log, tc.log) {
				t.Fatalf("steps %q, want %q", w.Log, tc.log)
			}
			if len(w.Describes) != tc.lookups {
				t.Fatalf("%d lookups, want %d", len(w.Describes), tc.lookups)
			}
			r, ok := l.Recs[id]
			if ok == tc.noRecord {
				t.Fatalf("record %+v, want one: %v", r, !tc.noRecord)
			}
			if ok && (r.Pending == "") != tc.settled {
				t.Fatalf("record %+v, want settled %v", r, tc.settled)
			}
		})
	}
}

// A failed lookup fails the batch's messages that needed it and acts on
// none of them: the claims come back with the redelivery, and the ledger
// records nothing of them until the tags are read.
func TestBatchLookupFails(t *testing.T) {
	w := &fakes.World{Pods: map[model.PodRef]bool{podOf(1): true}, Instances: map[string]instances.Instance{}, DescribeErr: errors.New("UnauthorizedOperation")}
	core, l, _ := newBatchCore(w)
	l.Recs[instanceOf(1)] = ledger.Record{InstanceID: instanceOf(1), Pod: podOf(1)} // adopted by a sweep
	resp, _ := core.HandleQueueEvent(t.Context(), batch(t, exitMsg(1, 0), exitMsg(1, 0)))
	if got := failures(resp); !slices.Equal(got, []string{"m0", "m1"}) {
		t.Fatalf("failures %v, want both messages", got)
	}
	if len(w.Log) != 0 || l.Recs[instanceOf(1)].Latest() != nil || l.Recs[instanceOf(1)].Pending != "" {
		t.Fatalf("acted on an unchecked claim: %q, %+v", w.Log, l.Recs[instanceOf(1)])
	}
}

// When the share of the terminate bucket runs out before the deadline, the
// Pods are still written and the work goes back on the queue, delayed; it
// is not a failure. The exit is recorded: one sweep message carries the
// work, so the next try does not record it again.
func TestBatchDefersWithoutTokens(t *testing.T) {
	w := &fakes.World{Pods: map[model.PodRef]bool{podOf(1): true}, Instances: map[string]instances.Instance{instanceOf(1): owned(instanceOf(1), podOf(1))}, NoTokens: true}
	core, l, q := newBatchCore(w)
	resp, _ := core.HandleQueueEvent(t.Context(), batch(t, exitMsg(1, 0)))
	if len(resp.BatchItemFailures) != 0 {
		t.Fatalf("failures %v", failures(resp))
	}
	if !slices.Equal(w.Log, []string{"pod jobs/job-1 exit/0"}) {
		t.Fatalf("steps %q", w.Log)
	}
	if len(q.Sent) != 1 || !tokenDelay(q.Sent[0].Delay) || len(q.Sent[0].Msgs) != 1 || q.Sent[0].Msgs[0].Kind != workqueue.KindSweep {
		t.Fatalf("deferred %+v", q.Sent)
	}
	if r := l.Recs[instanceOf(1)]; r.PodSynced != "exit/0" || !r.Terminated.IsZero() || r.Pending == "" {
		t.Fatalf("record %+v", r)
	}
}

// A body that is not a work item is dropped, not redelivered forever.
func TestBatchDropsInvalid(t *testing.T) {
	core, _, _ := newBatchCore(&fakes.World{Instances: map[string]instances.Instance{}})
	resp, err := core.HandleQueueEvent(t.Context(), events.SQSEvent{Records: []events.SQSMessage{{MessageId: "m0", Body: "{"}}})
	if err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("failures %v, %v", failures(resp), err)
	}
}

// redeliver is a batch of what the reconciler put back on the queue, as
// the event source mapping would bring it back.
func redeliver(t *testing.T, q *fakes.Queue) events.SQSEvent {
	t.Helper()
	var msgs []workqueue.Message
	for _, s := range q.Sent {
		msgs = append(msgs, s.Msgs...)
	}
	q.Sent = nil
	return batch(t, msgs...)
}

// A batch several times larger than its share of the terminate bucket
// covers: each round writes what Pods are left, terminates what the share
// allows and defers only the rest, so the deferred work shrinks until it is
// done. No Pod is written twice and no instance terminated twice.
func TestBatchMakesProgress(t *testing.T) {
	const n, share = 10, 3
	w := fakes.NewWorld()
	var msgs []workqueue.Message
	for i := range n {
		w.Pods[podOf(i)], w.Instances[instanceOf(i)] = true, owned(instanceOf(i), podOf(i))
		msgs = append(msgs, exitMsg(i, 0))
	}
	w.TerminateShare = share
	core, l, q := newBatchCore(w)
	ev := batch(t, msgs...)
	rounds := 0
	for len(ev.Records) > 0 {
		if rounds++; rounds > n {
			t.Fatalf("no progress after %d rounds: %q", rounds, w.Log)
		}
		resp, err := core.HandleQueueEvent(t.Context(), ev)
		if err != nil || len(resp.BatchItemFailures) != 0 {
			t.Fatalf("round %d: failures %v, %v", rounds, failures(resp), err)
		}
		ev = redeliver(t, q)
		if left := n - share*rounds; len(ev.Records) != max(left, 0) {
			t.Fatalf("round %d deferred %d messages, want %d", rounds, len(ev.Records), max(left, 0))
		}
	}
	if want := (n + share - 1) / share; rounds != want {
		t.Fatalf("%d rounds, want %d", rounds, want)
	}
	pods, terminated := 0, map[string]int{}
	for _, step := range w.Log {
		if strings.HasPrefix(step, "pod ") {
			pods++
			continue
		}
		for _, id := range strings.Fields(strings.Trim(strings.TrimPrefix(step, "terminate "), "[]")) {
			terminated[id]++
		}
	}
	if pods != n || len(terminated) != n {
		t.Fatalf("%d Pod writes and %d instances terminated, want %d each: %q", pods, len(terminated), n, w.Log)
	}
	for id, c := range terminated {
		if c != 1 {
			t.Fatalf("%s terminated %d times", id, c)
		}
	}
	for i := range n {
		if r := l.Recs[instanceOf(i)]; r.PodSynced != "exit/0" || r.Terminated.IsZero() || r.Pending != "" {
			t.Fatalf("record %+v", r)
		}
	}
}

// When the share of the Describe bucket runs out part way, the claims of
// the instances it did not reach are neither rejected nor acted on: they
// go back on the queue as they came, and nothing is written for them.
func TestBatchDefersUndescribed(t *testing.T) {
	w := fakes.NewWorld()
	var msgs []workqueue.Message
	for i := range 4 {
		w.Pods[podOf(i)], w.Instances[instanceOf(i)] = true, owned(instanceOf(i), podOf(i))
		msgs = append(msgs, exitMsg(i, 0))
	}
	w.DescribeShare = 1
	core, l, q := newBatchCore(w)
	var logs bytes.Buffer
	core.Log = slog.New(slog.NewTextHandler(&logs, nil))
	resp, err := core.HandleQueueEvent(t.Context(), batch(t, msgs...))
	if err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("failures %v, %v", failures(resp), err)
	}
	if want := []string{"pod jobs/job-0 exit/0", "terminate [" + instanceOf(0) + "]"}; !slices.Equal(w.Log, want) {
		t.Fatalf("steps %q, want %q", w.Log, want)
	}
	if len(q.Sent) != 1 || !tokenDelay(q.Sent[0].Delay) || len(q.Sent[0].Msgs) != 3 {
		t.Fatalf("deferred %+v, want the 3 undescribed claims", q.Sent)
	}
	for i, m := range q.Sent[0].Msgs {
		if m.Kind != workqueue.KindExit || m.InstanceID != instanceOf(i+1) || *m.Pod != podOf(i+1) {
			t.Fatalf("deferred message %d: %+v", i, m)
		}
	}
	// The ledger learns only that a claim waits on the queue (for the
	// exit-wait window), nothing the claim says.
	for i := 1; i < 4; i++ {
		if r := l.Recs[instanceOf(i)]; r.Pod != (model.PodRef{}) || len(r.Runs()) > 0 || r.ExitQueuedUntil.IsZero() {
			t.Fatalf("record of an unchecked claim: %+v, want the queued claim's time alone", r)
		}
	}
	if strings.Contains(logs.String(), "not believed") {
		t.Fatalf("an unchecked claim was rejected:\n%s", logs.String())
	}
}

// A batch whose Pod writes outlast its time writes what it can, terminates
// only the instances whose Pods it wrote, and hands the rest back at once;
// none of it is reported done, and nothing fails.
func TestBatchOutOfTime(t *testing.T) {
	const n = 12
	w := fakes.NewWorld()
	var msgs []workqueue.Message
	for i := range n {
		w.Pods[podOf(i)], w.Instances[instanceOf(i)] = true, owned(instanceOf(i), podOf(i))
		msgs = append(msgs, exitMsg(i, 0))
	}
	// 16 writes in flight at once, 300 ms each, and 400 ms of work time
	// (a quarter of the 1.6 s each goes to terminating and to settling):
	// every write is started, none but those done in time count.
	w.ApplyDelay = 300 * time.Millisecond
	core, l, q := newBatchCore(w)
	ctx, cancel := context.WithTimeout(t.Context(), 1600*time.Millisecond)
	defer cancel()
	resp, err := core.HandleQueueEvent(ctx, batch(t, msgs...))
	if err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("failures %v, %v", failures(resp), err)
	}
	written := map[string]bool{}
	for _, step := range w.Log {
		if strings.HasPrefix(step, "pod ") {
			written[strings.Fields(step)[1]] = true
		}
	}
	var deferred []string
	for _, s := range q.Sent {
		if s.Delay != 0 {
			t.Fatalf("work deferred for want of time waits %v, want 0", s.Delay)
		}
		for _, m := range s.Msgs {
			deferred = append(deferred, m.InstanceID)
		}
	}
	if len(written)+len(deferred) != n {
		t.Fatalf("%d Pods written and %d instances deferred, want %d in all", len(written), len(deferred), n)
	}
	for i := range n {
		r := l.Recs[instanceOf(i)]
		done := r.PodSynced != ""
		if done != written[podOf(i).String()] || done == r.Terminated.IsZero() || done == slices.Contains(deferred, instanceOf(i)) {
			t.Fatalf("instance %d: Pod written %v, record %+v, deferred %v", i, written[podOf(i).String()], r, deferred)
		}
	}
}

// The two state changes EC2 sends for an instance Reaper terminated after
// a checked exit, its record settled, need no lookup and no ledger write:
// they say what Reaper's own terminate made true. One for a record still
// pending is written once per batch, the newest, until the record settles
// ended by Reaper, which forgets the states, so that the record ends the
// same whichever came first; a state change after that costs none.
func TestBatchStateChangeWrites(t *testing.T) {
	id, pod := instanceOf(1), podOf(1)
	settled := ledger.Record{InstanceID: id, Pod: pod, Exits: exitsOf(model.Exit{Container: "main"}), PodSynced: "exit/0", Terminated: time.Unix(1, 0), Version: 1}
	w := fakes.NewWorld()
	core, l, _ := newBatchCore(w)
	l.Recs[id] = settled
	at := testNow().Add(-time.Minute)
	msgs := []workqueue.Message{workqueue.State(id, model.StateTerminated, at.Add(time.Second)), workqueue.State(id, model.StateShuttingDown, at)}
	if resp, err := core.HandleQueueEvent(t.Context(), batch(t, msgs...)); err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("failures %v, %v", failures(resp), err)
	}
	if r := l.Recs[id]; len(w.Describes) != 0 || l.Writes != 0 || r.Version != 1 {
		t.Fatalf("%d lookups, %d writes, record %+v: want none", len(w.Describes), l.Writes, r)
	}
	// Still pending: its Pod written, its instance not yet terminated.
	pending := settled
	pending.Terminated, pending.Pending = time.Time{}, "p"
	l.Recs[id] = pending
	if resp, err := core.HandleQueueEvent(t.Context(), batch(t, msgs...)); err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("failures %v, %v", failures(resp), err)
	}
	// One write of the state (the version counts it), then the mark
	// that settles the record ended by Reaper, which forgets the states:
	// the record ends as if the state changes had come after it.
	r := l.Recs[id]
	if r.Version != 2 || l.Writes != 2 || r.Pending != "" || r.Terminated.IsZero() || r.LastState != "" || r.Gone != nil {
		t.Fatalf("%d writes, record %+v: want one state write, then settled, ended, without the states", l.Writes, r)
	}
	msgs = []workqueue.Message{workqueue.State(id, model.StateShuttingDown, at)}
	if resp, err := core.HandleQueueEvent(t.Context(), batch(t, msgs...)); err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("failures %v, %v", failures(resp), err)
	}
	if r := l.Recs[id]; r.Version != 2 || l.Writes != 2 {
		t.Fatalf("record %+v after a stale state change: want it unwritten", r)
	}
}

// The batch line's level says whether the batch needs a look.
func TestBatchLogLevel(t *testing.T) {
	for _, tc := range []struct {
		sum  BatchSummary
		want slog.Level
	}{
		{BatchSummary{Messages: 3, Reconciled: 3}, slog.LevelInfo},
		{BatchSummary{Messages: 3, Deferred: 3}, slog.LevelInfo},
		{BatchSummary{Messages: 3, Invalid: 1}, slog.LevelWarn},
		{BatchSummary{Messages: 3, Rejected: 1}, slog.LevelWarn},
		{BatchSummary{Messages: 3, Rejected: 1, Failed: 1}, slog.LevelError},
	} {
		if got := tc.sum.level(); got != tc.want {
			t.Errorf("%+v: level %v, want %v", tc.sum, got, tc.want)
		}
	}
}

// A claim the batch rejects is counted in the batch's summary, whose line
// it raises to WARN, and in LinesRejected by its reason: one naming
// another Pod than the tags, one dated in the future, another line after
// a terminal exit. Believed claims, and a terminal line delivered again,
// leave the line at INFO.
func TestRejectedClaimsWarnTheBatch(t *testing.T) {
	future := workqueue.Exit(instanceOf(3), podOf(3), model.Exit{Container: "main", FinishedAt: testNow().Add(time.Hour)})
	otherPod := workqueue.Exit(instanceOf(1), podOf(2), model.Exit{Container: "main", FinishedAt: testNow()})
	w := fakes.NewWorld(owned(instanceOf(1), podOf(1)), owned(instanceOf(2), podOf(2)), owned(instanceOf(3), podOf(3)), owned(instanceOf(4), podOf(4)))
	w.Pods[podOf(1)], w.Pods[podOf(2)], w.Pods[podOf(3)], w.Pods[podOf(4)] = true, true, true, true
	core, _, _ := newBatchCore(w)
	for _, tc := range []struct {
		name     string
		msgs     []workqueue.Message
		level    string
		rejected int
		reason   string
	}{
		{name: "believed", msgs: []workqueue.Message{exitMsg(4, 0), exitMsg(2, 0), exitMsg(2, 0)}, level: "INFO"},
		{name: "another Pod", msgs: []workqueue.Message{otherPod, exitMsg(1, 0)}, level: "WARN", rejected: 1, reason: model.ReasonPodMismatch},
		{name: "in the future", msgs: []workqueue.Message{future}, level: "WARN", rejected: 1, reason: model.ReasonFinishedInFuture},
		{name: "the terminal line again", msgs: []workqueue.Message{exitMsg(4, 0)}, level: "INFO"},
		{name: "another line after the terminal one", msgs: []workqueue.Message{exitMsg(4, 1)}, level: "WARN", rejected: 1, reason: model.ReasonAfterTerminal},
	} {
		var emf, logs bytes.Buffer
		core.Metrics = metrics.New(slog.New(slog.NewJSONHandler(&emf, nil)), "Reaper", metrics.FunctionReconciler)
		core.Log = slog.New(slog.NewJSONHandler(&logs, nil))
		if _, err := core.HandleQueueEvent(t.Context(), batch(t, tc.msgs...)); err != nil {
			t.Fatal(err)
		}
		var line struct {
			Level    string `json:"level"`
			Msg      string `json:"msg"`
			Rejected int    `json:"rejected"`
		}
		for l := range strings.Lines(logs.String()) {
			if err := json.Unmarshal([]byte(l), &line); err != nil {
				t.Fatal(err)
			}
			if line.Msg == "batch" {
				break
			}
		}
		if line.Msg != "batch" || line.Level != tc.level || line.Rejected != tc.rejected {
			t.Errorf("%s: batch line %+v, want level %s, %d rejected:\n%s", tc.name, line, tc.level, tc.rejected, logs.String())
		}
		if n := countOf(t, emf.String(), metrics.LinesRejected, tc.reason); tc.reason != "" && n != tc.rejected {
			t.Errorf("%s: %s{%s} = %d, want %d", tc.name, metrics.LinesRejected, tc.reason, n, tc.rejected)
		}
	}
}

// tokenDelay says whether d is the delay of work first deferred for want of
// EC2 tokens: DeferDelay, stretched by up to a quarter.
func tokenDelay(d time.Duration) bool { return d >= DeferDelay && d <= DeferDelay*5/4 }
