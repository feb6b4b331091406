package reaper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/reaper-k8s/reaper/pkg/exitline"
	"github.com/reaper-k8s/reaper/pkg/instances"
	"github.com/reaper-k8s/reaper/pkg/kube"
	"github.com/reaper-k8s/reaper/pkg/ledger"
	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/model"
	"github.com/reaper-k8s/reaper/pkg/workqueue"
)

// Queue is the work queue (package workqueue).
type Queue interface {
	Send(ctx context.Context, delay time.Duration, msgs ...workqueue.Message) error
}

// DeferDelay is how long work the reconciler's share of EC2's buckets
// could not cover waits on the queue before it is tried again. Work a batch
// ran out of time for goes back at once.
const DeferDelay = 30 * time.Second

// BatchSummary is what one reconciler batch came to; it is logged as one
// line.
type BatchSummary struct {
	Messages  int `json:"messages"`
	Instances int `json:"instances"`
	// Invalid messages are dropped: they will not parse better later.
	Invalid int `json:"invalid"`
	// Lookups are the instances described.
	Lookups int `json:"lookups"`
	// Skipped instances are not this deployment's, or unknown to EC2 and
	// to the ledger.
	Skipped    int `json:"skipped"`
	Rejected   int `json:"rejected"`
	Reconciled int `json:"reconciled"`
	Patched    int `json:"patched"`
	Terminated int `json:"terminated"`
	Orphans    int `json:"orphans"`
	// Deferred instances went back on the queue for want of EC2 tokens.
	Deferred int `json:"deferred"`
	// Failed instances are returned as batch item failures.
	Failed int `json:"failed"`
}

// level is the level of the batch's line: ERROR when work failed (it
// comes back), WARN when messages were dropped as invalid or claims
// rejected, INFO otherwise.
func (s BatchSummary) level() slog.Level {
	switch {
	case s.Failed > 0:
		return slog.LevelError
	case s.Invalid > 0 || s.Rejected > 0:
		return slog.LevelWarn
	}
	return slog.LevelInfo
}

// HandleQueueEvent is the reconciler's handler: one batch of the work
// queue, from the event source mapping. The messages of the instances whose
// work failed are returned as batch item failures and come back after the
// visibility timeout; everything else is deleted.
func (r *Reaper) HandleQueueEvent(ctx context.Context, ev events.SQSEvent) (events.SQSEventResponse, error) {
	defer r.flushMetrics(ctx)
	var resp events.SQSEventResponse
	byInstance := map[string][]workqueue.Item{}
	sum := BatchSummary{Messages: len(ev.Records)}
	now := r.Now()
	for _, rec := range ev.Records {
		it, err := workqueue.Parse(rec)
		if err != nil {
			sum.Invalid++
			r.Log.LogAttrs(ctx, slog.LevelError, "work item rejected", slog.String("messageId", rec.MessageId), slog.String("error", err.Error()))
			continue
		}
		if !it.SentAt.IsZero() {
			r.Metrics.Observe(metrics.QueueAge, now.Sub(it.SentAt))
		}
		byInstance[it.InstanceID] = append(byInstance[it.InstanceID], it)
	}
	sum.Instances = len(byInstance)
	failed := r.ReconcileBatch(ctx, byInstance, &sum)
	for id := range failed {
		for _, it := range byInstance[id] {
			resp.BatchItemFailures = append(resp.BatchItemFailures, events.SQSBatchItemFailure{ItemIdentifier: it.MessageID})
		}
	}
	sum.Failed = len(failed)
	r.Metrics.Count(metrics.WorkItemsFailed, sum.Failed)
	r.Log.LogAttrs(ctx, sum.level(), "batch",
		slog.Int("messages", sum.Messages), slog.Int("instances", sum.Instances), slog.Int("invalid", sum.Invalid),
		slog.Int("lookups", sum.Lookups), slog.Int("skipped", sum.Skipped), slog.Int("rejected", sum.Rejected),
		slog.Int("reconciled", sum.Reconciled), slog.Int("patched", sum.Patched), slog.Int("terminated", sum.Terminated),
		slog.Int("orphans", sum.Orphans), slog.Int("deferred", sum.Deferred), slog.Int("failed", sum.Failed))
	return resp, nil
}

