package replay

import (
	"encoding/json"
	"maps"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/reaper-k8s/reaper/internal/ec2server"
	"github.com/reaper-k8s/reaper/internal/labstack"
	"github.com/reaper-k8s/reaper/pkg/intake"
	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/model"
	"github.com/reaper-k8s/reaper/pkg/reaper"
)

// The tests of this file sweep or make EC2 fail for everyone, so like
// those of ends_test.go none runs in parallel.

// wantUntouched checks a Pod still carries what it was created with.
func wantUntouched(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	now := getPod(t, pod.Namespace, pod.Name)
	if now.UID != pod.UID || now.ResourceVersion != pod.ResourceVersion || now.Status.Phase != corev1.PodRunning {
		t.Fatalf("pod %s was written: %s %+v", pod.Name, now.Status.Phase, now.Status.ContainerStatuses)
	}
}

// wantRejected invokes the exitrecorder with payload and checks that the
// reconciler did not believe its lines, for reasons.
func wantRejected(t *testing.T, payload []byte, reasons map[string]int) {
	t.Helper()
	before := map[string]int{}
	for r := range reasons {
		before[r] = lab.rejections(r)
	}
	if sum := invokeExit(t, payload); sum.Rejected != 0 || sum.Queued != 1 {
		t.Fatalf("summary %+v, want the line queued for its check", sum)
	}
	for r, n := range reasons {
		if got := lab.rejections(r) - before[r]; got != n {
			t.Fatalf("%d lines not believed for %s, want %d", got, r, n)
		}
	}
}

func wantNoRecord(t *testing.T, id string) {
	t.Helper()
	if _, ok, err := lab.Ledger.Get(t.Context(), id); err != nil || ok {
		t.Fatalf("ledger record of %s: ok=%v err=%v", id, ok, err)
	}
}

// Two deployments in one account: instances tagged for another cluster
// are not this deployment's, whatever reaches it about them.
func TestOtherClusterUntouched(t *testing.T) {
	sc := prepare(t, "other-cluster", corev1.RestartPolicyNever, nil)
	for name, id := range sc.Instances {
		lab.AddTaggedInstance(id, lab.InstanceTags(sc.Pods[name], true, "other-"+labstack.Cluster))
	}
	exited, spotted := sc.Instances["other-exit"], sc.Instances["other-spot"]

	wantRejected(t, sc.Payloads("exitrecorder")[0], map[string]int{model.ReasonOtherCluster: 1})
	var state intake.StateSummary
	if play(t, LiveStep{Function: "statechange", Payload: sc.Payloads("statechange")[0]}, &state); !state.Queued {
		t.Fatalf("state change of another cluster's instance: %+v", state)
	}
	// Its Pod is gone: to this deployment's sweep it would be an orphan.
	if err := lab.DeletePod(t.Context(), "tenants", "other-exit"); err != nil {
		t.Fatal(err)
	}
	sweepNow(t)
	if terminateCalls(exited) != 0 || instanceState(t, exited) != ec2server.Running {
		t.Fatal("another cluster's instance was terminated")
	}
	wantUntouched(t, sc.Pods["other-spot"])
	wantNoRecord(t, exited)
	wantNoRecord(t, spotted)
}

// A host writes, into its own stream, lines naming a Pod that runs
// elsewhere: a terminal one and a restart. Neither Pod is written and
// neither instance terminated.
func TestLineNamingAnotherPod(t *testing.T) {
	sc := prepare(t, "pod-mismatch", corev1.RestartPolicyNever, nil)
	writer := sc.Instances["writer"]
	for _, p := range sc.Payloads("exitrecorder") {
		wantRejected(t, p, map[string]int{model.ReasonPodMismatch: 1})
	}
	wantUntouched(t, sc.Pods["writer"])
	wantUntouched(t, sc.Pods["victim"])
	for _, id := range sc.Instances {
		if terminateCalls(id) != 0 || instanceState(t, id) != ec2server.Running {
			t.Fatalf("instance %s terminated", id)
		}
	}
	wantNoRecord(t, writer)
	// Restart lines are checked like the rest: one lookup per delivery.
	if n := lookups(writer); n != 2 {
		t.Fatalf("%d tag lookups for 2 deliveries", n)
	}
}

