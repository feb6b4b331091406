package reaper

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/reaper-k8s/reaper/pkg/instances"
	"github.com/reaper-k8s/reaper/pkg/kube"
	"github.com/reaper-k8s/reaper/pkg/ledger"
	"github.com/reaper-k8s/reaper/pkg/podstatus"
	"github.com/reaper-k8s/reaper/pkg/workqueue"
)

// The fakes below are in-memory stand-ins for the outside systems, for
// fast truth tables of a batch's decisions; the replay tests run the same
// paths against the real apiserver, dynalite and the EC2 and SQS servers.

// memLedger keeps records by instance; it applies the ledger's rules that
// the reconciler relies on (verified exits replace unverified ones; done
// steps stay done) and ignores the rest.
type memLedger struct {
	mu   sync.Mutex
	recs map[string]ledger.Record
}

func (l *memLedger) Get(_ context.Context, id string) (ledger.Record, bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, ok := l.recs[id]
	return r, ok, nil
}

func (l *memLedger) RecordExit(_ context.Context, id string, pod ledger.PodRef, exit ledger.Exit, verified bool) (ledger.Record, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.recs[id]
	if r.Exit == nil || r.Unverified || r.Exit.RestartCount <= exit.RestartCount {
		r.InstanceID, r.Pod, r.Exit, r.Unverified, r.Pending = id, pod, &exit, !verified, "1"
		r.Version++
	}
	l.recs[id] = r
	return r, nil
}

func (l *memLedger) RecordState(_ context.Context, id string, pod ledger.PodRef, sc ledger.StateChange) (ledger.Record, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.recs[id]
	r.InstanceID, r.LastState = id, sc.State
	if r.Pod == (ledger.PodRef{}) {
		r.Pod = pod
	}
	if sc.Gone {
		r.Gone, r.Pending = &ledger.Gone{State: sc.State, At: sc.At}, "1"
	}
	r.Version++
	l.recs[id] = r
	return r, nil
}

func (l *memLedger) MarkDone(_ context.Context, id string, d ledger.Done) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.recs[id]
	if d.PodSynced != "" {
		r.PodSynced = d.PodSynced
	}
	if d.Terminated && r.Terminated.IsZero() {
		r.Terminated = time.Unix(1, 0)
	}
	if d.Settled && d.Version == r.Version {
		r.Pending = ""
	}
	r.InstanceID = id
	l.recs[id] = r
	return nil
}

func (l *memLedger) Pending(_ context.Context, fn func(ledger.Record) error) error {
	l.mu.Lock()
	var recs []ledger.Record
	for _, r := range l.recs {
		if r.Pending != "" {
			recs = append(recs, r)
		}
	}
	l.mu.Unlock()
	for _, r := range recs {
		if err := fn(r); err != nil {
			return err
		}
	}
	return nil
}

func (l *memLedger) GetMany(_ context.Context, ids []string) (map[string]ledger.Record, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]ledger.Record{}
	for _, id := range ids {
		if r, ok := l.recs[id]; ok {
			out[id] = r
		}
	}
	return out, nil
}

// world records, in order, the Pod writes and terminations a batch makes.
type world struct {
	mu        sync.Mutex
	pods      map[ledger.PodRef]bool // existing Pods
	instances map[string]instances.Instance
	log       []string // "pod ns/name exit/0", "terminate i-…"
	describes [][]string
	// noTokens makes Terminate answer as a Fleet whose share of the
	// bucket runs out before the deadline.
	noTokens    bool
	describeErr error
}

func (w *world) Read(_ context.Context, ref ledger.PodRef) (kube.Snapshot, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.pods[ref] {
		return kube.Snapshot{Ref: ref, Result: kube.PodGone}, nil
	}
	return kube.Snapshot{Ref: ref, Result: kube.Current}, nil
}

func (w *world) Apply(_ context.Context, ref ledger.PodRef, o podstatus.Outcome) (kube.Result, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.log = append(w.log, "pod "+ref.String()+" "+o.Key())
	return kube.Patched, nil
}

func (w *world) Describe(_ context.Context, ids []string) (map[string]instances.Instance, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.describes = append(w.describes, slices.Clone(ids))
	if w.describeErr != nil {
		return nil, w.describeErr
	}
	out := map[string]instances.Instance{}
	for _, id := range ids {
		if i, ok := w.instances[id]; ok {
			out[id] = i
		}
	}
	return out, nil
}

func (w *world) Terminate(_ context.Context, ids []string, _ map[string]instances.Instance) (map[string]instances.Termination, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.noTokens {
		return nil, fmt.Errorf("terminate %d instances: %w", len(ids), instances.ErrNoTokens)
	}
	w.log = append(w.log, fmt.Sprint("terminate ", ids))
	out := map[string]instances.Termination{}
	for _, id := range ids {
		out[id] = instances.Terminating
	}
	return out, nil
}

