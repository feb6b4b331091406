package reaper

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/reaper-k8s/reaper/pkg/exitline"
	"github.com/reaper-k8s/reaper/pkg/ledger"
	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/model"
	"github.com/reaper-k8s/reaper/pkg/podstatus"
	"github.com/reaper-k8s/reaper/pkg/workqueue"
)

// apply is the batch's apply phase: for each entry, in parallel, record
// what its messages report and believe the record once (entry.view). An
// entry whose writes did not happen in time is deferred whole.
func (b *batchRun) apply(ctx context.Context) {
	var g errgroup.Group
	g.SetLimit(ledgerWorkers)
	for _, e := range b.live() {
		if ctx.Err() != nil {
			e.conclude(errNoTime)
			continue
		}
		g.Go(func() error {
			e.conclude(outOfTime(ctx, b.applyEntry(ctx, e)))
			return nil
		})
	}
	_ = g.Wait()
}

// applyEntry records what an entry's messages report and sets its view,
// the record as it is believed (believe: checked once against the
// instance's launch tags), if there is one to reconcile; a record the tags
// do not back is settled untouched. State changes of instances that are
// not this deployment's, and exit claims the tags do not back, are logged
// and dropped. What a message says of the instance's state is checked
// against EC2's own answer (confirmedState), and a time in the future
// beyond the clock skew a host may have is refused.
func (b *batchRun) applyEntry(ctx context.Context, e *entry) error {
	if e.ec2 != nil && !e.ec2.Owned {
		b.count(func(s *BatchSummary) { s.Skipped++ })
		b.Log.LogAttrs(ctx, slog.LevelDebug, "work skipped", slog.String("instance", e.id),
			slog.Bool("managed", e.ec2.Managed), slog.String("cluster", e.ec2.Cluster))
		for _, it := range e.items {
			if c, ok := it.Body.(workqueue.ExitClaim); ok {
				b.rejectClaim(ctx, e, c.Pod, trust(claimOf(c), e.ec2, nil))
			}
		}
		return nil
	}
	items := b.notInFuture(ctx, e.id, e.items)
	rec := e.stored
	reconcile, err := b.applyState(ctx, e, items, &rec)
	if err != nil {
		return err
	}
	for _, it := range items {
		switch c := it.Body.(type) {
		case workqueue.ExitClaim:
			if reason := trust(claimOf(c), e.ec2, rec); reason != "" {
				if reason == model.ReasonInstanceUnknown && it.Checks+1 < unknownChecks {
					b.checkAgain(e, it.Message)
					continue
				}
				b.rejectClaim(ctx, e, c.Pod, reason)
				continue
			}
			if c.TokenHash != "" && e.ec2 != nil && e.ec2.ExitTokenHash == "" {
				b.unexpectedToken(ctx, e, c.Pod)
			}
			if reason := b.containerCheck(e, rec, c.Exit); reason != "" {
				b.rejectClaim(ctx, e, c.Pod, reason)
				continue
			}
			if rec != nil && ledger.FinalExit(*rec, c.Pod, c.Exit.Container) {
				// Nothing replaces it (the ledger refuses the write too):
				// the same line again is a redelivery, anything else is
				// counted.
				if final, _ := rec.ExitOf(c.Exit.Container); !sameExit(final, c.Exit) {
					b.rejected(model.ReasonAfterTerminal)
					b.Log.LogAttrs(ctx, slog.LevelWarn, "exit after a terminal exit", slog.String("instance", e.id),
						slog.String("pod", c.Pod.String()), slog.Int("restartCount", int(c.Exit.RestartCount)))
				}
				reconcile = true
				continue
			}
			next, err := b.Ledger.RecordExit(ctx, e.id, c.Pod, e.tokenTag(), c.Exit)
			if err != nil {
				return fmt.Errorf("record exit of %s: %w", e.id, err)
			}
			rec, reconcile = &next, true
			b.Metrics.Observe(metrics.FinishToRecorded, b.Now().Sub(c.Exit.FinishedAt))
		case workqueue.SweepRequest, workqueue.StillRunningCheck:
			reconcile = reconcile || rec != nil
		}
	}
	if !reconcile {
		if rec == nil && e.ec2 == nil && slices.ContainsFunc(items, isState) {
			b.count(func(s *BatchSummary) { s.Skipped++ })
		}
		return nil
	}
	return b.believeEntry(ctx, e, *rec)
}

