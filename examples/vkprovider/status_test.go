package vkprovider

import (
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"

	"github.com/reaper-k8s/reaper/pkg/model"
	"github.com/reaper-k8s/reaper/pkg/podstatus"
)

var launchedAt = time.Date(2026, 5, 4, 9, 0, 0, 0, time.UTC)

// twoContainers is a Pod of two regular containers and no init container.
func twoContainers() *corev1.Pod {
	pod := jobPod()
	pod.Spec.InitContainers = nil
	pod.Spec.Containers = []corev1.Container{{Name: "a", Image: "a:1"}, {Name: "b", Image: "b:1"}}
	return pod
}

// reaperWrites leaves pod with the status Reaper writes for exits, as
// podstatus.Build makes it.
func reaperWrites(t *testing.T, pod *corev1.Pod, exits ...model.Exit) {
	t.Helper()
	for i := range exits {
		exits[i].StartedAt = launchedAt.Add(time.Duration(i) * time.Minute)
		exits[i].FinishedAt = exits[i].StartedAt.Add(30 * time.Second)
		exits[i].ReceivedAt = exits[i].FinishedAt
	}
	st, ok := podstatus.Build(pod, model.Outcome{InstanceID: "i-0123456789abcdef0", Exits: exits}, launchedAt.Add(time.Hour))
	if !ok {
		t.Fatalf("Reaper writes nothing for %+v", exits)
	}
	pod.Status = st
}

// wantWhole checks that st has a complete status for every container of
// pod, in spec order, each in exactly one state, and returns them by name.
func wantWhole(t *testing.T, pod *corev1.Pod, st *corev1.PodStatus) map[string]corev1.ContainerStatus {
	t.Helper()
	out := map[string]corev1.ContainerStatus{}
	for _, l := range []struct {
		spec []corev1.Container
		sts  []corev1.ContainerStatus
	}{{pod.Spec.InitContainers, st.InitContainerStatuses}, {pod.Spec.Containers, st.ContainerStatuses}} {
		if len(l.sts) != len(l.spec) {
			t.Fatalf("%d statuses for %d containers: %+v", len(l.sts), len(l.spec), l.sts)
		}
		for i, cs := range l.sts {
			n := 0
			for _, set := range []bool{cs.State.Waiting != nil, cs.State.Running != nil, cs.State.Terminated != nil} {
				if set {
					n++
				}
			}
			if cs.Name != l.spec[i].Name || cs.Image == "" || cs.Started == nil || n != 1 {
				t.Fatalf("status %d %+v for container %s: want its name, image, started and one state", i, cs, l.spec[i].Name)
			}
			out[cs.Name] = cs
		}
	}
	return out
}

func conditionOf(st *corev1.PodStatus, typ corev1.PodConditionType) corev1.ConditionStatus {
	for _, c := range st.Conditions {
		if c.Type == typ {
			return c.Status
		}
	}
	return ""
}

// wantStable checks that the provider computes the same status again once
// the Pod carries it: it notifies, and virtual-kubelet writes, changes
// only.
func wantStable(t *testing.T, pod *corev1.Pod, st *corev1.PodStatus) {
	t.Helper()
	again := pod.DeepCopy()
	again.Status = *st
	if next := running(again, launchedAt); !apiequality.Semantic.DeepEqual(next, st) {
		t.Fatalf("status changes when the Pod carries it:\n%+v\nthen\n%+v", st, next)
	}
}

func waitingReason(cs corev1.ContainerStatus) string {
	if cs.State.Waiting == nil {
		return ""
	}
	return cs.State.Waiting.Reason
}

// While the instance starts every container waits: those whose turn comes
// first for the instance, the rest for the init containers.
func TestPendingWholePod(t *testing.T) {
	pod := jobPod()
	st := pending(pod)
	got := wantWhole(t, pod, st)
	if st.Phase != corev1.PodPending || waitingReason(got["proxy"]) != InstancePending || waitingReason(got["downloader"]) != InstancePending ||
		waitingReason(got["provisioner"]) != podstatus.ReasonPodInitializing {
		t.Fatalf("pending: %+v", st)
	}
}

// The seed's Pod on a running instance: the sidecar and the first init
// container run, the main container waits for them, and the Pod is
// Pending and not ready until Reaper writes the init container's exit;
// then it runs and is ready. Each status is the same once the Pod
// carries it.
func TestRunningInitThenMain(t *testing.T) {
	pod := jobPod()
	st := running(pod, launchedAt)
	got := wantWhole(t, pod, st)
	if st.Phase != corev1.PodPending || got["proxy"].State.Running == nil || !got["proxy"].Ready ||
		got["downloader"].State.Running == nil || got["downloader"].Ready ||
		waitingReason(got["provisioner"]) != podstatus.ReasonPodInitializing || got["provisioner"].Ready {
		t.Fatalf("at the start: %+v", st)
	}
	for _, c := range []corev1.PodConditionType{corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady} {
		if conditionOf(st, c) != corev1.ConditionFalse {
			t.Fatalf("%s %s before the init container completed: %+v", c, conditionOf(st, c), st.Conditions)
		}
	}
	wantStable(t, pod, st)
	pod.Status = *st

	reaperWrites(t, pod, model.Exit{Container: "downloader", ContainerID: "docker://d", OthersRunning: true})
	st = running(pod, launchedAt)
	got = wantWhole(t, pod, st)
	if term := got["downloader"].State.Terminated; st.Phase != corev1.PodRunning || term == nil || term.Reason != podstatus.ReasonCompleted ||
		got["provisioner"].State.Running == nil || !got["provisioner"].Ready || !got["provisioner"].State.Running.StartedAt.Equal(&term.FinishedAt) {
		t.Fatalf("after the init container's exit: %+v", st)
	}
	for _, c := range []corev1.PodConditionType{corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady} {
		if conditionOf(st, c) != corev1.ConditionTrue {
			t.Fatalf("%s %s once every container runs: %+v", c, conditionOf(st, c), st.Conditions)
		}
	}
	wantStable(t, pod, st)
}