// The tag lookup fails: the exit waits on the queue, and nothing acts on
// it or records it until EC2 answers; the queue brings the work back. A
// forged line kept that way is dropped once the tags are read, and the
// real Pod is left alone.
func TestTagLookupFails(t *testing.T) {
	t.Run("real line", func(t *testing.T) {
		sc := prepare(t, "lookup-fails", corev1.RestartPolicyNever, nil)
		id := sc.Instances["job-lookup-fails"]
		lab.Stack.EC2.FailNext("DescribeInstances", 1, "UnauthorizedOperation", 403)
		if err := lab.InvokeOnly(t.Context(), "exitrecorder", sc.Payloads("exitrecorder")[0], nil); err != nil {
			t.Fatal(err)
		}
		waitFailedBatch(t)
		wantNoRecord(t, id) // the claim waits on the queue

		wantUntouched(t, sc.Pods["job-lookup-fails"])
		if terminateCalls(id) != 0 {
			t.Fatal("terminated on a line not yet checked")
		}
		if err := lab.DrainSent(t.Context(), time.Now()); err != nil { // the redelivery
			t.Fatal(err)
		}
		wantEnded(t, getPod(t, "jobs", "job-lookup-fails"), corev1.PodSucceeded, 0, "Completed")
		if rec := record(t, id); rec.Latest() == nil || rec.PodSynced != "exit/0" || terminateCalls(id) != 1 {
			t.Fatalf("ledger after the redelivery: %+v, %d terminate calls", rec, terminateCalls(id))
		}
	})
	t.Run("forged line", func(t *testing.T) {
		sc := prepare(t, "unverified", corev1.RestartPolicyNever, nil)
		writer := sc.Instances["unverified-writer"]
		lab.Stack.EC2.FailNext("DescribeInstances", 1, "UnauthorizedOperation", 403)
		if err := lab.InvokeOnly(t.Context(), "exitrecorder", sc.Payloads("exitrecorder")[0], nil); err != nil {
			t.Fatal(err)
		}
		waitFailedBatch(t)
		wantNoRecord(t, writer)
		if err := lab.DrainSent(t.Context(), time.Now()); err != nil {
			t.Fatal(err)
		}
		sum := sweepNow(t)
		wantUntouched(t, sc.Pods["unverified-victim"])
		wantUntouched(t, sc.Pods["unverified-writer"])
		if terminateCalls(writer) != 0 || instanceState(t, writer) != ec2server.Running {
			t.Fatalf("acted on a forged record: %+v", sum)
		}
		// The sweep adopted the running instance: its record holds the
		// tags' Pod, and nothing of the forged line.
		if rec := record(t, writer); rec.Latest() != nil || rec.Pod.UID != string(sc.Pods["unverified-writer"].UID) || sum.Adopted < 1 {
			t.Fatalf("record after the sweep: %+v (sweep %+v)", rec, sum)
		}
	})
}

// waitFailedBatch waits until the reconcilers have run a batch whose tag
// lookup failed.
func waitFailedBatch(t *testing.T) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		for _, c := range lab.Stack.EC2.Calls() {
			if c.Action == "DescribeInstances" && c.ErrorCode == "UnauthorizedOperation" {
				time.Sleep(200 * time.Millisecond) // the batch's response
				return
			}
		}
	}
	t.Fatal("no failed tag lookup")
}

// A restart-pending exit does not outlive its instance: once the window
// has passed without a terminal line, the Pod is lost.
func TestRestartPendingThenSpot(t *testing.T) {
	sc := prepare(t, "restart-then-spot", corev1.RestartPolicyAlways, nil)
	invokeExit(t, sc.Payloads("exitrecorder")[0])
	if p := getPod(t, "services", "restart-spot"); p.Status.Phase != corev1.PodRunning || p.Status.ContainerStatuses[0].State.Waiting == nil {
		t.Fatalf("after the restart line: %+v", p.Status)
	}
	until := playStates(t, sc)
	if sum := sweepNow(t); sum.WaitingExit < 1 {
		t.Fatalf("sweep inside the window: %+v", sum)
	}
	if p := getPod(t, "services", "restart-spot"); p.Status.Phase != corev1.PodRunning {
		t.Fatalf("finalized before the window closed: %s", p.Status.Phase)
	}
	waitPast(until)
	if sum := sweepNow(t); sum.Queued < 1 {
		t.Fatalf("sweep after the window: %+v", sum)
	}
	pod := getPod(t, "services", "restart-spot")
	wantLost(t, pod, "InstanceTerminated")
	if rc := pod.Status.ContainerStatuses[0].RestartCount; rc != 1 {
		t.Fatalf("restartCount %d, want the restart that was pending counted", rc)
	}
}

