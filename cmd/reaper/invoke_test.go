package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	corev1 "k8s.io/api/core/v1"

	"github.com/reaper-k8s/reaper/internal/ec2server"
	"github.com/reaper-k8s/reaper/internal/localstack"
	"github.com/reaper-k8s/reaper/internal/replay"
	"github.com/reaper-k8s/reaper/pkg/reaper"
)

// TestInvoke runs the invoke path on one stack, with the three functions
// built and started once: every sample event, then the -keep-time and
// function-error cases. The calls share the sample world; each one clears
// what the previous one left of it.
func TestInvoke(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	root, err := replay.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	lab := startLab(ctx, t, root)
	t.Run("events", func(t *testing.T) { testEvents(ctx, t, lab, root) })
	t.Run("keep-time", func(t *testing.T) { testKeepTime(ctx, t, lab, root) })
	t.Run("function-error", func(t *testing.T) { testFunctionError(ctx, t, lab, root) })
	if t.Failed() {
		for name, f := range lab.Functions {
			t.Logf("%s output (tail):\n%s", name, tailLines(f.Logs(), 30))
		}
	}
}

// testEvents sends every sample event in events/ to its function (the
// directory's name) the way `make invoke` does and checks that each call
// succeeds and does what events/README.md says.
func testEvents(ctx context.Context, t *testing.T, lab *replay.Lab, root string) {
	files, err := filepath.Glob(filepath.Join(root, "events", "*", "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no sample events under events/")
	}
	for _, file := range files {
		name := filepath.ToSlash(strings.TrimPrefix(file, filepath.Join(root, "events")+string(filepath.Separator)))
		fn := filepath.Base(filepath.Dir(file))
		t.Run(name, func(t *testing.T) {
			event, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			if got, err := pickFunction(fn, event, file); err != nil || got != fn {
				t.Fatalf("pickFunction = %q, %v; want %s", got, err, fn)
			}
			inv, err := invokeEvent(ctx, lab, fn, event, invokeOptions{Progress: t.Logf})
			if err != nil {
				t.Fatal(err)
			}
			if inv.Err != nil {
				t.Fatalf("function error %s: %s\nresponse %s\nlog:\n%s", inv.Err.Type, inv.Err.Message, inv.Response, inv.Logs)
			}
			check, ok := expectations[name]
			if !ok {
				t.Logf("no expectation for %s beyond success: add one", name)
				return
			}
			check(t, inv)
			if t.Failed() {
				var out bytes.Buffer
				inv.print(&out, true)
				t.Logf("reaper invoke would print:\n%s", out.String())
			}
		})
	}
}

// expectations follow the "Expected outcome" column of events/README.md.
var expectations = map[string]func(*testing.T, *invocation){
	"exitrecorder/exit-0.json": func(t *testing.T, inv *invocation) {
		wantExit(t, inv, 1, 1, 0)
		wantPod(t, inv, corev1.PodSucceeded, 0, "Completed", 0)
		wantInstance(t, inv, ec2server.Terminated)
	},
	"exitrecorder/exit-1.json": func(t *testing.T, inv *invocation) {
		wantExit(t, inv, 1, 1, 0)
		wantPod(t, inv, corev1.PodFailed, 1, "Error", 0)
		wantInstance(t, inv, ec2server.Terminated)
	},
	"exitrecorder/oom.json": func(t *testing.T, inv *invocation) {
		wantExit(t, inv, 1, 1, 0)
		wantPod(t, inv, corev1.PodFailed, 137, "OOMKilled", 0)
		wantInstance(t, inv, ec2server.Terminated)
	},
	"exitrecorder/batch.json": func(t *testing.T, inv *invocation) {
		wantExit(t, inv, 3, 2, 1)
		wantPod(t, inv, corev1.PodSucceeded, 0, "Completed", 1)
		wantInstance(t, inv, ec2server.Terminated)
	},
	"exitrecorder/control.json": func(t *testing.T, inv *invocation) {
		if sum := decode[reaper.ExitSummary](t, inv); !reflect.DeepEqual(sum, reaper.ExitSummary{}) {
			t.Errorf("response %+v, want nothing done", sum)
		}
		if len(inv.Pods)+len(inv.Instances) != 0 {
			t.Errorf("seeded %v %v for a control message", inv.Pods, inv.Instances)
		}
	},
	"statechange/running.json": func(t *testing.T, inv *invocation) {
		sum := decode[reaper.StateSummary](t, inv)
		if sum != (reaper.StateSummary{InstanceID: sampleInstanceID, State: "running"}) {
			t.Errorf("response %+v, want the state recorded and nothing else", sum)
		}
		wantPod(t, inv, corev1.PodRunning, -1, "", 0)
		wantInstance(t, inv, ec2server.Running)
	},
	// The instance stopped: the window opens and, with the default
	// REAPER_TERMINATE_STOPPED, the instance is terminated.
	"statechange/stopping.json": func(t *testing.T, inv *invocation) {
		wantStateChange(t, inv, "stopping", "terminating")
		wantPod(t, inv, corev1.PodRunning, -1, "", 0)
		wantInstance(t, inv, ec2server.Terminated)
	},
	"statechange/stopped.json": func(t *testing.T, inv *invocation) {
		wantStateChange(t, inv, "stopped", "terminating")
		wantPod(t, inv, corev1.PodRunning, -1, "", 0)
		wantInstance(t, inv, ec2server.Terminated)
	},
	// EC2 is ending the instance itself: only the window opens.
	"statechange/shutting-down.json": func(t *testing.T, inv *invocation) {
		wantStateChange(t, inv, "shutting-down", "")
		wantPod(t, inv, corev1.PodRunning, -1, "", 0)
		wantInstance(t, inv, ec2server.ShuttingDown)
	},
	"statechange/terminated.json": func(t *testing.T, inv *invocation) {
		wantStateChange(t, inv, "terminated", "")
		wantPod(t, inv, corev1.PodRunning, -1, "", 0)
		wantInstance(t, inv, ec2server.Terminated)
	},
	"sweeper/scheduled.json": func(t *testing.T, inv *invocation) {
		sum := decode[reaper.SweepSummary](t, inv)
		if sum.ManagedInstances != 1 || sum.Orphans != 1 || sum.Errors != 0 {
			t.Errorf("response %+v, want the one seeded orphan terminated", sum)
		}
		wantInstance(t, inv, ec2server.Terminated)
	},
}

