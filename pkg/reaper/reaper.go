package reaper

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/reaper-k8s/reaper/pkg/instances"
	"github.com/reaper-k8s/reaper/pkg/kube"
	"github.com/reaper-k8s/reaper/pkg/ledger"
	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/model"
)

// Ledger is the instance ledger (package ledger).
type Ledger interface {
	Get(ctx context.Context, instanceID string) (ledger.Record, bool, error)
	RecordExit(ctx context.Context, instanceID string, pod model.PodRef, exit model.Exit) (ledger.Record, error)
	RecordState(ctx context.Context, instanceID string, pod model.PodRef, sc ledger.StateChange) (ledger.Record, error)
	Adopt(ctx context.Context, instanceID string, pod model.PodRef) (ledger.Record, error)
	MarkDone(ctx context.Context, instanceID string, d ledger.Done) error
	Pending(ctx context.Context, fn func(ledger.Record) error) error
	GetMany(ctx context.Context, ids []string) (map[string]ledger.Record, error)
}

// Pods reads Pods, a batch at a time, and writes their status from what
// was read (package kube). ClusterIdentity says which cluster they are
// read from; Warn tells a Pod's owner what Reaper could not do.
type Pods interface {
	ReadMany(ctx context.Context, refs []model.PodRef) (map[model.PodRef]kube.Snapshot, error)
	ApplyTo(ctx context.Context, snap kube.Snapshot, o model.Outcome) (kube.Result, error)
	ClusterIdentity(ctx context.Context) (string, error)
	Warn(ctx context.Context, ref model.PodRef, instance, reason, message string) error
}

// Fleet reads and terminates EC2 instances (package instances).
type Fleet interface {
	Describe(ctx context.Context, ids []string) (map[string]instances.Instance, error)
	Terminate(ctx context.Context, ids []string, known map[string]instances.Instance) (map[string]instances.Termination, error)
	Tag(ctx context.Context, ids []string, key, value string) ([]string, error)
	ListOwned(ctx context.Context, fn func(instances.Instance) error) error
}

// Reaper carries out plans.
type Reaper struct {
	Ledger Ledger
	Pods   Pods
	Fleet  Fleet
	Policy Policy
	// Queue takes the work the reconciler does in batches.
	Queue Queue
	Log   *slog.Logger
	// Metrics records what the handlers did (nil records nothing); each
	// handler flushes it before it returns.
	Metrics *metrics.Recorder
	Now     func() time.Time
}

// Step results reported per instance.
type Report struct {
	InstanceID string
	Plan       Plan
	// PodResult is set when a Pod write was attempted.
	PodResult kube.Result
	// TerminateResult is set when termination was attempted.
	TerminateResult instances.Termination
}

// work is one record's progress through reconcileMany.
type work struct {
	// view is the record as believed, and as its Pod step left it.
	view            ledger.Record
	podErr, termErr error
	// refused is EC2's code when it refused to terminate the instance.
	refused string
}

