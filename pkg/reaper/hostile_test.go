package reaper

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/reaper-k8s/reaper/internal/fakes"
	"github.com/reaper-k8s/reaper/pkg/instances"
	"github.com/reaper-k8s/reaper/pkg/ledger"
	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/model"
	"github.com/reaper-k8s/reaper/pkg/workqueue"
)

// The tests of this file are the fast truth tables of what hostile hosts,
// forged events and operators' mistakes come to; internal/replay runs the
// same cases through the built functions on the local stack.

func sweepMsgs(t *testing.T, q *fakes.Queue) []string {
	t.Helper()
	var out []string
	for _, s := range q.Sent {
		for _, m := range s.Msgs {
			out = append(out, string(m.Kind)+" "+m.InstanceID)
		}
	}
	slices.Sort(out)
	return out
}

// A record holding a terminal exit of a Pod the instance's tags do not
// name shields the instance from neither orphan check once its real Pod
// is deleted: only an exit of the tags' Pod ends it (mayBeOrphan).
func TestRejectedClaimShieldsNothing(t *testing.T) {
	id := instanceOf(1)
	inst := owned(id, podOf(1))
	inst.LaunchTime = testNow().Add(-time.Hour)
	w := fakes.NewWorld(inst) // the real Pod is deleted
	core, l, q := newBatchCore(w)
	ended := true
	l.Recs[id] = ledger.Record{InstanceID: id, Pod: podOf(99), Exits: exitsOf(model.Exit{Container: "main", ExitCode: 0}), PodSynced: "exit/0", PodEnded: &ended, Version: 1}
	sum, err := core.Sweep(t.Context(), 15*time.Minute)
	if err != nil || sum.Orphans != 1 {
		t.Fatalf("sweep %+v, %v: want the instance found orphaned", sum, err)
	}
	if got := sweepMsgs(t, q); !slices.Contains(got, "orphan "+id) {
		t.Fatalf("queued %v", got)
	}
	resp, err := core.HandleQueueEvent(t.Context(), redeliver(t, q))
	if err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("failures %v, %v", failures(resp), err)
	}
	if want := []string{"terminate [" + id + "]"}; !slices.Equal(w.Log, want) {
		t.Fatalf("steps %q, want %q", w.Log, want)
	}
}

// What a state-change message says of an instance is checked against EC2:
// a forged "stopped" of a running instance changes nothing (it is checked
// again later), a state dated in the future is refused, and a claim ahead
// of EC2 is recorded as far as EC2 has got.
func TestStateChangeIsEC2s(t *testing.T) {
	id := instanceOf(1)
	at := testNow().Add(-30 * time.Second)
	for _, tc := range []struct {
		name      string
		described string
		msg       workqueue.Message
		wantState string // "": no record
		wantAt    time.Time
	}{
		{name: "forged stop of a running instance", described: model.StateRunning, msg: workqueue.State(id, model.StateStopped, at)},
		{name: "dated in the future", described: model.StateTerminated, msg: workqueue.State(id, model.StateTerminated, testNow().Add(time.Hour))},
		{name: "EC2 is further on", described: model.StateTerminated, msg: workqueue.State(id, model.StateShuttingDown, at),
			wantState: model.StateShuttingDown, wantAt: at},
		{name: "the claim is ahead of EC2", described: model.StateShuttingDown, msg: workqueue.State(id, model.StateTerminated, at),
			wantState: model.StateShuttingDown, wantAt: at},
		{name: "EC2 agrees", described: model.StateShuttingDown, msg: workqueue.State(id, model.StateShuttingDown, at),
			wantState: model.StateShuttingDown, wantAt: at},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inst := owned(id, podOf(1))
			inst.State = tc.described
			w := fakes.NewWorld(inst)
			w.Pods[podOf(1)] = true
			core, l, q := newBatchCore(w)
			resp, err := core.HandleQueueEvent(t.Context(), batch(t, tc.msg))
			if err != nil || len(resp.BatchItemFailures) != 0 {
				t.Fatalf("failures %v, %v", failures(resp), err)
			}
			if slices.ContainsFunc(w.Log, func(s string) bool { return strings.HasPrefix(s, "terminate") }) {
				t.Fatalf("steps %q: terminated", w.Log)
			}
			rec, ok := l.Recs[id]
			if tc.wantState == "" {
				if ok {
					t.Fatalf("record %+v, want none", rec)
				}
				// An unconfirmed gone state is checked again, DeferDelay later.
				recheck := tc.msg.State == model.StateStopped
				if got := len(q.Sent) == 1 && q.Sent[0].Delay == DeferDelay && q.Sent[0].Msgs[0].Checks == 1; got != recheck {
					t.Fatalf("sent %+v, want a check again: %v", q.Sent, recheck)
				}
				return
			}
			if !ok || rec.Gone == nil || rec.Gone.State != tc.wantState || !rec.Gone.At.Equal(tc.wantAt) {
				t.Fatalf("record %+v, want gone %s at %s", rec, tc.wantState, tc.wantAt)
			}
		})
	}
}

