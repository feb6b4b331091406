// Package reaper is the decision core shared by every handler: from what the
// ledger knows of an instance, and what EC2 says of it, it decides once what
// the Pod must say and whether and when the instance must go (Decide, pure),
// then carries that out idempotently through one small interface per
// outside system (Reaper).
package reaper

import (
	"time"

	"github.com/reaper-k8s/reaper/pkg/instances"
	"github.com/reaper-k8s/reaper/pkg/ledger"
	"github.com/reaper-k8s/reaper/pkg/model"
)

// Policy holds the knobs that shape decisions.
type Policy struct {
	// ExitWait is how long after an instance is gone a late exit line still
	// decides the Pod's status; after it the Pod is finalized as lost.
	ExitWait time.Duration
	// TerminateStopped terminates managed instances that stop: a stopped
	// one-Pod instance does no work but still bills its volumes.
	TerminateStopped bool
	// PowerOffGrace is how long an instance still running after its
	// terminal exit is left to power itself off before Reaper terminates
	// it (0: at once), counted from the exit's finishedAt, or with
	// PodWrittenTag from Reaper's write of its Pod if later (graceEnd):
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
	// End is when the instance is terminated once the Pod step is done
	// (the Pod written, or no write planned).
	End End
	// EndUnwritten is when it is terminated if the planned Pod write fails:
	// a failed write never holds the instance billing beyond the grace
	// after its exit (an apiserver outage must not keep a GPU running).
	EndUnwritten End
	// WaitUntil is set while something is still to come: the exit-wait
	// window of an instance gone without an exit line (nothing is decided
	// for its Pod before then), EC2's refusal to terminate it (asked again
	// then), or the end of a power-off grace (End.At).
	WaitUntil time.Time
	// DueSince is when the work the plan asks for fell due: the sweep
	// queues a record again only when its work fell due after the last
	// batch wrote it, or long ago.
	DueSince time.Time
	// Why says in a few words what decided the plan, for the logs.
	Why string
}

// Idle says the plan leaves nothing to do, now or later: its record is
// settled and leaves the pending index.
func (p Plan) Idle() bool { return p.Pod == nil && !p.End.Now && p.WaitUntil.IsZero() }

// RefusalBackoff is how long after EC2 refused to terminate an instance
// (termination protection, a policy) Reaper asks again: an operator's
// protection is meant to hold, and asking every minute would only spend
// the account's tokens.
const RefusalBackoff = time.Hour

// Decide returns the plan for an instance's record at time now, given the
// instance as EC2 described it in this batch (nil: not described). Steps
// the record marks done are never planned again. A power-off grace is
// judged from when EC2 described the instance: a host may have powered off
// since a lookup made earlier in a long batch, so the instance is looked at
// again when the grace ends instead of being terminated on old news.
func Decide(rec ledger.Record, ec2 *instances.Instance, now time.Time, p Policy) Plan {
	var plan Plan
	if outcome, due := outcomeOf(rec, now, p); outcome != nil && outcome.Key() != rec.PodSynced && rec.PodSynced != lostKey {
		plan.Pod, plan.DueSince, plan.Why = outcome, due, "pod "+outcome.Key()
	}
	if rec.Gone != nil && (rec.Exit == nil || !rec.Exit.Terminal()) && now.Before(rec.GoneSince().Add(p.ExitWait)) {
		plan.WaitUntil, plan.Why = rec.GoneSince().Add(p.ExitWait), "exit-wait window open"
	}
	if stillRunning(rec, ec2) {
		plan.End, plan.EndUnwritten = End{Now: true}, End{Now: true}
		plan.DueSince, plan.Why = rec.Terminated.Add(terminateTakes), "still running after its terminate"
		return plan
	}
	if !rec.Terminated.IsZero() || !wantTerminated(rec, p) {
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
	plan.EndUnwritten = endAfterGrace(graceEnd(rec, rec.PodSyncedAt, p), rec, seen, p)
	plan.End = plan.EndUnwritten
	if plan.Pod != nil && p.PodWrittenTag != "" {
		// The host waits for the Pod-written tag: its grace runs from the
		// write this batch makes.
		plan.End = endAfterGrace(graceEnd(rec, now, p), rec, seen, p)
	}
	if !plan.End.At.IsZero() {
		plan.WaitUntil = laterOf(plan.WaitUntil, plan.End.At)
	}
	plan.DueSince = laterOf(plan.DueSince, terminateDue(rec, p))
	return plan
}

var lostKey = model.Outcome{}.Key()

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
// when it ends. Only the instance of a terminal exit that EC2 has not
// reported gone has a grace.
func endAfterGrace(graceEnds time.Time, rec ledger.Record, seen time.Time, p Policy) End {
	hasGrace := p.PowerOffGrace > 0 && rec.Gone == nil && rec.Exit != nil && rec.Exit.Terminal()
	if hasGrace && seen.Before(graceEnds) {
		return End{At: graceEnds}
	}
	return End{Now: true}
}

// graceEnd is when the power-off grace of rec's instance ends: the grace
// after Reaper received its terminal exit, on Reaper's clock (the first
// terminal exit is final, so no later line moves it; a record an older
// version wrote without the time falls back to the exit's finishedAt), as
// the default user-data's hosts power off a few seconds after their exit
// whenever Reaper writes the Pod. With the Pod-written tag the hosts wait
// for Reaper's write instead, so the grace runs from the later of the
// exit and the write of its Pod (written), however long the write took.
func graceEnd(rec ledger.Record, written time.Time, p Policy) time.Time {
	if rec.Exit == nil {
		return time.Time{}
	}
	from := rec.Exit.ReceivedAt
	if from.IsZero() {
		from = rec.Exit.FinishedAt
	}
	if p.PodWrittenTag != "" {
		from = laterOf(from, written)
	}
	return from.Add(p.PowerOffGrace)
}

// terminateDue is when terminating rec's instance fell due.
func terminateDue(rec ledger.Record, p Policy) time.Time {
	due := graceEnd(rec, rec.PodSyncedAt, p)
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

// outcomeOf is what the Pod must say, if anything is known yet, and since
// when. A terminal exit line, however late, wins over "lost" while the Pod
// is not yet finalized; once a Pod is finalized as lost it stays so (it is
// terminal). A restart-pending exit holds only while the instance runs:
// once it is gone and the window has passed with no terminal line, the
// restart will never happen and the Pod is lost.
func outcomeOf(rec ledger.Record, now time.Time, p Policy) (*model.Outcome, time.Time) {
	lost := rec.Gone != nil && !now.Before(rec.GoneSince().Add(p.ExitWait))
	switch {
	case rec.Exit != nil && (rec.Exit.Terminal() || !lost):
		return &model.Outcome{InstanceID: rec.InstanceID, Exit: rec.Exit}, rec.Exit.ReceivedAt
	case lost:
		return &model.Outcome{InstanceID: rec.InstanceID, Lost: rec.Gone, LostAfter: p.ExitWait}, rec.GoneSince().Add(p.ExitWait)
	}
	return nil, time.Time{}
}

func wantTerminated(rec ledger.Record, p Policy) bool {
	if rec.Exit != nil && rec.Exit.Terminal() {
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