func (w *world) ListOwned(_ context.Context, fn func(instances.Instance) error) error {
	w.mu.Lock()
	var owned []instances.Instance
	for _, i := range w.instances {
		if i.Owned {
			owned = append(owned, i)
		}
	}
	w.mu.Unlock()
	for _, i := range owned {
		if err := fn(i); err != nil {
			return err
		}
	}
	return nil
}

type sent struct {
	delay time.Duration
	msgs  []workqueue.Message
}

type memQueue struct{ sent []sent }

func (q *memQueue) Send(_ context.Context, delay time.Duration, msgs ...workqueue.Message) error {
	q.sent = append(q.sent, sent{delay, msgs})
	return nil
}

func newBatchCore(w *world) (*Reaper, *memLedger, *memQueue) {
	l, q := &memLedger{recs: map[string]ledger.Record{}}, &memQueue{}
	return &Reaper{
		Ledger: l, Pods: w, Fleet: w, Queue: q,
		Policy: Policy{ExitWait: time.Minute, TerminateStopped: true},
		Log:    slog.New(slog.NewTextHandler(io.Discard, nil)),
		Now:    func() time.Time { return time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC) },
	}, l, q
}

const clusterName = "prod"

// owned is an instance of this deployment running pod.
func owned(id string, pod ledger.PodRef) instances.Instance {
	return instances.Instance{ID: id, State: instances.Running, Managed: true, Owned: true, Cluster: clusterName, Pod: pod}
}

func podOf(n int) ledger.PodRef {
	return ledger.PodRef{Namespace: "jobs", Name: fmt.Sprintf("job-%d", n), UID: fmt.Sprintf("00000000-0000-0000-0000-%012d", n)}
}

func instanceOf(n int) string { return fmt.Sprintf("i-%017x", n) }

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
	return workqueue.Exit(instanceOf(n), podOf(n), ledger.Exit{Container: "main", ExitCode: code, FinishedAt: time.Date(2026, 12, 1, 11, 59, 0, 0, time.UTC)})
}