// A claim EC2 never confirms is checked stateChecks times, then refused.
func TestUnconfirmedStateRefused(t *testing.T) {
	id := instanceOf(1)
	w := fakes.NewWorld(owned(id, podOf(1)))
	w.Pods[podOf(1)] = true
	core, l, q := newBatchCore(w)
	ev := batch(t, workqueue.State(id, model.StateStopped, testNow()))
	for range stateChecks {
		if _, err := core.HandleQueueEvent(t.Context(), ev); err != nil {
			t.Fatal(err)
		}
		ev = redeliver(t, q)
	}
	if len(ev.Records) != 0 || len(l.Recs) != 0 || len(w.Log) != 0 {
		t.Fatalf("after %d checks: %d messages left, records %+v, steps %q", stateChecks, len(ev.Records), l.Recs, w.Log)
	}
}

// An instance with termination protection is refused alone: the others
// of the batch end, its Pod is told, and Reaper asks again only after
// RefusalBackoff, not on every sweep.
func TestRefusedTerminationBacksOff(t *testing.T) {
	w := fakes.NewWorld(owned(instanceOf(1), podOf(1)), owned(instanceOf(2), podOf(2)))
	w.Pods[podOf(1)], w.Pods[podOf(2)] = true, true
	w.Protected = map[string]bool{instanceOf(1): true}
	core, l, q := newBatchCore(w)
	resp, err := core.HandleQueueEvent(t.Context(), batch(t, exitMsg(1, 0), exitMsg(2, 0)))
	if err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("failures %v, %v", failures(resp), err)
	}
	if !slices.Contains(w.Log, "warn jobs/job-1 TerminationRefused "+instanceOf(1)) {
		t.Fatalf("steps %q: no warning on the Pod", w.Log)
	}
	rec := l.Recs[instanceOf(1)]
	if rec.TerminateRefused == nil || rec.TerminateRefused.Code != "OperationNotPermitted" || rec.Pending == "" || !rec.Terminated.IsZero() {
		t.Fatalf("record %+v, want the refusal kept, pending", rec)
	}
	if r2 := l.Recs[instanceOf(2)]; r2.Terminated.IsZero() || r2.Pending != "" {
		t.Fatalf("the other instance: %+v", r2)
	}
	clock := testNow().Add(time.Minute)
	core.Now = func() time.Time { return clock }
	if _, err := core.Sweep(t.Context(), 15*time.Minute); err != nil {
		t.Fatal(err)
	}
	if got := sweepMsgs(t, q); len(got) != 0 {
		t.Fatalf("a minute later the sweep queued %v", got)
	}
	clock = testNow().Add(RefusalBackoff + time.Minute)
	if _, err := core.Sweep(t.Context(), 15*time.Minute); err != nil {
		t.Fatal(err)
	}
	if got := sweepMsgs(t, q); !slices.Equal(got, []string{"sweep " + instanceOf(1)}) {
		t.Fatalf("after the backoff the sweep queued %v", got)
	}
}

// A Kubernetes endpoint that reaches another cluster (or a recreated one)
// finds none of the fleet's Pods: no instance is an orphan there, and no
// orphan message makes one.
func TestWrongClusterTerminatesNothing(t *testing.T) {
	var insts []instances.Instance
	for n := range 20 {
		inst := owned(instanceOf(n+1), podOf(n+1))
		inst.LaunchTime = testNow().Add(-time.Hour)
		insts = append(insts, inst)
	}
	w := fakes.NewWorld(insts...)
	w.Identity = "0e7e0000-0000-4000-8000-000000000bad"
	core, _, q := newBatchCore(w)
	sum, err := core.Sweep(t.Context(), 15*time.Minute)
	if err != nil || sum.Orphans != 0 || sum.IdentityMismatch != 20 {
		t.Fatalf("sweep %+v, %v: want no orphan, 20 mismatches", sum, err)
	}
	if got := sweepMsgs(t, q); len(got) != 0 {
		t.Fatalf("queued %v", got)
	}
	resp, err := core.HandleQueueEvent(t.Context(), batch(t, workqueue.Orphan(instanceOf(1), 1)))
	if err != nil || len(resp.BatchItemFailures) != 0 || len(w.Log) != 0 {
		t.Fatalf("orphan message: failures %v, %v, steps %q", failures(resp), err, w.Log)
	}
}

