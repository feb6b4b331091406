// Package reaper is the decision core shared by every handler: from what the
// ledger knows of an instance it decides what the Pod must say and whether
// the instance must go (Decide, pure), then carries that out idempotently
// through one small interface per outside system (Reaper).
package reaper

import (
	"time"

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

// Plan is what must happen for one instance. The zero Plan does nothing.
type Plan struct {
	// Pod is the outcome the Pod must carry, nil when it needs no write.
	Pod *model.Outcome
	// Terminate asks for the instance to be terminated.
	Terminate bool
	// WaitUntil is set when the instance is gone without an exit line and
	// the exit-wait window is still open: nothing is decided before then.
	// It is also when an instance EC2 refused to terminate is asked for
	// again, and when one whose host is given time to power off is
	// terminated (TerminateAt).
	WaitUntil time.Time
	// TerminateAt is set while the instance of a terminal exit has its
	// power-off grace (Policy.PowerOffGrace): it is terminated then, unless
	// EC2 reports it gone first.
	TerminateAt time.Time
}

// Idle says the plan leaves nothing to do, now or later: its record is
// settled and leaves the pending index.
func (p Plan) Idle() bool { return p.Pod == nil && !p.Terminate && p.WaitUntil.IsZero() }

// RefusalBackoff is how long after EC2 refused to terminate an instance
// (termination protection, a policy) Reaper asks again: an operator's
// protection is meant to hold, and asking every minute would only spend
// the account's tokens.
const RefusalBackoff = time.Hour

// Decide returns the plan for an instance's record at time now. Steps the
// record marks done are never planned again.
func Decide(rec ledger.Record, now time.Time, p Policy) Plan {
	var plan Plan
	outcome := outcomeOf(rec, now, p)
	if outcome != nil && outcome.Key() != rec.PodSynced && rec.PodSynced != lostKey {
		plan.Pod = outcome
	}
	if rec.Gone != nil && (rec.Exit == nil || !rec.Exit.Terminal()) && now.Before(rec.Gone.At.Add(p.ExitWait)) {
		plan.WaitUntil = rec.Gone.At.Add(p.ExitWait)
	}
	// Whether the instance is already on its way out is EC2's to say, not
	// the ledger's: the terminate step asks it (one lookup) and counts an
	// instance already gone as done.
	if rec.Terminated.IsZero() && wantTerminated(rec, p) {
		switch r := rec.TerminateRefused; {
		case r != nil && now.Before(r.At.Add(RefusalBackoff)):
			plan.WaitUntil = later(plan.WaitUntil, r.At.Add(RefusalBackoff))
		case poweringOff(rec, now, p):
			plan.TerminateAt = graceEnd(rec, p)
			plan.WaitUntil = later(plan.WaitUntil, plan.TerminateAt)
		default:
			plan.Terminate = true
		}
	}
	return plan
}

var lostKey = model.Outcome{}.Key()

// poweringOff says whether the instance of rec's terminal exit is still
// within its power-off grace at now: EC2 has reported no end of it, and
// the grace has not ended (graceEnd).
func poweringOff(rec ledger.Record, now time.Time, p Policy) bool {
	return p.PowerOffGrace > 0 && rec.Gone == nil && rec.Exit != nil && rec.Exit.Terminal() &&
		now.Before(graceEnd(rec, p))
}

// graceEnd is when the power-off grace of rec's instance ends: the grace
// after its exit's finishedAt, as the default user-data's hosts power off
// a few seconds after their exit whenever Reaper writes the Pod. With the
// Pod-written tag the hosts wait for Reaper's write instead, so the grace
// runs from the later of the exit and the last write of its Pod, however
// long the write took; a Pod write that fails sets nothing, so an
// apiserver outage does not keep the instance billing beyond the grace
// after its exit.
func graceEnd(rec ledger.Record, p Policy) time.Time {
	from := rec.Exit.FinishedAt
	if p.PodWrittenTag != "" {
		from = later(from, rec.PodSyncedAt)
	}
	return from.Add(p.PowerOffGrace)
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// outcomeOf is what the Pod must say, if anything is known yet. A terminal
// exit line, however late, wins over "lost" while the Pod is not yet
// finalized; once a Pod is finalized as lost it stays so (it is terminal).
// A restart-pending exit holds only while the instance runs: once it is
// gone and the window has passed with no terminal line, the restart will
// never happen and the Pod is lost.
func outcomeOf(rec ledger.Record, now time.Time, p Policy) *model.Outcome {
	lost := rec.Gone != nil && !now.Before(rec.Gone.At.Add(p.ExitWait))
	switch {
	case rec.Exit != nil && (rec.Exit.Terminal() || !lost):
		return &model.Outcome{InstanceID: rec.InstanceID, Exit: rec.Exit}
	case lost:
		return &model.Outcome{InstanceID: rec.InstanceID, Lost: rec.Gone, LostAfter: p.ExitWait}
	}
	return nil
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