// ReconcileBatch carries out the work items of a batch, grouped by
// instance, and returns the instances whose work failed (with why). It
// reads their ledger records together and describes, 200 ids a call, every
// instance whose tags are still to be checked; then applies what the
// messages report (state changes, checked exit claims), and reconciles the
// records together (reconcileMany: the Pod writes, then the terminations).
//
// Every batch makes progress and nothing reads as done that was not: the
// batch does what its time and its share of EC2's buckets allow (phases),
// and puts back on the queue, untouched, the work of every instance it did
// not finish for want of either (deferWork). Deferred work shrinks each
// time it comes back.
func (r *Reaper) ReconcileBatch(ctx context.Context, byInstance map[string][]workqueue.Item, sum *BatchSummary) map[string]error {
	p := phasesOf(ctx)
	workCtx, cancel := withDeadline(ctx, p.work)
	defer cancel()
	settleCtx, cancelSettle := p.settleContext(ctx)
	defer cancelSettle()
	b := &batchRun{Reaper: r, byInstance: byInstance, sum: sum, failed: map[string]error{}, later: map[string]error{}}

	ids := slices.Sorted(maps.Keys(byInstance))
	records, err := r.Ledger.GetMany(workCtx, ids)
	if err != nil {
		b.fail(workCtx, ids, err)
		b.deferLater(settleCtx)
		return b.failed
	}
	known := b.lookup(workCtx, ids, records)

	var (
		act     []string // instances whose messages this batch applies
		orphans []string
	)
	for _, id := range ids {
		if !b.settled(id) {
			act = append(act, id)
		}
	}
	recs := make([]*ledger.Record, len(act))
	for i := range act {
		b.later[act[i]] = errNoTime // until apply has run
	}
	_ = forEach(workCtx, ledgerWorkers, indices(act), func(i int) error {
		id := act[i]
		rec, err := r.apply(workCtx, id, byInstance[id], records, known, b)
		b.mu.Lock()
		defer b.mu.Unlock()
		delete(b.later, id)
		recs[i] = rec
		b.settle(id, outOfTime(workCtx, err))
		return nil
	})
	var work []ledger.Record
	for i, id := range act {
		if b.settled(id) {
			continue
		}
		if recs[i] != nil {
			work = append(work, *recs[i])
		}
		if slices.ContainsFunc(byInstance[id], func(it workqueue.Item) bool { return it.Kind == workqueue.KindOrphan }) {
			orphans = append(orphans, id)
		}
	}

	reps, errs := r.reconcileMany(ctx, p, work, known)
	for i, rep := range reps {
		sum.Reconciled++
		if rep.PodResult == kube.Patched {
			sum.Patched++
		}
		if rep.TerminateResult == instances.Terminating {
			sum.Terminated++
		}
		b.settle(rep.InstanceID, errs[i])
		if !rep.Plan.TerminateAt.IsZero() && errs[i] == nil {
			b.wakeAt(rep.InstanceID, rep.Plan.TerminateAt)
		}
	}
	for id, err := range r.terminateOrphans(ctx, p, orphans, records, known, sum) {
		b.settle(id, err)
	}
	b.deferLater(settleCtx)
	return b.failed
}

// batchRun is what one batch keeps track of: the instances whose work
// failed and those whose work goes back on the queue.
type batchRun struct {
	*Reaper
	byInstance map[string][]workqueue.Item
	mu         sync.Mutex
	sum        *BatchSummary
	failed     map[string]error
	// later are the instances whose work is deferred, with why; nothing
	// else is done for them in this batch.
	later map[string]error
	// asked are the instances EC2 was asked about and answered for: those
	// absent from its answer it no longer knows.
	asked map[string]bool
	// recheck are state messages EC2 did not confirm yet, to send again
	// (unconfirmedState).
	recheck []workqueue.Message
	// wake are the instances to look at again, by how much later: those
	// whose host has its power-off grace (Plan.TerminateAt).
	wake map[time.Duration][]workqueue.Message
}

// WakeGrid is the wall-clock step on which wake-ups come back: those of
// all batches due within one step arrive together, so that in a burst
// they share a few lookups and terminates instead of costing some each
// batch. A host that never powers off is terminated at most this much
// after its grace.
const WakeGrid = 5 * time.Second

