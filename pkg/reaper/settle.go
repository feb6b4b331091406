package reaper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"

	"github.com/reaper-k8s/reaper/pkg/instances"
	"github.com/reaper-k8s/reaper/pkg/kube"
	"github.com/reaper-k8s/reaper/pkg/ledger"
	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/model"
	"github.com/reaper-k8s/reaper/pkg/workqueue"
)

// settle is the batch's last phase. Each entry's steps come to a verdict
// (done, deferred, dead-lettered or failed); the ledger learns what was
// done, until phases.marks; then the queue's sends, in the time reserved
// for them until phases.settle: deferred work with its attempt counted,
// work past workqueue.MaxAttempts to the dead-letter queue with its
// reason, wake-ups at the end of power-off graces, and state changes EC2
// did not confirm yet.
func (b *batchRun) settle(ctx context.Context) {
	for _, e := range b.live() {
		var podErr error
		if e.view != nil && e.plan.Pod != nil {
			podErr = e.podErr
		}
		e.conclude(errors.Join(podErr, e.termErr))
	}
	b.deferrals()
	marksCtx, cancel := afterWork(ctx, b.p.marks)
	b.mark(marksCtx)
	cancel()
	sendCtx, cancel := afterWork(ctx, b.p.settle)
	defer cancel()
	b.sendDeferred(sendCtx)
	b.sendDeadLetters(sendCtx)
	b.sendWakeUps(sendCtx)
	b.sendRechecks(sendCtx)
	for _, e := range b.entries {
		if e.view != nil {
			b.logEntry(ctx, e)
		}
		if e.orphanConfirmed() {
			b.countOrphan(e)
		}
	}
}

// countOrphan counts an orphan the batch terminated, or would have in a
// dry run.
func (b *batchRun) countOrphan(e *entry) {
	switch e.term {
	case instances.Terminating:
		b.sum.Orphans++
		b.Metrics.Count(metrics.OrphansTerminated, 1)
	case instances.WouldTerminate:
		b.sum.Orphans++
	}
}

// deadLetter says whether the entry's work goes to the dead-letter queue:
// deferred on its last attempt.
func (e *entry) deadLetter() bool { return e.failed == nil && e.deferred != nil && e.lastAttempt() }

// mark writes, in parallel, what the ledger must learn of each entry
// (entry.done), and the marks of the orphans terminated. A mark the batch
// has no time for defers its entry: the next try marks it.
func (b *batchRun) mark(ctx context.Context) {
	var g errgroup.Group
	g.SetLimit(ledgerWorkers)
	for _, e := range b.entries {
		d, write := e.done(b.Now())
		if write == noWrite {
			continue
		}
		if ctx.Err() != nil {
			e.conclude(errNoTime)
			continue
		}
		g.Go(func() error {
			if write == exitQueued {
				// Not a failure if it cannot be written: the claim still
				// comes back, only the window may close first.
				if err := b.Ledger.ExitQueued(ctx, e.id, b.Now().Add(e.backIn+exitQueuedSlack)); err != nil {
					b.Log.LogAttrs(ctx, slog.LevelWarn, "queued exit not recorded", slog.String("instance", e.id), slog.String("error", err.Error()))
				}
				return nil
			}
			if e.refusal != "" {
				b.terminationRefused(ctx, e.id, d.Pod, e.refusal)
			}
			e.markErr = outOfTime(ctx, b.Ledger.MarkDone(ctx, e.id, d))
			e.conclude(e.markErr)
			return nil
		})
	}
	_ = g.Wait()
}