// Many orphans at once: a sweep hands at most the cap's part of the
// running instances to the reconciler, the oldest first, and counts the
// rest; a small fleet's few orphans (at most orphanFloor) go in one sweep.
func TestOrphanCap(t *testing.T) {
	small := fakes.NewWorld(owned(instanceOf(1), podOf(1)), owned(instanceOf(2), podOf(2)))
	for id, inst := range small.Instances {
		inst.LaunchTime = testNow().Add(-time.Hour)
		small.Instances[id] = inst
	}
	smallCore, _, _ := newBatchCore(small)
	smallCore.Policy.OrphanCap = 0.1
	if sum, err := smallCore.Sweep(t.Context(), 15*time.Minute); err != nil || sum.Orphans != 2 || sum.HeldBack != 0 {
		t.Fatalf("sweep of 2 orphans among 2 instances %+v, %v: want both in one sweep", sum, err)
	}
	var insts []instances.Instance
	for n := range 70 {
		inst := owned(instanceOf(n+1), podOf(n+1))
		inst.LaunchTime = testNow().Add(-time.Hour - time.Duration(n)*time.Minute)
		insts = append(insts, inst)
	}
	w := fakes.NewWorld(insts...)
	core, _, q := newBatchCore(w)
	core.Policy.OrphanCap = 0.1
	sum, err := core.Sweep(t.Context(), 15*time.Minute)
	if err != nil || sum.Orphans != 7 || sum.HeldBack != 63 {
		t.Fatalf("sweep %+v, %v: want 7 orphans, 63 held back", sum, err)
	}
	var want []string
	for n := 64; n <= 70; n++ {
		want = append(want, "orphan "+instanceOf(n))
	}
	if got := sweepMsgs(t, q); !slices.Equal(got, want) {
		t.Fatalf("queued %v, want the seven oldest %v", got, want)
	}
}

// EC2 forgets a terminated instance after about an hour. A record kept for
// it still ends its Pod: a late exit of that Pod is believed from the
// record, and without one the Pod is lost after the window.
func TestInstanceEC2Forgot(t *testing.T) {
	id := instanceOf(1)
	restart := &model.Exit{Container: "main", ExitCode: 1, WillRestart: true, RestartCount: 1}
	late := exitMsg(1, 0)
	late.Exit.RestartCount = 2 // the run after the restart
	for _, tc := range []struct {
		name string
		msg  workqueue.Message
		want []string
	}{
		// The terminate is answered "already gone" by EC2.
		{name: "late exit", msg: late, want: []string{"pod jobs/job-1 exit/2", "terminate [" + id + "]"}},
		{name: "sweep", msg: workqueue.Sweep(id), want: []string{"pod jobs/job-1 " + model.OutcomeLost}},
		{name: "forged exit of another Pod", msg: exitMsg(2, 0), want: []string{"pod jobs/job-1 " + model.OutcomeLost}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := fakes.NewWorld() // EC2 knows no instance
			w.Pods[podOf(1)], w.Pods[podOf(2)] = true, true
			core, l, _ := newBatchCore(w)
			synced := (&model.Outcome{InstanceID: id, Exits: []model.Exit{*restart}}).Key()
			l.Recs[id] = ledger.Record{InstanceID: id, Pod: podOf(1), Exits: exitsOf(*restart), PodSynced: synced, Version: 1}
			msg := tc.msg
			msg.InstanceID = id
			if _, err := core.HandleQueueEvent(t.Context(), batch(t, msg)); err != nil {
				t.Fatal(err)
			}
			// The record learns the instance is gone; the late exit's
			// settles it at once, ended, and a settled record forgets
			// its instance's states.
			rec := l.Recs[id]
			gone := rec.Gone != nil && rec.Gone.State == model.StateTerminated
			settled := rec.Pending == "" && !rec.Terminated.IsZero() && rec.Gone == nil
			if (tc.name == "late exit" && !settled) || (tc.name != "late exit" && !gone) {
				t.Fatalf("record %+v, want it gone, or for the late exit settled", rec)
			}
			// Past the window, the sweep's item ends the Pod.
			core.Now = func() time.Time { return testNow().Add(2 * time.Minute) }
			if _, err := core.HandleQueueEvent(t.Context(), batch(t, workqueue.Sweep(id))); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(w.Log, tc.want) {
				t.Fatalf("steps %q, want %q", w.Log, tc.want)
			}
		})
	}
}

