package reaper

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/reaper-k8s/reaper/internal/fakes"
	"github.com/reaper-k8s/reaper/pkg/instances"
	"github.com/reaper-k8s/reaper/pkg/ledger"
	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/model"
	"github.com/reaper-k8s/reaper/pkg/workqueue"
)

// A Pod whose write always outlasts the batch's time (an admission chain
// slower than any batch) does not circle for ever: each batch defers it
// with its attempt counted and a delay that grows, never at once twice in
// a row; on its last attempt its instance is terminated without the write,
// its work goes to the dead-letter queue with the reason, its record
// leaves the pending index, and nothing more comes back on the queue.
func TestWorkThatNeverFinishesIsDeadLettered(t *testing.T) {
	w := fakes.NewWorld(owned(instanceOf(1), podOf(1)))
	w.Pods[podOf(1)] = true
	w.ApplyDelay = time.Second // the batch's work phase lasts 200 ms
	core, l, q := newBatchCore(w)
	dead := &fakes.Queue{}
	core.DeadLetters = dead
	ev := batch(t, exitMsg(1, 0))
	var delays []time.Duration
	for round := range workqueue.MaxAttempts + 2 {
		ctx, cancel := context.WithTimeout(t.Context(), 400*time.Millisecond)
		resp, err := core.HandleQueueEvent(ctx, ev)
		cancel()
		if err != nil || len(resp.BatchItemFailures) != 0 {
			t.Fatalf("round %d: failures %v, %v", round, failures(resp), err)
		}
		if len(q.Sent) == 0 {
			break
		}
		if len(q.Sent) != 1 || len(q.Sent[0].Msgs) != 1 || q.Sent[0].Msgs[0].Attempt != round+1 {
			t.Fatalf("round %d: sent %+v, want the exit back with attempt %d", round, q.Sent, round+1)
		}
		delays = append(delays, q.Sent[0].Delay)
		ev = redeliver(t, q)
	}
	if len(delays) != workqueue.MaxAttempts-1 {
		t.Fatalf("deferred %d times (delays %v), want %d before the dead-letter queue", len(delays), delays, workqueue.MaxAttempts-1)
	}
	for i := 1; i < len(delays); i++ {
		if delays[i] <= delays[i-1] {
			t.Fatalf("delays %v: want each longer than the one before", delays)
		}
	}
	if len(dead.Sent) != 1 || len(dead.Sent[0].Msgs) != 1 {
		t.Fatalf("dead letters %+v, want the exit", dead.Sent)
	}
	// The first try recorded the exit: the work came back as a sweep of
	// its record, and that is what goes to the dead-letter queue.
	// A redrive gives it its attempts anew.
	if m := dead.Sent[0].Msgs[0]; m.Attempt != 0 || !strings.Contains(m.Reason, fmt.Sprintf("%d attempts", workqueue.MaxAttempts)) ||
		!strings.Contains(m.Reason, errNoTime.Error()) || m.Kind != workqueue.KindSweep {
		t.Fatalf("dead letter %+v, want the work with its reason and its %d attempts, and none counted", m, workqueue.MaxAttempts)
	}
	if !slices.Contains(w.Log, fmt.Sprint("terminate ", []string{instanceOf(1)})) {
		t.Fatalf("steps %q: the instance of a Pod that could not be written keeps billing", w.Log)
	}
	if r := l.Recs[instanceOf(1)]; r.Latest() == nil || r.Terminated.IsZero() || r.Pending != "" || r.PodSynced != "" {
		t.Fatalf("record %+v, want the exit recorded, the instance terminated, the record off the pending index and its Pod step not marked", r)
	}
	if l.Writes != 2 {
		t.Fatalf("%d ledger writes, want 2: the exit recorded once, then the terminate marked with the record settled", l.Writes)
	}
}

