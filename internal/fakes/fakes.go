// Package fakes holds in-memory stand-ins for the outside systems behind
// the core's interfaces, for fast truth tables of its decisions: a ledger
// that applies the real ledger's write rules (ledger.WithExit, WithState,
// WithDone), a World of Pods and instances that records the writes and
// terminations made to it, and a Queue that keeps what was sent. The replay
// tests run the same paths against the real apiserver, dynalite and the EC2
// and SQS test servers.
package fakes

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/reaper-k8s/reaper/pkg/instances"
	"github.com/reaper-k8s/reaper/pkg/kube"
	"github.com/reaper-k8s/reaper/pkg/ledger"
	"github.com/reaper-k8s/reaper/pkg/model"
	"github.com/reaper-k8s/reaper/pkg/podstatus"
	"github.com/reaper-k8s/reaper/pkg/workqueue"
)

// Ledger keeps records by instance.
type Ledger struct {
	mu   sync.Mutex
	Recs map[string]ledger.Record
	Now  func() time.Time
	// Writes counts the writes made to it.
	Writes int
	// FailChunk, when set, is asked about each chunk of GetMany (100 ids,
	// as the real ledger reads them): an error leaves the chunk's ids Left
	// with it.
	FailChunk func(ids []string) error
	// WriteDelay is how long each write takes; a write whose context ends
	// first fails with the context's error.
	WriteDelay time.Duration
}

