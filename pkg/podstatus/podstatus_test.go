package podstatus

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reaper-k8s/reaper/pkg/model"
)

var (
	t0  = time.Date(2026, 11, 30, 6, 0, 0, 0, time.UTC)
	now = t0.Add(time.Hour)
)

func runningPod(containers ...string) *corev1.Pod {
	p := &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	for _, c := range containers {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: c, Image: "repo/" + c + ":1"})
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{
			Name: c, Image: "repo/" + c + ":1", ImageID: "sha256:" + c, ContainerID: "containerd://" + c, Ready: true,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(t0)}},
		})
	}
	return p
}

func exit(code int, mutate ...func(*model.Exit)) model.Outcome {
	e := &model.Exit{Container: "main", ContainerID: "abc", ExitCode: code, StartedAt: t0, FinishedAt: now}
	for _, m := range mutate {
		m(e)
	}
	return model.Outcome{InstanceID: "i-0123456789abcdef0", Exits: []model.Exit{*e}}
}

// TestTruthTable walks the rows of the status truth table of a Pod of one
// container (docs/concepts.md, "A Pod of one container").
func TestTruthTable(t *testing.T) {
	for _, tc := range []struct {
		name         string
		pod          *corev1.Pod
		outcome      model.Outcome
		phase        corev1.PodPhase
		code         int32
		reason       string
		restarts     int32
		lastTerm     bool
		waiting      string
		disruptionTo string
	}{
		{name: "exit 0", pod: runningPod("main"), outcome: exit(0), phase: corev1.PodSucceeded, reason: ReasonCompleted},
		{name: "exit 1", pod: runningPod("main"), outcome: exit(1), phase: corev1.PodFailed, code: 1, reason: ReasonError},
		{name: "oom", pod: runningPod("main"), outcome: exit(137, func(e *model.Exit) { e.OOMKilled = true }), phase: corev1.PodFailed, code: 137, reason: ReasonOOMKilled},
		{name: "oom reported as 0", pod: runningPod("main"), outcome: exit(0, func(e *model.Exit) { e.OOMKilled = true }), phase: corev1.PodFailed, code: 137, reason: ReasonOOMKilled},
		{name: "restarting", pod: runningPod("main"), outcome: exit(1, func(e *model.Exit) { e.WillRestart, e.RestartCount, e.BackoffSeconds = true, 2, 40 }),
			phase: corev1.PodRunning, code: 1, reason: ReasonError, restarts: 3, lastTerm: true, waiting: ReasonCrashLoopBackOff},
		{name: "restart cap reached", pod: runningPod("main"), outcome: exit(1, func(e *model.Exit) { e.RestartCount = 5 }), phase: corev1.PodFailed, code: 1, reason: ReasonError, restarts: 5},
		{name: "lost", pod: runningPod("main"), outcome: model.Outcome{InstanceID: "i-0123456789abcdef0", Lost: &model.Gone{State: "terminated", At: t0}, LostAfter: 3 * time.Minute},
			phase: corev1.PodFailed, code: ExitCodeUnknown, reason: ReasonStatusUnknown, disruptionTo: "InstanceTerminated"},
		{name: "lost by stop", pod: runningPod("main"), outcome: model.Outcome{InstanceID: "i-0123456789abcdef0", Lost: &model.Gone{State: "stopped", At: t0}, LostAfter: time.Minute},
			phase: corev1.PodFailed, code: ExitCodeUnknown, reason: ReasonStatusUnknown, disruptionTo: "InstanceStopped"},
		{name: "pending pod without statuses", pod: &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "img"}}}, Status: corev1.PodStatus{Phase: corev1.PodPending}},
			outcome: exit(0), phase: corev1.PodSucceeded, reason: ReasonCompleted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, ok := Build(tc.pod, tc.outcome, now)
			if !ok {
				t.Fatal("no write planned")
			}
			if s.Phase != tc.phase {
				t.Fatalf("phase %s, want %s", s.Phase, tc.phase)
			}
			if len(s.ContainerStatuses) != 1 {
				t.Fatalf("%d container statuses", len(s.ContainerStatuses))
			}
			cs := s.ContainerStatuses[0]
			if cs.Name != "main" || cs.Image == "" || cs.Ready || cs.RestartCount != tc.restarts {
				t.Fatalf("container status %+v", cs)
			}
			if states := countStates(cs.State); states != 1 {
				t.Fatalf("%d states set, want exactly one", states)
			}
			term := cs.State.Terminated
			if tc.lastTerm {
				term = cs.LastTerminationState.Terminated
				if cs.State.Waiting == nil || cs.State.Waiting.Reason != tc.waiting {
					t.Fatalf("waiting %+v, want %s", cs.State.Waiting, tc.waiting)
				}
			}
			if term == nil || term.ExitCode != tc.code || term.Reason != tc.reason {
				t.Fatalf("terminated %+v, want code %d reason %s", term, tc.code, tc.reason)
			}
			var disruption *corev1.PodCondition
			for i, c := range s.Conditions {
				if c.Type == corev1.DisruptionTarget {
					disruption = &s.Conditions[i]
				}
			}
			if (disruption != nil) != (tc.disruptionTo != "") || (disruption != nil && (disruption.Reason != tc.disruptionTo || disruption.Status != corev1.ConditionTrue || disruption.Message == "")) {
				t.Fatalf("DisruptionTarget %+v, want reason %q", disruption, tc.disruptionTo)
			}
		})
	}
}