// A terminate EC2 refuses on every attempt (another tool holds the
// account's bucket empty) goes to the dead-letter queue, the operator's
// signal, but the record whose instance must end stays pending: once the
// bucket is free, a later sweep queues it again and the instance is named
// in exactly one TerminateInstances that EC2 takes.
func TestDeadLetteredTerminateIsEndedBySweep(t *testing.T) {
	w, core, l, q, dead := refusedTerminates()
	now := testNow()
	core.Now = func() time.Time { return now }
	ev := batch(t, exitMsg(1, 0))
	for round := range workqueue.MaxAttempts {
		resp, err := core.HandleQueueEvent(t.Context(), ev)
		if err != nil || len(resp.BatchItemFailures) != 0 {
			t.Fatalf("round %d: failures %v, %v", round, failures(resp), err)
		}
		if round < workqueue.MaxAttempts-1 {
			ev = redeliver(t, q)
			now = now.Add(time.Minute)
		}
	}
	if len(q.Sent) != 0 || len(dead.Sent) != 1 {
		t.Fatalf("sent %+v, dead letters %+v: want the work dead-lettered on its last attempt", q.Sent, dead.Sent)
	}
	if r := l.Recs[instanceOf(1)]; r.Pending == "" || !r.Terminated.IsZero() || r.PodSynced == "" {
		t.Fatalf("record %+v: want the Pod written, the terminate not made and the record still pending", r)
	}
	if slices.ContainsFunc(w.Log, func(s string) bool { return strings.HasPrefix(s, "terminate") }) {
		t.Fatalf("steps %q: no terminate was taken", w.Log)
	}

	w.NoTokens = false
	now = now.Add(requeueAfter)
	if _, err := core.Sweep(t.Context(), time.Hour); err != nil {
		t.Fatal(err)
	}
	if len(q.Sent) != 1 || len(q.Sent[0].Msgs) != 1 || q.Sent[0].Msgs[0].Kind != workqueue.KindSweep {
		t.Fatalf("sweep sent %+v, want the record queued again", q.Sent)
	}
	if resp, err := core.HandleQueueEvent(t.Context(), redeliver(t, q)); err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("failures %v, %v", failures(resp), err)
	}
	terminates := slices.DeleteFunc(slices.Clone(w.Log), func(s string) bool { return !strings.HasPrefix(s, "terminate") })
	if want := fmt.Sprint("terminate ", []string{instanceOf(1)}); len(terminates) != 1 || terminates[0] != want {
		t.Fatalf("terminates %q, want one: %s", terminates, want)
	}
	if r := l.Recs[instanceOf(1)]; r.Pending != "" || r.Terminated.IsZero() {
		t.Fatalf("record %+v: want it settled with its instance terminated", r)
	}
	if _, err := core.Sweep(t.Context(), time.Hour); err != nil || len(q.Sent) != 0 {
		t.Fatalf("a sweep after: sent %+v, %v; want nothing more", q.Sent, err)
	}
}

// One count bounds deferrals and receives alike: work deferred six times
// whose message then failed once (SQS's second receive of it) is on its
// last attempt, and goes to the dead-letter queue with its reason,
// instead of circling until SQS's own redrive, which carries none.
func TestReceivesCountAsAttempts(t *testing.T) {
	_, core, _, q, dead := refusedTerminates()
	m := exitMsg(1, 0)
	m.Attempt = workqueue.MaxAttempts - 2
	ev := batch(t, m)
	ev.Records[0].Attributes = map[string]string{"ApproximateReceiveCount": "2"}
	if resp, err := core.HandleQueueEvent(t.Context(), ev); err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("failures %v, %v", failures(resp), err)
	}
	if len(q.Sent) != 0 || len(dead.Sent) != 1 {
		t.Fatalf("sent %+v, dead letters %+v: want the work dead-lettered on its last attempt", q.Sent, dead.Sent)
	}
}

// refusedTerminates is a batch core over one running instance with a live
// Pod, whose terminates EC2 refuses (w.NoTokens) until a test says
// otherwise, and its dead-letter queue.
func refusedTerminates() (*fakes.World, *Reaper, *fakes.Ledger, *fakes.Queue, *fakes.Queue) {
	w := fakes.NewWorld(owned(instanceOf(1), podOf(1)))
	w.Pods[podOf(1)] = true
	w.NoTokens = true
	core, l, q := newBatchCore(w)
	dead := &fakes.Queue{}
	core.DeadLetters = dead
	return w, core, l, q, dead
}

