package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	corev1 "k8s.io/api/core/v1"

	"github.com/reaper-k8s/reaper/internal/ec2server"
	"github.com/reaper-k8s/reaper/internal/labstack"
	"github.com/reaper-k8s/reaper/internal/replay"
	"github.com/reaper-k8s/reaper/pkg/intake"
	"github.com/reaper-k8s/reaper/pkg/reaper"
)

// TestInvoke runs the invoke path on one stack, with the four functions
// built and started once, the reconciler behind the work queue: every
// sample event, then the -keep-time and function-error cases. The calls
// share the sample world; each one clears what the previous one left of it.
func TestInvoke(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	root, err := replay.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	lab, stop, err := replay.StartLab(ctx, labstack.Options{}, invokeTable)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	t.Run("events", func(t *testing.T) { testEvents(ctx, t, lab, root) })
	t.Run("keep-time", func(t *testing.T) { testKeepTime(ctx, t, lab, root) })
	t.Run("function-error", func(t *testing.T) { testFunctionError(ctx, t, lab, root) })
	if t.Failed() {
		for name, f := range lab.Functions {
			t.Logf("%s output (tail):\n%s", name, replay.Tail(f.Logs(), 30))
		}
		for i, f := range lab.Reconcilers[1:] {
			t.Logf("reconciler %d output (tail):\n%s", i+2, replay.Tail(f.Logs(), 30))
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
			inv, err := lab.InvokeEvent(ctx, fn, event, replay.SeedOptions{Progress: t.Logf})
			if err != nil {
				t.Fatal(err)
			}
			if inv.Err != nil {
				t.Fatalf("function error %s: %s\nresponse %s\nlog:\n%s", inv.Err.Type, inv.Err.Message, inv.Response, inv.Logs)
			}
			check, ok := expectations[name]
			if !ok {
				t.Fatalf("no expectation for %s: add one to expectations (events/README.md says what it should do)", name)
			}
			check(t, inv)
			if t.Failed() {
				var out bytes.Buffer
				printInvocation(&out, inv, true)
				t.Logf("reaper-lab invoke would print:\n%s", out.String())
			}
		})
	}
}

// The mixed reconciler batch's second instance and its Pod
// (events/README.md).
const (
	secondInstanceID = "i-0123456789abcdef1"
	secondPod        = "sample-job-2"
)