// believeEntry sets the entry's view from its record (believe), or
// rejects the record.
func (b *batchRun) believeEntry(ctx context.Context, e *entry, rec ledger.Record) error {
	view, reason := believe(rec, e.ec2)
	if view == nil {
		return b.reject(ctx, rec, e, reason)
	}
	if reason != "" {
		b.Log.LogAttrs(ctx, slog.LevelWarn, "exit not believed", slog.String("instance", e.id),
			slog.String("reason", reason), slog.String("claimed", rec.Pod.String()), slog.String("tags", view.Pod.String()))
	}
	e.view = view
	return nil
}

// applyState records the state change the entry's messages and EC2 agree
// on, if any (confirmedState), into *rec, and says whether it leaves work
// to reconcile: a gone state does, unless it leaves a settled record
// nothing to do (stateAddsWork).
func (b *batchRun) applyState(ctx context.Context, e *entry, items []workqueue.Item, rec **ledger.Record) (bool, error) {
	sc := b.confirmedState(ctx, e, items, *rec)
	if sc == nil {
		return false, nil
	}
	sc.SeenAt = b.Now()
	if *rec != nil && endedByReaper(**rec) {
		// The gone state is what Reaper's own terminate made true, and
		// the record is settled: nothing to record. In a burst these are
		// the two state changes EC2 sends for every instance Reaper
		// terminated.
		return false, nil
	}
	if *rec != nil {
		next, applies := ledger.WithState(**rec, e.id, e.podTags(), e.tokenTag(), *sc, b.Now())
		if !applies {
			// Older than the newest state recorded: the ledger's
			// conditional write would refuse it and answer with a read.
			// Work the record has pending is still reconciled.
			return sc.Gone() && (*rec).Pending != "", nil
		}
		if (*rec).Pending == "" && Decide(next, e.ec2, e.livePod(), b.Now(), b.Policy).Idle() {
			// One write keeps the record off the pending index, where
			// setting and clearing it took two, and there is nothing to
			// reconcile.
			sc.AddsNoWork = true
		}
	}
	next, err := b.Ledger.RecordState(ctx, e.id, e.podTags(), e.tokenTag(), *sc)
	if err != nil {
		return false, err
	}
	*rec = &next
	return sc.Gone() && !sc.AddsNoWork, nil
}

// endedByReaper says whether rec is settled by Reaper's own steps: its
// Pod written ended by its container exits, checked when they were
// recorded, and its instance terminated.
func endedByReaper(rec ledger.Record) bool {
	return rec.Pending == "" && len(rec.Runs()) > 0 && rec.PodSynced != "" && rec.PodSynced != lostKey &&
		rec.PodSynced == (model.Outcome{Exits: rec.Runs()}).Key() && podEndedAsWritten(rec) && !rec.Terminated.IsZero()
}

// podEndedAsWritten says whether rec's Pod ended with the outcome last
// written to it; a record written before Reaper kept that goes by the
// host's word.
func podEndedAsWritten(rec ledger.Record) bool {
	if rec.PodEnded != nil {
		return *rec.PodEnded
	}
	return podstatus.HostSaysEnded(rec.Runs())
}

// containerCheck is why a believed exit claim names a container Reaper
// does not take ("" takes it): one its Pod's spec, as read in this batch,
// does not have (a host's wrapper configured with the wrong name must not
// end the Pod), or one more than a record keeps (ledger.MaxContainers).
// A Pod the batch could not read is not checked: its claim is still
// recorded, never lost, and the decision ignores a container its spec
// turns out not to have.
func (b *batchRun) containerCheck(e *entry, rec *ledger.Record, exit model.Exit) string {
	if pod := e.livePod(); pod != nil && podstatus.KindOf(&pod.Spec, exit.Container) == podstatus.KindNone {
		return model.ReasonUnknownContainer
	}
	if rec != nil && len(rec.Runs()) >= ledger.MaxContainers {
		if _, known := rec.ExitOf(exit.Container); !known {
			return model.ReasonTooManyContainers
		}
	}
	return ""
}

// sameExit says whether two exits are the same line's, but for when Reaper
// received them.
func sameExit(a, b model.Exit) bool {
	a.ReceivedAt, b.ReceivedAt = time.Time{}, time.Time{}
	return a == b
}

// podTags is the Pod the instance's tags name, as far as EC2 described it.
func (e *entry) podTags() model.PodRef {
	if e.ec2 == nil {
		return model.PodRef{}
	}
	return e.ec2.Pod
}

// tokenTag is the instance's exit-token tag, as far as EC2 described it
// ("" none): every write that records the instance gives it to its record,
// which keeps the first (ledger.Record.ExitTokenHash).
func (e *entry) tokenTag() string {
	if e.ec2 == nil {
		return ""
	}
	return e.ec2.ExitTokenHash
}