// reconcileMany decides and carries out the plans of records, as they are
// believed (apply checked each against its instance's launch tags, once),
// whose instances known describes (absent: EC2 does not know it): every
// Pod step until p.work, then one terminate for all the instances to end (at most 1,000
// ids a call, waiting for tokens at most maxTokenWait), each step whatever
// became of the other, then the done steps of each record in one ledger
// write. Reports and errors are per record, in the order of views; an error
// for which forLater holds means the step was not made for want of time or
// tokens, and the record's work goes back on the queue.
//
// The Pod writes land before the terminate is sent: a provider that
// derives the Pod's status from the instance's state would otherwise see
// the instance go first and write its own "instance gone" status, which the
// terminal guard then keeps. So a record whose Pod write the batch had no
// time for is not terminated either. A failed write does not hold the
// terminate back: an apiserver outage must not keep a GPU billing, and a
// failed terminate must not hide the exit.
func (r *Reaper) reconcileMany(ctx context.Context, p phases, views []ledger.Record, known map[string]instances.Instance) ([]Report, []error) {
	reps, errs, works := make([]Report, len(views)), make([]error, len(views)), make([]work, len(views))
	settleCtx, cancelSettle := p.settleContext(ctx)
	defer cancelSettle()
	var live, writes []int // every record; those with a Pod step
	for i, view := range views {
		reps[i].InstanceID = view.InstanceID
		works[i].view = view
		reps[i].Plan = Decide(view, r.Now(), r.Policy)
		live = append(live, i)
		if reps[i].Plan.Pod != nil {
			writes = append(writes, i)
			works[i].podErr = errNoTime // until it is written
		}
	}

	podCtx, cancelPods := withDeadline(ctx, p.work)
	var refs []model.PodRef
	for _, i := range writes {
		if ref := works[i].view.Pod; ref.UID != "" {
			refs = append(refs, ref)
		}
	}
	// The reads may take half the time left for the Pods: a slow apiserver
	// then still leaves the other half to write those that were read.
	readCtx, cancelRead := withDeadline(podCtx, halfway(p.work))
	snaps, readErr := r.Pods.ReadMany(readCtx, refs)
	readErr = outOfTime(readCtx, readErr)
	cancelRead()
	_ = forEach(podCtx, podWorkers, writes, func(i int) error {
		view := works[i].view
		snap, read := snaps[view.Pod]
		switch {
		case view.Pod.UID == "":
			works[i].podErr = fmt.Errorf("instance %s: no Pod known for it (no exit line and no pod tags)", view.InstanceID)
		case !read:
			works[i].podErr = fmt.Errorf("read pod %s: %w", view.Pod, readErr)
		default:
			res, err := r.Pods.ApplyTo(podCtx, snap, *reps[i].Plan.Pod)
			reps[i].PodResult, works[i].podErr = res, outOfTime(podCtx, err)
		}
		return nil
	})
	cancelPods()

	// The power-off grace runs from the Pod write too: the terminate step
	// of a record follows the plan its Pod step left, judged from when
	// EC2 last described the instance.
	now := r.Now()
	for _, i := range writes {
		if works[i].podErr == nil {
			works[i].view.PodSynced, works[i].view.PodSyncedAt = reps[i].Plan.Pod.Key(), now
		}
	}
	for _, i := range live {
		inst, described := known[views[i].InstanceID]
		r.terminateWhen(&reps[i].Plan, works[i].view, inst, described, now)
	}
	r.tagPodWritten(ctx, p, reps, writes, works, known)

	var ending []string
	for _, i := range live {
		if reps[i].Plan.Terminate && !forLater(works[i].podErr) {
			ending = append(ending, views[i].InstanceID)
		}
	}
	if len(ending) > 0 {
		termCtx, cancelTerm := p.terminateContext(ctx)
		out, err := r.Fleet.Terminate(termCtx, ending, known)
		err = outOfTime(termCtx, err)
		cancelTerm()
		var refusals instances.Refusals
		errors.As(err, &refusals)
		for _, i := range live {
			if reps[i].Plan.Terminate {
				switch reps[i].TerminateResult = out[views[i].InstanceID]; reps[i].TerminateResult {
				case "":
					works[i].termErr = cmp.Or(err, errNoTime)
				case instances.Refused:
					works[i].refused = refusals[views[i].InstanceID]
				}
			}
		}
	}

	for _, i := range live {
		errs[i] = errNoTime // until its steps are marked
	}
	_ = forEach(settleCtx, ledgerWorkers, live, func(i int) error {
		rep, w := reps[i], works[i]
		var markErr error
		if w.refused != "" {
			r.terminationRefused(settleCtx, rep.InstanceID, w.view.Pod, w.refused)
		}
		if done, write := r.done(w.view, rep.Plan, w.podErr, w.termErr, w.refused); write {
			markErr = outOfTime(settleCtx, r.Ledger.MarkDone(settleCtx, rep.InstanceID, done))
		}
		r.recordSteps(w.view, rep)
		errs[i] = errors.Join(w.podErr, w.termErr, markErr)
		attrs := []slog.Attr{
			slog.String("instance", rep.InstanceID),
			slog.String("pod", w.view.Pod.String()),
			slog.String("outcome", outcomeKey(rep.Plan.Pod)),
			slog.String("podResult", string(rep.PodResult)),
			slog.String("terminateResult", string(rep.TerminateResult)),
		}
		level := slog.LevelInfo
		switch {
		case errs[i] == nil:
		case forLater(errs[i]):
			// Deferred, not failed: the work comes back.
			attrs = append(attrs, slog.String("deferred", errs[i].Error()))
		default:
			level = slog.LevelError
			attrs = append(attrs, slog.String("error", errs[i].Error()))
		}
		r.Log.LogAttrs(ctx, level, "reconciled", attrs...)
		return nil
	})
	return reps, errs
}