// wakeAt has the instance's record looked at again just after at, on the
// next step of WakeGrid: its instance is then terminated unless EC2
// reported it gone by then. The sweep would find it too, up to a sweep
// later.
func (b *batchRun) wakeAt(id string, at time.Time) {
	due := at.Add(time.Second)
	if step := due.Truncate(WakeGrid); step.Before(due) {
		due = step.Add(WakeGrid)
	}
	// SQS delays are whole seconds: round up, never wake early.
	delay := min(max((due.Sub(b.Now())+time.Second-1).Truncate(time.Second), 0), workqueue.MaxDelay)
	if b.wake == nil {
		b.wake = map[time.Duration][]workqueue.Message{}
	}
	b.wake[delay] = append(b.wake[delay], workqueue.Sweep(id))
}

// settled says whether id's work is decided for this batch: failed or
// deferred.
func (b *batchRun) settled(id string) bool {
	_, failed := b.failed[id]
	_, later := b.later[id]
	return failed || later
}

// settle sorts the error of id's work: none, for later, or a failure.
func (b *batchRun) settle(id string, err error) {
	switch {
	case err == nil:
	case forLater(err):
		b.later[id] = err
	default:
		b.failed[id] = err
	}
}

func (b *batchRun) skipped() {
	b.mu.Lock()
	b.sum.Skipped++
	b.mu.Unlock()
}

func (b *batchRun) rejected() {
	b.mu.Lock()
	b.sum.Rejected++
	b.mu.Unlock()
}

func (b *batchRun) fail(ctx context.Context, ids []string, err error) {
	for _, id := range ids {
		b.settle(id, outOfTime(ctx, err))
	}
}

// forLater says whether err ended work for want of time or of EC2 tokens:
// the work is deferred, not failed.
func forLater(err error) bool {
	return errors.Is(err, errNoTime) || errors.Is(err, instances.ErrNoTokens)
}

// lookup describes the instances whose tags are still to be checked and
// returns what EC2 knows of them. An instance needs its tags checked unless
// Reaper already checked and terminated it and its messages are state
// changes or wake-ups (sweeps), which only have the record's own verdict
// carried out: in a burst those are most messages, and they need no EC2
// call. The instances EC2 could not be asked about for want of
// tokens are deferred; if it could not be asked at all, their work fails:
// nothing acts on what EC2 has not confirmed.
func (b *batchRun) lookup(ctx context.Context, ids []string, records map[string]ledger.Record) map[string]instances.Instance {
	var lookup []string
	for _, id := range ids {
		rec, ok := records[id]
		settled := ok && !rec.Unverified && !rec.Terminated.IsZero()
		if !settled || slices.ContainsFunc(b.byInstance[id], func(it workqueue.Item) bool {
			return it.Kind != workqueue.KindState && it.Kind != workqueue.KindSweep
		}) {
			lookup = append(lookup, id)
		}
	}
	b.sum.Lookups = len(lookup)
	b.asked = map[string]bool{}
	if len(lookup) == 0 {
		return map[string]instances.Instance{}
	}
	known, err := b.Fleet.Describe(ctx, lookup)
	var deferred *instances.Deferred
	switch {
	case err == nil:
	case errors.As(err, &deferred):
		b.fail(ctx, deferred.IDs, fmt.Errorf("check %d instances against their tags: %w", len(deferred.IDs), err))
	default:
		b.fail(ctx, lookup, fmt.Errorf("check %d instances against their tags: %w", len(lookup), err))
	}
	for _, id := range lookup {
		if !b.settled(id) {
			b.asked[id] = true
		}
	}
	if known == nil {
		known = map[string]instances.Instance{}
	}
	return known
}

