package reaper

import (
	"cmp"
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/reaper-k8s/reaper/pkg/instances"
	"github.com/reaper-k8s/reaper/pkg/kube"
	"github.com/reaper-k8s/reaper/pkg/ledger"
	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/workqueue"
)

// BatchSummary is what one reconciler batch came to; it is logged as one
// line.
type BatchSummary struct {
	Messages  int `json:"messages"`
	Instances int `json:"instances"`
	// Invalid messages are dropped: they will not parse better later.
	Invalid int `json:"invalid"`
	// Lookups are the instances described.
	Lookups int `json:"lookups"`
	// UnknownRemembered are claims for instances EC2 answered lately it
	// does not know, taken as unknown without a call.
	UnknownRemembered int `json:"unknownRemembered"`
	// RechecksHeldBack are claims for instances EC2 did not know, checked
	// again, beyond those a batch describes (maxRechecks): deferred.
	RechecksHeldBack int `json:"rechecksHeldBack"`
	// Skipped instances are not this deployment's, or unknown to EC2 and
	// to the ledger.
	Skipped int `json:"skipped"`
	// Rejected are the exit claims and records not acted on, for a reason
	// (rejected): claims the instance's tags or its Pod's spec do not
	// back, dated in the future, or after a terminal exit of their
	// container, and records the tags do not back. Each is logged at WARN
	// and counted in LinesRejected by its reason.
	Rejected   int `json:"rejected"`
	Reconciled int `json:"reconciled"`
	Patched    int `json:"patched"`
	Terminated int `json:"terminated"`
	Orphans    int `json:"orphans"`
	// OrphansHeldBack are orphan candidates beyond the orphan cap, deferred.
	OrphansHeldBack int `json:"orphansHeldBack"`
	// Deferred instances went back on the queue, their attempt counted,
	// for want of time or EC2 tokens.
	Deferred int `json:"deferred"`
	// DeadLettered instances reached workqueue.MaxAttempts: their work went
	// to the dead-letter queue with its reason.
	DeadLettered int `json:"deadLettered"`
	// Failed instances are returned as batch item failures.
	Failed int `json:"failed"`
}

// level is the level of the batch's line: ERROR when work failed (it
// comes back) or was dead-lettered, WARN when messages were dropped as
// invalid or claims or records rejected (Rejected), INFO otherwise.
func (s BatchSummary) level() slog.Level {
	switch {
	case s.Failed > 0 || s.DeadLettered > 0:
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
	var resp events.SQSEventResponse
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
		slog.Int("lookups", sum.Lookups), slog.Int("unknownRemembered", sum.UnknownRemembered), slog.Int("rechecksHeldBack", sum.RechecksHeldBack),
		slog.Int("skipped", sum.Skipped), slog.Int("rejected", sum.Rejected),
		slog.Int("reconciled", sum.Reconciled), slog.Int("patched", sum.Patched), slog.Int("terminated", sum.Terminated),
		slog.Int("orphans", sum.Orphans), slog.Int("orphansHeldBack", sum.OrphansHeldBack), slog.Int("deferred", sum.Deferred), slog.Int("deadLettered", sum.DeadLettered),
		slog.Int("failed", sum.Failed))
	return resp, nil
}

// entry is one instance's state through a batch: what was read, the one
// decision made about it, and what each step came to. Each phase fills in
// its part and later phases read it.
type entry struct {
	id    string
	items []workqueue.Item
	// attempt is the most attempts among its messages (workqueue.Item.Attempts).
	attempt int
	// since is when its oldest message was first queued.
	since time.Time

	// The read phase.
	stored *ledger.Record      // its ledger record (nil: none)
	ec2    *instances.Instance // as EC2 described it in this batch (nil: not described)
	asked  bool                // EC2 answered for it: described it, or does not know it

	// The apply and decide phases.
	view   *ledger.Record // the record as believed, to reconcile (nil: nothing to)
	plan   Plan
	orphan bool // an orphan message whose instance is still a candidate (mayBeOrphan)

	// The steps.
	snap       *kube.Snapshot // its Pod as read, for a claim's check, a Pod write or an orphan check
	podReadErr error          // why readPods could not read it
	pod        kube.Applied
	podErr     error
	end        End // the End the terminate phase acted on (Plan.End or Plan.EndUnwritten)
	term       instances.Termination
	refusal    string // EC2's code when it refused to terminate the instance
	termErr    error
	markErr    error

	// backIn is when its deferred work comes back (settle's deferrals).
	backIn time.Duration
	// heldBack: its messages go back on the queue unchecked, as they came
	// (unknownLast); nothing else is done with it in this batch.
	heldBack bool

	// The batch's verdict: both nil is done; deferred is why the work
	// goes back on the queue (for want of time or tokens); failed comes
	// back as a batch item failure.
	deferred, failed error
}