// unexpectedToken counts and logs a claim believed whose line carries an
// exit token while the instance EC2 describes has no exit-token tag: there
// is nothing to check the token against. Instances launched without a
// token are allowed, but hosts that write one were launched with it: the
// provider then wrote its hash under another tag key than the one the
// deployment reads (REAPER_TAG_EXIT_TOKEN), and no token is checked.
func (b *batchRun) unexpectedToken(ctx context.Context, e *entry, pod model.PodRef) {
	b.Metrics.Count(metrics.ExitTokensUnexpected, 1)
	b.Log.LogAttrs(ctx, slog.LevelWarn, "exit token without an exit-token tag", slog.String("instance", e.id),
		slog.String("pod", pod.String()), slog.String("cluster", e.cluster()),
		slog.String("hint", "the provider writes the token's hash under another tag key than REAPER_TAG_EXIT_TOKEN: no token is checked"))
}

// notInFuture is items without those whose time lies further ahead than
// the clock skew a host may have (exitline.MaxClockSkew): a state change
// dated in the future would keep every real one from being recorded, and
// an exit so dated is a forgery. Each is logged and counted.
func (b *batchRun) notInFuture(ctx context.Context, id string, items []workqueue.Item) []workqueue.Item {
	limit := b.Now().Add(exitline.MaxClockSkew)
	return slices.DeleteFunc(slices.Clone(items), func(it workqueue.Item) bool {
		var at time.Time
		switch c := it.Body.(type) {
		case workqueue.StateChange:
			at = c.At
		case workqueue.ExitClaim:
			at = c.Exit.FinishedAt
		default:
			return false
		}
		if !at.After(limit) {
			return false
		}
		if _, exit := it.Body.(workqueue.ExitClaim); exit {
			b.rejected(model.ReasonFinishedInFuture)
		} else {
			b.Metrics.By(metrics.Reason(model.ReasonInFuture)).Count(metrics.StateChangesRefused, 1)
		}
		b.Log.LogAttrs(ctx, slog.LevelWarn, "work item in the future", slog.String("instance", id),
			slog.String("kind", string(it.Body.Kind())), slog.Time("at", at), slog.Duration("maxSkew", exitline.MaxClockSkew))
		return true
	})
}

// confirmedState is the state change to record for an entry's instance,
// if any: what a message claims only as far as EC2 confirms it. Any
// principal that can reach the queue could claim "stopped" of a running
// instance and have it terminated, or date a state in the future
// (notInFuture).
//   - EC2 described the instance: a message claiming it gone while EC2
//     describes it running or pending is not confirmed: it is checked
//     again later (recheck). Otherwise the claim is recorded as far as EC2
//     has got: its state when EC2 is there or further on (its time says
//     since when), EC2's own state when the claim is ahead of it.
//   - EC2 was asked and no longer knows it (terminated over an hour ago):
//     a record kept for it, with no gone state yet, is gone now (or since
//     a message said so), so its Pod ends, lost after the window if no
//     exit comes. No record is made for an instance nobody knows.
//   - EC2 was not asked (a record Reaper checked and terminated, whose
//     messages are state changes only): a gone state is what Reaper's own
//     terminate makes true; nothing else is recorded.
func (b *batchRun) confirmedState(ctx context.Context, e *entry, items []workqueue.Item, rec *ledger.Record) *ledger.StateChange {
	claimed := newestState(items)
	switch {
	case e.ec2 != nil:
		if claimed == nil {
			return nil
		}
		if claimed.Gone() && !model.IsGone(e.ec2.State) {
			b.recheck(ctx, e, items)
			return nil
		}
		if claimed.Rank() > model.StateRank(e.ec2.State) {
			claimed.State = e.ec2.State
		}
		return claimed
	case e.asked && rec != nil && rec.Gone == nil && rec.Pod.UID != "":
		// (A record that knows no Pod, only a queued claim's mark, says
		// nothing of an instance EC2 does not know.)
		sc := &ledger.StateChange{State: model.StateTerminated, At: b.Now()}
		if claimed != nil && claimed.Gone() && !claimed.At.After(sc.At) {
			sc.At = claimed.At
		}
		b.Log.LogAttrs(ctx, slog.LevelWarn, "instance no longer known to EC2", slog.String("instance", e.id), slog.String("pod", rec.Pod.String()))
		return sc
	case claimed != nil && rec != nil && claimed.Gone():
		return claimed
	}
	return nil
}