// deferLater puts the messages of the instances whose work is for later
// back on the queue, as they came (an exit claim not yet checked is still
// to be checked): delayed when EC2 tokens ran short, at once when time
// did. If that fails they become failures, and SQS brings them back after
// the visibility timeout.
func (b *batchRun) deferLater(ctx context.Context) {
	byDelay := map[time.Duration][]string{}
	for id, err := range b.later {
		delay := time.Duration(0)
		if errors.Is(err, instances.ErrNoTokens) {
			delay = DeferDelay
		}
		byDelay[delay] = append(byDelay[delay], id)
	}
	for delay, ids := range byDelay {
		slices.Sort(ids)
		var msgs []workqueue.Message
		for _, id := range ids {
			for _, it := range b.byInstance[id] {
				msgs = append(msgs, it.Message)
			}
		}
		if err := b.Queue.Send(ctx, delay, msgs...); err != nil {
			b.Log.LogAttrs(ctx, slog.LevelError, "work not deferred", slog.Int("instances", len(ids)), slog.String("error", err.Error()))
			for _, id := range ids {
				b.failed[id] = fmt.Errorf("defer: %w (deferred for: %w)", err, b.later[id])
			}
			continue
		}
		b.sum.Deferred += len(ids)
		b.Metrics.Count(metrics.WorkItemsDeferred, len(ids))
	}
	b.later = map[string]error{}
	for delay, msgs := range b.wake {
		if err := b.Queue.Send(ctx, delay, msgs...); err != nil {
			// The sweep queues the work once the grace has passed.
			b.Log.LogAttrs(ctx, slog.LevelWarn, "wake-ups not sent", slog.Int("messages", len(msgs)), slog.String("error", err.Error()))
		}
	}
	b.wake = nil
	if len(b.recheck) > 0 {
		if err := b.Queue.Send(ctx, DeferDelay, b.recheck...); err != nil {
			// The sweep records what EC2 lists as gone: nothing is lost.
			b.Log.LogAttrs(ctx, slog.LevelWarn, "state changes not sent for a check", slog.Int("messages", len(b.recheck)), slog.String("error", err.Error()))
		}
		b.recheck = nil
	}
}

func indices[T any](s []T) []int {
	out := make([]int, len(s))
	for i := range s {
		out[i] = i
	}
	return out
}

// apply records what an instance's messages report and returns its record
// as it is believed (believe: checked once against the instance's launch
// tags), if there is one to reconcile; a record the tags do not back is
// settled untouched. State changes of instances that are not this
// deployment's, and exit claims the tags do not back, are logged and
// dropped. What a message says of the instance's state is
// checked against EC2's own answer (confirmedState), and a time in the
// future beyond the clock skew a host may have is refused.
func (r *Reaper) apply(ctx context.Context, id string, items []workqueue.Item, records map[string]ledger.Record, known map[string]instances.Instance, b *batchRun) (*ledger.Record, error) {
	rec, haveRecord := records[id]
	inst, described := known[id]
	if described && !inst.Owned {
		b.skipped()
		r.Log.LogAttrs(ctx, slog.LevelDebug, "work skipped", slog.String("instance", id),
			slog.Bool("managed", inst.Managed), slog.String("cluster", inst.Cluster))
		for _, it := range items {
			if it.Kind == workqueue.KindExit {
				if err := r.rejectClaim(ctx, id, *it.Pod, rec, distrust(inst, described, *it.Pod), inst); err != nil {
					return nil, err
				}
			}
		}
		return nil, nil
	}
	items = r.notInFuture(ctx, id, items)
	var reconcile bool
	sc, ok, unconfirmed := r.confirmedState(ctx, id, items, rec, haveRecord, inst, described, b.asked[id])
	if unconfirmed {
		b.unconfirmedState(ctx, id, items, inst.State)
	}
	if ok {
		next, write := rec, true
		if haveRecord {
			next, write = r.stateChanges(rec, id, inst.Pod, &sc)
		}
		if write {
			var err error
			if next, err = r.Ledger.RecordState(ctx, id, inst.Pod, sc); err != nil {
				return nil, err
			}
		}
		rec, haveRecord = next, true
		reconcile = sc.Gone()
	}
	for _, it := range items {
		switch it.Kind {
		case workqueue.KindExit:
			if reason := claimDistrust(*it.Pod, inst, described, rec, haveRecord); reason != "" {
				if err := r.rejectClaim(ctx, id, *it.Pod, rec, reason, inst); err != nil {
					return nil, err
				}
				continue
			}
			next, err := r.Ledger.RecordExit(ctx, id, *it.Pod, *it.Exit)
			if err != nil {
				return nil, fmt.Errorf("record exit of %s: %w", id, err)
			}
			rec, haveRecord, reconcile = next, true, true
			r.Metrics.Observe(metrics.FinishToRecorded, r.Now().Sub(it.Exit.FinishedAt))
		case workqueue.KindSweep:
			reconcile = reconcile || haveRecord
		}
	}
	if !reconcile {
		if !haveRecord && !described && slices.ContainsFunc(items, func(it workqueue.Item) bool { return it.Kind == workqueue.KindState }) {
			b.skipped()
		}
		return nil, nil
	}
	view, reason, believed := believe(rec, inst, described)
	if !believed {
		b.rejected()
		return nil, r.reject(ctx, rec, inst, reason)
	}
	if reason != "" {
		r.Log.LogAttrs(ctx, slog.LevelWarn, "exit not believed", slog.String("instance", id),
			slog.String("reason", reason), slog.String("claimed", rec.Pod.String()), slog.String("tags", inst.Pod.String()))
	}
	return &view, nil
}