// testKeepTime sends a state change as recorded, an hour old: the
// exit-wait window is long over, so the Pod is finalized as lost at once.
func testKeepTime(ctx context.Context, t *testing.T, lab *replay.Lab, root string) {
	raw, err := os.ReadFile(filepath.Join(root, "events", "statechange", "terminated.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ev events.CloudWatchEvent
	if err := json.Unmarshal(raw, &ev); err != nil {
		t.Fatal(err)
	}
	ev.Time = time.Now().Add(-time.Hour).UTC().Truncate(time.Second)
	old, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	inv, err := invokeEvent(ctx, lab, "statechange", old, invokeOptions{KeepTime: true, Progress: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	if inv.Err != nil {
		t.Fatalf("function error %s: %s", inv.Err.Type, inv.Err.Message)
	}
	if sum := decode[reaper.StateSummary](t, inv); sum.PodResult != "patched" || sum.WaitUntil != "" {
		t.Errorf("response %+v, want the Pod patched as lost", sum)
	}
	wantPod(t, inv, corev1.PodFailed, 137, "ContainerStatusUnknown", 0)
	if p := inv.Pods[0]; p.Disruption != "InstanceTerminated" {
		t.Errorf("disruption %q, want InstanceTerminated", p.Disruption)
	}
}

// testFunctionError runs the exitrecorder on a table that does not exist:
// the error is reported, with the function's log, and the rest still shown.
func testFunctionError(ctx context.Context, t *testing.T, lab *replay.Lab, root string) {
	f, err := localstack.StartFunction(ctx, lab.Bootstraps["exitrecorder"], append(lab.Env, "REAPER_TABLE=no-such-table"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Stop()
	broken := *lab
	broken.Functions = map[string]*localstack.Function{"exitrecorder": f}
	raw, err := os.ReadFile(filepath.Join(root, "events", "exitrecorder", "exit-1.json"))
	if err != nil {
		t.Fatal(err)
	}
	inv, err := invokeEvent(ctx, &broken, "exitrecorder", raw, invokeOptions{Progress: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	if inv.Err == nil || !strings.Contains(inv.Err.Message, "ResourceNotFoundException") {
		t.Fatalf("function error %v, want the missing table", inv.Err)
	}
	var out bytes.Buffer
	inv.print(&out, false)
	for _, want := range []string{"what happened (error ", "pod default/sample-job", "Running → Running", "function log:", "ResourceNotFoundException", "REPORT RequestId:"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestPickFunction(t *testing.T) {
	root, err := replay.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	read := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join(root, "events", name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, tc := range []struct {
		fn    string
		event []byte
		want  string // "" wants an error
	}{
		{"", read("exitrecorder/oom.json"), "exitrecorder"},
		{"", read("statechange/stopped.json"), "statechange"},
		{"", read("sweeper/scheduled.json"), "sweeper"},
		{"statechange", read("statechange/running.json"), "statechange"},
		{"sweeper", read("statechange/stopped.json"), ""},
		{"exitrecorder", read("sweeper/scheduled.json"), ""},
		{"reaper", read("exitrecorder/oom.json"), ""},
		{"", []byte(`{"hello":"world"}`), ""},
		{"sweeper", []byte(`{"hello":"world"}`), "sweeper"},
		{"sweeper", []byte(`not json`), ""},
	} {
		got, err := pickFunction(tc.fn, tc.event, "event.json")
		if got != tc.want || (err != nil) != (tc.want == "") {
			t.Errorf("pickFunction(%q, %.40s) = %q, %v; want %q", tc.fn, tc.event, got, err, tc.want)
		}
	}
}

// TestInvokeArgs checks that bad arguments fail before anything is built.
func TestInvokeArgs(t *testing.T) {
	root, err := replay.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	oom := filepath.Join(root, "events", "exitrecorder", "oom.json")
	for _, args := range [][]string{
		{},
		{"-fn", "exitrecorder"},
		{"-event", filepath.Join(root, "events", "no-such.json")},
		{"-fn", "nope", "-event", oom},
		{"-fn", "sweeper", "-event", oom},
		{"-event", oom, "-env", "NOEQUALS"},
		{"-event", oom, "extra"},
	} {
		if err := runInvoke(t.Context(), args); err == nil {
			t.Errorf("runInvoke(%q) succeeded", args)
		}
	}
}

// startLab builds the three functions, starts a stack and runs them on it.
func startLab(ctx context.Context, t *testing.T, root string) *replay.Lab {
	t.Helper()
	bins, err := replay.Build(ctx, root, t.TempDir(), replay.Functions...)
	if err != nil {
		t.Fatal(err)
	}
	stack, err := localstack.Start(ctx, localstack.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stack.Stop)
	lab, err := replay.NewLab(ctx, stack, invokeTable, bins)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lab.Stop)
	return lab
}

func decode[T any](t *testing.T, inv *invocation) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(inv.Response, &v); err != nil {
		t.Fatalf("response %s: %v", inv.Response, err)
	}
	return v
}

func wantExit(t *testing.T, inv *invocation, lines, recorded, rejected int) {
	t.Helper()
	sum := decode[reaper.ExitSummary](t, inv)
	want := reaper.ExitSummary{InstanceID: sampleInstanceID, Lines: lines, Recorded: recorded, Rejected: rejected, PodResult: "patched", Terminate: "terminating"}
	sum.RejectedFor = nil // the reasons are the parser's and the trust check's to test
	if !reflect.DeepEqual(sum, want) {
		t.Errorf("response %+v, want %+v", sum, want)
	}
}

// wantStateChange checks that the event was moved to now, so the window
// opens now, and what the function did about the instance.
func wantStateChange(t *testing.T, inv *invocation, state, terminate string) {
	t.Helper()
	sum := decode[reaper.StateSummary](t, inv)
	if sum.InstanceID != sampleInstanceID || sum.State != state || sum.Skipped != "" || sum.PodResult != "" || sum.Terminate != terminate {
		t.Errorf("response %+v, want state %s, terminate %q, nothing skipped", sum, state, terminate)
	}
	until, err := time.Parse(time.RFC3339, sum.WaitUntil)
	if err != nil {
		t.Fatalf("waitUntil %q: %v", sum.WaitUntil, err)
	}
	// The functions run with the default 3-minute window.
	if d := time.Until(until); d < 2*time.Minute || d > 4*time.Minute {
		t.Errorf("waitUntil %s is %s away, want about 3m", sum.WaitUntil, d.Round(time.Second))
	}
}

// wantPod checks the one seeded Pod; exitCode -1 wants none.
func wantPod(t *testing.T, inv *invocation, phase corev1.PodPhase, exitCode int32, reason string, restarts int32) {
	t.Helper()
	if len(inv.Pods) != 1 {
		t.Fatalf("seeded Pods %+v, want the sample Pod", inv.Pods)
	}
	p := inv.Pods[0]
	got := int32(-1)
	if p.ExitCode != nil {
		got = *p.ExitCode
	}
	if p.Gone || p.Phase != phase || got != exitCode || p.Reason != reason || p.Restarts != restarts {
		t.Errorf("pod %s/%s: %s; want %s, exit code %d, reason %q, restarts %d", p.Namespace, p.Name, p.after(), phase, exitCode, reason, restarts)
	}
}

func wantInstance(t *testing.T, inv *invocation, state ec2server.State) {
	t.Helper()
	if len(inv.Instances) != 1 || inv.Instances[0].ID != sampleInstanceID || inv.Instances[0].After != state {
		t.Errorf("instances %+v, want %s %s", inv.Instances, sampleInstanceID, state)
	}
}

func tailLines(s string, n int) string {
	lines := strings.SplitAfter(s, "\n")
	return strings.Join(lines[max(0, len(lines)-n-1):], "")
}