// With a power-off grace, a terminal exit's Pod is written at once and its
// instance is left to power itself off, for the grace after Reaper received
// the exit (the default hosts power off seconds after their exit) or, with
// the Pod-written tag, after the later of that and the Pod write (those
// hosts wait for the write); a wake-up on the queue has the record looked
// at again when the grace ends, and an instance still running then is
// terminated. The exit's own finishedAt, the host's word, moves nothing.
func TestPowerOffGrace(t *testing.T) {
	for _, tc := range []struct {
		name string
		tag  string
		wake time.Duration
	}{
		// The grace ends 30 s from now, when the exit is received and
		// its Pod written: the wake-up comes on the next step of
		// WakeGrid after a second more.
		{"from the exit's receipt", "", 35 * time.Second},
		{"from the Pod write", "reaper.io:pod-written", 35 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := fakes.NewWorld(owned(instanceOf(1), podOf(1)))
			w.Pods[podOf(1)] = true
			core, l, q := newBatchCore(w)
			core.Policy.PowerOffGrace = 30 * time.Second
			core.Policy.PodWrittenTag = tc.tag
			msg := exitMsg(1, 0)
			msg.Exit.FinishedAt = testNow().Add(-10 * time.Second)
			if _, err := core.HandleQueueEvent(t.Context(), batch(t, msg)); err != nil {
				t.Fatal(err)
			}
			if got := slices.DeleteFunc(slices.Clone(w.Log), func(s string) bool { return strings.HasPrefix(s, "tag ") }); !slices.Equal(got, []string{"pod jobs/job-1 exit/0"}) {
				t.Fatalf("steps %q, want the Pod written and no terminate", w.Log)
			}
			if rec := l.Recs[instanceOf(1)]; rec.Pending == "" || !rec.Terminated.IsZero() || !rec.PodSyncedAt.Equal(testNow()) {
				t.Fatalf("record %+v, want it pending, not terminated, its Pod written at %s", rec, testNow())
			}
			if len(q.Sent) != 1 || q.Sent[0].Delay != tc.wake || q.Sent[0].Msgs[0].Kind != workqueue.KindSweep {
				t.Fatalf("sent %+v, want a wake-up in %v, when the grace ends", q.Sent, tc.wake)
			}
			core.Now = func() time.Time { return testNow().Add(tc.wake) }
			if _, err := core.HandleQueueEvent(t.Context(), redeliver(t, q)); err != nil {
				t.Fatal(err)
			}
			if got := w.Log[len(w.Log)-1]; got != "terminate ["+instanceOf(1)+"]" {
				t.Fatalf("steps %q, want the instance terminated", w.Log)
			}
			if rec := l.Recs[instanceOf(1)]; rec.Pending != "" || rec.Terminated.IsZero() {
				t.Fatalf("record %+v, want it settled", rec)
			}
		})
	}
}

// Wake-ups come back on the WakeGrid's steps of the wall clock, never
// before their time: those of batches that end at different times share a
// step, and with it the lookup and terminate of the batch they come in.
func TestWakeUpsOnTheGrid(t *testing.T) {
	for _, tc := range []struct {
		now, due time.Duration // from testNow (on a step)
		wake     time.Duration // when the wake-up comes back, from testNow
	}{
		{0, 20 * time.Second, 25 * time.Second},
		{1300 * time.Millisecond, 21500 * time.Millisecond, 25 * time.Second},
		{3700 * time.Millisecond, 23 * time.Second, 25 * time.Second},
		{0, 24 * time.Second, 25 * time.Second},
		{0, 24500 * time.Millisecond, 30 * time.Second},
		{10 * time.Second, 0, 10 * time.Second}, // overdue: at once
	} {
		delay := wakeDelay(testNow().Add(tc.now), testNow().Add(tc.due))
		back := tc.now + delay
		if delay%time.Second != 0 || back < tc.wake || back >= tc.wake+time.Second {
			t.Errorf("now +%v, grace ends +%v: delay %v comes back at +%v, want within a second of +%v", tc.now, tc.due, delay, back, tc.wake)
		}
	}
}