// done is what the ledger must learn of an entry after its steps, and
// whether that is worth a write: the Pod outcome written, the instance
// terminated (or EC2's refusal), and whether the record is settled (it
// then leaves the pending index): its Pod step done, nothing left to wait
// for, its instance ended if the plan ended it. It reads the plan and the
// steps' results (Plan.Settled); it decides nothing again. Work that goes
// to the dead-letter queue gives up its Pod write (a redrive of the dead
// letter retries it), never its terminate: a record whose instance was to
// end and did not stays pending, and the sweep queues it again. A record that
// settles ended by Reaper's own steps forgets its instance's states
// (Done.ForgetStates), as one so settled never records them.
func (e *entry) done(now time.Time) (ledger.Done, markKind) {
	if e.view == nil {
		if e.deferred != nil && !e.deadLetter() && e.uncheckedExit() {
			return ledger.Done{}, exitQueued
		}
		d, ok := e.orphanDone()
		return d, markIf(ok)
	}
	d := ledger.Done{Version: e.view.Version}
	if e.plan.Pod != nil && e.podErr == nil {
		d.PodSynced, d.PodEnded, d.PodEndedAt = e.plan.Pod.Key(), e.plan.PodEnds, e.plan.PodEndedAt
	}
	if e.end.Now && e.termErr == nil && e.term != "" {
		if e.term == instances.Refused {
			d.Refused, d.Pod = e.refusal, e.view.Pod
		} else {
			d.Terminated = true
		}
	}
	d.Settled = e.plan.Settled(e.podErr == nil || e.deadLetter(), e.end, d.Terminated)
	after := ledger.WithDone(*e.view, e.id, d, now)
	d.ForgetStates = d.Settled && endedByReaper(after) && (e.view.LastState != "" || e.view.Gone != nil)
	write := d.PodSynced != "" || d.Terminated || d.Refused != "" || d.Settled == (e.view.Pending != "") || d.ForgetStates
	return d, markIf(write)
}

// markKind is what the ledger must learn of an entry after its steps.
type markKind int

const (
	noWrite    markKind = iota
	markDone            // ledger.Done, through MarkDone
	exitQueued          // its exit claim waits on the queue (Ledger.ExitQueued)
)

func markIf(ok bool) markKind {
	if ok {
		return markDone
	}
	return noWrite
}

// exitQueuedSlack is how long past its return a deferred exit claim keeps
// its instance's exit-wait window open: time for its batch to record it.
const exitQueuedSlack = 2 * time.Minute

// uncheckedExit says whether the entry carries an exit claim the batch did
// not get to check and record.
func (e *entry) uncheckedExit() bool {
	return slices.ContainsFunc(e.items, isExit)
}

// orphanDone is what the ledger must learn of an orphan the batch
// terminated, or EC2 refused: its record then keeps later sweeps and its
// state-change events from asking again (before RefusalBackoff, for a
// refusal).
func (e *entry) orphanDone() (ledger.Done, bool) {
	if !e.orphanConfirmed() || e.termErr != nil {
		return ledger.Done{}, false
	}
	d := ledger.Done{Pod: e.ec2.Pod, ExitTokenHash: e.ec2.ExitTokenHash, Settled: true}
	if e.stored != nil {
		d.Version = e.stored.Version
	}
	switch e.term {
	case instances.Terminating:
		d.Terminated = true
	case instances.Refused:
		d.Refused = e.refusal
	default:
		return ledger.Done{}, false
	}
	return d, true
}

// deferrals sets, for each entry whose work is deferred (not on its last
// attempt), the delay after which it comes back (entry.backIn): when the
// share it waits for has refilled (pacedDelay), or after retryDelay's
// backoff for anything else. A backoff's jitter is drawn once per batch,
// cause and attempt, so that the work deferred together comes back
// together.
func (b *batchRun) deferrals() {
	type backoff struct {
		attempt int
		refused bool
	}
	backoffs := map[backoff]time.Duration{}
	for _, e := range b.entries {
		if e.deferred == nil || e.deadLetter() {
			continue
		}
		delay, paced := pacedDelay(b.Now(), e.deferred)
		if !paced {
			k := backoff{e.attempt + 1, waitsForEC2(e.deferred)}
			if _, ok := backoffs[k]; !ok {
				backoffs[k] = retryDelay(k.attempt, k.refused)
			}
			delay = backoffs[k]
		}
		e.backIn = delay
	}
}

