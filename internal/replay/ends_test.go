package replay

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/reaper-k8s/reaper/internal/ec2server"
	"github.com/reaper-k8s/reaper/internal/labstack"
	"github.com/reaper-k8s/reaper/pkg/intake"
	"github.com/reaper-k8s/reaper/pkg/reaper"
)

// The tests of this file sweep, and a sweep looks at every instance and
// record of the shared lab, so none of them runs in parallel: Go runs them
// before the parallel exit tests start.

func play(t *testing.T, st LiveStep, out any) {
	t.Helper()
	if err := lab.Play(t.Context(), st, out); err != nil {
		t.Fatalf("%s: %v", st.Function, err)
	}
}

func sweepNow(t *testing.T) reaper.SweepSummary {
	t.Helper()
	var sum reaper.SweepSummary
	if err := lab.Invoke(t.Context(), "sweeper", []byte(`{"source":"aws.events","detail-type":"Scheduled Event"}`), &sum); err != nil {
		t.Fatalf("sweeper: %v", err)
	}
	return sum
}

// playStates plays the state changes of a scenario and returns the end of
// the exit-wait window they opened.
func playStates(t *testing.T, sc *Scenario) time.Time {
	t.Helper()
	for _, st := range sc.Steps {
		if st.Function == "statechange" {
			var sum intake.StateSummary
			if play(t, st, &sum); !sum.Queued {
				t.Fatalf("state change not queued: %+v", sum)
			}
		}
	}
	return windowEnd(t, lab, sc)
}

// windowEnd is when the exit-wait window of the scenario's instances closes,
// from the gone states their records hold.
func windowEnd(t *testing.T, l *Lab, sc *Scenario) time.Time {
	t.Helper()
	until, err := l.windowEnd(t.Context(), sc, exitWait)
	if err != nil {
		t.Fatal(err)
	}
	if until.IsZero() {
		t.Fatal("no exit-wait window opened")
	}
	return until
}

func waitPast(t time.Time) { time.Sleep(time.Until(t) + 50*time.Millisecond) }

// wantLost checks the Pod was finalized as lost, naming what happened.
func wantLost(t *testing.T, pod *corev1.Pod, disruption string) {
	t.Helper()
	if pod.Status.Phase != corev1.PodFailed {
		t.Fatalf("phase %s", pod.Status.Phase)
	}
	term := pod.Status.ContainerStatuses[0].State.Terminated
	if term == nil || term.ExitCode != 137 || term.Reason != "ContainerStatusUnknown" {
		t.Fatalf("container %+v", pod.Status.ContainerStatuses[0].State)
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.DisruptionTarget {
			if c.Status != corev1.ConditionTrue || c.Reason != disruption || c.Message == "" {
				t.Fatalf("DisruptionTarget %+v", c)
			}
			return
		}
	}
	t.Fatalf("no DisruptionTarget condition: %+v", pod.Status.Conditions)
}

func TestSpotInterruptionWithoutExit(t *testing.T) {
	sc := prepare(t, "spot-no-exit", corev1.RestartPolicyNever, nil)
	until := playStates(t, sc)
	if p := getPod(t, "spot", "train-spot"); p.Status.Phase != corev1.PodRunning {
		t.Fatalf("finalized before the window closed: %s", p.Status.Phase)
	}
	if sum := sweepNow(t); sum.WaitingExit < 1 {
		t.Fatalf("sweep inside the window: %+v", sum)
	}
	waitPast(until)
	if sum := sweepNow(t); sum.Queued < 1 {
		t.Fatalf("sweep after the window: %+v", sum)
	}
	wantLost(t, getPod(t, "spot", "train-spot"), "InstanceTerminated")
	if terminateCalls(sc.Instances["train-spot"]) != 0 {
		t.Fatal("a terminated instance was terminated again")
	}
}

func TestTerminatedBeforeExitLine(t *testing.T) {
	sc := prepare(t, "terminated-before-exit", corev1.RestartPolicyNever, nil)
	playStates(t, sc)
	invokeExit(t, sc.Payloads("exitrecorder")[0])
	wantEnded(t, getPod(t, "spot", "train-late-line"), corev1.PodSucceeded, 0, "Completed")
	sweepNow(t) // nothing left to do, and nothing undone
	wantEnded(t, getPod(t, "spot", "train-late-line"), corev1.PodSucceeded, 0, "Completed")
	if terminateCalls(sc.Instances["train-late-line"]) != 0 {
		t.Fatal("a terminated instance was terminated again")
	}
}

func TestManualStop(t *testing.T) {
	t.Run("terminate stopped (default)", func(t *testing.T) {
		sc := prepare(t, "manual-stop", corev1.RestartPolicyNever, nil)
		id := sc.Instances["stopped-by-hand"]
		until := playStates(t, sc)
		if n := terminateCalls(id); n != 1 || instanceState(t, id) != ec2server.Terminated {
			t.Fatalf("stopped instance: %d terminate calls, state %s", n, instanceState(t, id))
		}
		waitPast(until)
		sweepNow(t)
		wantLost(t, getPod(t, "ops", "stopped-by-hand"), "InstanceStopped")
	})
	t.Run("keep stopped", func(t *testing.T) {
		// The knob is deployment-wide; a deployment of its own (another
		// cluster, table and queue) runs with it, so the shared lab's
		// reconcilers never see this instance.
		const cluster = "reaper-keep-stopped"
		keep := deployment(t, cluster, LabOptions{Env: []string{"REAPER_TERMINATE_STOPPED=false"}}, "statechange", "sweeper", "reconciler")
		sc := prepare(t, "manual-stop-kept", corev1.RestartPolicyNever, nil)
		id := sc.Instances["stopped-and-kept"]
		keep.AddTaggedInstance(id, lab.InstanceTags(sc.Pods["stopped-and-kept"], true, cluster))
		for _, st := range sc.Steps {
			if st.Function == "statechange" {
				if err := keep.Play(t.Context(), st, nil); err != nil {
					t.Fatalf("statechange: %v", err)
				}
			}
		}
		if n := terminateCalls(id); n != 0 || instanceState(t, id) != ec2server.Stopped {
			t.Fatalf("kept instance: %d terminate calls, state %s", n, instanceState(t, id))
		}
		waitPast(windowEnd(t, keep, sc))
		if err := keep.Invoke(t.Context(), "sweeper", sc.Payloads("sweeper")[0], nil); err != nil {
			t.Fatalf("sweeper: %v", err)
		}
		wantLost(t, getPod(t, "ops", "stopped-and-kept"), "InstanceStopped")
		if instanceState(t, id) != ec2server.Stopped {
			t.Fatal("the sweep terminated a stopped instance kept by the knob")
		}
	})
}

