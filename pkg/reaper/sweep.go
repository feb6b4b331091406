package reaper

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

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
	Orphans int `json:"orphans"`
	// HeldBack are orphans beyond the cap (Policy.OrphanCap), left running
	// until a later sweep.
	HeldBack int `json:"heldBack"`
	// IdentityMismatch are running owned instances whose cluster identity
	// tag is not the identity of the cluster Reaper reaches: none is
	// treated as an orphan.
	IdentityMismatch int `json:"identityMismatch"`
	// StillRunning are instances EC2 lists running well after Reaper's
	// terminate of them, handed to the reconciler to terminate again.
	StillRunning int `json:"stillRunning"`
	// Adopted are running owned instances the ledger had no record of; a
	// record of their Pod, from their tags, now outlives EC2's memory.
	Adopted int `json:"adopted"`
	// LeftOver are ledger writes (missed gone states, adoptions) the sweep
	// had no time for: the next sweep makes them.
	LeftOver     int `json:"leftOver"`
	WaitingExit  int `json:"waitingExit"`
	Errors       int `json:"errors"`
	DurationMsec int `json:"durationMs"`
}

// sweepReserve is the time a sweep keeps, before its invocation's
// deadline, for what follows its ledger writes: the Pod reads of the
// orphan check and the queue's sends. A quarter of a short invocation.
const sweepReserve = 15 * time.Second

