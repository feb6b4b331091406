package reaper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/reaper-k8s/reaper/pkg/instances"
	"github.com/reaper-k8s/reaper/pkg/kube"
	"github.com/reaper-k8s/reaper/pkg/ledger"
	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/model"
	"github.com/reaper-k8s/reaper/pkg/workqueue"
)

// SweepSummary counts what one sweep found; it is logged as one line. The
// work it finds goes to the reconciler.
type SweepSummary struct {
	// Records is how many pending ledger records the sweep looked at.
	Records          int `json:"records"`
	ManagedInstances int `json:"managedInstances"`
	// MissedGone are managed instances found gone that the ledger did not
	// know about: their state-change event was lost.
	MissedGone int `json:"missedGone"`
	// Queued are records with a step left, handed to the reconciler.
	Queued int `json:"queued"`
	// InFlight are records with a step left whose work is on the queue
	// already (see requeueAfter): not queued again.
	InFlight int `json:"inFlight"`
	// Orphans are running owned instances without a live Pod, handed to
	// the reconciler to terminate.
	Orphans      int `json:"orphans"`
	WaitingExit  int `json:"waitingExit"`
	Errors       int `json:"errors"`
	DurationMsec int `json:"durationMs"`
}

// Sweep compares ledger × owned instances × Pods and hands what it finds
// to the reconciler, so that a lost or failed event delays a result but
// never loses it. It reads the pending records (those that may need work)
// and the records of the managed instances it checks, never the whole
// ledger, then applies one rule after the other:
//   - managed instances found gone that the ledger does not know are
//     recorded (their state-change event was lost): missedGone;
//   - records with a step left (a Pod write, a termination; a Pod lost
//     past the exit-wait window) go to the reconciler: unfinished;
//   - managed instances running with no live Pod, older than the orphan
//     grace period, go to the reconciler to be terminated (it reads the
//     Pod again): orphans.
//
// It returns an error if any step failed; the next sweep picks them up.
func (r *Reaper) Sweep(ctx context.Context, orphanGrace time.Duration) (SweepSummary, error) {
	defer r.flushMetrics(ctx)
	start := r.Now()
	var sum SweepSummary
	records, managed, err := r.sweepInputs(ctx, start.Add(-orphanGrace), &sum)
	if err != nil {
		return sum, err
	}
	var errs []error
	fresh, err := r.missedGone(ctx, managed, records, start, &sum)
	errs = append(errs, err)
	msgs := r.unfinished(records, fresh, start, &sum)
	orphans, err := r.orphans(ctx, managed, records, start.Add(-orphanGrace))
	errs = append(errs, err)
	sum.Orphans = len(orphans)
	r.Metrics.Count(metrics.OrphansFound, len(orphans))
	for _, id := range orphans {
		msgs = append(msgs, workqueue.Orphan(id))
	}
	if len(msgs) > 0 {
		if err := r.Queue.Send(ctx, 0, msgs...); err != nil {
			errs = append(errs, err)
		} else {
			r.Metrics.Count(metrics.WorkItemsQueued, len(msgs))
		}
	}

	err = errors.Join(errs...)
	if err != nil {
		sum.Errors = len(flatten(err))
	}
	sum.DurationMsec = int(r.Now().Sub(start).Milliseconds())
	r.Log.LogAttrs(ctx, logLevel(err), "sweep",
		slog.Int("records", sum.Records), slog.Int("managedInstances", sum.ManagedInstances),
		slog.Int("missedGone", sum.MissedGone), slog.Int("queued", sum.Queued), slog.Int("inFlight", sum.InFlight), slog.Int("orphans", sum.Orphans),
		slog.Int("waitingExit", sum.WaitingExit), slog.Int("errors", sum.Errors),
		slog.Int("durationMs", sum.DurationMsec))
	return sum, err
}

// sweepInputs reads what the rules look at: the pending records, the owned
// instances (one paginated listing), and the records of those owned
// instances the rules check (gone, or launched before cutoff) that are not
// pending.
func (r *Reaper) sweepInputs(ctx context.Context, cutoff time.Time, sum *SweepSummary) (map[string]ledger.Record, map[string]instances.Instance, error) {
	records := map[string]ledger.Record{}
	if err := r.Ledger.Pending(ctx, func(rec ledger.Record) error {
		records[rec.InstanceID] = rec
		return nil
	}); err != nil {
		return nil, nil, err
	}
	sum.Records = len(records)
	managed := map[string]instances.Instance{}
	if err := r.Fleet.ListOwned(ctx, func(i instances.Instance) error {
		managed[i.ID] = i
		return nil
	}); err != nil {
		return nil, nil, err
	}
	sum.ManagedInstances = len(managed)
	var lookup []string
	for id, inst := range managed {
		if _, ok := records[id]; !ok && (model.IsGone(inst.State) || inst.LaunchTime.Before(cutoff)) {
			lookup = append(lookup, id)
		}
	}
	settled, err := r.Ledger.GetMany(ctx, lookup)
	if err != nil {
		return nil, nil, err
	}
	maps.Copy(records, settled)
	return records, managed, nil
}

