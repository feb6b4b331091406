package replay

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

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