// notInFuture is items without those whose time lies further ahead than
// the clock skew a host may have (exitline.MaxClockSkew): a state change
// dated in the future would keep every real one from being recorded, and
// an exit so dated is a forgery. Each is logged and counted.
func (r *Reaper) notInFuture(ctx context.Context, id string, items []workqueue.Item) []workqueue.Item {
	limit := r.Now().Add(exitline.MaxClockSkew)
	return slices.DeleteFunc(slices.Clone(items), func(it workqueue.Item) bool {
		var at time.Time
		switch it.Kind {
		case workqueue.KindState:
			at = it.At
		case workqueue.KindExit:
			at = it.Exit.FinishedAt
		default:
			return false
		}
		if !at.After(limit) {
			return false
		}
		if it.Kind == workqueue.KindExit {
			r.Metrics.By(metrics.Reason(model.ReasonFinishedInFuture)).Count(metrics.LinesRejected, 1)
		} else {
			r.Metrics.By(metrics.Reason(model.ReasonInFuture)).Count(metrics.StateChangesRefused, 1)
		}
		r.Log.LogAttrs(ctx, slog.LevelWarn, "work item in the future", slog.String("instance", id),
			slog.String("kind", string(it.Kind)), slog.Time("at", at), slog.Duration("maxSkew", exitline.MaxClockSkew))
		return true
	})
}

// confirmedState is the state change to record for an instance, if any:
// what a message claims only as far as EC2 confirms it. Any principal that
// can reach the queue could claim "stopped" of a running instance and have
// it terminated, or date a state in the future (notInFuture).
//   - EC2 described the instance: a message claiming it gone while EC2
//     describes it running or pending is not confirmed (unconfirmed: it is
//     checked again later, unconfirmedState). Otherwise the claim is
//     recorded as far as EC2 has got: its state when EC2 is there or
//     further on (its time says since when), EC2's own state when the claim
//     is ahead of it.
//   - EC2 was asked and no longer knows it (terminated over an hour ago):
//     a record kept for it, with no gone state yet, is gone now (or since
//     a message said so), so its Pod ends, lost after the window if no
//     exit comes. No record is made for an instance nobody knows.
//   - EC2 was not asked (a record Reaper checked and terminated, whose
//     messages are state changes only): a gone state is what Reaper's own
//     terminate makes true; nothing else is recorded.
func (r *Reaper) confirmedState(ctx context.Context, id string, items []workqueue.Item, rec ledger.Record, haveRecord bool, inst instances.Instance, described, asked bool) (sc ledger.StateChange, ok, unconfirmed bool) {
	claimed, claims := newestState(items)
	switch {
	case described:
		if !claims {
			return ledger.StateChange{}, false, false
		}
		if claimed.Gone() && !model.IsGone(inst.State) {
			return ledger.StateChange{}, false, true
		}
		sc = claimed
		if claimed.Rank() > model.StateRank(inst.State) {
			sc.State = inst.State
		}
		return sc, true, false
	case asked && haveRecord && !rec.Unverified && rec.Gone == nil:
		sc = ledger.StateChange{State: model.StateTerminated, At: r.Now()}
		if claims && claimed.Gone() && !claimed.At.After(sc.At) {
			sc.At = claimed.At
		}
		r.Log.LogAttrs(ctx, slog.LevelWarn, "instance no longer known to EC2", slog.String("instance", id), slog.String("pod", rec.Pod.String()))
		return sc, true, false
	case claims && haveRecord && claimed.Gone():
		return claimed, true, false
	}
	return ledger.StateChange{}, false, false
}

