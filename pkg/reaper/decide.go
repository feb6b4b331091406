// Package reaper is the decision core shared by every handler: from what the
// ledger knows of an instance, and what EC2 says of it, it decides once what
// the Pod must say and whether and when the instance must go (Decide, pure),
// then carries that out idempotently through one small interface per
// outside system (Reaper).
package reaper

import (
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/reaper-k8s/reaper/pkg/instances"
	"github.com/reaper-k8s/reaper/pkg/ledger"
	"github.com/reaper-k8s/reaper/pkg/model"
	"github.com/reaper-k8s/reaper/pkg/podstatus"
)

// Policy holds the knobs that shape decisions.
type Policy struct {
	// ExitWait is how long after an instance is gone a late exit line still
	// decides the Pod's status; after it the Pod ends lost.
	ExitWait time.Duration
	// TerminateStopped terminates managed instances that stop: a stopped
	// one-Pod instance does no work but still bills its volumes.
	TerminateStopped bool
	// PowerOffGrace is how long an instance still running after its
	// terminal exit is left to power itself off before Reaper terminates
	// it (0: at once), counted from when Reaper learned its Pod ended, on
	// Reaper's clock, never from the line's finishedAt: the receipt of the
	// exit that ended it (or the end of the grace of sidecars that
	// outlived it), or with PodWrittenTag Reaper's write of its Pod if
	// later (graceEnd):
	// the default user-data's hosts power off within seconds of their exit
	// line shipping, those that wait for the Pod-written tag within
	// seconds of the write. Reaper's terminate is then the safety net, and
	// the account's terminate buckets are spent only on hosts that did not
	// power off.
	PowerOffGrace time.Duration
	// PodWrittenTag, when set, is the tag key Reaper puts on a running
	// instance once its Pod carries its terminal exit
	// (model.TagKeys.PodWritten).
	PodWrittenTag string
	// OrphanCap is the most a sweep terminates as orphans, as a part of the
	// owned instances running (0: no cap). The rest stay running, counted
	// (metrics.OrphansHeldBack), until a later sweep.
	OrphanCap float64
	// Reconcilers is how many reconciler batches may run at once (the
	// event source mapping's concurrency): each ends at most its part of
	// the orphan cap (0 counts as 1).
	Reconcilers int
}

// End says whether and when an instance is terminated.
type End struct {
	// Now: terminate it in this batch. An instance EC2 describes as
	// shutting down or terminated costs no call: it counts as done.
	Now bool
	// At: its host is left its power-off grace until then; it is looked
	// at again then (a wake-up) and terminated unless EC2 reports it gone.
	At time.Time
}

// Plan is the one decision about an instance for a batch or a sweep: what
// its Pod must say, whether and when the instance goes, and what is left to
// wait for. The phases after the decision read it; none decides again.
type Plan struct {
	// Pod is the outcome the Pod must carry, nil when it needs no write.
	Pod *model.Outcome
	// PodEndedAt is when Reaper learned what ended the Pod, with PodEnds:
	// its instance's power-off grace runs from it; the ledger keeps the
	// first (ledger.Record.PodEndedAt).
	PodEndedAt time.Time
	// PodEnds says the Pod has ended, or ends once Pod is written: every
	// container that decides its phase has ended for good (podstatus), or
	// its instance is gone and the exit-wait window passed. Only then is
	// its instance terminated for its end (End).
	PodEnds bool
	// End is when the instance is terminated once the Pod step is done
	// (the Pod written, or no write planned).
	End End
	// EndUnwritten is when it is terminated if the planned Pod write fails:
	// a failed write never holds the instance billing beyond the grace
	// after Reaper received its exit (an apiserver outage must not keep a
	// GPU running).
	EndUnwritten End
	// WaitUntil is set while something is still to come: the exit-wait
	// window of an instance gone without an exit line (nothing is decided
	// for its Pod before then), EC2's refusal to terminate it (asked again
	// then), or the end of a power-off grace (End.At).
	WaitUntil time.Time
	// SidecarsDue is when the Pod's sidecars, still running once every
	// regular container ended for good, are taken as lost unless they
	// reported by then: the record is looked at again then, with its Pod
	// read (a wake-up).
	SidecarsDue time.Time
	// DueSince is when the work the plan asks for fell due: the sweep
	// queues a record again only when its work fell due after the last
	// batch wrote it, or long ago.
	DueSince time.Time
	// Why says in a few words what decided the plan, for the logs.
	Why string
}