// expectations follow the "Expected outcome" column of events/README.md:
// the function's response, then the effects once the reconciler has done
// the queued work.
var expectations = map[string]func(*testing.T, *replay.Invocation){
	"exitrecorder/exit-0.json": func(t *testing.T, inv *replay.Invocation) {
		wantExit(t, inv, 1, 1, 0)
		wantPod(t, inv, corev1.PodSucceeded, 0, "Completed", 0)
		wantInstance(t, inv, ec2server.Terminated)
		wantTerminated(t, inv, replay.SampleInstanceID)
		wantBatches(t, inv, reaper.BatchSummary{Messages: 1, Instances: 1, Lookups: 1, Reconciled: 1, Patched: 1, Terminated: 1})
	},
	"exitrecorder/exit-1.json": func(t *testing.T, inv *replay.Invocation) {
		wantExit(t, inv, 1, 1, 0)
		wantPod(t, inv, corev1.PodFailed, 1, "Error", 0)
		wantInstance(t, inv, ec2server.Terminated)
		wantTerminated(t, inv, replay.SampleInstanceID)
	},
	"exitrecorder/oom.json": func(t *testing.T, inv *replay.Invocation) {
		wantExit(t, inv, 1, 1, 0)
		wantPod(t, inv, corev1.PodFailed, 137, "OOMKilled", 0)
		wantInstance(t, inv, ec2server.Terminated)
		wantTerminated(t, inv, replay.SampleInstanceID)
	},
	"exitrecorder/batch.json": func(t *testing.T, inv *replay.Invocation) {
		wantExit(t, inv, 3, 2, 1)
		wantPod(t, inv, corev1.PodSucceeded, 0, "Completed", 1)
		wantInstance(t, inv, ec2server.Terminated)
		wantTerminated(t, inv, replay.SampleInstanceID)
	},
	"exitrecorder/control.json": func(t *testing.T, inv *replay.Invocation) {
		if sum := decode[intake.ExitSummary](t, inv); !reflect.DeepEqual(sum, intake.ExitSummary{}) {
			t.Errorf("response %+v, want nothing done", sum)
		}
		if len(inv.Pods)+len(inv.Instances) != 0 {
			t.Errorf("seeded %v %v for a control message", inv.Pods, inv.Instances)
		}
		wantBatches(t, inv, reaper.BatchSummary{})
		wantTerminated(t, inv)
	},
	"statechange/running.json": func(t *testing.T, inv *replay.Invocation) {
		wantStateChange(t, inv, "running", false)
		wantPod(t, inv, corev1.PodRunning, -1, "", 0)
		wantInstance(t, inv, ec2server.Running)
		wantTerminated(t, inv)
		if rec := inv.Instances[0].Record; rec == nil || rec.LastState != "running" || rec.Gone != nil {
			t.Errorf("ledger record %+v, want the running state recorded", rec)
		}
	},
	// The instance stopped: the window opens and, with the default
	// REAPER_TERMINATE_STOPPED, the instance is terminated.
	"statechange/stopping.json": func(t *testing.T, inv *replay.Invocation) {
		wantStateChange(t, inv, "stopping", true)
		wantPod(t, inv, corev1.PodRunning, -1, "", 0)
		wantInstance(t, inv, ec2server.Terminated)
		wantTerminated(t, inv, replay.SampleInstanceID)
	},
	"statechange/stopped.json": func(t *testing.T, inv *replay.Invocation) {
		wantStateChange(t, inv, "stopped", true)
		wantPod(t, inv, corev1.PodRunning, -1, "", 0)
		wantInstance(t, inv, ec2server.Terminated)
		wantTerminated(t, inv, replay.SampleInstanceID)
		wantBatches(t, inv, reaper.BatchSummary{Messages: 1, Instances: 1, Lookups: 1, Reconciled: 1, Terminated: 1})
	},
	// EC2 is ending the instance itself: only the window opens.
	"statechange/shutting-down.json": func(t *testing.T, inv *replay.Invocation) {
		wantStateChange(t, inv, "shutting-down", true)
		wantPod(t, inv, corev1.PodRunning, -1, "", 0)
		wantInstance(t, inv, ec2server.ShuttingDown)
		wantTerminated(t, inv)
	},
	"statechange/terminated.json": func(t *testing.T, inv *replay.Invocation) {
		wantStateChange(t, inv, "terminated", true)
		wantPod(t, inv, corev1.PodRunning, -1, "", 0)
		wantInstance(t, inv, ec2server.Terminated)
		wantTerminated(t, inv)
	},
	"sweeper/scheduled.json": func(t *testing.T, inv *replay.Invocation) {
		// Earlier calls' instances may still be listed: the count that
		// says what the sweep did is of orphans.
		sum := decode[reaper.SweepSummary](t, inv)
		if sum.ManagedInstances < 1 || sum.Orphans != 1 || sum.Errors != 0 {
			t.Errorf("response %+v, want the one seeded orphan found", sum)
		}
		wantInstance(t, inv, ec2server.Terminated)
		wantTerminated(t, inv, replay.SampleInstanceID)
		wantBatches(t, inv, reaper.BatchSummary{Messages: 1, Instances: 1, Lookups: 1, Orphans: 1})
	},
	"reconciler/exit-claim.json": func(t *testing.T, inv *replay.Invocation) {
		wantNoFailures(t, inv)
		wantPod(t, inv, corev1.PodSucceeded, 0, "Completed", 0)
		wantInstance(t, inv, ec2server.Terminated)
		wantTerminated(t, inv, replay.SampleInstanceID)
		wantBatches(t, inv, reaper.BatchSummary{Messages: 1, Instances: 1, Lookups: 1, Reconciled: 1, Patched: 1, Terminated: 1})
		if rec := inv.Instances[0].Record; rec == nil || rec.Latest() == nil || rec.Pending != "" {
			t.Errorf("ledger record %+v, want the claim recorded and settled", rec)
		}
	},
	"reconciler/state-change.json": func(t *testing.T, inv *replay.Invocation) {
		wantNoFailures(t, inv)
		wantPod(t, inv, corev1.PodRunning, -1, "", 0)
		wantInstance(t, inv, ec2server.Terminated)
		wantTerminated(t, inv, replay.SampleInstanceID)
		wantWindow(t, inv.Instances[0])
		wantBatches(t, inv, reaper.BatchSummary{Messages: 1, Instances: 1, Lookups: 1, Reconciled: 1, Terminated: 1})
	},
	// One lookup for both instances, both Pods written, and one terminate
	// of the instance EC2 is not already ending.
	"reconciler/mixed.json": func(t *testing.T, inv *replay.Invocation) {
		wantNoFailures(t, inv)
		if len(inv.Pods) != 2 || len(inv.Instances) != 2 {
			t.Fatalf("seeded %+v and %+v, want two Pods and two instances", inv.Pods, inv.Instances)
		}
		wantPodNamed(t, inv, replay.SamplePod, corev1.PodSucceeded, 0, "Completed", 0)
		wantPodNamed(t, inv, secondPod, corev1.PodFailed, 137, "OOMKilled", 0)
		wantInstanceNamed(t, inv, replay.SampleInstanceID, ec2server.Terminated)
		wantInstanceNamed(t, inv, secondInstanceID, ec2server.ShuttingDown)
		wantTerminated(t, inv, replay.SampleInstanceID)
		wantBatches(t, inv, reaper.BatchSummary{Messages: 4, Instances: 2, Lookups: 2, Reconciled: 2, Patched: 2, Terminated: 1})
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
	inv, err := lab.InvokeEvent(ctx, "statechange", old, replay.SeedOptions{KeepTime: true, Progress: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	if inv.Err != nil {
		t.Fatalf("function error %s: %s", inv.Err.Type, inv.Err.Message)
	}
	if sum := decode[intake.StateSummary](t, inv); !sum.Queued {
		t.Errorf("response %+v, want the state change queued", sum)
	}
	// Delivered an hour after the time it carries, the state change does
	// not close the exit-wait window: it runs from when Reaper first
	// recorded the instance gone, so an exit line still on its way wins.
	wantPod(t, inv, corev1.PodRunning, -1, "", 0)
	if i := inv.Instances[0]; i.WaitUntil.Before(time.Now().Add(time.Minute)) {
		t.Errorf("exit-wait window open until %s, want it open for minutes from now", i.WaitUntil)
	}
	wantTerminated(t, inv)
	wantBatches(t, inv, reaper.BatchSummary{Messages: 1, Instances: 1, Lookups: 1, Reconciled: 1})
}

// testFunctionError runs the exitrecorder on a work queue that does not
// exist: the error is reported, with the function's log, and the rest
// still shown.
func testFunctionError(ctx context.Context, t *testing.T, lab *replay.Lab, root string) {
	f, err := labstack.StartFunction(ctx, lab.Bootstraps["exitrecorder"], append(lab.Env, "REAPER_QUEUE_URL="+lab.QueueURL+"-no-such-queue"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Stop()
	broken := *lab
	broken.Functions = map[string]*labstack.Function{"exitrecorder": f}
	raw, err := os.ReadFile(filepath.Join(root, "events", "exitrecorder", "exit-1.json"))
	if err != nil {
		t.Fatal(err)
	}
	inv, err := broken.InvokeEvent(ctx, "exitrecorder", raw, replay.SeedOptions{Progress: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	if inv.Err == nil || !strings.Contains(inv.Err.Message, "NonExistentQueue") {
		t.Fatalf("function error %v, want the missing queue", inv.Err)
	}
	var out bytes.Buffer
	printInvocation(&out, inv, false)
	for _, want := range []string{"what happened (error ", "pod default/sample-job", "Running → Running", "what the reconciler did:\n  nothing: no work was queued",
		"function log:", "NonExistentQueue", "REPORT RequestId:"} {
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
		{"", read("reconciler/mixed.json"), "reconciler"},
		{"reconciler", read("reconciler/exit-claim.json"), "reconciler"},
		{"exitrecorder", read("reconciler/state-change.json"), ""},
		{"reconciler", read("exitrecorder/oom.json"), ""},
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
	for _, tc := range []struct {
		args []string
		want string // in the error
	}{
		{nil, "-event <file> is required"},
		{[]string{"-fn", "exitrecorder"}, "-event <file> is required"},
		{[]string{"-event", filepath.Join(root, "events", "no-such.json")}, "no-such.json: no such file"},
		{[]string{"-fn", "nope", "-event", oom}, `unknown function "nope" (want one of exitrecorder, statechange, sweeper, reconciler)`},
		{[]string{"-fn", "sweeper", "-event", oom}, "is an event for exitrecorder, not for sweeper"},
		{[]string{"-fn", "reconciler", "-event", oom}, "is an event for exitrecorder, not for reconciler"},
		{[]string{"-event", oom, "-env", "NOEQUALS"}, `"NOEQUALS" is not K=V`},
		{[]string{"-event", oom, "extra"}, "takes no other arguments"},
	} {
		if err := runInvoke(t.Context(), tc.args); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("runInvoke(%q): %v, want an error saying %q", tc.args, err, tc.want)
		}
	}
}

func decode[T any](t *testing.T, inv *replay.Invocation) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(inv.Response, &v); err != nil {
		t.Fatalf("response %s: %v", inv.Response, err)
	}
	return v
}

// wantExit checks the exitrecorder's response: the sample Pod's one claim
// queued.
func wantExit(t *testing.T, inv *replay.Invocation, lines, recorded, rejected int) {
	t.Helper()
	sum := decode[intake.ExitSummary](t, inv)
	want := intake.ExitSummary{InstanceID: replay.SampleInstanceID, Lines: lines, Recorded: recorded, Queued: 1, Rejected: rejected}
	sum.RejectedFor = nil // the reasons are the parser's and the trust check's to test
	if !reflect.DeepEqual(sum, want) {
		t.Errorf("response %+v, want %+v", sum, want)
	}
}

// wantStateChange checks that the state change was queued and, for a gone
// state, that the reconciler recorded it with the event moved to now, so
// the window opens now.
func wantStateChange(t *testing.T, inv *replay.Invocation, state string, gone bool) {
	t.Helper()
	sum := decode[intake.StateSummary](t, inv)
	if sum != (intake.StateSummary{InstanceID: replay.SampleInstanceID, State: state, Queued: true}) {
		t.Errorf("response %+v, want state %s queued, nothing skipped", sum, state)
	}
	if len(inv.Instances) != 1 {
		t.Fatalf("seeded instances %+v, want the sample instance", inv.Instances)
	}
	if i := inv.Instances[0]; !gone && !i.WaitUntil.IsZero() {
		t.Errorf("exit-wait window open until %s for state %s", i.WaitUntil, state)
	} else if gone {
		wantWindow(t, i)
	}
}

// wantWindow checks that the instance's exit-wait window opened about now:
// the functions run with the default 3-minute window.
func wantWindow(t *testing.T, i replay.InstanceView) {
	t.Helper()
	if d := time.Until(i.WaitUntil); d < 2*time.Minute || d > 4*time.Minute {
		t.Errorf("instance %s: exit-wait window open until %s, %s away; want about 3m (record %+v)", i.ID, i.WaitUntil, d.Round(time.Second), i.Record)
	}
}

// wantNoFailures checks the reconciler's response to a direct batch.
func wantNoFailures(t *testing.T, inv *replay.Invocation) {
	t.Helper()
	if resp := decode[events.SQSEventResponse](t, inv); len(resp.BatchItemFailures) != 0 {
		t.Errorf("batch item failures %+v, want none", resp.BatchItemFailures)
	}
}

// wantBatches checks what the reconciler's batches came to, summed: the
// mapping may split the queued work in several.
func wantBatches(t *testing.T, inv *replay.Invocation, want reaper.BatchSummary) {
	t.Helper()
	var got reaper.BatchSummary
	for _, b := range inv.Batches {
		got.Messages += b.Messages
		got.Instances += b.Instances
		got.Invalid += b.Invalid
		got.Lookups += b.Lookups
		got.Skipped += b.Skipped
		got.Rejected += b.Rejected
		got.Reconciled += b.Reconciled
		got.Patched += b.Patched
		got.Terminated += b.Terminated
		got.Orphans += b.Orphans
		got.Deferred += b.Deferred
		got.Failed += b.Failed
	}
	if got != want {
		t.Errorf("reconciler batches %+v come to %+v, want %+v", inv.Batches, got, want)
	}
}

// wantTerminated checks the instances of the accepted TerminateInstances
// calls.
func wantTerminated(t *testing.T, inv *replay.Invocation, ids ...string) {
	t.Helper()
	if !slices.Equal(inv.Terminated, ids) {
		t.Errorf("TerminateInstances of %v, want %v", inv.Terminated, ids)
	}
}

// wantPod checks the one seeded Pod, the sample Pod; exitCode -1 wants
// none.
func wantPod(t *testing.T, inv *replay.Invocation, phase corev1.PodPhase, exitCode int32, reason string, restarts int32) {
	t.Helper()
	if len(inv.Pods) != 1 {
		t.Fatalf("seeded Pods %+v, want the sample Pod", inv.Pods)
	}
	wantPodNamed(t, inv, replay.SamplePod, phase, exitCode, reason, restarts)
}

// wantPodNamed checks the seeded Pod default/name.
func wantPodNamed(t *testing.T, inv *replay.Invocation, name string, phase corev1.PodPhase, exitCode int32, reason string, restarts int32) {
	t.Helper()
	i := slices.IndexFunc(inv.Pods, func(p replay.PodView) bool { return p.Namespace == replay.SampleNamespace && p.Name == name })
	if i < 0 {
		t.Fatalf("seeded Pods %+v, want %s/%s", inv.Pods, replay.SampleNamespace, name)
	}
	p := inv.Pods[i]
	got := int32(-1)
	if p.ExitCode != nil {
		got = *p.ExitCode
	}
	if p.Gone || p.Phase != phase || got != exitCode || p.Reason != reason || p.Restarts != restarts {
		t.Errorf("pod %s/%s: %s; want %s, exit code %d, reason %q, restarts %d", p.Namespace, p.Name, podAfter(p), phase, exitCode, reason, restarts)
	}
}

// wantInstance checks the one seeded instance, the sample instance.
func wantInstance(t *testing.T, inv *replay.Invocation, state ec2server.State) {
	t.Helper()
	if len(inv.Instances) != 1 {
		t.Fatalf("seeded instances %+v, want the sample instance", inv.Instances)
	}
	wantInstanceNamed(t, inv, replay.SampleInstanceID, state)
}

// wantInstanceNamed checks the state of the seeded instance id.
func wantInstanceNamed(t *testing.T, inv *replay.Invocation, id string, state ec2server.State) {
	t.Helper()
	i := slices.IndexFunc(inv.Instances, func(i replay.InstanceView) bool { return i.ID == id })
	if i < 0 || inv.Instances[i].After != state {
		t.Errorf("instances %+v, want %s %s", inv.Instances, id, state)
	}
}