// A batch whose lookup of an instance predates the end of its grace does
// not terminate it, however late the batch decides: the host may have
// powered off since. The instance is looked at again at once, and
// terminated then if EC2 still describes it running; one EC2 described as
// shutting down is settled at once, with no call.
func TestGraceJudgedFromTheLookup(t *testing.T) {
	w := fakes.NewWorld(owned(instanceOf(1), podOf(1)), owned(instanceOf(2), podOf(2)))
	ending := w.Instances[instanceOf(2)]
	ending.State = model.StateShuttingDown
	w.Instances[instanceOf(2)] = ending
	core, l, q := newBatchCore(w)
	core.Policy.PowerOffGrace = 30 * time.Second
	for n := 1; n <= 2; n++ {
		l.Recs[instanceOf(n)] = ledger.Record{InstanceID: instanceOf(n), Pod: podOf(n), Pending: "p", Version: 1,
			Exits:       exitsOf(model.Exit{Container: "main", FinishedAt: testNow().Add(-35 * time.Second), ReceivedAt: testNow().Add(-34 * time.Second)}), // the grace ended 4 s ago
			PodSynced:   model.Outcome{InstanceID: instanceOf(n), Exits: []model.Exit{{Container: "main", FinishedAt: testNow().Add(-34 * time.Second)}}}.Key(),
			PodSyncedAt: testNow().Add(-34 * time.Second)}
	}
	// EC2 answered 5 s ago: a long batch, or a slow call.
	w.Now = func() time.Time { return testNow().Add(-5 * time.Second) }
	if _, err := core.HandleQueueEvent(t.Context(), batch(t, workqueue.Sweep(instanceOf(1)), workqueue.Sweep(instanceOf(2)))); err != nil {
		t.Fatal(err)
	}
	if want := []string{"terminate [" + instanceOf(2) + "]"}; !slices.Equal(w.Log, want) {
		t.Fatalf("steps %q, want %q: the running instance was seen before its grace ended", w.Log, want)
	}
	if len(q.Sent) != 1 || q.Sent[0].Delay != 0 || len(q.Sent[0].Msgs) != 1 || q.Sent[0].Msgs[0].InstanceID != instanceOf(1) {
		t.Fatalf("sent %+v, want a wake-up of %s at once", q.Sent, instanceOf(1))
	}
	w.Now = core.Now
	if _, err := core.HandleQueueEvent(t.Context(), redeliver(t, q)); err != nil {
		t.Fatal(err)
	}
	if want := []string{"terminate [" + instanceOf(2) + "]", "terminate [" + instanceOf(1) + "]"}; !slices.Equal(w.Log, want) {
		t.Fatalf("steps %q, want %q", w.Log, want)
	}
}

// With the Pod-written tag, each running instance whose Pod a batch wrote
// is tagged in one call for the batch, and left its grace; an instance EC2
// describes as ending is not tagged. A tag that cannot be put is counted
// and fails nothing.
func TestPodWrittenTag(t *testing.T) {
	w := fakes.NewWorld(owned(instanceOf(1), podOf(1)), owned(instanceOf(2), podOf(2)), owned(instanceOf(3), podOf(3)))
	ending := w.Instances[instanceOf(3)]
	ending.State = model.StateShuttingDown
	w.Instances[instanceOf(3)] = ending
	for n := 1; n <= 3; n++ {
		w.Pods[podOf(n)] = true
	}
	core, l, _ := newBatchCore(w)
	core.Policy.PowerOffGrace = 10 * time.Second
	core.Policy.PodWrittenTag = "reaper.io:pod-written"
	resp, err := core.HandleQueueEvent(t.Context(), batch(t, exitMsg(1, 0), exitMsg(2, 0), exitMsg(3, 0)))
	if err != nil || len(resp.BatchItemFailures) > 0 {
		t.Fatalf("failures %v, %v", failures(resp), err)
	}
	want := []string{"pod jobs/job-1 exit/0", "pod jobs/job-2 exit/0", "pod jobs/job-3 exit/0",
		fmt.Sprint("tag ", []string{instanceOf(1), instanceOf(2)}), fmt.Sprint("terminate ", []string{instanceOf(3)})}
	got := slices.Clone(w.Log)
	slices.Sort(got[:3])
	slices.Sort(got[3:]) // the tags and the terminate go side by side
	if !slices.Equal(got, want) {
		t.Fatalf("steps %q, want %q", got, want)
	}
	if v := w.Tags[instanceOf(1)]["reaper.io:pod-written"]; v != testNow().Format(time.RFC3339) {
		t.Fatalf("tag value %q", v)
	}
	if rec := l.Recs[instanceOf(1)]; rec.Pending == "" || !rec.Terminated.IsZero() {
		t.Fatalf("record %+v, want it left its grace", rec)
	}

	w2 := fakes.NewWorld(owned(instanceOf(1), podOf(1)))
	w2.Pods[podOf(1)] = true
	w2.TagErr = errors.New("UnauthorizedOperation")
	core2, _, _ := newBatchCore(w2)
	core2.Policy.PowerOffGrace = 10 * time.Second
	core2.Policy.PodWrittenTag = "reaper.io:pod-written"
	var emf bytes.Buffer
	core2.Metrics = metrics.New(slog.New(slog.NewJSONHandler(&emf, nil)), "Reaper", metrics.FunctionReconciler)
	if resp, err := core2.HandleQueueEvent(t.Context(), batch(t, exitMsg(1, 0))); err != nil || len(resp.BatchItemFailures) > 0 {
		t.Fatalf("a tag not put failed the work: %v, %v", failures(resp), err)
	}
	if !strings.Contains(emf.String(), `"PodWrittenTagsFailed":1`) {
		t.Fatalf("metrics %s, want PodWrittenTagsFailed 1", emf.String())
	}
}