// Idle says the plan leaves nothing to do, now or later: its record is
// settled and leaves the pending index.
func (p Plan) Idle() bool { return p.Settled(false, p.End, false) }

// Settled is the one rule of a settled record (it leaves the pending
// index): once the plan's steps came to this, nothing is left to do or to
// wait for. podDone: the Pod was written, or no write was planned, or the
// write was given up (its work went to the dead-letter queue, which tells
// the operator); terminated: the instance was terminated (or found gone)
// if end, the End acted on, ended it now. A terminate is never given up:
// a record whose instance must still end stays pending, for the sweep to
// queue again, whatever the dead-letter queue holds.
func (p Plan) Settled(podDone bool, end End, terminated bool) bool {
	return (p.Pod == nil || podDone) && p.WaitUntil.IsZero() && (!end.Now || terminated)
}

// RefusalBackoff is how long after EC2 refused to terminate an instance
// (termination protection, a policy) Reaper asks again: an operator's
// protection is meant to hold, and asking every minute would only spend
// the account's tokens.
const RefusalBackoff = time.Hour

// Decide returns the plan for an instance's record at time now, given the
// instance as EC2 described it in this batch (nil: not described) and its
// Pod as read in this batch (nil: not read, or no longer live). Steps the
// record marks done are never planned again. A power-off grace is judged
// from when EC2 described the instance: a host may have powered off since
// a lookup made earlier in a long batch, so the instance is looked at
// again when the grace ends instead of being terminated on old news.
func Decide(rec ledger.Record, ec2 *instances.Instance, pod *corev1.Pod, now time.Time, p Policy) Plan {
	var plan Plan
	v := viewPod(rec, pod, now, p)
	plan.PodEnds = v.ended
	if v.ended {
		plan.PodEndedAt = v.endedAt
	}
	if v.outcome != nil && v.outcome.Key() != rec.PodSynced && rec.PodSynced != lostKey {
		plan.Pod, plan.DueSince, plan.Why = v.outcome, v.due, "pod "+v.outcome.Key()
	}
	if !v.waitUntil.IsZero() {
		plan.WaitUntil, plan.Why = v.waitUntil, v.waitWhy
	}
	plan.SidecarsDue = v.sidecarsDue
	if stillRunning(rec, ec2) {
		plan.End, plan.EndUnwritten = End{Now: true}, End{Now: true}
		plan.DueSince, plan.Why = rec.Terminated.Add(terminateTakes), "still running after its terminate"
		return plan
	}
	if !rec.Terminated.IsZero() || !wantTerminated(rec, v, p) {
		return plan
	}
	seen := now
	if ec2 != nil {
		if model.IsEnding(ec2.State) {
			plan.End, plan.EndUnwritten = End{Now: true}, End{Now: true}
			return plan
		}
		seen = ec2.DescribedAt
	}
	if r := rec.TerminateRefused; r != nil && now.Before(r.At.Add(RefusalBackoff)) {
		plan.WaitUntil, plan.Why = laterOf(plan.WaitUntil, r.At.Add(RefusalBackoff)), "terminate refused: "+r.Code
		return plan
	}
	plan.EndUnwritten = endAfterGrace(graceEnd(v, rec.PodSyncedAt, p), rec, v, seen, p)
	plan.End = plan.EndUnwritten
	if plan.Pod != nil && p.PodWrittenTag != "" {
		// The host waits for the Pod-written tag: its grace runs from the
		// write this batch makes.
		plan.End = endAfterGrace(graceEnd(v, now, p), rec, v, seen, p)
	}
	if !plan.End.At.IsZero() {
		plan.WaitUntil = laterOf(plan.WaitUntil, plan.End.At)
	}
	plan.DueSince = laterOf(plan.DueSince, terminateDue(rec, v, p))
	return plan
}