func countStates(s corev1.ContainerState) int {
	n := 0
	for _, set := range []bool{s.Waiting != nil, s.Running != nil, s.Terminated != nil} {
		if set {
			n++
		}
	}
	return n
}

func TestBuildKeepsWhatItDoesNotOwn(t *testing.T) {
	pod := runningPod("main", "shipper")
	s, ok := Build(pod, exit(0), now)
	if !ok {
		t.Fatal("no write")
	}
	main, shipper := s.ContainerStatuses[0], s.ContainerStatuses[1]
	if main.ImageID != "sha256:main" || main.ContainerID != "containerd://main" || main.State.Terminated.ContainerID != "containerd://main" {
		t.Fatalf("image/container ids not carried: %+v", main)
	}
	// The other regular container still runs: its status is kept as it
	// is, and the Pod with it.
	if shipper.State.Running == nil || shipper.ImageID != "sha256:shipper" {
		t.Fatalf("shipper %+v", shipper)
	}
	if s.Phase != corev1.PodRunning {
		t.Fatalf("phase %s: a container still runs", s.Phase)
	}
	// Its own end, with the first one's, ends the Pod: one failed.
	pod.Status = s
	second := exit(3)
	second.Exits = append(second.Exits, model.Exit{Container: "shipper", ExitCode: 3, StartedAt: t0, FinishedAt: now})
	second.Exits[0].ExitCode = 0
	s, ok = Build(pod, second, now)
	if !ok || s.Phase != corev1.PodFailed {
		t.Fatalf("phase %s (write %v), want Failed", s.Phase, ok)
	}
	if c := s.ContainerStatuses[0].State.Terminated; c == nil || c.ExitCode != 0 {
		t.Fatalf("main %+v", s.ContainerStatuses[0])
	}
	if c := s.ContainerStatuses[1].State.Terminated; c == nil || c.ExitCode != 3 || s.ContainerStatuses[1].ImageID != "sha256:shipper" {
		t.Fatalf("shipper %+v", s.ContainerStatuses[1])
	}
}

func TestBuildNeverRewrites(t *testing.T) {
	for _, phase := range []corev1.PodPhase{corev1.PodSucceeded, corev1.PodFailed} {
		p := runningPod("main")
		p.Status.Phase = phase
		if _, ok := Build(p, exit(1), now); ok {
			t.Fatalf("%s pod would be rewritten", phase)
		}
	}
	p := runningPod("main")
	p.Status.ContainerStatuses[0].RestartCount = 4
	if _, ok := Build(p, exit(1, func(e *model.Exit) { e.WillRestart, e.RestartCount = true, 2 }), now); ok {
		t.Fatal("an older restart would overwrite a newer one")
	}
}

func TestOutcomeKey(t *testing.T) {
	if k := exit(0, func(e *model.Exit) { e.RestartCount = 3 }).Key(); k != "exit/3" {
		t.Fatal(k)
	}
	if k := (model.Outcome{Lost: &model.Gone{}}).Key(); k != "lost" {
		t.Fatal(k)
	}
}