// isExit and isState say whether an item is an exit claim, a state change.
func isExit(it workqueue.Item) bool {
	_, ok := it.Body.(workqueue.ExitClaim)
	return ok
}

func isState(it workqueue.Item) bool {
	_, ok := it.Body.(workqueue.StateChange)
	return ok
}

// olderFirst orders entries as every phase that may stop early takes them:
// the work tried most often first, then the longest queued, so that no
// work waits while newer work goes first, and an instance id decides
// nothing but ties.
func olderFirst(x, y *entry) int {
	return cmp.Or(cmp.Compare(y.attempt, x.attempt), x.since.Compare(y.since), cmp.Compare(x.id, y.id))
}

// recheck is a message of entry e to send again for a later check.
type recheck struct {
	e *entry
	m workqueue.Message
}

// stopped says whether the entry's work in this batch has stopped: failed,
// deferred, or held back for a later check.
func (e *entry) stopped() bool { return e.deferred != nil || e.failed != nil || e.heldBack }

// conclude sorts the error of the entry's work: none, for later, or a
// failure. A failure wins over a deferral.
func (e *entry) conclude(err error) {
	switch {
	case err == nil:
	case deferrable(err):
		if e.failed == nil {
			e.deferred = err
		}
	default:
		e.failed, e.deferred = err, nil
	}
}

// lastAttempt says whether this is the entry's last try before its work
// goes to the dead-letter queue.
func (e *entry) lastAttempt() bool { return e.attempt+1 >= workqueue.MaxAttempts }

// batchRun is one reconciler batch: its entries, and what it counts.
type batchRun struct {
	*Reaper
	p       phases
	entries []*entry
	sum     *BatchSummary
	// rechecks are the messages to send again for a later check: state
	// changes and exit claims EC2 did not confirm yet, and claims held
	// back unchecked (unknownLast).
	rechecks []recheck
	mu       sync.Mutex // guards sum and rechecks during the parallel phases
}

// ReconcileBatch carries out the work items of a batch, grouped by
// instance, and returns the instances whose work failed (with why). It is
// plain phases over one entry per instance:
//
//   - read: the ledger records, and EC2's description of every instance
//     whose tags are still to be checked (one call per 200); then the Pods
//     that may be written, in LIST pages, for their specs;
//   - apply: record what the messages report (state changes as EC2
//     confirms them, exit claims as the tags back them), and believe the
//     record once;
//   - decide: one Plan per record (Decide), and which orphans stay
//     candidates;
//   - write Pods: write each outcome (reading the Pods not read yet);
//   - terminate and tag: one TerminateInstances per 1,000 ids for what the
//     plans end now (beside it, the Pod-written tags);
//   - settle: the ledger marks, then the queue's sends: deferred work with
//     its attempt counted and a growing delay, work past
//     workqueue.MaxAttempts to the dead-letter queue, wake-ups at the end
//     of power-off graces, state changes to check again.
//
// Every batch makes progress and nothing reads as done that was not: the
// batch does what its time and its share of EC2's buckets allow, and the
// rest comes back.
func (r *Reaper) ReconcileBatch(ctx context.Context, byInstance map[string][]workqueue.Item, sum *BatchSummary) map[string]error {
	b := &batchRun{Reaper: r, p: phasesOf(ctx), sum: sum}
	for id, items := range byInstance {
		e := &entry{id: id, items: items}
		for _, it := range e.items {
			e.attempt = max(e.attempt, it.Attempts())
			if q := it.FirstQueued(); e.since.IsZero() || q.Before(e.since) {
				e.since = q
			}
		}
		b.entries = append(b.entries, e)
	}
	slices.SortFunc(b.entries, olderFirst)
	workCtx, cancel := until(ctx, b.p.work)
	defer cancel()
	b.read(workCtx)
	b.readPods(workCtx)
	b.apply(workCtx)
	b.decide()
	b.writePods(workCtx)
	b.terminate(ctx)
	b.settle(ctx)

	failed := map[string]error{}
	for _, e := range b.entries {
		if e.failed != nil {
			failed[e.id] = e.failed
		}
	}
	return failed
}

// count adds to the batch's summary from a parallel phase.
func (b *batchRun) count(f func(*BatchSummary)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	f(b.sum)
}

// live are the entries still to work on in this batch.
func (b *batchRun) live() []*entry {
	var out []*entry
	for _, e := range b.entries {
		if !e.stopped() {
			out = append(out, e)
		}
	}
	return out
}
