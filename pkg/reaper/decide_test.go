package reaper

import (
	"cmp"
	"testing"
	"time"

	"github.com/reaper-k8s/reaper/pkg/instances"
	"github.com/reaper-k8s/reaper/pkg/ledger"
	"github.com/reaper-k8s/reaper/pkg/model"
)

// exitsOf is a record's Exits holding exits, by their containers.
func exitsOf(exits ...model.Exit) map[string]model.Exit {
	out := map[string]model.Exit{}
	for _, e := range exits {
		out[e.Container] = e
	}
	return out
}

// receivedAt sets when Reaper received the exit of the record's container
// "main" (at) and how long before that the container finished (ago).
func receivedAt(r *ledger.Record, at time.Time, ago time.Duration) {
	e := r.Exits["main"]
	e.FinishedAt, e.ReceivedAt = at.Add(-ago), at
	r.Exits["main"] = e
}

func TestDecide(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 6, 0, 0, 0, time.UTC)
	policy := Policy{ExitWait: 3 * time.Minute, TerminateStopped: true}
	exitRec := func(willRestart bool) ledger.Record {
		return ledger.Record{InstanceID: "i-1", Exits: exitsOf(model.Exit{Container: "main", RestartCount: 1, WillRestart: willRestart})}
	}
	with := func(r ledger.Record, f func(*ledger.Record)) ledger.Record { f(&r); return r }
	gone := func(state string) *model.Gone { return &model.Gone{State: state, At: t0} }

	for _, tc := range []struct {
		name      string
		rec       ledger.Record
		now       time.Time
		policy    Policy
		ec2       *instances.Instance // as described in the batch
		pod       string              // outcome key, "" for no write
		terminate bool
		wait      bool
		// unwritten is End.Now when the Pod write fails (default: terminate)
		unwritten *bool
	}{
		{name: "fresh exit", rec: exitRec(false), pod: "exit/1", terminate: true},
		{name: "restart keeps instance", rec: exitRec(true), pod: "exit/1"},
		{name: "exit already on pod", rec: with(exitRec(false), func(r *ledger.Record) { r.PodSynced = "exit/1" }), terminate: true},
		{name: "all done", rec: with(exitRec(false), func(r *ledger.Record) { r.PodSynced, r.Terminated = "exit/1", t0 })},
		{name: "newer restart than synced", rec: with(exitRec(true), func(r *ledger.Record) { r.PodSynced = "exit/0" }), pod: "exit/1"},
		{name: "exit after terminated event", rec: with(exitRec(false), func(r *ledger.Record) { r.Gone, r.LastState = gone("terminated"), "terminated" }), pod: "exit/1", terminate: true},
		{name: "gone inside window", rec: ledger.Record{InstanceID: "i-1", Gone: gone("terminated"), LastState: "terminated"}, now: t0.Add(time.Minute), wait: true},
		{name: "gone window expired", rec: ledger.Record{InstanceID: "i-1", Gone: gone("terminated"), LastState: "terminated"}, now: t0.Add(3 * time.Minute), pod: "lost"},
		{name: "stopped: terminate now, pod later", rec: ledger.Record{InstanceID: "i-1", Gone: gone("stopped"), LastState: "stopped"}, now: t0, terminate: true, wait: true},
		{name: "stopped, knob off", rec: ledger.Record{InstanceID: "i-1", Gone: gone("stopped"), LastState: "stopped"}, now: t0, policy: Policy{ExitWait: time.Minute}, wait: true},
		{name: "lost is final", rec: with(exitRec(false), func(r *ledger.Record) { r.PodSynced, r.Gone, r.LastState = "lost", gone("terminated"), "terminated" }), terminate: true},
		{name: "running, nothing known", rec: ledger.Record{InstanceID: "i-1", LastState: "running"}},
		{name: "restart pending, instance gone inside window", rec: with(exitRec(true), func(r *ledger.Record) { r.PodSynced, r.Gone = "exit/1", gone("terminated") }), now: t0.Add(time.Minute), wait: true},
		{name: "restart pending, instance gone, window passed", rec: with(exitRec(true), func(r *ledger.Record) { r.PodSynced, r.Gone = "exit/1", gone("terminated") }), now: t0.Add(3 * time.Minute), pod: "lost"},
		{name: "restart pending, stopped: terminate, pod later", rec: with(exitRec(true), func(r *ledger.Record) { r.PodSynced, r.Gone = "exit/1", gone("stopped") }), now: t0, terminate: true, wait: true},
		{name: "powering off: the Pod now, the instance after the grace", rec: with(exitRec(false), func(r *ledger.Record) { receivedAt(r, t0, 5*time.Second) }), now: t0.Add(10 * time.Second),
			policy: Policy{ExitWait: time.Minute, PowerOffGrace: 30 * time.Second}, pod: "exit/1", wait: true},
		{name: "grace from the receipt, not the finish", rec: with(exitRec(false), func(r *ledger.Record) { receivedAt(r, t0, time.Hour) }), now: t0.Add(10 * time.Second),
			policy: Policy{ExitWait: time.Minute, PowerOffGrace: 30 * time.Second}, pod: "exit/1", wait: true},
		{name: "powering off, grace passed", rec: with(exitRec(false), func(r *ledger.Record) { receivedAt(r, t0, 5*time.Second) }), now: t0.Add(30 * time.Second),
			policy: Policy{ExitWait: time.Minute, PowerOffGrace: 30 * time.Second}, pod: "exit/1", terminate: true},
		{name: "powered off inside the grace", rec: with(exitRec(false), func(r *ledger.Record) {
			receivedAt(r, t0, 5*time.Second)
			r.Gone, r.PodSynced = gone("shutting-down"), "exit/1"
		}), now: t0.Add(10 * time.Second),
			policy: Policy{ExitWait: time.Minute, PowerOffGrace: 30 * time.Second}, terminate: true},
		{name: "described ending: terminated, no grace", rec: with(exitRec(false), func(r *ledger.Record) { receivedAt(r, t0, 5*time.Second) }), now: t0.Add(10 * time.Second),
			ec2: &instances.Instance{State: model.StateShuttingDown}, policy: Policy{ExitWait: time.Minute, PowerOffGrace: 30 * time.Second}, pod: "exit/1", terminate: true},
		{name: "grace judged from the lookup", rec: with(exitRec(false), func(r *ledger.Record) { receivedAt(r, t0, 5*time.Second) }), now: t0.Add(40 * time.Second),
			ec2: &instances.Instance{State: model.StateRunning, DescribedAt: t0.Add(20 * time.Second)}, policy: Policy{ExitWait: time.Minute, PowerOffGrace: 30 * time.Second}, pod: "exit/1", wait: true},
		{name: "pod-written tag: grace from the write, from the exit if the write fails", rec: with(exitRec(false), func(r *ledger.Record) { receivedAt(r, t0, 5*time.Second) }), now: t0.Add(40 * time.Second),
			policy: Policy{ExitWait: time.Minute, PowerOffGrace: 30 * time.Second, PodWrittenTag: "reaper.io/pod-written"}, pod: "exit/1", wait: true, unwritten: new(true)},
		{name: "restart pending, terminal line inside window wins", rec: with(exitRec(false), func(r *ledger.Record) { r.PodSynced, r.Gone = "exit/0", gone("terminated") }), now: t0.Add(time.Minute), pod: "exit/1", terminate: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.policy
			if p == (Policy{}) {
				p = policy
			}
			plan := Decide(tc.rec, tc.ec2, nil, tc.now, p)
			if got := outcomeKey(plan.Pod); got != tc.pod {
				t.Errorf("pod outcome %q, want %q", got, tc.pod)
			}
			if plan.End.Now != tc.terminate {
				t.Errorf("terminate %v, want %v", plan.End.Now, tc.terminate)
			}
			if want := cmp.Or(tc.unwritten, &tc.terminate); plan.EndUnwritten.Now != *want {
				t.Errorf("terminate if the write fails %v, want %v", plan.EndUnwritten.Now, *want)
			}
			if !plan.WaitUntil.IsZero() != tc.wait {
				t.Errorf("wait until %v, want waiting=%v", plan.WaitUntil, tc.wait)
			}
		})
	}
}

// outcomeKey is the key of the outcome a plan writes, "" for none.
func outcomeKey(o *model.Outcome) string {
	if o == nil {
		return ""
	}
	return o.Key()
}