// The first terminal exit of a Pod is final: a host that sends the same
// terminal line again and again, dated ever later within the clock skew
// Reaper allows, neither replaces the recorded exit nor pushes its
// power-off grace on: its instance is terminated when the grace after the
// first receipt ends. A later restart of a Pod whose exit was terminal is
// refused and counted.
func TestTerminalExitIsFinal(t *testing.T) {
	w := fakes.NewWorld(owned(instanceOf(1), podOf(1)))
	w.Pods[podOf(1)] = true
	core, l, q := newBatchCore(w)
	core.Policy.PowerOffGrace = 30 * time.Second
	var emf bytes.Buffer
	core.Metrics = metrics.New(slog.New(slog.NewJSONHandler(&emf, nil)), "Reaper", metrics.FunctionReconciler)
	start := testNow()
	if _, err := core.HandleQueueEvent(t.Context(), batch(t, exitMsg(1, 0))); err != nil {
		t.Fatal(err)
	}
	first := *l.Recs[instanceOf(1)].Latest()
	q.Sent = nil
	// Every 10 s, the same line dated 4 min 50 s ahead, and a restart.
	for i := 1; i <= 2; i++ {
		now := start.Add(time.Duration(i) * 10 * time.Second)
		core.Now = func() time.Time { return now }
		again := exitMsg(1, 0)
		again.Exit.FinishedAt = now.Add(4*time.Minute + 50*time.Second)
		restart := exitMsg(1, 1)
		restart.Exit.RestartCount = 1
		if _, err := core.HandleQueueEvent(t.Context(), batch(t, again, restart)); err != nil {
			t.Fatal(err)
		}
	}
	if rec := l.Recs[instanceOf(1)]; *rec.Latest() != first {
		t.Fatalf("recorded exit %+v, want the first one %+v", *rec.Latest(), first)
	}
	if n := countOf(t, emf.String(), metrics.LinesRejected, model.ReasonAfterTerminal); n != 4 {
		t.Fatalf("%d claims counted as after a terminal exit, want 4", n)
	}
	core.Now = func() time.Time { return start.Add(35 * time.Second) }
	if _, err := core.HandleQueueEvent(t.Context(), batch(t, workqueue.Sweep(instanceOf(1)))); err != nil {
		t.Fatal(err)
	}
	if got := w.Log[len(w.Log)-1]; got != "terminate ["+instanceOf(1)+"]" {
		t.Fatalf("steps %q, want the instance terminated when the grace after the first receipt ends", w.Log)
	}
}

// countOf sums the metric name counted with reason in the EMF lines emf.
func countOf(t *testing.T, emf, name, reason string) int {
	t.Helper()
	n := 0
	for line := range strings.Lines(emf) {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatal(err)
		}
		if v, ok := m[name].(float64); ok && m[metrics.ReasonDim] == reason {
			n += int(v)
		}
	}
	return n
}

// A state change delivered long after the time it carries (asynchronous
// retries after an outage last up to six hours) does not close the
// exit-wait window at once: it runs from when Reaper first saw the
// instance gone, so the real exit, arriving seconds later, still decides
// the Pod.
func TestLateStateChangeKeepsTheWindow(t *testing.T) {
	inst := owned(instanceOf(1), podOf(1))
	inst.State = model.StateTerminated
	w := fakes.NewWorld(inst)
	w.Pods[podOf(1)] = true
	core, l, _ := newBatchCore(w)
	late := workqueue.State(instanceOf(1), model.StateTerminated, testNow().Add(-time.Hour))
	if _, err := core.HandleQueueEvent(t.Context(), batch(t, late)); err != nil {
		t.Fatal(err)
	}
	if len(w.Log) != 0 {
		t.Fatalf("steps %q: the Pod was written lost on a state change an hour old", w.Log)
	}
	if rec := l.Recs[instanceOf(1)]; !rec.GoneSince().Equal(testNow()) {
		t.Fatalf("record %+v: want the window to run from when Reaper saw the instance gone", rec)
	}
	core.Now = func() time.Time { return testNow().Add(10 * time.Second) }
	if _, err := core.HandleQueueEvent(t.Context(), batch(t, exitMsg(1, 3))); err != nil {
		t.Fatal(err)
	}
	if len(w.Log) == 0 || w.Log[0] != "pod jobs/job-1 exit/0" {
		t.Fatalf("steps %q, want the Pod written with the exit: the exit decides the Pod", w.Log)
	}
}

