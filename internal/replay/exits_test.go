package replay

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reaper-k8s/reaper/internal/ec2server"
	"github.com/reaper-k8s/reaper/pkg/intake"
	"github.com/reaper-k8s/reaper/pkg/ledger"
	"github.com/reaper-k8s/reaper/pkg/model"
)

func prepare(t *testing.T, name string, policy corev1.RestartPolicy, managed func(Subject) bool) *Scenario {
	t.Helper()
	sc, err := lab.Prepare(t.Context(), filepath.Join(recordingsDir, name), policy, managed)
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

func invokeExit(t *testing.T, payload []byte) intake.ExitSummary {
	t.Helper()
	var sum intake.ExitSummary
	if err := lab.Invoke(t.Context(), "exitrecorder", payload, &sum); err != nil {
		t.Fatalf("exitrecorder: %v", err)
	}
	return sum
}

func getPod(t *testing.T, ns, name string) *corev1.Pod {
	t.Helper()
	pod, err := lab.Stack.Kube.CoreV1().Pods(ns).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pod
}

// wantEnded checks a Pod ended with phase, and its container with the exit
// code and reason, keeping the fields only the provider knew.
func wantEnded(t *testing.T, pod *corev1.Pod, phase corev1.PodPhase, code int32, reason string) {
	t.Helper()
	if pod.Status.Phase != phase {
		t.Fatalf("pod %s phase %s, want %s", pod.Name, pod.Status.Phase, phase)
	}
	if len(pod.Status.ContainerStatuses) != 1 {
		t.Fatalf("pod %s has %d container statuses", pod.Name, len(pod.Status.ContainerStatuses))
	}
	cs := pod.Status.ContainerStatuses[0]
	term := cs.State.Terminated
	if term == nil || cs.State.Running != nil || cs.State.Waiting != nil {
		t.Fatalf("pod %s container state %+v, want terminated only", pod.Name, cs.State)
	}
	if term.ExitCode != code || term.Reason != reason {
		t.Fatalf("pod %s exit %d %s, want %d %s", pod.Name, term.ExitCode, term.Reason, code, reason)
	}
	if cs.Ready || cs.ImageID == "" || cs.Image == "" || cs.ContainerID != ContainerID(pod) || term.ContainerID != ContainerID(pod) {
		t.Fatalf("pod %s container status lost provider fields: %+v", pod.Name, cs)
	}
}

func terminateCalls(id string) int {
	n := 0
	for _, c := range lab.Stack.EC2.Calls() {
		if slices.Contains(c.Terminated(), id) {
			n++
		}
	}
	return n
}

// lookups counts the DescribeInstances calls that named id, by InstanceIds
// or by a filter value.
func lookups(id string) int {
	n := 0
	for _, c := range lab.Stack.EC2.Calls() {
		if c.Action == "DescribeInstances" && names(c, id) {
			n++
		}
	}
	return n
}

// names says whether an EC2 request named id, by InstanceIds or by a filter
// value.
func names(c ec2server.Call, id string) bool {
	named := slices.Contains(c.InstanceIDs, id)
	for k, v := range c.Params {
		named = named || (strings.HasPrefix(k, "Filter.") && slices.Contains(v, id))
	}
	return named
}

func instanceState(t *testing.T, id string) ec2server.State {
	t.Helper()
	i, ok := lab.Stack.EC2.Instance(id)
	if !ok {
		t.Fatalf("instance %s unknown", id)
	}
	return i.State
}

func record(t *testing.T, id string) ledger.Record {
	t.Helper()
	return recordOf(t, lab, id)
}

// The observed case: 30 replicas whose command ends. Every Pod must end
// Succeeded and every instance must be terminated exactly once.
func TestReplicas30(t *testing.T) {
	t.Parallel()
	sc := prepare(t, "replicas30", corev1.RestartPolicyNever, nil)
	for _, p := range sc.Payloads("exitrecorder") {
		if sum := invokeExit(t, p); sum.Recorded != 1 || sum.Queued != 1 {
			t.Fatalf("summary %+v", sum)
		}
	}
	if len(sc.Pods) != 30 {
		t.Fatalf("%d pods", len(sc.Pods))
	}
	for name, pod := range sc.Pods {
		wantEnded(t, getPod(t, pod.Namespace, name), corev1.PodSucceeded, 0, "Completed")
		id := sc.Instances[name]
		if s := instanceState(t, id); s != ec2server.Terminated {
			t.Fatalf("instance %s is %s", id, s)
		}
		if n := terminateCalls(id); n != 1 {
			t.Fatalf("instance %s terminated %d times", id, n)
		}
		if rec := record(t, id); rec.PodSynced != "exit/0" || rec.Terminated.IsZero() || rec.Latest().ExitCode != 0 {
			t.Fatalf("ledger %+v", rec)
		}
	}
}

func TestJobOutcomes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		scenario string
		phase    corev1.PodPhase
		code     int32
		reason   string
	}{
		{"job-succeeded", corev1.PodSucceeded, 0, "Completed"},
		{"job-failed", corev1.PodFailed, 1, "Error"},
		{"oom", corev1.PodFailed, 137, "OOMKilled"},
		{"installer", corev1.PodSucceeded, 0, "Completed"},
	} {
		t.Run(tc.scenario, func(t *testing.T) {
			sc := prepare(t, tc.scenario, corev1.RestartPolicyNever, nil)
			invokeExit(t, sc.Payloads("exitrecorder")[0])
			for name, pod := range sc.Pods {
				got := getPod(t, pod.Namespace, name)
				wantEnded(t, got, tc.phase, tc.code, tc.reason)
				if instanceState(t, sc.Instances[name]) != ec2server.Terminated {
					t.Fatal("instance not terminated")
				}
				events, err := lab.Stack.Kube.CoreV1().Events(pod.Namespace).List(t.Context(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
				if err != nil || len(events.Items) != 1 || events.Items[0].Reason != "ContainerExited" {
					t.Fatalf("events %+v %v", events, err)
				}
			}
		})
	}
}

func TestDuplicateDelivery(t *testing.T) {
	t.Parallel()
	sc := prepare(t, "duplicate", corev1.RestartPolicyNever, nil)
	for range 3 {
		invokeExit(t, sc.Payloads("exitrecorder")[0])
	}
	pod := getPod(t, "jobs", "job-duplicate")
	wantEnded(t, pod, corev1.PodSucceeded, 0, "Completed")
	id := sc.Instances["job-duplicate"]
	if n := terminateCalls(id); n != 1 {
		t.Fatalf("terminated %d times", n)
	}
	// One tag lookup per delivery, made by the reconciler for the exit
	// claim; the terminate step uses it rather than looking again.
	if n := lookups(id); n != 3 {
		t.Fatalf("%d tag lookups for 3 deliveries", n)
	}
}

func TestForeignLineRejected(t *testing.T) {
	t.Parallel()
	rec, err := Load(filepath.Join(recordingsDir, "foreign-line"))
	if err != nil {
		t.Fatal(err)
	}
	payload := []byte(rec.Steps[0].Event)
	stream := rec.Steps[0].Logs.LogStream
	sum := invokeExit(t, payload)
	if sum.Rejected != 1 || sum.Recorded != 0 {
		t.Fatalf("summary %+v", sum)
	}
	if _, ok, _ := lab.Ledger.Get(t.Context(), stream); ok {
		t.Fatal("a rejected line reached the ledger")
	}
	for _, c := range lab.Stack.EC2.Calls() {
		if c.Action == "TerminateInstances" && (slices.Contains(c.InstanceIDs, stream) || slices.Contains(c.InstanceIDs, "i-00a11ce000000000b")) {
			t.Fatalf("terminate call %+v", c)
		}
	}
}

func TestMalformedLineInGoodBatch(t *testing.T) {
	t.Parallel()
	sc := prepare(t, "malformed-in-batch", corev1.RestartPolicyAlways, nil)
	sum := invokeExit(t, sc.Payloads("exitrecorder")[0])
	if sum.Lines != 4 || sum.Rejected != 2 || sum.Recorded != 2 {
		t.Fatalf("summary %+v", sum)
	}
	pod := getPod(t, "jobs", "job-batch")
	wantEnded(t, pod, corev1.PodSucceeded, 0, "Completed")
	if rc := pod.Status.ContainerStatuses[0].RestartCount; rc != 1 {
		t.Fatalf("restartCount %d", rc)
	}
	if instanceState(t, sc.Instances["job-batch"]) != ec2server.Terminated {
		t.Fatal("instance not terminated")
	}
}

func TestPodDeletedBeforeLine(t *testing.T) {
	t.Parallel()
	sc := prepare(t, "pod-deleted", corev1.RestartPolicyNever, nil)
	if err := lab.DeletePod(t.Context(), "jobs", "job-deleted"); err != nil {
		t.Fatal(err)
	}
	invokeExit(t, sc.Payloads("exitrecorder")[0])
	id := sc.Instances["job-deleted"]
	if rec := record(t, id); rec.PodSynced != "exit/0" || terminateCalls(id) != 1 {
		t.Fatalf("steps not done: %+v, %d terminate calls", rec, terminateCalls(id))
	}
}

func TestPodReplacedIsUntouched(t *testing.T) {
	t.Parallel()
	sc := prepare(t, "pod-replaced", corev1.RestartPolicyNever, nil)
	if err := lab.DeletePod(t.Context(), "jobs", "job-replaced"); err != nil {
		t.Fatal(err)
	}
	replacement, err := lab.RunningPod(t.Context(), "jobs", "job-replaced", corev1.RestartPolicyNever)
	if err != nil {
		t.Fatal(err)
	}
	invokeExit(t, sc.Payloads("exitrecorder")[0])
	if rec := record(t, sc.Instances["job-replaced"]); rec.PodSynced != "exit/0" {
		t.Fatalf("step not marked done: %+v", rec)
	}
	now := getPod(t, "jobs", "job-replaced")
	if now.UID != replacement.UID || now.ResourceVersion != replacement.ResourceVersion || now.Status.Phase != corev1.PodRunning {
		t.Fatalf("replacement pod was written: %+v", now.Status)
	}
}

// A line from an instance without the managed tag is not believed: the
// Pod it names is left alone, and the instance too.
func TestUnmanagedInstanceKept(t *testing.T) {
	t.Parallel()
	sc := prepare(t, "unmanaged", corev1.RestartPolicyNever, func(Subject) bool { return false })
	id := sc.Instances["job-unmanaged"]
	rejected := lab.rejections(model.ReasonNotManaged)
	if sum := invokeExit(t, sc.Payloads("exitrecorder")[0]); sum.Queued != 1 {
		t.Fatalf("summary %+v", sum)
	}
	if n := lab.rejections(model.ReasonNotManaged) - rejected; n != 1 {
		t.Fatalf("%d lines rejected as not managed, want 1", n)
	}
	if terminateCalls(id) != 0 || instanceState(t, id) != ec2server.Running {
		t.Fatal("unmanaged instance was terminated")
	}
	if pod := getPod(t, "jobs", "job-unmanaged"); pod.Status.Phase != corev1.PodRunning || pod.ResourceVersion != sc.Pods["job-unmanaged"].ResourceVersion {
		t.Fatalf("the Pod of an unmanaged instance was written: %+v", pod.Status)
	}
}

// Restarts under restartPolicy Always keep the Pod Running with the count
// of restarts, and keep the instance.
func TestRestartsKeepPodRunning(t *testing.T) {
	t.Parallel()
	sc := prepare(t, "restarts", corev1.RestartPolicyAlways, nil)
	for _, p := range sc.Payloads("exitrecorder") {
		invokeExit(t, p)
	}
	pod := getPod(t, "services", "web")
	cs := pod.Status.ContainerStatuses[0]
	if pod.Status.Phase != corev1.PodRunning || cs.RestartCount != 2 || cs.State.Waiting == nil || cs.State.Waiting.Reason != "CrashLoopBackOff" {
		t.Fatalf("pod status %+v", pod.Status)
	}
	if last := cs.LastTerminationState.Terminated; last == nil || last.ExitCode != 1 || last.Reason != "Error" {
		t.Fatalf("lastState %+v", cs.LastTerminationState)
	}
	id := sc.Instances["web"]
	if terminateCalls(id) != 0 || instanceState(t, id) != ec2server.Running {
		t.Fatal("instance of a restarting pod was terminated")
	}
	// Restart lines are checked against the tags too: one lookup per
	// delivery, and still no terminate.
	if n := lookups(id); n != 2 {
		t.Fatalf("%d tag lookups for 2 deliveries", n)
	}
}

// A Kubernetes outage must not lose the exit nor keep the instance billing:
// the reconciler terminates without the Pod write and hands the instance
// back to the queue, whose redelivery after the API is back finishes the
// job.
func TestKubernetesDown(t *testing.T) {
	// Not parallel: it stops the apiserver everyone uses.
	sc := prepare(t, "api-down", corev1.RestartPolicyNever, nil)
	id := sc.Instances["job-api-down"]
	lab.Stack.StopAPIServer()
	up := false
	t.Cleanup(func() {
		if !up {
			_ = lab.Stack.StartAPIServer(context.Background())
		}
	})
	if err := lab.InvokeOnly(t.Context(), "exitrecorder", sc.Payloads("exitrecorder")[0], nil); err != nil {
		t.Fatalf("exitrecorder with the apiserver down: %v", err)
	}
	var rec ledger.Record
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		// The reconciler records the exit once it has checked it.
		var err error
		if rec, _, err = lab.Ledger.Get(t.Context(), id); err != nil {
			t.Fatal(err)
		}
		if !rec.Terminated.IsZero() || time.Now().After(deadline) {
			break
		}
	}
	if rec.Latest() == nil || rec.PodSynced != "" || rec.Terminated.IsZero() || instanceState(t, id) != ec2server.Terminated {
		t.Fatalf("ledger with the apiserver down: %+v", rec)
	}
	if err := lab.Stack.StartAPIServer(t.Context()); err != nil {
		t.Fatal(err)
	}
	up = true
	if err := lab.DrainSent(t.Context(), time.Now()); err != nil {
		t.Fatal(err)
	}
	wantEnded(t, getPod(t, "jobs", "job-api-down"), corev1.PodSucceeded, 0, "Completed")
	if n := terminateCalls(id); n != 1 {
		t.Fatalf("terminated %d times", n)
	}
	if rec := record(t, id); rec.PodSynced != "exit/0" {
		t.Fatalf("ledger after the redelivery: %+v", rec)
	}
}

// rejections counts the exit claims the reconcilers have not believed for
// reason so far, from their logs.
func (l *Lab) rejections(reason string) int { return rejectionsOf(l, "", reason) }