// podView is what the record and the Pod's spec say of the Pod: the
// outcome its status must carry (nil: nothing known yet) and since when,
// whether the Pod has ended and since when (its instance's power-off
// grace runs from then), and until when something is still to come.
type podView struct {
	outcome *model.Outcome
	due     time.Time
	ended   bool
	endedAt time.Time
	// byRuns: the containers ended it (their exits, or the sidecars'
	// grace), not the instance's going: its instance is then ended too.
	byRuns bool
	// waitUntil is the end of the exit-wait window of an instance gone
	// with containers unaccounted for, or of the grace sidecars have to
	// stop once the regular containers ended; waitWhy says which.
	waitUntil time.Time
	waitWhy   string
	// sidecarsDue is when the sidecars' grace ends.
	sidecarsDue time.Time
}

// viewPod is the one reading of a record's container runs against the
// Pod's spec (pod, nil when not read). With the spec, the kubelet's rule
// decides whether the runs end the Pod (podstatus); sidecars still running
// once every regular container ended for good are left the Pod's
// termination grace period to report their end, then taken as lost.
// Without it, the phase this record's outcome was written with decides,
// and failing that the host's word (podstatus.HostSaysEnded): a host can
// always end its own instance, so its word decides nothing it could not
// do itself. An instance gone with the Pod not ended leaves the runs the
// exit-wait window to come; after it, what is unaccounted for is lost.
func viewPod(rec ledger.Record, pod *corev1.Pod, now time.Time, p Policy) podView {
	o := model.Outcome{InstanceID: rec.InstanceID, Exits: rec.Runs()}
	if pod != nil {
		o.Exits = slices.DeleteFunc(o.Exits, func(e model.Exit) bool { return podstatus.KindOf(&pod.Spec, e.Container) == podstatus.KindNone })
	}
	var v podView
	v.ended, v.endedAt = endedByRuns(rec, pod, o, now), latestReceipt(decisive(pod, o.Exits))
	regularsAt, regularsEnded := time.Time{}, false
	if pod != nil {
		regularsAt, regularsEnded = podstatus.RegularsEnded(&pod.Spec, o)
	}
	if !v.ended && regularsEnded && podstatus.HasSidecars(&pod.Spec) {
		// Only sidecars are unaccounted for, and they decide nothing: the
		// Pod ends, its sidecars lost, once their grace has passed or
		// their instance is gone (no exit-wait window for them).
		deadline := regularsAt.Add(terminationGrace(pod))
		switch {
		case rec.Gone != nil:
			o.SidecarsLost, v.ended, v.endedAt = true, true, laterOf(regularsAt, rec.GoneSince())
		case now.Before(deadline):
			v.waitUntil, v.waitWhy, v.sidecarsDue = deadline, "sidecars' termination grace", deadline
		default:
			o.SidecarsLost, v.ended, v.endedAt = true, true, deadline
		}
	}
	v.byRuns = v.ended
	if v.ended && !rec.PodEndedAt.IsZero() {
		v.endedAt = rec.PodEndedAt // decided when it was first written ended
	}
	if !v.ended && rec.Gone != nil {
		// An exit claim deferred on the queue keeps the window open until
		// it comes back.
		windowEnd := laterOf(rec.GoneSince().Add(p.ExitWait), rec.ExitQueuedUntil)
		if now.Before(windowEnd) {
			v.waitUntil, v.waitWhy = laterOf(v.waitUntil, windowEnd), "exit-wait window open"
		} else {
			o.Lost, o.LostAfter, v.ended, v.endedAt = rec.Gone, p.ExitWait, true, windowEnd
		}
	}
	if len(o.Exits) > 0 || o.Lost != nil {
		v.outcome, v.due = &o, v.endedAt
	}
	return v
}

// endedByRuns says whether the container runs of o end the Pod.
func endedByRuns(rec ledger.Record, pod *corev1.Pod, o model.Outcome, now time.Time) bool {
	if len(o.Exits) == 0 {
		return false
	}
	if pod != nil {
		if status, ok := podstatus.Build(pod, o, now); ok {
			return podstatus.Terminal(status.Phase)
		}
	}
	switch {
	case rec.PodEnded != nil && *rec.PodEnded:
		return true // a Pod written ended stays ended, whatever came since
	case rec.PodEnded != nil && rec.PodSynced == o.Key():
		return false
	}
	return podstatus.HostSaysEnded(o.Exits)
}

