package replay

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/reaper-k8s/reaper/pkg/exitline"
	"github.com/reaper-k8s/reaper/pkg/intake"
	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/model"
)

// Hosts that power themselves off after their exit line (the default
// user-data does within seconds): with REAPER_POWER_OFF_GRACE, Reaper
// writes each Pod at once and terminates only the instance whose host did
// not power off, once the grace has passed, woken by the queue and not by
// a sweep. The one that powered off costs no TerminateInstances.
func TestPowerOffGrace(t *testing.T) {
	const (
		cluster = "reaper-power-off"
		grace   = 10 * time.Second
	)
	ctx := t.Context()
	hosts := deployment(t, cluster, LabOptions{Env: []string{"REAPER_POWER_OFF_GRACE=" + grace.String()}}, "exitrecorder", "statechange", "reconciler")
	pods := map[string]*corev1.Pod{}
	ids := map[string]string{"powers-off": hostileInstance(0xf08, 1), "stays-on": hostileInstance(0xf08, 2)}
	for name, id := range ids {
		pod, err := lab.RunningPod(ctx, "power-off", name, corev1.RestartPolicyNever)
		if err != nil {
			t.Fatal(err)
		}
		pods[name] = pod
		hosts.AddTaggedInstance(id, lab.InstanceTags(pod, true, cluster))
	}
	exit := func(name string) {
		payload, err := ExitPayload(ids[name], pods[name], 0, 1)
		if err != nil {
			t.Fatal(err)
		}
		if err := hosts.Invoke(ctx, "exitrecorder", payload, nil); err != nil {
			t.Fatal(err)
		}
		wantEnded(t, getPod(t, "power-off", name), corev1.PodSucceeded, 0, "Completed")
	}
	// One host powers itself off right after its exit, and EC2 says so.
	exit("powers-off")
	for _, state := range []string{model.StateShuttingDown, model.StateTerminated} {
		b, err := json.Marshal(StateChangeEvent("power-off-"+state, ids["powers-off"], state, time.Now()))
		if err != nil {
			t.Fatal(err)
		}
		if err := hosts.Play(ctx, LiveStep{Function: "statechange", Payload: b}, nil); err != nil {
			t.Fatal(err)
		}
	}
	// The other stays on.
	start := time.Now()
	exit("stays-on")
	// The other is terminated once its grace has passed.
	var terminated time.Time
	for deadline := start.Add(grace + 15*time.Second); terminated.IsZero(); time.Sleep(100 * time.Millisecond) {
		for _, c := range lab.Stack.EC2.Calls() {
			if slices.Contains(c.Terminated(), ids["stays-on"]) {
				terminated = c.Time
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the host that stayed on still runs %s after its exit", time.Since(start))
		}
	}
	if took := terminated.Sub(start); took < grace {
		t.Fatalf("terminated %s after the exit, inside the %s grace", took, grace)
	}
	if n := terminateCalls(ids["powers-off"]); n != 0 {
		t.Fatalf("the host that powered off was named in %d TerminateInstances", n)
	}
	if n := terminateCalls(ids["stays-on"]); n != 1 {
		t.Fatalf("the host that stayed on was named in %d TerminateInstances", n)
	}
}

// A host whose Pod ended keeps its own instance billing if a line can move
// its grace: it sends its terminal line dated ahead (within the clock skew
// a host may have), then the same Pod's terminal line again and again,
// each dated further ahead, and one with a higher restart count, though
// its Pod does not restart. The first terminal exit is final: the Pod
// keeps it, each later line is counted and changes nothing, and the
// instance is terminated once the grace has passed since Reaper received
// the first one.
func TestResentTerminalLineMovesNoGrace(t *testing.T) {
	const grace = 10 * time.Second
	ctx := t.Context()
	hosts := deployment(t, "reaper-final-exit", LabOptions{MaxConcurrency: 1, Env: []string{"REAPER_POWER_OFF_GRACE=" + grace.String()}},
		"exitrecorder", "reconciler")
	pod, err := lab.RunningPod(ctx, "final-exit", "resends", corev1.RestartPolicyNever)
	if err != nil {
		t.Fatal(err)
	}
	id := hostileInstance(0xf09, 1)
	hosts.AddTaggedInstance(id, lab.InstanceTags(pod, true, "reaper-final-exit"))
	// send hands the exitrecorder one line of the Pod, dated ahead, and
	// returns once it is queued.
	send := func(seq int, code int, restart int32, ahead time.Duration) {
		t.Helper()
		ev, err := ExitLogsEvent(id, pod, exitline.Line{ContainerID: BareContainerID(pod), ExitCode: code, RestartCount: restart,
			FinishedAt: time.Now().Add(ahead).UTC()}, seq)
		if err != nil {
			t.Fatal(err)
		}
		b, err := json.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		var sum intake.ExitSummary
		if err := hosts.InvokeOnly(ctx, "exitrecorder", b, &sum); err != nil || sum.Queued != 1 {
			t.Fatalf("exitrecorder: %+v, %v", sum, err)
		}
	}
	start := time.Now()
	send(1, 0, 0, 4*time.Minute)
	if err := hosts.DrainSent(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	first := recordOf(t, hosts, id)
	if first.Latest() == nil {
		t.Fatalf("no exit recorded: %+v", first)
	}
	wantEnded(t, getPod(t, "final-exit", "resends"), corev1.PodSucceeded, 0, "Completed")
	resent := 0
	for terminateCalls(id) == 0 {
		if time.Since(start) > grace+20*time.Second {
			t.Fatalf("the instance still runs %s after its exit, %d lines later", time.Since(start), resent)
		}
		resent++
		if resent == 2 {
			send(1+resent, 3, 1, 4*time.Minute+50*time.Second)
		} else {
			send(1+resent, 0, 0, 4*time.Minute+50*time.Second)
		}
		time.Sleep(time.Second)
	}
	if resent < 3 {
		t.Fatalf("terminated after %d lines sent again; the test wants the higher restart count among them", resent)
	}
	if err := hosts.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	var terminated time.Time
	for _, c := range lab.Stack.EC2.Calls() {
		if slices.Contains(c.Terminated(), id) {
			terminated = c.Time
		}
	}
	// The lines dated ahead would have moved the grace by minutes.
	took := terminated.Sub(start)
	if took < grace || took > grace+10*time.Second {
		t.Fatalf("terminated %s after the first exit, want within 10 s of the %s grace", took, grace)
	}
	t.Logf("terminated %s after the first exit, %d lines later", took, resent)
	if n := terminateCalls(id); n != 1 {
		t.Fatalf("the instance was named in %d TerminateInstances", n)
	}
	if got := recordOf(t, hosts, id); got.Latest() == nil || *got.Latest() != *first.Latest() {
		t.Fatalf("recorded exit %+v, want the first %+v", *got.Latest(), *first.Latest())
	}
	wantEnded(t, getPod(t, "final-exit", "resends"), corev1.PodSucceeded, 0, "Completed")
	_, counted, _ := metric(emfLines(t, hosts.Reconcilers[0].Logs()), metrics.FunctionReconciler, metrics.LinesRejected,
		map[string]string{metrics.ReasonDim: model.ReasonAfterTerminal})
	sum := 0.0
	for _, n := range counted {
		sum += n
	}
	if int(sum) != resent {
		t.Fatalf("%v lines counted after the terminal exit, want the %d sent after it", sum, resent)
	}
}