// slowMarks is a ledger whose marks take delay each.
type slowMarks struct {
	*fakes.Ledger
	delay time.Duration
}

func (l slowMarks) MarkDone(ctx context.Context, id string, d ledger.Done) error {
	select {
	case <-time.After(l.delay):
	case <-ctx.Done():
		return ctx.Err()
	}
	return l.Ledger.MarkDone(ctx, id, d)
}

// The settle phase keeps time for the queue's sends: when the Pod writes
// use the batch's work time and the ledger marks all of theirs, the work
// not done (Pods not written, marks not made) is still deferred, not
// failed, and the wake-up of an instance
// left its power-off grace is still sent.
func TestSettleKeepsTimeForTheQueue(t *testing.T) {
	const writes = 4
	w := fakes.NewWorld(owned(instanceOf(0), podOf(0)))
	var msgs []workqueue.Message
	for i := 1; i <= writes; i++ {
		w.Pods[podOf(i)], w.Instances[instanceOf(i)] = true, owned(instanceOf(i), podOf(i))
		msgs = append(msgs, exitMsg(i, 0))
	}
	w.ApplyDelay = 10 * time.Second
	core, l, q := newBatchCore(w)
	core.Policy.PowerOffGrace = 30 * time.Second
	// Instance 0's Pod is written; its host has its grace.
	finished := testNow().Add(-5 * time.Second)
	l.Recs[instanceOf(0)] = ledger.Record{InstanceID: instanceOf(0), Pod: podOf(0), Pending: "p", Version: 1,
		Exits: exitsOf(model.Exit{Container: "main", FinishedAt: finished, ReceivedAt: finished}), PodSynced: "exit/0", PodSyncedAt: finished}
	// Instances 10 to 13 are terminated after their grace: their marks
	// take the marks' time.
	for i := 10; i < 14; i++ {
		w.Instances[instanceOf(i)] = owned(instanceOf(i), podOf(i))
		l.Recs[instanceOf(i)] = ledger.Record{InstanceID: instanceOf(i), Pod: podOf(i), Pending: "p", Version: 1,
			Exits: exitsOf(model.Exit{Container: "main", FinishedAt: testNow().Add(-time.Minute), ReceivedAt: testNow().Add(-time.Minute)}), PodSynced: "exit/0", PodSyncedAt: testNow().Add(-time.Minute)}
		msgs = append(msgs, workqueue.Sweep(instanceOf(i)))
	}
	core.Ledger = slowMarks{Ledger: l, delay: 10 * time.Second}
	msgs = append(msgs, workqueue.Sweep(instanceOf(0)))
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	resp, err := core.HandleQueueEvent(ctx, batch(t, msgs...))
	if err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("failures %v, %v: work not done in time must be deferred, not failed", failures(resp), err)
	}
	var deferred, wakeUps []string
	for _, s := range q.Sent {
		for _, m := range s.Msgs {
			if m.Kind == workqueue.KindSweep && s.Delay > 0 {
				wakeUps = append(wakeUps, m.InstanceID)
			} else {
				deferred = append(deferred, m.InstanceID)
			}
		}
	}
	if len(wakeUps) != 1 || wakeUps[0] != instanceOf(0) {
		t.Fatalf("wake-ups %v, want %s's", wakeUps, instanceOf(0))
	}
	if len(deferred) != writes+4 {
		t.Fatalf("deferred %v, want the %d exits whose Pods were not written and the 4 whose marks were not", deferred, writes)
	}
}

// The outcome counted is the status written: an OOM kill whose exit code
// is 0 is written Failed (137), and counted failed, not succeeded.
func TestOutcomeCountedAsWritten(t *testing.T) {
	w := fakes.NewWorld(owned(instanceOf(1), podOf(1)))
	w.Pods[podOf(1)] = true
	core, _, _ := newBatchCore(w)
	var emf bytes.Buffer
	core.Metrics = metrics.New(slog.New(slog.NewJSONHandler(&emf, nil)), "Reaper", metrics.FunctionReconciler)
	m := exitMsg(1, 0)
	m.Exit.OOMKilled = true
	if resp, err := core.HandleQueueEvent(t.Context(), batch(t, m)); err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("failures %v, %v", failures(resp), err)
	}
	for line := range strings.Lines(emf.String()) {
		if strings.Contains(line, `"PodStatusesWritten":1`) {
			if !strings.Contains(line, `"Outcome":"`+metrics.OutcomeFailed+`"`) {
				t.Fatalf("counted %s, want outcome %s", line, metrics.OutcomeFailed)
			}
			return
		}
	}
	t.Fatalf("no PodStatusesWritten in %s", emf.String())
}