// newestState is the newest of the state changes among items (nil: none):
// applied in any order, the ledger's write rules leave a record as the
// newest alone does, so a batch writes that one only.
func newestState(items []workqueue.Item) *ledger.StateChange {
	var newest *ledger.StateChange
	for _, it := range items {
		c, ok := it.Body.(workqueue.StateChange)
		if !ok {
			continue
		}
		sc := ledger.StateChange{State: c.State, At: c.At}
		if newest == nil || sc.At.After(newest.At) || (sc.At.Equal(newest.At) && sc.Rank() >= newest.Rank()) {
			newest = &sc
		}
	}
	return newest
}

// stateChecks is how often a state message EC2 does not confirm is checked
// before it is refused, the most a message may carry: EC2's answers are
// eventually consistent, within seconds, and DeferDelay apart these checks
// span minutes. A forged claim is then refused, logged and counted; a real
// end EC2 was slow to show is recorded at a later check, or by the sweep,
// which records gone states from EC2's own listing.
const stateChecks = workqueue.MaxChecks

// unknownChecks is how often an exit claim for an instance EC2 does not
// list (and the ledger does not know) is checked before it is refused:
// EC2's answers are eventually consistent, and a new instance may be
// missing from them for a while. DeferDelay apart, the checks span a
// minute. A made-up instance id is then refused, logged and counted.
const unknownChecks = 3

// checkAgain sends m, a message of e, again, DeferDelay later, checked
// once more.
func (b *batchRun) checkAgain(e *entry, m workqueue.Message) {
	m.Checks++
	b.sendAgain(e, m)
}

// sendAgain sends m, a message of e, again, DeferDelay later, once the
// batch settles (sendRechecks). Until then m is e's: if the send fails, e
// fails, and SQS brings m back as it came.
func (b *batchRun) sendAgain(e *entry, m workqueue.Message) {
	b.count(func(*BatchSummary) { b.rechecks = append(b.rechecks, recheck{e, m}) })
}

// recheck has the entry's state messages that claim it gone while EC2
// describes it running sent again, DeferDelay later, each checked once
// more, and refuses those checked stateChecks times already.
func (b *batchRun) recheck(ctx context.Context, e *entry, items []workqueue.Item) {
	for _, it := range items {
		c, ok := it.Body.(workqueue.StateChange)
		if !ok || !model.IsGone(c.State) {
			continue
		}
		if it.Checks+1 < stateChecks {
			b.checkAgain(e, it.Message)
			continue
		}
		b.Metrics.By(metrics.Reason(model.ReasonNotConfirmed)).Count(metrics.StateChangesRefused, 1)
		b.Log.LogAttrs(ctx, slog.LevelWarn, "state change not confirmed", slog.String("instance", e.id),
			slog.String("claimed", c.State), slog.Time("at", c.At), slog.String("described", e.ec2.State), slog.Int("checks", it.Checks+1))
	}
}

// rejectClaim logs and counts an exit claim Reaper does not take, for
// reason: the ledger holds nothing of it.
func (b *batchRun) rejectClaim(ctx context.Context, e *entry, pod model.PodRef, reason string) {
	b.rejected(reason)
	b.Log.LogAttrs(ctx, slog.LevelWarn, "exit line not believed", slog.String("instance", e.id),
		slog.String("reason", reason), slog.String("claimed", pod.String()), slog.String("claimedUID", pod.UID),
		slog.String("tags", e.podTags().String()), slog.String("cluster", e.cluster()))
}

// reject logs a record that the instance's tags do not back and settles
// it: no Pod write, no terminate, and no sweep comes back to it.
func (b *batchRun) reject(ctx context.Context, rec ledger.Record, e *entry, reason string) error {
	b.Log.LogAttrs(ctx, slog.LevelWarn, "record not believed", slog.String("instance", e.id),
		slog.String("reason", reason), slog.String("claimed", rec.Pod.String()), slog.String("tags", e.podTags().String()),
		slog.String("cluster", e.cluster()))
	b.rejected(reason)
	if rec.Pending == "" {
		return nil
	}
	return b.Ledger.MarkDone(ctx, e.id, ledger.Done{Settled: true, Version: rec.Version})
}

// rejected counts an exit claim or a record the batch does not act on, for
// reason: in the batch's summary (Rejected), which it raises to WARN, and
// in LinesRejected.
func (b *batchRun) rejected(reason string) {
	b.count(func(s *BatchSummary) { s.Rejected++ })
	b.Metrics.By(metrics.Reason(reason)).Count(metrics.LinesRejected, 1)
}

// cluster is the cluster tag of the entry's instance, as far as EC2
// described it.
func (e *entry) cluster() string {
	if e.ec2 == nil {
		return ""
	}
	return e.ec2.Cluster
}