// Exits of several instances in one batch: one lookup for all, every Pod
// written, then one terminate naming them all.
func TestBatchCoalesces(t *testing.T) {
	w := &world{pods: map[ledger.PodRef]bool{}, instances: map[string]instances.Instance{}}
	for n := range 3 {
		w.pods[podOf(n)], w.instances[instanceOf(n)] = true, owned(instanceOf(n), podOf(n))
	}
	core, l, _ := newBatchCore(w)
	resp, err := core.HandleQueueEvent(t.Context(), batch(t, exitMsg(0, 0), exitMsg(1, 1), exitMsg(2, 0), exitMsg(1, 1)))
	if err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("failures %v, %v", failures(resp), err)
	}
	if len(w.describes) != 1 || len(w.describes[0]) != 3 {
		t.Fatalf("lookups %v, want one of the 3 instances", w.describes)
	}
	want := []string{"pod jobs/job-0 exit/0", "pod jobs/job-1 exit/0", "pod jobs/job-2 exit/0", "terminate [" + instanceOf(0) + " " + instanceOf(1) + " " + instanceOf(2) + "]"}
	got := slices.Clone(w.log)
	slices.Sort(got[:3]) // the Pod writes run in parallel
	if !slices.Equal(got, want) {
		t.Fatalf("steps %q, want %q", got, want)
	}
	for n := range 3 {
		if r := l.recs[instanceOf(n)]; r.Unverified || r.PodSynced != "exit/0" || r.Terminated.IsZero() {
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
			rec:  &ledger.Record{InstanceID: id, Pod: pod, Exit: &ledger.Exit{Container: "main"}, Unverified: true, Pending: "1", Version: 1},
			msgs: []workqueue.Message{exitMsg(1, 0)}, lookups: 1, settled: true},
		{name: "another cluster's instance", inst: &instances.Instance{ID: id, State: instances.Running, Managed: true, Cluster: "staging", Pod: pod},
			rec:  &ledger.Record{InstanceID: id, Pod: pod, Exit: &ledger.Exit{Container: "main"}, Unverified: true, Pending: "1", Version: 1},
			msgs: []workqueue.Message{exitMsg(1, 0)}, lookups: 1, settled: true},
		{name: "unknown to EC2 and the ledger", msgs: []workqueue.Message{workqueue.State(id, "terminated", time.Now())}, lookups: 1, noRecord: true},
		{name: "not ours: state change", inst: &instances.Instance{ID: id, State: instances.Terminated, Pod: pod},
			msgs: []workqueue.Message{workqueue.State(id, "terminated", time.Now())}, lookups: 1, noRecord: true},
		{name: "state change of a settled record: no lookup",
			rec:  &ledger.Record{InstanceID: id, Pod: pod, Exit: &ledger.Exit{Container: "main"}, PodSynced: "exit/0", Terminated: time.Unix(1, 0), Version: 1},
			msgs: []workqueue.Message{workqueue.State(id, "shutting-down", time.Now()), workqueue.State(id, "terminated", time.Now())}, settled: true},
		{name: "spot reclaim inside the window", inst: &instances.Instance{ID: id, State: instances.Terminated, Managed: true, Owned: true, Pod: pod},
			msgs: []workqueue.Message{workqueue.State(id, "terminated", time.Date(2026, 12, 1, 11, 59, 30, 0, time.UTC))}, lookups: 1},
		{name: "orphan with its Pod gone", inst: new(owned(id, other)), msgs: []workqueue.Message{workqueue.Orphan(id)},
			log: []string{"terminate [" + id + "]"}, lookups: 1, settled: true},
		{name: "orphan whose Pod is back", inst: new(owned(id, pod)), msgs: []workqueue.Message{workqueue.Orphan(id)}, lookups: 1, noRecord: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &world{pods: map[ledger.PodRef]bool{pod: true}, instances: map[string]instances.Instance{}}
			if tc.inst != nil {
				w.instances[id] = *tc.inst
			}
			core, l, _ := newBatchCore(w)
			if tc.rec != nil {
				l.recs[id] = *tc.rec
			}
			resp, err := core.HandleQueueEvent(t.Context(), batch(t, tc.msgs...))
			if err != nil || len(resp.BatchItemFailures) != 0 {
				t.Fatalf("failures %v, %v", failures(resp), err)
			}
			if !slices.Equal(w.log, tc.log) {
				t.Fatalf("steps %q, want %q", w.log, tc.log)
			}
			if len(w.describes) != tc.lookups {
				t.Fatalf("%d lookups, want %d", len(w.describes), tc.lookups)
			}
			r, ok := l.recs[id]
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
// none of them; the exit stays in the ledger for the redelivery.
func TestBatchLookupFails(t *testing.T) {
	w := &world{pods: map[ledger.PodRef]bool{podOf(1): true}, instances: map[string]instances.Instance{}, describeErr: errors.New("UnauthorizedOperation")}
	core, l, _ := newBatchCore(w)
	l.recs[instanceOf(1)] = ledger.Record{InstanceID: instanceOf(1), Pod: podOf(1), Exit: &ledger.Exit{Container: "main"}, Unverified: true, Pending: "1"}
	resp, _ := core.HandleQueueEvent(t.Context(), batch(t, exitMsg(1, 0), exitMsg(1, 0)))
	if got := failures(resp); !slices.Equal(got, []string{"m0", "m1"}) {
		t.Fatalf("failures %v, want both messages", got)
	}
	if len(w.log) != 0 || !l.recs[instanceOf(1)].Unverified {
		t.Fatalf("acted on an unchecked claim: %q, %+v", w.log, l.recs[instanceOf(1)])
	}
}

// When the share of the terminate bucket runs out before the deadline, the
// Pods are still written and the messages go back on the queue, delayed,
// as they came; they are not failures.
func TestBatchDefersWithoutTokens(t *testing.T) {
	w := &world{pods: map[ledger.PodRef]bool{podOf(1): true}, instances: map[string]instances.Instance{instanceOf(1): owned(instanceOf(1), podOf(1))}, noTokens: true}
	core, l, q := newBatchCore(w)
	resp, _ := core.HandleQueueEvent(t.Context(), batch(t, exitMsg(1, 0)))
	if len(resp.BatchItemFailures) != 0 {
		t.Fatalf("failures %v", failures(resp))
	}
	if !slices.Equal(w.log, []string{"pod jobs/job-1 exit/0"}) {
		t.Fatalf("steps %q", w.log)
	}
	if len(q.sent) != 1 || q.sent[0].delay != DeferDelay || len(q.sent[0].msgs) != 1 || q.sent[0].msgs[0].Kind != workqueue.KindExit {
		t.Fatalf("deferred %+v", q.sent)
	}
	if r := l.recs[instanceOf(1)]; r.PodSynced != "exit/0" || !r.Terminated.IsZero() || r.Pending == "" {
		t.Fatalf("record %+v", r)
	}
}

// A body that is not a work item is dropped, not redelivered forever.
func TestBatchDropsInvalid(t *testing.T) {
	core, _, _ := newBatchCore(&world{instances: map[string]instances.Instance{}})
	resp, err := core.HandleQueueEvent(t.Context(), events.SQSEvent{Records: []events.SQSMessage{{MessageId: "m0", Body: "{"}}})
	if err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("failures %v, %v", failures(resp), err)
	}
}