// A restart-pending instance whose Pod is deleted is an orphan, and the
// sweep that finds it says so in its metrics: a leak the events missed.
func TestRestartPendingOrphan(t *testing.T) {
	sweeper := labstack.MustStartFunction(t, lab.Bootstraps["sweeper"], lab.Env)
	sc := prepare(t, "restart-orphan", corev1.RestartPolicyAlways, nil)
	id := sc.Instances["restart-orphan"]
	invokeExit(t, sc.Payloads("exitrecorder")[0])
	if err := lab.DeletePod(t.Context(), "services", "restart-orphan"); err != nil {
		t.Fatal(err)
	}
	// The lab's other tests leave orphans too (TestOrphanCapHoldsBack 40),
	// and the orphan cap ends the oldest first, a part of the running
	// instances a sweep: a few sweeps may pass before this one's turn.
	for sweeps := 0; terminateCalls(id) == 0; sweeps++ {
		if sweeps == 20 {
			t.Fatalf("restart-pending orphan not terminated after %d sweeps", sweeps)
		}
		resp, fnErr, err := sweeper.Invoke(t.Context(), sc.Payloads("sweeper")[0])
		var sum reaper.SweepSummary
		if err != nil || fnErr != nil || json.Unmarshal(resp, &sum) != nil || sum.Orphans < 1 {
			t.Fatalf("sweep: %v %v %s", err, fnErr, resp)
		}
		if err := lab.DrainSent(t.Context(), time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	if terminateCalls(id) != 1 || instanceState(t, id) != ec2server.Terminated {
		t.Fatal("restart-pending orphan not terminated once")
	}
	if unit, values, ok := metric(emfLines(t, sweeper.Logs()), metrics.FunctionSweeper, metrics.OrphansFound, nil); !ok || unit != "Count" || len(values) == 0 || slices.Max(values) < 1 {
		t.Errorf("%s: found=%v unit %q values %v, want a count of at least 1", metrics.OrphansFound, ok, unit, values)
	}
	var terminated []float64
	for _, f := range lab.Reconcilers {
		_, values, _ := metric(emfLines(t, f.Logs()), metrics.FunctionReconciler, metrics.OrphansTerminated, nil)
		terminated = append(terminated, values...)
	}
	if len(terminated) == 0 {
		t.Errorf("no %s count in the reconcilers' logs", metrics.OrphansTerminated)
	}
}

// Lines outside the input limits are rejected each for itself; the good
// line of the batch is recorded, and a forged restart count does not
// shadow it.
func TestInputLimits(t *testing.T) {
	sc := prepare(t, "input-limits", corev1.RestartPolicyNever, nil)
	sum := invokeExit(t, sc.Payloads("exitrecorder")[0])
	want := map[string]int{"invalid": 5, "finished-in-future": 1}
	if sum.Lines != 7 || sum.Recorded != 1 || sum.Rejected != 6 || !maps.Equal(sum.RejectedFor, want) {
		t.Fatalf("summary %+v, want 1 recorded and rejected %v", sum, want)
	}
	id := sc.Instances["job-limits"]
	if rec := record(t, id); rec.Latest() == nil || rec.Latest().RestartCount != 1 {
		t.Fatalf("ledger %+v", rec)
	}
	wantEnded(t, getPod(t, "jobs", "job-limits"), corev1.PodSucceeded, 0, "Completed")
	if instanceState(t, id) != ec2server.Terminated {
		t.Fatal("instance not terminated")
	}
}