func TestOrphans(t *testing.T) {
	sc := prepare(t, "orphans", corev1.RestartPolicyNever, func(s Subject) bool { return s.Name == "orphan-managed" })
	for name := range sc.Pods {
		if err := lab.DeletePod(t.Context(), "ops", name); err != nil {
			t.Fatal(err)
		}
	}
	if sum := sweepNow(t); sum.Orphans < 1 {
		t.Fatalf("sweep: %+v", sum)
	}
	if id := sc.Instances["orphan-managed"]; terminateCalls(id) != 1 || instanceState(t, id) != ec2server.Terminated {
		t.Fatal("orphaned managed instance not terminated")
	}
	if id := sc.Instances["orphan-unmanaged"]; terminateCalls(id) != 0 || instanceState(t, id) != ec2server.Running {
		t.Fatal("unmanaged instance touched")
	}
}

func TestSweepDuringAPIOutage(t *testing.T) {
	sc := prepare(t, "sweep-api-down", corev1.RestartPolicyNever, nil)
	waitPast(playStates(t, sc))
	lab.Stack.StopAPIServer()
	up := false
	t.Cleanup(func() {
		if !up {
			_ = lab.Stack.StartAPIServer(context.Background())
		}
	})
	// The sweep hands the Pod's end to the reconciler, whose Pod write
	// fails until the apiserver is back; the queue brings it back.
	var sum reaper.SweepSummary
	if err := lab.InvokeOnly(t.Context(), "sweeper", sc.Payloads("sweeper")[0], &sum); err != nil && !errors.As(err, new(*labstack.FunctionError)) {
		t.Fatalf("sweep with the apiserver down: %v", err)
	}
	time.Sleep(time.Second)
	if rec := record(t, sc.Instances["train-sweep-outage"]); rec.PodSynced != "" || rec.Gone == nil {
		t.Fatalf("ledger with the apiserver down: %+v", rec)
	}
	if err := lab.Stack.StartAPIServer(t.Context()); err != nil {
		t.Fatal(err)
	}
	up = true
	if err := lab.DrainSent(t.Context(), time.Now()); err != nil {
		t.Fatal(err)
	}
	wantLost(t, getPod(t, "spot", "train-sweep-outage"), "InstanceTerminated")
	// A later sweep finds nothing undone.
	if err := lab.Invoke(t.Context(), "sweeper", sc.Payloads("sweeper")[1], nil); err != nil {
		t.Fatalf("sweep after the outage: %v", err)
	}
	wantLost(t, getPod(t, "spot", "train-sweep-outage"), "InstanceTerminated")
}

// EC2 throttles the account: the reconciler's SDK retryer, tuned, rides it
// out inside the invocation.
func TestThrottledEC2(t *testing.T) {
	sc := prepare(t, "job-throttled", corev1.RestartPolicyNever, nil)
	lab.Stack.EC2.Throttle("TerminateInstances", 2)
	lab.Stack.EC2.Throttle("DescribeInstances", 1)
	if sum := invokeExit(t, sc.Payloads("exitrecorder")[0]); sum.Queued != 1 {
		t.Fatalf("summary %+v", sum)
	}
	if id := sc.Instances["job-throttled"]; instanceState(t, id) != ec2server.Terminated || terminateCalls(id) != 1 {
		t.Fatal("instance not terminated once")
	}
}

// The second demo: spot reclaims 10 instances; 5 exit lines arrive late but
// inside the window and win, the other 5 Pods are finalized as lost.
func TestSpot10(t *testing.T) {
	var progress strings.Builder
	res, err := lab.Spot10(t.Context(), recordingsDir, exitWait, &progress)
	if err != nil {
		t.Fatal(err)
	}
	if res.Finalized() != 10 || res.Leaked() != 0 || res.Terminated() != 10 {
		t.Fatalf("finalized %d terminated %d leaked %d", res.Finalized(), res.Terminated(), res.Leaked())
	}
	lost := count(res.Rows, func(r Row) bool { return r.Reason == "ContainerStatusUnknown" })
	if lost != 5 {
		t.Fatalf("%d lost, want 5: %+v", lost, res.Rows)
	}
	// The progress line is rewritten per step, says what it waits for, and
	// ends at the total.
	p := progress.String()
	if !strings.Contains(p, "\r\x1b[Kspot10: 0/16 statechange") || !strings.Contains(p, "waiting") ||
		!strings.HasSuffix(p, "spot10: 16/16 events replayed\n") {
		t.Fatalf("progress %q", p)
	}
}