// stateChecks is how often a state message EC2 does not confirm is checked
// before it is refused: EC2's answers are eventually consistent, within
// seconds, and DeferDelay apart these checks span minutes. A forged claim
// is then refused, logged and counted; a real end EC2 was slow to show is
// recorded at a later check, or by the sweep, which records gone states
// from EC2's own listing.
const stateChecks = 5

// unconfirmedState sends again, DeferDelay later, the state messages of id
// that claim it gone while EC2 describes it as state, each checked once
// more, and refuses those checked stateChecks times already.
func (b *batchRun) unconfirmedState(ctx context.Context, id string, items []workqueue.Item, state string) {
	for _, it := range items {
		if it.Kind != workqueue.KindState || !model.IsGone(it.State) {
			continue
		}
		if it.Checks+1 < stateChecks {
			m := it.Message
			m.Checks++
			b.mu.Lock()
			b.recheck = append(b.recheck, m)
			b.mu.Unlock()
			continue
		}
		b.Metrics.By(metrics.Reason(model.ReasonNotConfirmed)).Count(metrics.StateChangesRefused, 1)
		b.Log.LogAttrs(ctx, slog.LevelWarn, "state change not confirmed", slog.String("instance", id),
			slog.String("claimed", it.State), slog.Time("at", it.At), slog.String("described", state), slog.Int("checks", it.Checks+1))
	}
}

// claimDistrust says why an exit claim is not to be believed, or "". The
// instance's launch tags decide while EC2 describes it. Once EC2 no longer
// knows it, a record checked against those tags while it did backs a
// claim of the Pod it names: the exit of a Pod whose lookups failed until
// EC2 forgot its instance still counts.
func claimDistrust(pod model.PodRef, inst instances.Instance, described bool, rec ledger.Record, haveRecord bool) string {
	if described {
		return distrust(inst, described, pod)
	}
	if haveRecord && !rec.Unverified && rec.Pod.UID != "" && rec.Pod == pod {
		return ""
	}
	return model.ReasonInstanceUnknown
}

// newestState is the newest of the state changes among items: applied in
// any order, the ledger's write rules leave a record as the newest alone
// does, so a batch writes that one only.
func newestState(items []workqueue.Item) (ledger.StateChange, bool) {
	var (
		newest ledger.StateChange
		found  bool
	)
	for _, it := range items {
		if it.Kind != workqueue.KindState {
			continue
		}
		sc := ledger.StateChange{State: it.State, At: it.At}
		if !found || sc.At.After(newest.At) || (sc.At.Equal(newest.At) && sc.Rank() >= newest.Rank()) {
			newest, found = sc, true
		}
	}
	return newest, found
}

// stateChanges is rec after the state change sc, and whether that is worth
// a write: not for an event older than the newest one recorded, which the
// ledger's conditional write would refuse and answer with a read. A gone
// state that leaves a settled record nothing to do (in a burst, the two
// EC2 sends for every instance Reaper terminated) keeps it off the pending
// index: one write, where setting and clearing the index took two.
func (r *Reaper) stateChanges(rec ledger.Record, id string, pod model.PodRef, sc *ledger.StateChange) (ledger.Record, bool) {
	next, applies := ledger.WithState(rec, id, pod, *sc, r.Now())
	if !applies {
		return rec, false
	}
	if rec.Pending == "" && !rec.Unverified && Decide(next, r.Now(), r.Policy).Idle() {
		sc.AddsNoWork = true
		next.Pending = ""
	}
	return next, true
}

// rejectClaim logs and counts an exit claim the instance's tags do not
// back, for reason. If the record holds the claim unverified (an older
// exitrecorder wrote it), the record is settled untouched: nothing acts on
// it, and no sweep comes back to it.
func (r *Reaper) rejectClaim(ctx context.Context, id string, pod model.PodRef, rec ledger.Record, reason string, inst instances.Instance) error {
	r.Metrics.By(metrics.Reason(reason)).Count(metrics.LinesRejected, 1)
	r.Log.LogAttrs(ctx, slog.LevelWarn, "exit line not believed", slog.String("instance", id),
		slog.String("reason", reason), slog.String("claimed", pod.String()), slog.String("claimedUID", pod.UID),
		slog.String("tags", inst.Pod.String()), slog.String("cluster", inst.Cluster))
	if !rec.Unverified || rec.Pod != pod || rec.Pending == "" {
		return nil
	}
	return r.Ledger.MarkDone(ctx, id, ledger.Done{Settled: true, Version: rec.Version})
}