// Sweep compares ledger × owned instances × Pods and hands what it finds
// to the reconciler, so that a lost or failed event delays a result but
// never loses it. It reads the pending records (those that may need work)
// and the records of the managed instances it checks, never the whole
// ledger, then applies one rule after the other:
//   - managed instances found gone that the ledger does not know are
//     recorded (their state-change event was lost): missedGone;
//   - records with a step left (a Pod write, a termination; a Pod lost
//     past the exit-wait window) go to the reconciler: unfinished;
//   - running owned instances the ledger has no record of are recorded
//     from their tags, so that their Pod can still end once EC2 forgets
//     them: adopt;
//   - managed instances running with no live Pod, older than the orphan
//     grace period, launched for the cluster Reaper reaches, go to the
//     reconciler to be terminated (it reads the Pod again), at most
//     Policy.OrphanCap of the running ones a sweep: orphans.
//
// Its ledger writes go ledgerWorkers at a time until sweepReserve before
// the deadline; those it has no time for are left to the next sweep,
// counted (SweepSummary.LeftOver). It returns an error if any step failed;
// the next sweep picks them up.
func (r *Reaper) Sweep(ctx context.Context, orphanGrace time.Duration) (SweepSummary, error) {
	defer r.flushMetrics(ctx)
	start := r.Now()
	var sum SweepSummary
	records, managed, err := r.sweepInputs(ctx, start.Add(-orphanGrace), &sum)
	if records == nil {
		return sum, err
	}
	// Instances whose records could not be read are left out; the rest
	// are swept.
	errs := []error{err}
	writeCtx, cancel := until(ctx, sweepWriteDeadline(ctx))
	defer cancel()
	fresh, err := r.missedGone(writeCtx, managed, records, start, &sum)
	errs = append(errs, err)
	msgs := r.unfinished(records, managed, fresh, start, &sum)
	errs = append(errs, r.adopt(writeCtx, managed, records, start.Add(-orphanGrace), &sum))
	orphans, running, err := r.orphans(ctx, managed, records, start.Add(-orphanGrace), &sum)
	errs = append(errs, err)
	sum.Orphans = len(orphans)
	r.Metrics.Count(metrics.OrphansFound, len(orphans))
	r.Metrics.Count(metrics.SweepLeftOver, sum.LeftOver)
	for _, id := range orphans {
		msgs = append(msgs, workqueue.Orphan(id, running))
	}
	if len(msgs) > 0 {
		if _, err := r.Queue.Send(ctx, 0, msgs...); err != nil {
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
	r.Log.LogAttrs(ctx, errorLevel(err), "sweep",
		slog.Int("records", sum.Records), slog.Int("managedInstances", sum.ManagedInstances),
		slog.Int("missedGone", sum.MissedGone), slog.Int("queued", sum.Queued), slog.Int("inFlight", sum.InFlight), slog.Int("orphans", sum.Orphans),
		slog.Int("heldBack", sum.HeldBack), slog.Int("identityMismatch", sum.IdentityMismatch), slog.Int("stillRunning", sum.StillRunning), slog.Int("adopted", sum.Adopted),
		slog.Int("leftOver", sum.LeftOver), slog.Int("waitingExit", sum.WaitingExit), slog.Int("errors", sum.Errors),
		slog.Int("durationMs", sum.DurationMsec))
	return sum, err
}

// sweepWriteDeadline is when a sweep stops starting ledger writes: its
// invocation's deadline less sweepReserve, or less a quarter of the time
// left, whichever is less (zero: no deadline).
func sweepWriteDeadline(ctx context.Context) time.Time {
	d, ok := ctx.Deadline()
	if !ok {
		return time.Time{}
	}
	return d.Add(-min(sweepReserve, time.Until(d)/4))
}

// sweepInputs reads what the rules look at: the pending records, the owned
// instances (one paginated listing), and the records of those owned
// instances the rules check (gone, or launched before cutoff) that are not
// pending. Without the pending records or the listing it returns nil
// records; owned instances whose records could not be read are left out
// of managed, with an error that says so.
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
	fetched := r.Ledger.GetMany(ctx, lookup)
	maps.Copy(records, fetched.Found)
	if len(fetched.Left) > 0 {
		// The rules would take those instances for unknown to the ledger.
		var errs []error
		for id, err := range fetched.Left {
			errs = append(errs, fmt.Errorf("read the record of %s: %w", id, err))
			delete(managed, id)
		}
		return records, managed, errors.Join(errs...)
	}
	return records, managed, nil
}

// sweepWrites makes a sweep's ledger writes, ledgerWorkers at a time, and
// counts those it has no time for (ctx done) in sum.LeftOver.
func sweepWrites(ctx context.Context, ids []string, sum *SweepSummary, write func(id string) error) error {
	var (
		g    errgroup.Group
		mu   sync.Mutex
		errs []error
	)
	g.SetLimit(ledgerWorkers)
	for _, id := range ids {
		if ctx.Err() != nil {
			mu.Lock()
			sum.LeftOver++
			mu.Unlock()
			continue
		}
		g.Go(func() error {
			err := write(id)
			mu.Lock()
			defer mu.Unlock()
			if outOfTime(ctx, err) != err {
				sum.LeftOver++
			} else if err != nil {
				errs = append(errs, err)
			}
			return nil
		})
	}
	_ = g.Wait()
	return errors.Join(errs...)
}

// missedGone records the gone state of owned instances whose state-change
// event never arrived, and returns the instances whose records it wrote.
// Those Reaper terminated itself need nothing more: their Pod step was
// settled when it did.
func (r *Reaper) missedGone(ctx context.Context, managed map[string]instances.Instance, records map[string]ledger.Record, now time.Time, sum *SweepSummary) (map[string]bool, error) {
	var ids []string
	for id, inst := range managed {
		rec, ok := records[id]
		if model.IsGone(inst.State) && (!ok || (rec.Gone == nil && rec.Terminated.IsZero())) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	sum.MissedGone = len(ids)
	var mu sync.Mutex
	wrote := map[string]bool{}
	err := sweepWrites(ctx, ids, sum, func(id string) error {
		rec, err := r.Ledger.RecordState(ctx, id, managed[id].Pod, managed[id].ExitTokenHash, ledger.StateChange{State: managed[id].State, At: now, SeenAt: now})
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		records[id], wrote[id] = rec, true
		return nil
	})
	return wrote, err
}

// requeueAfter is how long after a reconciler batch last wrote a record
// its work counts as in flight. A batch writes the records it works on;
// what it does not finish it hands back to the queue (deferred, or as a
// batch item failure), so during a burst the sweep need not queue it again
// every minute. Past it, a record with work left is queued again.
const requeueAfter = 5 * time.Minute

// unfinished are the work items of the pending records with a step left
// at now, decided with the instance as the sweep listed it, but for those
// whose work is in flight: a batch wrote the record lately, after the work
// fell due (Plan.DueSince). Work that fell due since (an exit-wait window
// closing) and records this sweep wrote itself (fresh) are queued. A
// record off the pending index is settled (its work done, or gone to the
// dead-letter queue); if EC2 lists its instance running well after
// Reaper's terminate of it (stillRunning), the reconciler is asked to look
// again.
func (r *Reaper) unfinished(records map[string]ledger.Record, managed map[string]instances.Instance, fresh map[string]bool, now time.Time, sum *SweepSummary) []workqueue.Message {
	var msgs []workqueue.Message
	for id, rec := range records {
		var listed *instances.Instance
		if inst, ok := managed[id]; ok {
			listed = &inst
		}
		if rec.Pending == "" {
			if stillRunning(rec, listed) {
				msgs = append(msgs, workqueue.StillRunning(id))
				sum.StillRunning++
			}
			continue
		}
		// The sweep reads no Pod: without the spec, the phase the Pod was
		// written with, or the host's word, says whether it ended. A
		// record still pending with nothing the sweep can see to do or to
		// wait for (what it waits for needs the spec, such as its
		// sidecars' grace) is handed back once stale: the reconciler reads
		// its Pod.
		plan := Decide(rec, listed, nil, now, r.Policy)
		if !plan.WaitUntil.IsZero() {
			sum.WaitingExit++
		}
		if plan.Pod == nil && !plan.End.Now && (!plan.WaitUntil.IsZero() || now.Sub(rec.UpdatedAt) < requeueAfter) {
			continue
		}
		if !fresh[rec.InstanceID] && now.Sub(rec.UpdatedAt) < requeueAfter && !plan.DueSince.After(rec.UpdatedAt) {
			sum.InFlight++
			continue
		}
		msgs = append(msgs, workqueue.Sweep(rec.InstanceID))
	}
	sum.Queued = len(msgs)
	r.Metrics.Count(metrics.WorkItemsRetried, sum.Queued)
	return msgs
}

// adopt records the running owned instances older than cutoff that the
// ledger has no record of (sweepInputs read theirs): their Pod, from their
// tags, and nothing else. One write an instance, once; a fleet launched at
// once is adopted by one sweep, the writes side by side. EC2 forgets a
// terminated instance after about an hour; with a record, a late state
// change or exit still finds the Pod it concerns.
func (r *Reaper) adopt(ctx context.Context, managed map[string]instances.Instance, records map[string]ledger.Record, cutoff time.Time, sum *SweepSummary) error {
	var ids []string
	for id, inst := range managed {
		if _, ok := records[id]; !ok && inst.State == model.StateRunning && inst.LaunchTime.Before(cutoff) && inst.Pod.UID != "" {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	var mu sync.Mutex
	return sweepWrites(ctx, ids, sum, func(id string) error {
		rec, err := r.Ledger.Adopt(ctx, id, managed[id].Pod, managed[id].ExitTokenHash)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		records[id] = rec
		sum.Adopted++
		return nil
	})
}

// orphans are running owned instances older than cutoff whose Pod no
// longer needs them (mayBeOrphan, then the Pod deleted, replaced by
// another UID, or already terminal), in the cluster the instance was
// launched for (sameCluster), and how many owned instances run. At most
// Policy.OrphanCap of the running
// owned instances are returned, oldest first; the rest are held back,
// counted and logged.
func (r *Reaper) orphans(ctx context.Context, managed map[string]instances.Instance, records map[string]ledger.Record, cutoff time.Time, sum *SweepSummary) ([]string, int, error) {
	var (
		candidates []instances.Instance
		running    int
		errs       []error
	)
	now := r.Now()
	for id, inst := range managed {
		if inst.State != model.StateRunning && inst.State != model.StatePending {
			continue
		}
		running++
		if !inst.LaunchTime.Before(cutoff) {
			continue
		}
		if inst.Pod.UID == "" {
			errs = append(errs, fmt.Errorf("managed instance %s has no pod tags", inst.ID))
			continue
		}
		var rec *ledger.Record
		if r, ok := records[id]; ok {
			rec = &r
		}
		if mayBeOrphan(inst, rec, now) {
			candidates = append(candidates, inst)
		}
	}
	if len(candidates) == 0 {
		return nil, running, errors.Join(errs...)
	}
	candidates, mismatched, err := r.sameCluster(ctx, candidates)
	sum.IdentityMismatch = mismatched
	if err != nil {
		return nil, running, errors.Join(append(errs, err)...)
	}
	refs := make([]model.PodRef, len(candidates))
	for i, inst := range candidates {
		refs[i] = inst.Pod
	}
	// One read for them all, in LIST pages: the sweep's cost in requests
	// grows with the fleet by one per 500 Pods, not one per instance. A
	// Pod whose read failed leaves its instance alone until the next sweep.
	snaps, err := r.Pods.ReadMany(ctx, refs)
	errs = append(errs, err)
	var found []instances.Instance
	for _, inst := range candidates {
		pod, ok := snaps[inst.Pod]
		if !ok || pod.Result == kube.Current {
			continue
		}
		r.Log.LogAttrs(ctx, slog.LevelWarn, "orphaned instance", slog.String("instance", inst.ID),
			slog.String("pod", inst.Pod.String()), slog.String("pod state", string(pod.Result)))
		found = append(found, inst)
	}
	found = r.capOrphans(ctx, found, running, sum)
	ids := make([]string, len(found))
	for i, inst := range found {
		ids[i] = inst.ID
	}
	slices.Sort(ids)
	return ids, running, errors.Join(errs...)
}

// orphanFloor is the fewest orphans a sweep may hand on whatever the cap:
// a small fleet's few orphans go in one sweep (at a cap of 0.1, two
// orphans among two instances would otherwise take two sweeps).
const orphanFloor = 5

// orphanLimit is the most orphans one sweep, or all reconciler batches at
// once, may end among running owned instances: Policy.OrphanCap of them, but
// orphanFloor at least.
func (p Policy) orphanLimit(running int) int {
	return max(int(math.Ceil(p.OrphanCap*float64(running))), orphanFloor)
}

// batchOrphanLimit is the most orphans one reconciler batch may end:
// orphanLimit shared among the Reconcilers that may run at once, so that
// together they end no more than a sweep may.
func (p Policy) batchOrphanLimit(running int) int {
	return (p.orphanLimit(running) + max(p.Reconcilers, 1) - 1) / max(p.Reconcilers, 1)
}

// capOrphans keeps at most Policy.OrphanCap of the running owned instances
// (but orphanFloor at least) among found, the oldest first. Many orphans
// at once is what a wrong Kubernetes endpoint looks like: the cap bounds
// what one sweep ends, and the count of those held back raises an alarm.
func (r *Reaper) capOrphans(ctx context.Context, found []instances.Instance, running int, sum *SweepSummary) []instances.Instance {
	if r.Policy.OrphanCap <= 0 {
		return found
	}
	limit := r.Policy.orphanLimit(running)
	if len(found) <= limit {
		return found
	}
	slices.SortFunc(found, func(a, b instances.Instance) int {
		return cmp.Or(a.LaunchTime.Compare(b.LaunchTime), cmp.Compare(a.ID, b.ID))
	})
	sum.HeldBack = len(found) - limit
	r.Metrics.Count(metrics.OrphansHeldBack, sum.HeldBack)
	r.Log.LogAttrs(ctx, slog.LevelError, "orphans held back by the cap",
		slog.Int("orphans", len(found)), slog.Int("terminating", limit), slog.Int("heldBack", sum.HeldBack),
		slog.Int("running", running), slog.Float64("cap", r.Policy.OrphanCap))
	return found[:limit]
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