// A sweep with more ledger writes than its time allows (5,000 instances
// whose state-change events were lost) makes what it can, ledgerWorkers
// at a time, returns before its invocation's deadline, and leaves the
// rest to the next sweep, counted.
func TestSweepBudget(t *testing.T) {
	const gone = 5000
	w := fakes.NewWorld()
	for i := range gone {
		inst := owned(instanceOf(i), podOf(i))
		inst.State = model.StateTerminated
		w.Instances[inst.ID] = inst
	}
	core, l, q := newBatchCore(w)
	l.WriteDelay = 20 * time.Millisecond
	var emf bytes.Buffer
	core.Metrics = metrics.New(slog.New(slog.NewJSONHandler(&emf, nil)), "Reaper", metrics.FunctionSweeper)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	sum, _ := core.Sweep(ctx, 15*time.Minute)
	if ctx.Err() != nil {
		t.Fatalf("the sweep outlasted its invocation (summary %+v)", sum)
	}
	l.WriteDelay = 0
	written := len(l.Recs)
	if sum.MissedGone != gone || written == 0 || sum.LeftOver == 0 || written+sum.LeftOver != gone {
		t.Fatalf("summary %+v, %d records written: want some written and the rest of %d left over", sum, written, gone)
	}
	if !strings.Contains(emf.String(), fmt.Sprintf(`"SweepLeftOver":%d`, sum.LeftOver)) {
		t.Fatalf("metrics %s, want SweepLeftOver %d", emf.String(), sum.LeftOver)
	}
	if sum.WaitingExit != written || len(q.Sent) != 0 {
		t.Fatalf("summary %+v, sent %+v: want the %d records written waiting for their exit-wait window", sum, q.Sent, written)
	}
}

// Work whose EC2 call was refused, or cut by the deadline while the SDK
// waited to retry, waits for EC2 as work short of tokens does; work cut
// by the deadline in flight, or short of time, comes back sooner.
func TestWaitsForEC2(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("terminate: %w", instances.ErrNoTokens), true},
		{fmt.Errorf("terminate: %w", &aws.RequestCanceledError{Err: context.DeadlineExceeded}), true},
		{fmt.Errorf("terminate: %w", context.DeadlineExceeded), false},
		{errNoTime, false},
	} {
		if got := waitsForEC2(tc.err); got != tc.want {
			t.Errorf("%v: waits for EC2 %v, want %v", tc.err, got, tc.want)
		}
	}
}

// A client that refuses to wait past the step's deadline before it comes
// (client-go's rate limiter) ran out of time: the work is deferred, not
// failed. Without a deadline, or for another error, it is a failure.
func TestOutOfTime(t *testing.T) {
	limiter := fmt.Errorf("patch pod: client rate limiter Wait returned an error: %w", errors.New("rate: Wait(n=1) would exceed context deadline"))
	bounded, cancel := context.WithTimeout(t.Context(), time.Hour)
	defer cancel()
	done, cancelDone := context.WithCancel(t.Context())
	cancelDone()
	for _, c := range []struct {
		ctx  context.Context
		err  error
		want bool
	}{
		{bounded, limiter, true},
		{t.Context(), limiter, false},
		{bounded, errors.New("forbidden"), false},
		{done, context.Canceled, true},
		{bounded, context.DeadlineExceeded, false},
	} {
		if got := errors.Is(outOfTime(c.ctx, c.err), errNoTime); got != c.want {
			t.Errorf("outOfTime(%v): out of time %v, want %v", c.err, got, c.want)
		}
	}
}
