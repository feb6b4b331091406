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
	// Orphans are running owned instances without a live Pod, handed to
	// the reconciler to terminate.
	Orphans      int `json:"orphans"`
	WaitingExit  int `json:"waitingExit"`
	Errors       int `json:"errors"`
	DurationMsec int `json:"durationMs"`
}

// sweepWorkers bounds concurrent reconciles: enough to sweep thousands of
// instances inside one invocation, few enough not to flood the apiserver.
const sweepWorkers = 8

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
	errs = append(errs, r.missedGone(ctx, managed, records, start, &sum))
	msgs := r.unfinished(records, start, &sum)
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
		slog.Int("missedGone", sum.MissedGone), slog.Int("queued", sum.Queued), slog.Int("orphans", sum.Orphans),
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
// event never arrived. Those Reaper terminated itself need nothing more:
// their Pod step was settled when it did.
func (r *Reaper) missedGone(ctx context.Context, managed map[string]instances.Instance, records map[string]ledger.Record, now time.Time, sum *SweepSummary) error {
	var errs []error
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
		records[id] = rec
	}
	return errors.Join(errs...)
}

// unfinished are the work items of records with a step left at now.
func (r *Reaper) unfinished(records map[string]ledger.Record, now time.Time, sum *SweepSummary) []workqueue.Message {
	var msgs []workqueue.Message
	for _, rec := range records {
		plan := Decide(rec, now, r.Policy)
		if !plan.WaitUntil.IsZero() {
			sum.WaitingExit++
		}
		if plan.Pod != nil || plan.Terminate {
			msgs = append(msgs, workqueue.Sweep(rec.InstanceID))
		}
	}
	sum.Queued = len(msgs)
	r.Metrics.Count(metrics.WorkItemsRetried, sum.Queued)
	return msgs
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
		mu  sync.Mutex
		ids []string
	)
	err := forEach(ctx, candidates, func(inst instances.Instance) error {
		if inst.Pod.UID == "" {
			return fmt.Errorf("managed instance %s has no pod tags", inst.ID)
		}
		pod, err := r.Pods.Read(ctx, inst.Pod)
		if err != nil {
			return err
		}
		if pod.Result == kube.Current {
			return nil
		}
		r.Log.LogAttrs(ctx, slog.LevelWarn, "orphaned instance", slog.String("instance", inst.ID),
			slog.String("pod", inst.Pod.String()), slog.String("pod state", string(pod.Result)))
		mu.Lock()
		ids = append(ids, inst.ID)
		mu.Unlock()
		return nil
	})
	slices.Sort(ids)
	return ids, err
}

// forEach runs fn over items with sweepWorkers in parallel and joins the
// errors; one failure does not stop the others.
func forEach[T any](ctx context.Context, items []T, fn func(T) error) error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
		next = make(chan T)
	)
	for range min(sweepWorkers, len(items)) {
		wg.Go(func() {
			for it := range next {
				if err := fn(it); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		})
	}
	for _, it := range items {
		if ctx.Err() != nil {
			break
		}
		next <- it
	}
	close(next)
	wg.Wait()
	if ctx.Err() != nil {
		errs = append(errs, ctx.Err())
	}
	return errors.Join(errs...)
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