// sendDeferred puts the messages of the deferred entries back on the
// queue, as they came (an exit claim not yet checked is still to be
// checked) with their attempt counted, after their delay (entry.backIn):
// entries deferred together for one cause come back together. Those the
// queue does not take fail, and SQS brings them back after the visibility
// timeout.
func (b *batchRun) sendDeferred(ctx context.Context) {
	type key struct {
		attempt int
		delay   time.Duration
	}
	groups := map[key][]*entry{}
	for _, e := range b.entries {
		if e.deferred != nil && !e.deadLetter() {
			k := key{e.attempt + 1, e.backIn}
			groups[k] = append(groups[k], e)
		}
	}
	for k, es := range groups {
		sent := b.send(ctx, b.Queue, k.delay, es, (*entry).carried, func(m *workqueue.Message, e *entry) { m.Attempt = k.attempt })
		b.sum.Deferred += sent
		b.Metrics.Count(metrics.WorkItemsDeferred, sent)
	}
}

// pacedDelay is, for work deferred for err because the batch spent its
// share of a bucket (instances.ShareSpent), the delay that brings it back
// when the share will have refilled for it, on the WakeGrid step after:
// pacing is not failure, and waiting longer would leave tokens unused
// while instances bill. paced is false for any other cause, which backs
// off (retryDelay).
func pacedDelay(now time.Time, err error) (delay time.Duration, paced bool) {
	var spent *instances.ShareSpent
	if !errors.As(err, &spent) {
		return 0, false
	}
	return wakeDelay(now, spent.Ready), true
}

// waitsForEC2 says whether work deferred for err waits for EC2 to take
// calls again (retryDelay's longer delays): EC2 refused a call
// (RequestLimitExceeded), or the deadline came while the SDK waited to
// retry a call EC2 refused or failed (aws.RequestCanceledError). Asking
// again at once would meet the same refusal. Work the share did not cover
// is paced instead (pacedDelay).
func waitsForEC2(err error) bool {
	var canceled *aws.RequestCanceledError
	return errors.Is(err, instances.ErrNoTokens) || errors.As(err, &canceled)
}

// sendDeadLetters sends the work of the entries on their last attempt to
// the dead-letter queue, each message with the reason its work could not
// finish; their instances were terminated without the Pod write
// (endAfterPod). The alarm on the dead-letter queue's depth tells the
// operator, who redrives them once the cause is fixed.
func (b *batchRun) sendDeadLetters(ctx context.Context) {
	var es []*entry
	for _, e := range b.entries {
		if e.deadLetter() {
			es = append(es, e)
		}
	}
	if len(es) == 0 {
		return
	}
	if b.DeadLetters == nil {
		for _, e := range es {
			e.failed = fmt.Errorf("after %d attempts: %w", e.attempt+1, e.deferred)
		}
		return
	}
	// The messages as they came: an operator reads the claims themselves,
	// and a redrive records them again, which changes nothing recorded.
	// A redrive gives the work its attempts anew: the count goes into the
	// reason.
	sent := b.send(ctx, b.DeadLetters, 0, es, (*entry).received, func(m *workqueue.Message, e *entry) {
		m.Attempt, m.Reason = 0, fmt.Sprintf("not finished in %d attempts: %v", e.attempt+1, e.deferred)
	})
	b.sum.DeadLettered += sent
	b.Metrics.Count(metrics.WorkDeadLettered, sent)
	for _, e := range es {
		if e.failed == nil {
			b.Log.LogAttrs(ctx, slog.LevelError, "work dead-lettered", slog.String("instance", e.id),
				slog.Int("attempts", e.attempt+1), slog.String("reason", e.deferred.Error()), slog.String("terminateResult", string(e.term)))
		}
	}
}