// terminateWhen settles when the terminate of a record's instance is made,
// once its Pod step is done (view). An instance EC2 described as ending
// is "terminated" now: the step costs no call. One EC2 described running
// is terminated only if that was after its power-off grace ended: a host
// may have powered off since a lookup made before, so the instance is
// looked at again when the grace ends (Plan.TerminateAt) instead. A batch
// longer than the grace would otherwise terminate instances whose hosts
// powered off while it ran.
func (r *Reaper) terminateWhen(plan *Plan, view ledger.Record, inst instances.Instance, described bool, now time.Time) {
	if !plan.Terminate && plan.TerminateAt.IsZero() {
		return
	}
	seen := now
	if described {
		if model.IsEnding(inst.State) {
			plan.Terminate, plan.TerminateAt = true, time.Time{}
			return
		}
		seen = inst.DescribedAt
	}
	if poweringOff(view, seen, r.Policy) {
		plan.Terminate, plan.TerminateAt = false, graceEnd(view, r.Policy)
		plan.WaitUntil = later(plan.WaitUntil, plan.TerminateAt)
		return
	}
	plan.Terminate, plan.TerminateAt = true, time.Time{}
}

// tagPodWritten tags, with Policy.PodWrittenTag, the instances still
// running whose Pod this batch wrote and which are left their grace to
// power off: a host that waits for the tag (through the instance
// metadata) powers off only once its Pod tells its exit, so that a
// provider deriving the Pod's status from the instance's state never
// writes "instance gone" first. One CreateTags per 1,000 ids, its value
// the time of the writes. A tag not put is logged and counted; the
// instance is then terminated when its grace ends.
func (r *Reaper) tagPodWritten(ctx context.Context, p phases, reps []Report, writes []int, works []work, known map[string]instances.Instance) {
	if r.Policy.PodWrittenTag == "" {
		return
	}
	var ids []string
	for _, i := range writes {
		inst, described := known[reps[i].InstanceID]
		if works[i].podErr == nil && reps[i].Plan.Pod.Terminal() && !reps[i].Plan.TerminateAt.IsZero() &&
			described && inst.Owned && !model.IsEnding(inst.State) {
			ids = append(ids, reps[i].InstanceID)
		}
	}
	if len(ids) == 0 {
		return
	}
	tagCtx, cancel := p.terminateContext(ctx)
	defer cancel()
	value := r.Now().UTC().Format(time.RFC3339)
	if left, err := r.Fleet.Tag(tagCtx, ids, r.Policy.PodWrittenTag, value); err != nil {
		r.Metrics.Count(metrics.PodWrittenTagsFailed, len(left))
		r.Log.LogAttrs(ctx, slog.LevelWarn, "pod-written tag not put", slog.Int("instances", len(left)),
			slog.String("tag", r.Policy.PodWrittenTag), slog.String("error", err.Error()))
	}
}

// recordSteps counts what the steps achieved and, for an exit, how long
// after the container finished.
func (r *Reaper) recordSteps(rec ledger.Record, rep Report) {
	o := rep.Plan.Pod
	sinceFinish := func() (time.Duration, bool) {
		if rec.Exit == nil || rec.Exit.FinishedAt.IsZero() {
			return 0, false
		}
		return r.Now().Sub(rec.Exit.FinishedAt), true
	}
	if o != nil && rep.PodResult == kube.Patched {
		r.Metrics.By(metrics.Outcome(outcomeName(*o))).Count(metrics.PodStatusesWritten, 1)
		if d, ok := sinceFinish(); ok && o.Terminal() {
			r.Metrics.Observe(metrics.FinishToPodTerminal, d)
		}
	}
	if rep.TerminateResult == instances.Terminating {
		r.Metrics.Count(metrics.InstancesTerminated, 1)
		if d, ok := sinceFinish(); ok {
			r.Metrics.Observe(metrics.FinishToTerminated, d)
		}
	}
}