// One container's exit Reaper wrote stays while the other runs: the Pod
// runs on, not ready.
func TestRunningKeepsReapersExit(t *testing.T) {
	pod := twoContainers()
	pod.Status = *running(pod, launchedAt)
	reaperWrites(t, pod, model.Exit{Container: "a", ContainerID: "docker://a", OthersRunning: true})
	written := pod.Status.ContainerStatuses[0]
	st := running(pod, launchedAt)
	got := wantWhole(t, pod, st)
	if st.Phase != corev1.PodRunning || !apiequality.Semantic.DeepEqual(got["a"], written) || got["b"].State.Running == nil ||
		conditionOf(st, corev1.PodReady) != corev1.ConditionFalse || conditionOf(st, corev1.PodInitialized) != corev1.ConditionTrue {
		t.Fatalf("after a's exit: %+v", st)
	}
	wantStable(t, pod, st)
}

// A container the host restarts in place runs again from its last end,
// with its restart count and last termination.
func TestRunningRestarted(t *testing.T) {
	pod := twoContainers()
	pod.Spec.RestartPolicy = corev1.RestartPolicyOnFailure
	pod.Status = *running(pod, launchedAt)
	reaperWrites(t, pod, model.Exit{Container: "a", ExitCode: 1, WillRestart: true, BackoffSeconds: 10, OthersRunning: true})
	st := running(pod, launchedAt)
	a := wantWhole(t, pod, st)["a"]
	if st.Phase != corev1.PodRunning || a.State.Running == nil || a.RestartCount != 1 || a.LastTerminationState.Terminated == nil ||
		!a.State.Running.StartedAt.Equal(&a.LastTerminationState.Terminated.FinishedAt) {
		t.Fatalf("restarted: %+v", st)
	}
	wantStable(t, pod, st)
}

// Statuses that say the Pod ended are Reaper's to end it with: the
// provider leaves the status as it is.
func TestRunningLeavesTheEndToReaper(t *testing.T) {
	pod := twoContainers()
	pod.Status = *running(pod, launchedAt)
	for i := range pod.Status.ContainerStatuses {
		pod.Status.ContainerStatuses[i].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: podstatus.ReasonCompleted}}
	}
	if st := running(pod, launchedAt); !apiequality.Semantic.DeepEqual(st, &pod.Status) {
		t.Fatalf("status %+v, want the Pod's own", st)
	}
}

// The instance-state provider ends every container the Pod does not show
// ended as gone, and one whose turn never came waits; Reaper's exits stay,
// and sidecars alone going with the instance fail nothing.
func TestFromStateGoneWholePod(t *testing.T) {
	gone := ec2types.Instance{State: &ec2types.InstanceState{Name: ec2types.InstanceStateNameTerminated}, LaunchTime: aws.Time(launchedAt)}

	pod := jobPod()
	pod.Status = *running(pod, launchedAt)
	st := fromState(pod, gone)
	got := wantWhole(t, pod, st)
	for _, name := range []string{"proxy", "downloader"} {
		if term := got[name].State.Terminated; term == nil || term.ExitCode != 255 || term.Reason != InstanceGone {
			t.Fatalf("%s: %+v, want gone", name, got[name].State)
		}
	}
	if st.Phase != corev1.PodFailed || waitingReason(got["provisioner"]) != podstatus.ReasonPodInitializing {
		t.Fatalf("gone during init: %+v", st)
	}

	pod = twoContainers()
	pod.Status = *running(pod, launchedAt)
	reaperWrites(t, pod, model.Exit{Container: "a", OthersRunning: true})
	st = fromState(pod, gone)
	got = wantWhole(t, pod, st)
	if term := got["a"].State.Terminated; st.Phase != corev1.PodFailed || term == nil || term.Reason != podstatus.ReasonCompleted ||
		got["b"].State.Terminated == nil || got["b"].State.Terminated.Reason != InstanceGone {
		t.Fatalf("gone with b running: %+v", st)
	}

	pod = jobPod()
	pod.Spec.InitContainers = slices.DeleteFunc(pod.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == "downloader" })
	pod.Status = *running(pod, launchedAt)
	reaperWrites(t, pod, model.Exit{Container: "provisioner", OthersRunning: true})
	st = fromState(pod, gone)
	got = wantWhole(t, pod, st)
	if st.Phase != corev1.PodSucceeded || got["proxy"].State.Terminated == nil || got["proxy"].State.Terminated.Reason != InstanceGone {
		t.Fatalf("gone with only the sidecar running: %+v", st)
	}
}