// TestEvents: the Event that goes with each row of the truth table.
func TestEvents(t *testing.T) {
	lost := model.Outcome{InstanceID: "i-0123456789abcdef0", Lost: &model.Gone{State: "terminated", At: t0}, LostAfter: 3 * time.Minute}
	for _, tc := range []struct {
		name              string
		o                 model.Outcome
		phase             corev1.PodPhase
		reason, msg, kind string
	}{
		{"exit 0", exit(0), corev1.PodSucceeded, EventContainerExited,
			"container main exited with code 0 on instance i-0123456789abcdef0; pod is Succeeded", corev1.EventTypeNormal},
		{"exit 1", exit(1), corev1.PodFailed, EventContainerExited,
			"container main exited with code 1 on instance i-0123456789abcdef0; pod is Failed", corev1.EventTypeWarning},
		{"OOM", exit(137, func(e *model.Exit) { e.OOMKilled = true }), corev1.PodFailed, EventContainerExited,
			"container main exited with code 137 (OOMKilled) on instance i-0123456789abcdef0; pod is Failed", corev1.EventTypeWarning},
		{"runtime restart", exit(0, func(e *model.Exit) { e.RuntimeRestarted = true }), corev1.PodSucceeded, EventContainerExited,
			"container main exited with code 0 after a container runtime restart on instance i-0123456789abcdef0; pod is Succeeded", corev1.EventTypeNormal},
		{"restart", exit(1, func(e *model.Exit) { e.WillRestart, e.RestartCount, e.BackoffSeconds = true, 2, 40 }), corev1.PodRunning, EventContainerRestarted,
			"container main exited with code 1 on instance i-0123456789abcdef0; restart 3 in 40s", corev1.EventTypeWarning},
		{"lost", lost, corev1.PodFailed, EventInstanceLost,
			"Instance i-0123456789abcdef0 went terminated with no container exit reported; container status unknown", corev1.EventTypeWarning},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reason, msg, kind := Event(tc.o, tc.phase)
			if reason != tc.reason || msg != tc.msg || kind != tc.kind {
				t.Fatalf("event %s %q %s, want %s %q %s", reason, msg, kind, tc.reason, tc.msg, tc.kind)
			}
		})
	}
}

// A regular container starts only once every regular init container
// completed, so its exit proves them completed even when their own lines
// never came: the Pod ends with the main container's truth, under every
// policy, whether the instance is still there or gone.
func TestInitCompletedByLaterStart(t *testing.T) {
	for _, policy := range []corev1.RestartPolicy{corev1.RestartPolicyNever, corev1.RestartPolicyOnFailure, corev1.RestartPolicyAlways} {
		for _, lost := range []bool{false, true} {
			pod := runningPod("main")
			pod.Spec.RestartPolicy = policy
			pod.Spec.InitContainers = []corev1.Container{{Name: "setup", Image: "repo/setup:1"}}
			pod.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: "setup", Image: "repo/setup:1",
				State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(t0)}}}}
			o := exit(0)
			if lost {
				o.Lost, o.LostAfter = &model.Gone{State: model.StateTerminated, At: now}, time.Minute
			}
			s, ok := Build(pod, o, now)
			if !ok || s.Phase != corev1.PodSucceeded {
				t.Fatalf("%s, lost %v: phase %s (write %v), want Succeeded", policy, lost, s.Phase, ok)
			}
			if term := s.InitContainerStatuses[0].State.Terminated; term == nil || term.ExitCode != 0 || term.Reason != ReasonCompleted {
				t.Fatalf("%s, lost %v: setup %+v, want completed", policy, lost, s.InitContainerStatuses[0].State)
			}
			for _, c := range s.Conditions {
				if c.Type == corev1.PodInitialized && c.Status != corev1.ConditionTrue {
					t.Fatalf("%s, lost %v: Initialized %s", policy, lost, c.Status)
				}
				if c.Type == corev1.DisruptionTarget {
					t.Fatalf("%s, lost %v: DisruptionTarget on a Pod that succeeded", policy, lost)
				}
			}
		}
	}
}

// A regular init container the host will not run again (its restart cap
// reached) fails the Pod whatever its policy: nothing after it will run.
func TestInitFailedForGood(t *testing.T) {
	for _, policy := range []corev1.RestartPolicy{corev1.RestartPolicyOnFailure, corev1.RestartPolicyAlways} {
		pod := &corev1.Pod{Spec: corev1.PodSpec{RestartPolicy: policy,
			InitContainers: []corev1.Container{{Name: "setup"}}, Containers: []corev1.Container{{Name: "main"}}},
			Status: corev1.PodStatus{Phase: corev1.PodPending}}
		o := model.Outcome{Exits: []model.Exit{{Container: "setup", ExitCode: 1, RestartCount: 5, FinishedAt: now}}}
		s, ok := Build(pod, o, now)
		if !ok || s.Phase != corev1.PodFailed {
			t.Fatalf("%s: phase %s (write %v), want Failed", policy, s.Phase, ok)
		}
		if w := s.ContainerStatuses[0].State.Waiting; w == nil || w.Reason != ReasonPodInitializing {
			t.Fatalf("%s: main %+v, want waiting %s", policy, s.ContainerStatuses[0].State, ReasonPodInitializing)
		}
	}
}