// missedGone records the gone state of owned instances whose state-change
// event never arrived, and returns the instances whose records it wrote.
// Those Reaper terminated itself need nothing more: their Pod step was
// settled when it did.
func (r *Reaper) missedGone(ctx context.Context, managed map[string]instances.Instance, records map[string]ledger.Record, now time.Time, sum *SweepSummary) (map[string]bool, error) {
	var errs []error
	wrote := map[string]bool{}
	for id, inst := range managed {
		rec, ok := records[id]
		if !model.IsGone(inst.State) || (ok && (rec.Gone != nil || !rec.Terminated.IsZero())) {
			continue
		}
		sum.MissedGone++
		rec, err := r.Ledger.RecordState(ctx, id, inst.Pod, ledger.StateChange{
			State: inst.State, At: now, Rank: model.StateRank(inst.State), Gone: true,
		})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		records[id], wrote[id] = rec, true
	}
	return wrote, errors.Join(errs...)
}

// requeueAfter is how long after a reconciler batch last wrote a record
// its work counts as in flight. A batch writes the records it works on;
// what it does not finish it hands back to the queue (deferred, or as a
// batch item failure), so during a burst the sweep need not queue it again
// every minute. Past it, a record with work left is queued again.
const requeueAfter = 5 * time.Minute

// unfinished are the work items of records with a step left at now, but
// for those whose work is in flight: a batch wrote the record lately and
// the same work was due then. Work that fell due since (an exit-wait
// window closing) and records this sweep wrote itself (fresh) are queued.
func (r *Reaper) unfinished(records map[string]ledger.Record, fresh map[string]bool, now time.Time, sum *SweepSummary) []workqueue.Message {
	var msgs []workqueue.Message
	for _, rec := range records {
		plan := Decide(rec, now, r.Policy)
		if !plan.WaitUntil.IsZero() {
			sum.WaitingExit++
		}
		if plan.Pod == nil && !plan.Terminate {
			continue
		}
		if !fresh[rec.InstanceID] && now.Sub(rec.UpdatedAt) < requeueAfter && samePlan(plan, Decide(rec, rec.UpdatedAt, r.Policy)) {
			sum.InFlight++
			continue
		}
		msgs = append(msgs, workqueue.Sweep(rec.InstanceID))
	}
	sum.Queued = len(msgs)
	r.Metrics.Count(metrics.WorkItemsRetried, sum.Queued)
	return msgs
}

// samePlan says whether two plans ask for the same steps.
func samePlan(a, b Plan) bool {
	return a.Terminate == b.Terminate && outcomeKey(a.Pod) == outcomeKey(b.Pod)
}

// orphans are running owned instances older than cutoff whose Pod no
// longer needs them: deleted, replaced by another UID, or already terminal.
// Instances whose terminal exit the ledger holds are left to their record;
// one whose last exit waits for a restart is an orphan like any other once
// its Pod is gone.
func (r *Reaper) orphans(ctx context.Context, managed map[string]instances.Instance, records map[string]ledger.Record, cutoff time.Time) ([]string, error) {
	var candidates []instances.Instance
	for id, inst := range managed {
		if rec, ok := records[id]; ok && rec.Exit != nil && rec.Exit.Terminal() {
			continue
		}
		if (inst.State == model.StateRunning || inst.State == model.StatePending) && inst.LaunchTime.Before(cutoff) {
			candidates = append(candidates, inst)
		}
	}
	var (
		refs []model.PodRef
		errs []error
	)
	for _, inst := range candidates {
		if inst.Pod.UID == "" {
			errs = append(errs, fmt.Errorf("managed instance %s has no pod tags", inst.ID))
			continue
		}
		refs = append(refs, inst.Pod)
	}
	// One read for them all, in LIST pages: the sweep's cost in requests
	// grows with the fleet by one per 500 Pods, not one per instance. A
	// Pod whose read failed leaves its instance alone until the next sweep.
	snaps, err := r.Pods.ReadMany(ctx, refs)
	errs = append(errs, err)
	var ids []string
	for _, inst := range candidates {
		pod, ok := snaps[inst.Pod]
		if !ok || pod.Result == kube.Current {
			continue
		}
		r.Log.LogAttrs(ctx, slog.LevelWarn, "orphaned instance", slog.String("instance", inst.ID),
			slog.String("pod", inst.Pod.String()), slog.String("pod state", string(pod.Result)))
		ids = append(ids, inst.ID)
	}
	slices.Sort(ids)
	return ids, errors.Join(errs...)
}

// flatten lists the errors inside a joined error.
func flatten(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, flatten(e)...)
		}
		return out
	}
	return []error{err}
}