// decisive are the exits whose containers decide the Pod's phase: with
// its spec, all but its sidecars', whose restarts after the Pod ended must
// not move its instance's power-off grace; without it, all.
func decisive(pod *corev1.Pod, exits []model.Exit) []model.Exit {
	if pod == nil {
		return exits
	}
	return slices.DeleteFunc(slices.Clone(exits), func(e model.Exit) bool { return podstatus.KindOf(&pod.Spec, e.Container) == podstatus.KindSidecar })
}

// latestReceipt is when Reaper received the last of exits.
func latestReceipt(exits []model.Exit) time.Time {
	var at time.Time
	for _, e := range exits {
		at = laterOf(at, e.ReceivedAt)
	}
	return at
}

// defaultTerminationGrace is the Pod's terminationGracePeriodSeconds when
// its spec does not say, as the apiserver defaults it.
const defaultTerminationGrace = 30 * time.Second

func terminationGrace(pod *corev1.Pod) time.Duration {
	if g := pod.Spec.TerminationGracePeriodSeconds; g != nil {
		return time.Duration(*g) * time.Second
	}
	return defaultTerminationGrace
}

const lostKey = model.OutcomeLost

// terminateTakes is how long after TerminateInstances accepted an instance
// EC2 may still describe it running: its answers are eventually
// consistent, and an instance is shutting down within seconds.
const terminateTakes = 2 * time.Minute

// stillRunning says whether EC2 describes rec's instance running (or
// pending) terminateTakes after Reaper's terminate was accepted: the
// terminate did not take, and is made again.
func stillRunning(rec ledger.Record, ec2 *instances.Instance) bool {
	return !rec.Terminated.IsZero() && ec2 != nil && (ec2.State == model.StateRunning || ec2.State == model.StatePending) &&
		ec2.DescribedAt.Sub(rec.Terminated) > terminateTakes
}

// endAfterGrace is the End of an instance whose power-off grace ends at
// graceEnds, judged at seen: terminate now once the grace is over, or
// when it ends. Only the instance of a Pod ended by its containers' runs,
// which EC2 has not reported gone, has a grace.
func endAfterGrace(graceEnds time.Time, rec ledger.Record, v podView, seen time.Time, p Policy) End {
	hasGrace := p.PowerOffGrace > 0 && rec.Gone == nil && v.byRuns
	if hasGrace && seen.Before(graceEnds) {
		return End{At: graceEnds}
	}
	return End{Now: true}
}

// graceEnd is when the power-off grace of the instance ends: the grace
// after Reaper learned the Pod ended (received the exit that ended it, or
// the grace of sidecars that outlived it ended: podView.endedAt), on
// Reaper's clock (a container's first terminal exit is final, so no later
// line moves it), as the default user-data's hosts power off a few
// seconds after their last exit whenever Reaper writes the Pod. With the
// Pod-written tag the hosts wait for Reaper's write instead, so the grace
// runs from the later of the end and the write of its Pod (written),
// however long the write took.
func graceEnd(v podView, written time.Time, p Policy) time.Time {
	if !v.byRuns {
		return time.Time{}
	}
	from := v.endedAt
	if p.PodWrittenTag != "" {
		from = laterOf(from, written)
	}
	return from.Add(p.PowerOffGrace)
}

// terminateDue is when terminating rec's instance fell due.
func terminateDue(rec ledger.Record, v podView, p Policy) time.Time {
	due := graceEnd(v, rec.PodSyncedAt, p)
	if rec.Gone != nil {
		due = laterOf(due, rec.GoneSince())
	}
	if rec.TerminateRefused != nil {
		due = laterOf(due, rec.TerminateRefused.At.Add(RefusalBackoff))
	}
	return due
}

func laterOf(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// wantTerminated says whether the instance must go: its containers ended
// its Pod, or it stopped and stopped instances are terminated.
func wantTerminated(rec ledger.Record, v podView, p Policy) bool {
	if v.byRuns {
		return true
	}
	if rec.Gone == nil {
		return false
	}
	switch rec.Gone.State {
	case model.StateStopping, model.StateStopped:
		return p.TerminateStopped
	}
	// Shutting down or terminated: EC2 is already doing it.
	return false
}