// delay waits WriteDelay, or until ctx ends.
func (l *Ledger) delay(ctx context.Context) error {
	if l.WriteDelay <= 0 {
		return nil
	}
	select {
	case <-time.After(l.WriteDelay):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// NewLedger is an empty ledger whose writes happen at now.
func NewLedger(now func() time.Time) *Ledger {
	return &Ledger{Recs: map[string]ledger.Record{}, Now: now}
}

func (l *Ledger) Get(_ context.Context, id string) (ledger.Record, bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, ok := l.Recs[id]
	return r, ok, nil
}

func (l *Ledger) RecordExit(ctx context.Context, id string, pod model.PodRef, exitTokenHash string, exit model.Exit) (ledger.Record, error) {
	if err := l.delay(ctx); err != nil {
		return ledger.Record{}, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.Writes++
	r, _ := ledger.WithExit(l.Recs[id], id, pod, exitTokenHash, exit, l.Now())
	l.Recs[id] = r
	return r, nil
}

func (l *Ledger) RecordState(ctx context.Context, id string, pod model.PodRef, exitTokenHash string, sc ledger.StateChange) (ledger.Record, error) {
	if err := l.delay(ctx); err != nil {
		return ledger.Record{}, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.Writes++
	r, _ := ledger.WithState(l.Recs[id], id, pod, exitTokenHash, sc, l.Now())
	l.Recs[id] = r
	return r, nil
}

func (l *Ledger) Adopt(ctx context.Context, id string, pod model.PodRef, exitTokenHash string) (ledger.Record, error) {
	if err := l.delay(ctx); err != nil {
		return ledger.Record{}, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	r, applies := ledger.WithAdopt(l.Recs[id], id, pod, exitTokenHash, l.Now())
	if applies {
		l.Writes++
		l.Recs[id] = r
	}
	return r, nil
}

func (l *Ledger) ExitQueued(ctx context.Context, id string, until time.Time) error {
	if err := l.delay(ctx); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.Writes++
	if r, applies := ledger.WithExitQueued(l.Recs[id], id, until, l.Now()); applies {
		l.Recs[id] = r
	}
	return nil
}

func (l *Ledger) MarkDone(ctx context.Context, id string, d ledger.Done) error {
	if err := l.delay(ctx); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.Writes++
	l.Recs[id] = ledger.WithDone(l.Recs[id], id, d, l.Now())
	return nil
}

func (l *Ledger) Pending(_ context.Context, fn func(ledger.Record) error) error {
	l.mu.Lock()
	var recs []ledger.Record
	for _, r := range l.Recs {
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

// getManyChunk is how many ids the real ledger reads a BatchGetItem.
const getManyChunk = 100

func (l *Ledger) GetMany(_ context.Context, ids []string) ledger.Fetched {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := ledger.Fetched{Found: map[string]ledger.Record{}, Left: map[string]error{}}
	for chunk := range slices.Chunk(ids, getManyChunk) {
		if l.FailChunk != nil {
			if err := l.FailChunk(chunk); err != nil {
				leave(out.Left, chunk, err)
				continue
			}
		}
		for _, id := range chunk {
			if r, ok := l.Recs[id]; ok {
				out.Found[id] = r
			}
		}
	}
	return out
}

// leave records ids as left, each with err.
func leave(left map[string]error, ids []string, err error) {
	for _, id := range ids {
		left[id] = err
	}
}

// World is the Pods and the instances; it records, in order, the Pod
// writes and terminations made to it.
type World struct {
	mu   sync.Mutex
	Pods map[model.PodRef]bool // existing Pods
	// Live are existing Pods with their spec and status, which ReadMany
	// reads and ApplyTo writes, for Pods of several containers.
	Live map[model.PodRef]*corev1.Pod
	// ReadFails, when set, fails every ReadMany, as an apiserver that
	// cannot be reached.
	ReadFails error
	Instances map[string]instances.Instance
	Log       []string // "pod ns/name exit/0", "terminate [i-…]"
	Describes [][]string
	// NoTokens makes Terminate answer as a Fleet whose share of the
	// bucket runs out before the deadline.
	NoTokens bool
	// DescribeErr leaves every id of a Describe with it.
	DescribeErr error
	// DescribeFails, when set, is asked about each chunk of Describe (200
	// ids, as the real Fleet describes them): an error leaves the chunk's
	// ids with it, and the next chunk is described.
	DescribeFails func(chunk []string) error
	// Protected instances are refused by Terminate (OperationNotPermitted).
	Protected map[string]bool
	// TerminateShare and DescribeShare, when set, are how many instances
	// one Terminate or Describe reaches before its share of the bucket runs
	// out; it leaves the rest with instances.ErrNoTokens.
	TerminateShare, DescribeShare int
	// ApplyDelay is how long each Pod write takes; a write whose context
	// ends first fails with the context's error.
	ApplyDelay time.Duration
	// Identity is the cluster identity its Pods are read from (""
	// answers ClusterUID); IdentityErr fails reading it.
	Identity    string
	IdentityErr error
	// Now, when set, dates its answers to Describe (DescribedAt).
	Now func() time.Time
	// Tags are the tags Tag put, by instance and key.
	Tags map[string]map[string]string
	// TagErr fails every Tag.
	TagErr error
}

// ClusterUID is the cluster identity of a World by default, which the
// instances of its cluster carry.
const ClusterUID = "6c1a0000-0000-4000-8000-00000000c1d0"

func (w *World) ClusterIdentity(context.Context) (string, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.IdentityErr != nil {
		return "", w.IdentityErr
	}
	if w.Identity == "" {
		return ClusterUID, nil
	}
	return w.Identity, nil
}

// Warn logs "warn <ns/name> <reason> <instance>".
func (w *World) Warn(_ context.Context, ref model.PodRef, instance, reason, _ string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.Log = append(w.Log, "warn "+ref.String()+" "+reason+" "+instance)
	return nil
}

// NewWorld is a world of the given instances and no Pods.
func NewWorld(insts ...instances.Instance) *World {
	w := &World{Pods: map[model.PodRef]bool{}, Instances: map[string]instances.Instance{}}
	for _, i := range insts {
		w.Instances[i.ID] = i
	}
	return w
}

func (w *World) ReadMany(_ context.Context, refs []model.PodRef) (map[model.PodRef]kube.Snapshot, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ReadFails != nil {
		return nil, w.ReadFails
	}
	out := make(map[model.PodRef]kube.Snapshot, len(refs))
	for _, ref := range refs {
		out[ref] = kube.Snapshot{Ref: ref, Result: kube.PodGone}
		if w.Pods[ref] {
			out[ref] = kube.Snapshot{Ref: ref, Result: kube.Current}
		}
		if pod, ok := w.Live[ref]; ok {
			out[ref] = kube.SnapshotOf(ref, pod.DeepCopy())
		}
	}
	return out, nil
}

// ApplyTo writes the outcome to the Pod the snapshot read (PodSpecs), or
// else to a Pod of one container, "main" (or the latest exit's), with the
// real status truth table (podstatus.Build): the phase it answers is the
// one the real writer would write.
func (w *World) ApplyTo(ctx context.Context, snap kube.Snapshot, o model.Outcome) (kube.Applied, error) {
	if w.ApplyDelay > 0 {
		select {
		case <-time.After(w.ApplyDelay):
		case <-ctx.Done():
			return kube.Applied{}, ctx.Err()
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if snap.Result != kube.Current {
		return kube.Applied{Result: snap.Result}, nil
	}
	pod := snap.Pod()
	if pod == nil {
		container := "main"
		if e := o.Latest(); e != nil {
			container = e.Container
		}
		pod = &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: container}}}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	}
	status, write := podstatus.Build(pod, o, time.Now())
	if live, ok := w.Live[snap.Ref]; ok {
		if !write {
			return kube.Applied{Result: kube.Current}, nil
		}
		live.Status = status
	}
	w.Log = append(w.Log, "pod "+snap.Ref.String()+" "+o.Key())
	return kube.Applied{Result: kube.Patched, Phase: status.Phase}, nil
}

// describeChunk is how many ids the real Fleet names a DescribeInstances.
const describeChunk = 200

func (w *World) Describe(_ context.Context, ids []string) instances.Described {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.Describes = append(w.Describes, slices.Clone(ids))
	out := instances.Described{Found: map[string]instances.Instance{}, Left: map[string]error{}}
	if w.DescribeErr != nil {
		leave(out.Left, ids, w.DescribeErr)
		return out
	}
	ids = share(ids, w.DescribeShare, out.Left)
	for chunk := range slices.Chunk(ids, describeChunk) {
		if w.DescribeFails != nil {
			if err := w.DescribeFails(chunk); err != nil {
				leave(out.Left, chunk, err)
				continue
			}
		}
		for _, id := range chunk {
			if i, ok := w.Instances[id]; ok {
				if w.Now != nil {
					i.DescribedAt = w.Now()
				}
				out.Found[id] = i
			}
		}
	}
	return out
}

func (w *World) Tag(_ context.Context, ids []string, key, value string) ([]string, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.TagErr != nil {
		return slices.Clone(ids), w.TagErr
	}
	w.Log = append(w.Log, fmt.Sprint("tag ", ids))
	if w.Tags == nil {
		w.Tags = map[string]map[string]string{}
	}
	for _, id := range ids {
		if w.Tags[id] == nil {
			w.Tags[id] = map[string]string{}
		}
		w.Tags[id][key] = value
	}
	return nil, nil
}

// share returns the ids a share of n reaches (all, for n = 0) and leaves
// the rest with the error of a Fleet whose tokens ran out.
func share(ids []string, n int, left map[string]error) []string {
	if n == 0 || len(ids) <= n {
		return ids
	}
	leave(left, ids[n:], fmt.Errorf("%d instances: %w", len(ids)-n, instances.ErrNoTokens))
	return ids[:n]
}

func (w *World) Terminate(_ context.Context, ids []string, _ map[string]instances.Instance) instances.Terminated {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := instances.Terminated{Outcome: map[string]instances.Termination{}, Refusals: map[string]string{}, Left: map[string]error{}}
	if w.NoTokens {
		leave(out.Left, ids, fmt.Errorf("terminate %d instances: %w", len(ids), instances.ErrNoTokens))
		return out
	}
	ids = share(ids, w.TerminateShare, out.Left)
	w.Log = append(w.Log, fmt.Sprint("terminate ", ids))
	for _, id := range ids {
		out.Outcome[id] = instances.Terminating
		if w.Protected[id] {
			out.Outcome[id], out.Refusals[id] = instances.Refused, "OperationNotPermitted"
			continue
		}
		// As EC2 does: it is shutting down from now on.
		if inst, ok := w.Instances[id]; ok && !model.IsEnding(inst.State) {
			inst.State = model.StateShuttingDown
			w.Instances[id] = inst
		}
	}
	return out
}

func (w *World) ListOwned(_ context.Context, fn func(instances.Instance) error) error {
	w.mu.Lock()
	var owned []instances.Instance
	for _, i := range w.Instances {
		if i.Owned {
			if w.Now != nil {
				i.DescribedAt = w.Now()
			}
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

// Sent is one Send to the Queue.
type Sent struct {
	Delay time.Duration
	Msgs  []workqueue.Message
}

// Queue keeps what was sent, in order.
type Queue struct {
	mu sync.Mutex
	// Sent are the Sends, each with the messages the queue took.
	Sent []Sent
	// Refuse, when set, is asked about each message sent: one it answers
	// with an error is not taken but returned unsent.
	Refuse func(workqueue.Message) error
}

func (q *Queue) Send(ctx context.Context, delay time.Duration, msgs ...workqueue.Message) (unsent []workqueue.Message, err error) {
	if ctx.Err() != nil {
		// As the SQS client does: a request is not sent once its context
		// is done.
		return msgs, ctx.Err()
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	var took []workqueue.Message
	var errs []error
	for _, m := range msgs {
		if q.Refuse != nil {
			if err := q.Refuse(m); err != nil {
				unsent, errs = append(unsent, m), append(errs, fmt.Errorf("%s: %w", m.InstanceID, err))
				continue
			}
		}
		took = append(took, m)
	}
	q.Sent = append(q.Sent, Sent{delay, took})
	if len(unsent) == 0 {
		return nil, nil
	}
	return unsent, fmt.Errorf("work queue: %d of %d messages not sent: %w", len(unsent), len(msgs), errors.Join(errs...))
}

// Pod is the n-th Pod of a test: jobs/job-<n>, with a UID made of n.
func Pod(n int) model.PodRef {
	return model.PodRef{Namespace: "jobs", Name: fmt.Sprintf("job-%d", n), UID: fmt.Sprintf("00000000-0000-0000-0000-%012d", n)}
}

// InstanceID is the n-th instance of a test.
func InstanceID(n int) string { return fmt.Sprintf("i-%017x", n) }