// send sends the messages of entries es (msgsOf each) to q after delay,
// each edited by edit, and returns how many entries were sent whole; an
// entry with a message q did not take fails.
func (b *batchRun) send(ctx context.Context, q Queue, delay time.Duration, es []*entry, msgsOf func(*entry) []workqueue.Message, edit func(*workqueue.Message, *entry)) int {
	var msgs []workqueue.Message
	for _, e := range es {
		for _, m := range msgsOf(e) {
			edit(&m, e)
			msgs = append(msgs, m)
		}
	}
	unsent, err := q.Send(ctx, delay, msgs...)
	notSent := map[string]bool{}
	for _, m := range unsent {
		notSent[m.InstanceID] = true
	}
	sent := 0
	for _, e := range es {
		if notSent[e.id] {
			e.failed = fmt.Errorf("send to the queue: %w (for: %w)", err, e.deferred)
			continue
		}
		sent++
	}
	if len(unsent) > 0 {
		b.Log.LogAttrs(ctx, slog.LevelError, "work not sent", slog.Int("messages", len(unsent)), slog.String("error", fmt.Sprint(err)))
	}
	return sent
}

// carried are the messages that carry an entry's work to its next try.
// A record the batch believed holds what its messages said (the exit
// claims checked and recorded, the state changes recorded): one sweep
// message carries it, so the next try neither records nor sends them
// again. Orphan messages ask for their own check, and the messages of an
// entry that got no further go as they came.
func (e *entry) carried() []workqueue.Message {
	if e.view == nil {
		return e.received()
	}
	sweep := workqueue.Sweep(e.id)
	sweep.QueuedAt = e.since
	msgs := []workqueue.Message{sweep}
	for _, it := range e.items {
		if _, ok := it.Body.(workqueue.OrphanCheck); ok {
			msgs = append(msgs, it.Message)
		}
	}
	return msgs
}

// received are the entry's messages as they came.
func (e *entry) received() []workqueue.Message {
	msgs := make([]workqueue.Message, len(e.items))
	for i, it := range e.items {
		msgs[i] = it.Message
	}
	return msgs
}

// WakeGrid is the wall-clock step on which wake-ups come back: those of
// all batches due within one step arrive together, so that in a burst
// they share a few lookups and terminates instead of costing some each
// batch. A host that never powers off is terminated at most this much
// after its grace.
const WakeGrid = 5 * time.Second

// sendWakeUps has the record of each instance left its power-off grace
// looked at again just after the grace ends, on the next step of
// WakeGrid: its instance is then terminated unless EC2 reported it gone
// by then; and the record of each Pod whose sidecars were left their
// grace, once it ends (Plan.SidecarsDue). The sweep would find them too,
// up to a sweep later.
func (b *batchRun) sendWakeUps(ctx context.Context) {
	byDelay := map[time.Duration][]workqueue.Message{}
	for _, e := range b.entries {
		at := e.end.At
		if at.IsZero() && e.view != nil {
			at = e.plan.SidecarsDue
		}
		if at.IsZero() || e.stopped() {
			continue
		}
		delay := wakeDelay(b.Now(), at)
		byDelay[delay] = append(byDelay[delay], workqueue.Sweep(e.id))
	}
	for delay, msgs := range byDelay {
		if unsent, err := b.Queue.Send(ctx, delay, msgs...); err != nil {
			// The sweep queues the work once the grace has passed.
			b.Log.LogAttrs(ctx, slog.LevelWarn, "wake-ups not sent", slog.Int("messages", len(unsent)), slog.String("error", err.Error()))
		}
	}
}

// wakeDelay is the delay, from now, of the wake-up of an instance whose
// grace ends at: just after it, on the next step of WakeGrid.
func wakeDelay(now, at time.Time) time.Duration {
	due := at.Add(time.Second)
	if step := due.Truncate(WakeGrid); step.Before(due) {
		due = step.Add(WakeGrid)
	}
	// SQS delays are whole seconds: round up, never wake early.
	return min(max((due.Sub(now)+time.Second-1).Truncate(time.Second), 0), workqueue.MaxDelay)
}