// terminateOrphans ends the instances the sweeper found running without a
// live Pod, once it is clear they still are: owned, running, launched for
// the cluster Reaper reaches (sameCluster), no believed terminal exit in
// the ledger nor a recent refusal, and the Pod they were launched for
// deleted, replaced or finished (read again now). It returns the errors of
// the orphans whose work is not done.
func (r *Reaper) terminateOrphans(ctx context.Context, p phases, ids []string, records map[string]ledger.Record, known map[string]instances.Instance, sum *BatchSummary) map[string]error {
	errs := map[string]error{}
	var candidates []instances.Instance
	for _, id := range ids {
		inst, ok := known[id]
		rec, haveRecord := records[id]
		if !ok || !inst.Owned || inst.Pod.UID == "" || !mayBeOrphan(inst, rec, haveRecord, r.Now()) {
			continue
		}
		candidates = append(candidates, inst)
		errs[id] = errNoTime // until its Pod is read
	}
	if len(candidates) == 0 {
		return errs
	}
	workCtx, cancel := withDeadline(ctx, p.work)
	defer cancel()
	same, _, err := r.sameCluster(workCtx, candidates)
	if err != nil {
		for _, inst := range candidates {
			errs[inst.ID] = outOfTime(workCtx, err)
		}
		return errs
	}
	for _, inst := range candidates {
		delete(errs, inst.ID)
	}
	for _, inst := range same {
		errs[inst.ID] = errNoTime
	}
	refs := make([]model.PodRef, len(same))
	for i, inst := range same {
		refs[i] = inst.Pod
	}
	snaps, readErr := r.Pods.ReadMany(workCtx, refs)
	var targets []string
	for _, inst := range same {
		id := inst.ID
		pod, ok := snaps[inst.Pod]
		if !ok {
			errs[id] = outOfTime(workCtx, fmt.Errorf("read pod %s: %w", inst.Pod, readErr))
			continue
		}
		delete(errs, id)
		if pod.Result != kube.Current {
			r.Log.LogAttrs(ctx, slog.LevelWarn, "orphaned instance", slog.String("instance", id),
				slog.String("pod", inst.Pod.String()), slog.String("pod state", string(pod.Result)))
			targets = append(targets, id)
		}
	}
	if len(targets) == 0 {
		return errs
	}
	slices.Sort(targets)
	termCtx, cancelTerm := p.terminateContext(ctx)
	out, termErr := r.Fleet.Terminate(termCtx, targets, known)
	cancelTerm()
	termErr = outOfTime(termCtx, termErr)
	var refusals instances.Refusals
	errors.As(termErr, &refusals)
	settleCtx, cancelSettle := p.settleContext(ctx)
	defer cancelSettle()
	for _, id := range targets {
		switch out[id] {
		case "":
			errs[id] = termErr
		case instances.Refused:
			// Its Pod is gone: the warning and the count say it. The
			// record keeps the sweep from asking again before
			// RefusalBackoff.
			r.terminationRefused(settleCtx, id, model.PodRef{}, refusals[id])
			if err := r.Ledger.MarkDone(settleCtx, id, ledger.Done{Refused: refusals[id], Pod: known[id].Pod, Settled: true, Version: records[id].Version}); err != nil {
				errs[id] = err
			}
		case instances.WouldTerminate:
			sum.Orphans++
		case instances.Terminating:
			sum.Orphans++
			r.Metrics.Count(metrics.OrphansTerminated, 1)
			// Remember it, so that later sweeps and its state-change
			// events know the instance is settled: nothing is left to do
			// until those events report it gone (its Pod is not live).
			if err := r.Ledger.MarkDone(settleCtx, id, ledger.Done{Terminated: true, Pod: known[id].Pod, Settled: true, Version: records[id].Version}); err != nil {
				errs[id] = err
			}
		}
	}
	return errs
}