// outcomeName is an outcome's value of the Outcome dimension.
func outcomeName(o model.Outcome) string {
	switch {
	case o.Exit == nil:
		return metrics.OutcomeLost
	case !o.Exit.Terminal():
		return metrics.OutcomeRestart
	case o.Exit.ExitCode == 0:
		return metrics.OutcomeSucceeded
	}
	return metrics.OutcomeFailed
}

// reject logs a record that the instance's tags do not back and settles
// it: no Pod write, no terminate, and no sweep comes back to it.
func (r *Reaper) reject(ctx context.Context, rec ledger.Record, inst instances.Instance, reason string) error {
	r.Log.LogAttrs(ctx, slog.LevelWarn, "record not believed", slog.String("instance", rec.InstanceID),
		slog.String("reason", reason), slog.String("claimed", rec.Pod.String()), slog.String("tags", inst.Pod.String()),
		slog.String("cluster", inst.Cluster))
	r.Metrics.By(metrics.Reason(reason)).Count(metrics.LinesRejected, 1)
	if rec.Pending == "" {
		return nil
	}
	return r.Ledger.MarkDone(ctx, rec.InstanceID, ledger.Done{Settled: true, Version: rec.Version})
}

// done is what the ledger must learn after the steps: the steps that
// succeeded, EC2's refusal to terminate (refused, its code), and whether
// the record is settled (it then leaves the pending index). write is false
// when that changes nothing. A refused instance stays pending: Decide asks
// for it again after RefusalBackoff.
func (r *Reaper) done(rec ledger.Record, plan Plan, podErr, termErr error, refused string) (done ledger.Done, write bool) {
	after := rec
	if plan.Pod != nil && podErr == nil {
		done.PodSynced, after.PodSynced = plan.Pod.Key(), plan.Pod.Key()
	}
	switch {
	case !plan.Terminate || termErr != nil:
	case refused != "":
		done.Refused, after.TerminateRefused = refused, &ledger.Refusal{Code: refused, At: r.Now()}
	default:
		done.Terminated, after.Terminated = true, r.Now()
	}
	done.Settled = Decide(after, r.Now(), r.Policy).Idle()
	done.Version = rec.Version
	write = done.PodSynced != "" || done.Terminated || done.Refused != "" || done.Settled == (rec.Pending != "")
	return done, write
}

// terminationRefused reports an instance EC2 would not terminate
// (termination protection, a policy): a warning, a count by EC2's code,
// and an Event on its Pod, whose owner is the one to know. Reaper asks
// again after RefusalBackoff.
func (r *Reaper) terminationRefused(ctx context.Context, id string, pod model.PodRef, code string) {
	r.Metrics.By(metrics.Reason(code)).Count(metrics.TerminationsRefused, 1)
	r.Log.LogAttrs(ctx, slog.LevelWarn, "termination refused", slog.String("instance", id), slog.String("pod", pod.String()),
		slog.String("code", code), slog.Duration("askAgainIn", RefusalBackoff))
	if pod.UID == "" {
		return
	}
	msg := fmt.Sprintf("EC2 refused to terminate instance %s (%s): it keeps running and billing. Termination protection (disableApiTermination) or a policy denying ec2:TerminateInstances does this; Reaper asks again in %s.", id, code, RefusalBackoff)
	if err := r.Pods.Warn(ctx, pod, id, "TerminationRefused", msg); err != nil {
		r.Log.LogAttrs(ctx, slog.LevelWarn, "event not posted", slog.String("instance", id), slog.String("error", err.Error()))
	}
}

// flushMetrics writes what the invocation recorded; a failed write is
// logged, never the invocation's error.
func (r *Reaper) flushMetrics(ctx context.Context) {
	if err := r.Metrics.Flush(ctx); err != nil {
		r.Log.WarnContext(ctx, "metrics not written", "error", err)
	}
}

func outcomeKey(o *model.Outcome) string {
	if o == nil {
		return ""
	}
	return o.Key()
}

// errorLevel is the level of a summary line whose work ended with err.
func errorLevel(err error) slog.Level {
	if err != nil {
		return slog.LevelError
	}
	return slog.LevelInfo
}