// sendRechecks sends again, DeferDelay later, the messages to check again
// (batchRun.rechecks). Each is as durable as the message it came from: the
// entry of one the queue did not take fails, so that SQS brings back its
// messages as they came instead of losing a claim.
func (b *batchRun) sendRechecks(ctx context.Context) {
	if len(b.rechecks) == 0 {
		return
	}
	msgs := make([]workqueue.Message, len(b.rechecks))
	for i, r := range b.rechecks {
		msgs[i] = r.m
	}
	unsent, err := b.Queue.Send(ctx, DeferDelay, msgs...)
	if err == nil {
		return
	}
	notSent := map[string]bool{}
	for _, m := range unsent {
		notSent[m.InstanceID] = true
	}
	for _, r := range b.rechecks {
		if notSent[r.e.id] && r.e.failed == nil {
			r.e.failed, r.e.deferred = fmt.Errorf("send a check again: %w", err), nil
		}
	}
	b.Log.LogAttrs(ctx, slog.LevelError, "checks not sent again", slog.Int("messages", len(unsent)), slog.String("error", err.Error()))
}

// logEntry logs what became of a reconciled entry, and counts its steps.
func (b *batchRun) logEntry(ctx context.Context, e *entry) {
	b.sum.Reconciled++
	if e.pod.Result == kube.Patched {
		b.sum.Patched++
	}
	if e.term == instances.Terminating {
		b.sum.Terminated++
	}
	b.recordSteps(e)
	attrs := []slog.Attr{
		slog.String("instance", e.id),
		slog.String("pod", e.view.Pod.String()),
		slog.String("plan", e.plan.Why),
		slog.String("podResult", string(e.pod.Result)),
		slog.String("terminateResult", string(e.term)),
	}
	level := slog.LevelInfo
	switch {
	case e.failed != nil:
		level = slog.LevelError
		attrs = append(attrs, slog.String("error", e.failed.Error()))
	case e.deferred != nil:
		// Deferred, not failed: the work comes back.
		attrs = append(attrs, slog.String("deferred", e.deferred.Error()), slog.Int("attempt", e.attempt+1))
	}
	b.Log.LogAttrs(ctx, level, "reconciled", attrs...)
}

// recordSteps counts what an entry's steps achieved and, for an exit, how
// long after the container finished. The outcome counted is the phase the
// Pod was written with.
func (b *batchRun) recordSteps(e *entry) {
	sinceFinish := func() (time.Duration, bool) {
		last := e.view.Latest()
		if last == nil || last.FinishedAt.IsZero() {
			return 0, false
		}
		return b.Now().Sub(last.FinishedAt), true
	}
	if e.pod.Result == kube.Patched {
		b.Metrics.By(metrics.Outcome(outcomeName(e.pod.Phase, e.plan.Pod))).Count(metrics.PodStatusesWritten, 1)
		if d, ok := sinceFinish(); ok && e.plan.PodEnds {
			b.Metrics.Observe(metrics.FinishToPodTerminal, d)
		}
	}
	if e.term == instances.Terminating {
		b.Metrics.Count(metrics.InstancesTerminated, 1)
		if d, ok := sinceFinish(); ok {
			b.Metrics.Observe(metrics.FinishToTerminated, d)
		}
	}
}

// outcomeName is the value of the Outcome dimension for a Pod written in
// phase with outcome o: the status written decides, so an OOM kill with
// exit code 0, or a Pod another of whose containers failed, counts as
// failed.
func outcomeName(phase corev1.PodPhase, o *model.Outcome) string {
	switch {
	case phase == corev1.PodSucceeded:
		return metrics.OutcomeSucceeded
	case phase != corev1.PodFailed:
		return metrics.OutcomeRestart
	case o.Lost != nil:
		return metrics.OutcomeLost
	}
	return metrics.OutcomeFailed
}