// EC2's answers are eventually consistent: a claim for an instance EC2
// does not list yet is checked again, DeferDelay later, and believed once
// EC2 lists it; one for a made-up instance is refused, and counted, only
// after unknownChecks checks a minute apart.
func TestUnknownInstanceCheckedAgain(t *testing.T) {
	w := fakes.NewWorld()
	w.Pods[podOf(1)] = true
	core, _, q := newBatchCore(w)
	var emf bytes.Buffer
	core.Metrics = metrics.New(slog.New(slog.NewJSONHandler(&emf, nil)), "Reaper", metrics.FunctionReconciler)
	ev := batch(t, exitMsg(1, 0), exitMsg(2, 0))
	for check := 1; check <= 2; check++ { // unknownChecks is 3
		if _, err := core.HandleQueueEvent(t.Context(), ev); err != nil {
			t.Fatal(err)
		}
		if len(q.Sent) != 1 || q.Sent[0].Delay != DeferDelay || len(q.Sent[0].Msgs) != 2 || q.Sent[0].Msgs[0].Checks != check {
			t.Fatalf("check %d: sent %+v, want both claims again, %v later", check, q.Sent, DeferDelay)
		}
		ev = redeliver(t, q)
	}
	if n := countOf(t, emf.String(), metrics.LinesRejected, model.ReasonInstanceUnknown); n != 0 {
		t.Fatalf("%d claims refused before their last check", n)
	}
	// EC2 lists instance 1 now.
	w.Instances[instanceOf(1)] = owned(instanceOf(1), podOf(1))
	if _, err := core.HandleQueueEvent(t.Context(), ev); err != nil {
		t.Fatal(err)
	}
	if len(w.Log) == 0 || w.Log[0] != "pod jobs/job-1 exit/0" {
		t.Fatalf("steps %q, want instance 1's Pod written", w.Log)
	}
	if n := countOf(t, emf.String(), metrics.LinesRejected, model.ReasonInstanceUnknown); n != 1 || len(q.Sent) != 0 {
		t.Fatalf("%d claims refused, sent %+v: want the made-up one refused at its last check, nothing sent again", n, q.Sent)
	}
}

// A flood of made-up instance ids costs few calls: EC2's tokens go first
// to the instances the ledger knows; ids EC2 answered lately it does not
// know are not described again on a new claim; and a batch describes at
// most maxRechecks of the claims checked again, and sends the rest back
// unchecked, neither a check nor an attempt counted: they never reach the
// dead-letter queue as a shortage of tokens.
func TestUnknownInstancesAreCheap(t *testing.T) {
	w := fakes.NewWorld(owned(instanceOf(1), podOf(1)))
	w.Pods[podOf(1)] = true
	core, l, q := newBatchCore(w)
	l.Recs[instanceOf(1)] = ledger.Record{InstanceID: instanceOf(1), Pod: podOf(1), Pending: "p", Version: 1}
	const flood = 300
	var msgs []workqueue.Message
	for i := range flood {
		msgs = append(msgs, exitMsg(1000+i, 0))
	}
	// One call's worth of tokens: the known instance is described first.
	w.DescribeShare = 200
	if _, err := core.HandleQueueEvent(t.Context(), batch(t, append(msgs, exitMsg(1, 0))...)); err != nil {
		t.Fatal(err)
	}
	if len(w.Describes) == 0 || w.Describes[0][0] != instanceOf(1) {
		t.Fatalf("describes %v, want the instance the ledger knows first", w.Describes)
	}
	if len(w.Log) == 0 || w.Log[0] != "pod jobs/job-1 exit/0" {
		t.Fatalf("steps %q, want the known instance's Pod written", w.Log)
	}
	w.DescribeShare, w.Describes, q.Sent = 0, nil, nil
	// The same ids again, a first claim each: answered unknown lately.
	core.Now = func() time.Time { return testNow().Add(time.Minute) }
	resp, err := core.HandleQueueEvent(t.Context(), batch(t, msgs[:199]...))
	if err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("failures %v, %v", failures(resp), err)
	}
	if len(w.Describes) != 0 {
		t.Fatalf("%d describes of ids EC2 answered a minute ago it does not know", len(w.Describes))
	}
	// 300 checks made again: one call's worth is described, the rest wait.
	q.Sent = nil
	var again []workqueue.Message
	for _, m := range msgs {
		m.Checks = 1
		again = append(again, m)
	}
	if _, err := core.HandleQueueEvent(t.Context(), batch(t, again...)); err != nil {
		t.Fatal(err)
	}
	described := 0
	for _, d := range w.Describes {
		described += len(d)
	}
	if described != maxRechecks {
		t.Fatalf("%d rechecks described, want %d", described, maxRechecks)
	}
	deferred := 0
	for _, s := range q.Sent {
		if s.Delay >= DeferDelay {
			for _, m := range s.Msgs {
				if m.Checks == 1 && m.Attempt == 0 {
					deferred++
				}
			}
		}
	}
	if deferred != flood-maxRechecks {
		t.Fatalf("%d rechecks deferred unchecked, want %d (sent %d sends)", deferred, flood-maxRechecks, len(q.Sent))
	}
}

// An instance launched with an exit token carries its hash as a launch
// tag: a line is believed only with the token whose hash it is, so a host
// that writes into another instance's log stream cannot speak for that
// instance's Pod, even naming it right. An instance launched without the
// tag keeps the other checks.
func TestExitTokenDecides(t *testing.T) {
	const token = "a-token-only-the-instances-own-host-knows-0123456789"
	tagged := owned(instanceOf(1), podOf(1))
	tagged.ExitTokenHash = model.ExitTokenHash(token)
	w := fakes.NewWorld(tagged, owned(instanceOf(2), podOf(2)))
	w.Pods[podOf(1)], w.Pods[podOf(2)] = true, true
	core, l, _ := newBatchCore(w)
	var emf bytes.Buffer
	core.Metrics = metrics.New(slog.New(slog.NewJSONHandler(&emf, nil)), "Reaper", metrics.FunctionReconciler)
	forged, wrong := exitMsg(1, 0), exitMsg(1, 0)
	wrong.TokenHash = model.ExitTokenHash("another-host's-token-0123456789-abcdef")
	if _, err := core.HandleQueueEvent(t.Context(), batch(t, forged)); err != nil {
		t.Fatal(err)
	}
	if _, err := core.HandleQueueEvent(t.Context(), batch(t, wrong)); err != nil {
		t.Fatal(err)
	}
	if n := countOf(t, emf.String(), metrics.LinesRejected, model.ReasonTokenMismatch); n != 2 || len(w.Log) != 0 || l.Recs[instanceOf(1)].Latest() != nil {
		t.Fatalf("%d refused for their token, steps %q, record %+v: want both refused, nothing written", n, w.Log, l.Recs[instanceOf(1)])
	}
	real := exitMsg(1, 0)
	real.TokenHash = model.ExitTokenHash(token)
	untagged := exitMsg(2, 0)
	if _, err := core.HandleQueueEvent(t.Context(), batch(t, real, untagged)); err != nil {
		t.Fatal(err)
	}
	got := slices.Clone(w.Log[:2])
	slices.Sort(got)
	if want := []string{"pod jobs/job-1 exit/0", "pod jobs/job-2 exit/0"}; !slices.Equal(got, want) {
		t.Fatalf("steps %q, want both Pods written: the line with the token, and the one of the instance without the tag", w.Log)
	}
}

// A reconciler batch ends at most its part of the orphan cap (the floor of
// 5 shared by the two reconcilers that may run at once: 3), the oldest
// first; the orphans held back are counted and their messages dropped, not
// deferred: the next sweep finds them again, and they never reach the
// dead-letter queue.
func TestReconcilerCapsOrphans(t *testing.T) {
	const running, orphans = 30, 12
	for _, reconcilers := range []int{1, 2} {
		t.Run(fmt.Sprint(reconcilers, " reconcilers"), func(t *testing.T) {
			w := fakes.NewWorld()
			var msgs []workqueue.Message
			for n := 1; n <= orphans; n++ {
				inst := owned(instanceOf(n), podOf(n)) // their Pods are gone
				inst.LaunchTime = testNow().Add(-time.Hour - time.Duration(n)*time.Minute)
				w.Instances[inst.ID] = inst
				msgs = append(msgs, workqueue.Orphan(inst.ID, running))
			}
			core, _, q := newBatchCore(w)
			core.Policy.OrphanCap = 0.1 // of 30: 3, so the floor of 5
			core.Policy.Reconcilers = reconcilers
			var emf bytes.Buffer
			core.Metrics = metrics.New(slog.New(slog.NewJSONHandler(&emf, nil)), "Reaper", metrics.FunctionReconciler)
			limit := (orphanFloor + reconcilers - 1) / reconcilers
			resp, err := core.HandleQueueEvent(t.Context(), batch(t, msgs...))
			if err != nil || len(resp.BatchItemFailures) != 0 {
				t.Fatalf("failures %v, %v", failures(resp), err)
			}
			var want []string
			for n := orphans; n > orphans-limit; n-- {
				want = append(want, instanceOf(n))
			}
			slices.Sort(want)
			if got := w.Log; len(got) != 1 || got[0] != fmt.Sprint("terminate ", want) {
				t.Fatalf("steps %q, want the %d oldest terminated in one call %v", got, limit, want)
			}
			if len(q.Sent) != 0 {
				t.Fatalf("sent %+v, want the orphans held back dropped for the next sweep", q.Sent)
			}
			if want := fmt.Sprintf(`"OrphansHeldBack":%d`, orphans-limit); !strings.Contains(emf.String(), want) {
				t.Fatalf("metrics %s, want %s", emf.String(), want)
			}
		})
	}
}
