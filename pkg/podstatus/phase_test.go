package podstatus

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// The statuses a container can show, as the kubelet would write them.

func phRunning(name string) corev1.ContainerStatus {
	return corev1.ContainerStatus{Name: name, Started: new(true),
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}
}

// phStarting is a sidecar that runs but whose startup probe has not passed.
func phStarting(name string) corev1.ContainerStatus {
	cs := phRunning(name)
	cs.Started = new(false)
	return cs
}

func phWaiting(name, reason string) corev1.ContainerStatus {
	return corev1.ContainerStatus{Name: name, Started: new(false),
		State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason}}}
}

func phExited(name string, code int32) corev1.ContainerStatus {
	return corev1.ContainerStatus{Name: name, Started: new(false),
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code}}}
}

// phBackoff is a container that exited with code and waits to be
// restarted.
func phBackoff(name string, code int32) corev1.ContainerStatus {
	return corev1.ContainerStatus{Name: name, Started: new(false), RestartCount: 1,
		State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: ReasonCrashLoopBackOff}},
		LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code}}}
}

// phSpec is a Pod spec under policy: its init containers (a name starting
// with "sidecar" is a native sidecar) and its regular containers.
func phSpec(policy corev1.RestartPolicy, inits []string, regulars ...string) *corev1.PodSpec {
	spec := &corev1.PodSpec{RestartPolicy: policy}
	for _, n := range inits {
		c := corev1.Container{Name: n}
		if len(n) >= 7 && n[:7] == "sidecar" {
			c.RestartPolicy = new(corev1.ContainerRestartPolicyAlways)
		}
		spec.InitContainers = append(spec.InitContainers, c)
	}
	for _, n := range regulars {
		spec.Containers = append(spec.Containers, corev1.Container{Name: n})
	}
	return spec
}

func phInits(names ...string) []string { return names }

func phStatuses(s ...corev1.ContainerStatus) []corev1.ContainerStatus { return s }

// TestPhaseRules holds Phase to the kubelet's rules, one rule a group.
func TestPhaseRules(t *testing.T) {
	const (
		never     = corev1.RestartPolicyNever
		onFailure = corev1.RestartPolicyOnFailure
		always    = corev1.RestartPolicyAlways
	)
	for _, tc := range []struct {
		name        string
		spec        *corev1.PodSpec
		init, regs  []corev1.ContainerStatus
		terminal    bool // podIsTerminal: nothing of the Pod runs again
		initialized bool // podHasInitialized
		want        corev1.PodPhase
	}{
		// A regular init container that failed under Never fails the Pod,
		// whatever the containers after it show.
		{name: "init failed, Never", spec: phSpec(never, phInits("init"), "main"),
			init: phStatuses(phExited("init", 1)), regs: phStatuses(phWaiting("main", ReasonPodInitializing)), want: corev1.PodFailed},
		{name: "second init failed, Never", spec: phSpec(never, phInits("a", "b"), "main"),
			init: phStatuses(phExited("a", 0), phExited("b", 2)), regs: phStatuses(phWaiting("main", ReasonPodInitializing)), want: corev1.PodFailed},
		{name: "init failed, Never, sidecar running", spec: phSpec(never, phInits("sidecar", "init"), "main"),
			init: phStatuses(phRunning("sidecar"), phExited("init", 1)), regs: phStatuses(phWaiting("main", ReasonPodInitializing)), want: corev1.PodFailed},
		{name: "init failed, Never, terminal", spec: phSpec(never, phInits("init"), "main"),
			init: phStatuses(phExited("init", 1)), regs: phStatuses(phWaiting("main", ReasonPodInitializing)), terminal: true, want: corev1.PodFailed},
		// Under OnFailure and Always a failed init container is restarted:
		// the Pod's init is incomplete, so it is Pending.
		{name: "init restarting, OnFailure", spec: phSpec(onFailure, phInits("init"), "main"),
			init: phStatuses(phBackoff("init", 1)), regs: phStatuses(phWaiting("main", ReasonPodInitializing)), want: corev1.PodPending},
		{name: "init restarting, Always", spec: phSpec(always, phInits("init"), "main"),
			init: phStatuses(phBackoff("init", 1)), regs: phStatuses(phWaiting("main", ReasonPodInitializing)), want: corev1.PodPending},
		{name: "init failed, OnFailure", spec: phSpec(onFailure, phInits("init"), "main"),
			init: phStatuses(phExited("init", 1)), regs: phStatuses(phWaiting("main", ReasonPodInitializing)), want: corev1.PodPending},

		// While init is incomplete, and no regular container has started,
		// the Pod is Pending.
		{name: "init running", spec: phSpec(never, phInits("init"), "main"),
			init: phStatuses(phRunning("init")), regs: phStatuses(phWaiting("main", ReasonPodInitializing)), want: corev1.PodPending},
		{name: "init not reported", spec: phSpec(never, phInits("init"), "main"),
			regs: phStatuses(phWaiting("main", ReasonPodInitializing)), want: corev1.PodPending},
		{name: "init waiting", spec: phSpec(onFailure, phInits("init"), "main"),
			init: phStatuses(phWaiting("init", "PodInitializing")), regs: phStatuses(phWaiting("main", ReasonPodInitializing)), want: corev1.PodPending},
		{name: "first init done, second running", spec: phSpec(never, phInits("a", "b"), "main"),
			init: phStatuses(phExited("a", 0), phRunning("b")), regs: phStatuses(phWaiting("main", ReasonPodInitializing)), want: corev1.PodPending},
		{name: "first init done, second not started", spec: phSpec(always, phInits("a", "b"), "main"),
			init: phStatuses(phExited("a", 0), phWaiting("b", ReasonPodInitializing)), regs: phStatuses(phWaiting("main", ReasonPodInitializing)), want: corev1.PodPending},
		{name: "sidecar running, init running", spec: phSpec(never, phInits("sidecar", "init"), "main"),
			init: phStatuses(phRunning("sidecar"), phRunning("init")), regs: phStatuses(phWaiting("main", ReasonPodInitializing)), want: corev1.PodPending},
		{name: "sidecar starting before the Pod initialized", spec: phSpec(never, phInits("sidecar"), "main"),
			init: phStatuses(phStarting("sidecar")), regs: phStatuses(phWaiting("main", ReasonPodInitializing)), want: corev1.PodPending},
		// The kubelet starts the regular containers once a sidecar passed its
		// startup; until the Pod first initialized, one that has not keeps
		// it Pending.
		{name: "sidecar not started, Pod not initialized", spec: phSpec(never, phInits("sidecar"), "main"),
			init: phStatuses(phStarting("sidecar")), regs: phStatuses(phRunning("main")), want: corev1.PodPending},
		{name: "init incomplete, Pod terminal", spec: phSpec(onFailure, phInits("init"), "main"),
			init: phStatuses(phRunning("init")), regs: phStatuses(phWaiting("main", ReasonPodInitializing)), terminal: true, want: corev1.PodPending},

		// While a regular container or a sidecar runs, the Pod is Running.
		{name: "main running", spec: phSpec(never, nil, "main"),
			regs: phStatuses(phRunning("main")), want: corev1.PodRunning, initialized: true},
		{name: "init done, main running", spec: phSpec(never, phInits("init"), "main"),
			init: phStatuses(phExited("init", 0)), regs: phStatuses(phRunning("main")), initialized: true, want: corev1.PodRunning},
		{name: "one exited 0, other running", spec: phSpec(never, nil, "a", "b"),
			regs: phStatuses(phExited("a", 0), phRunning("b")), initialized: true, want: corev1.PodRunning},
		{name: "one failed under Never, other running", spec: phSpec(never, nil, "a", "b"),
			regs: phStatuses(phExited("a", 3), phRunning("b")), initialized: true, want: corev1.PodRunning},
		{name: "main exited 0, sidecar running", spec: phSpec(never, phInits("sidecar"), "main"),
			init: phStatuses(phRunning("sidecar")), regs: phStatuses(phExited("main", 0)), initialized: true, want: corev1.PodRunning},
		{name: "main failed, sidecar running, terminal", spec: phSpec(never, phInits("sidecar"), "main"),
			init: phStatuses(phRunning("sidecar")), regs: phStatuses(phExited("main", 1)), terminal: true, initialized: true, want: corev1.PodRunning},
		{name: "sidecar starting after the Pod initialized", spec: phSpec(never, phInits("sidecar"), "main"),
			init: phStatuses(phStarting("sidecar")), regs: phStatuses(phExited("main", 0)), initialized: true, want: corev1.PodRunning},
		{name: "init done, sidecar and main running", spec: phSpec(always, phInits("init", "sidecar"), "main"),
			init: phStatuses(phExited("init", 0), phRunning("sidecar")), regs: phStatuses(phRunning("main")), initialized: true, want: corev1.PodRunning},

		// Terminated sidecars do not count: the regular containers decide.
		{name: "main exited 0, sidecar 143", spec: phSpec(never, phInits("sidecar"), "main"),
			init: phStatuses(phExited("sidecar", 143)), regs: phStatuses(phExited("main", 0)), terminal: true, initialized: true, want: corev1.PodSucceeded},
		{name: "main exited 0, sidecar lost", spec: phSpec(always, phInits("sidecar"), "main"),
			init: phStatuses(phExited("sidecar", ExitCodeUnknown)), regs: phStatuses(phExited("main", 0)), terminal: true, initialized: true, want: corev1.PodSucceeded},
		{name: "main exited 0, sidecar restarting", spec: phSpec(onFailure, phInits("sidecar"), "main"),
			init: phStatuses(phBackoff("sidecar", 1)), regs: phStatuses(phExited("main", 0)), initialized: true, want: corev1.PodSucceeded},
		{name: "main failed, sidecar exited 0", spec: phSpec(never, phInits("sidecar"), "main"),
			init: phStatuses(phExited("sidecar", 0)), regs: phStatuses(phExited("main", 1)), terminal: true, initialized: true, want: corev1.PodFailed},
		{name: "sidecar exited, main running", spec: phSpec(never, phInits("sidecar"), "main"),
			init: phStatuses(phExited("sidecar", 1)), regs: phStatuses(phRunning("main")), initialized: true, want: corev1.PodRunning},

		// Every regular container ended for good: Succeeded when all
		// exited 0, else Failed.
		{name: "all exited 0, Never", spec: phSpec(never, nil, "a", "b"),
			regs: phStatuses(phExited("a", 0), phExited("b", 0)), terminal: true, initialized: true, want: corev1.PodSucceeded},
		{name: "one exited 3, Never", spec: phSpec(never, nil, "a", "b"),
			regs: phStatuses(phExited("a", 0), phExited("b", 3)), terminal: true, initialized: true, want: corev1.PodFailed},
		{name: "all exited 0, OnFailure", spec: phSpec(onFailure, nil, "a", "b"),
			regs: phStatuses(phExited("a", 0), phExited("b", 0)), terminal: true, initialized: true, want: corev1.PodSucceeded},
		{name: "one exited 3 for good, OnFailure", spec: phSpec(onFailure, nil, "a", "b"),
			regs: phStatuses(phExited("a", 0), phExited("b", 3)), terminal: true, initialized: true, want: corev1.PodFailed},
		{name: "all exited 0 for good, Always", spec: phSpec(always, nil, "a", "b"),
			regs: phStatuses(phExited("a", 0), phExited("b", 0)), terminal: true, initialized: true, want: corev1.PodSucceeded},
		{name: "one exited 3 for good, Always", spec: phSpec(always, nil, "a", "b"),
			regs: phStatuses(phExited("a", 3), phExited("b", 0)), terminal: true, initialized: true, want: corev1.PodFailed},
		{name: "init done, main exited 0", spec: phSpec(never, phInits("a", "b"), "main"),
			init: phStatuses(phExited("a", 0), phExited("b", 0)), regs: phStatuses(phExited("main", 0)), terminal: true, initialized: true, want: corev1.PodSucceeded},
		{name: "main lost", spec: phSpec(never, nil, "main"),
			regs: phStatuses(phExited("main", ExitCodeUnknown)), terminal: true, initialized: true, want: corev1.PodFailed},

		// Not yet for good: the policy restarts them.
		{name: "exited 0, Never, not yet terminal", spec: phSpec(never, nil, "main"),
			regs: phStatuses(phExited("main", 0)), initialized: true, want: corev1.PodSucceeded},
		{name: "exited 1, Never, not yet terminal", spec: phSpec(never, nil, "main"),
			regs: phStatuses(phExited("main", 1)), initialized: true, want: corev1.PodFailed},
		{name: "exited 1, OnFailure restarts it", spec: phSpec(onFailure, nil, "main"),
			regs: phStatuses(phExited("main", 1)), initialized: true, want: corev1.PodRunning},
		{name: "exited 0, OnFailure", spec: phSpec(onFailure, nil, "main"),
			regs: phStatuses(phExited("main", 0)), initialized: true, want: corev1.PodSucceeded},
		{name: "exited 0, Always restarts it", spec: phSpec(always, nil, "main"),
			regs: phStatuses(phExited("main", 0)), initialized: true, want: corev1.PodRunning},
		{name: "restarting, OnFailure, other exited 0", spec: phSpec(onFailure, nil, "a", "b"),
			regs: phStatuses(phBackoff("a", 1), phExited("b", 0)), initialized: true, want: corev1.PodRunning},
		{name: "restarting, Always", spec: phSpec(always, nil, "a", "b"),
			regs: phStatuses(phBackoff("a", 0), phExited("b", 0)), initialized: true, want: corev1.PodRunning},
		{name: "restarting, OnFailure, sidecar exited", spec: phSpec(onFailure, phInits("sidecar"), "main"),
			init: phStatuses(phExited("sidecar", 143)), regs: phStatuses(phBackoff("main", 2)), initialized: true, want: corev1.PodRunning},
		{name: "restarting when the Pod ended", spec: phSpec(onFailure, nil, "main"),
			regs: phStatuses(phBackoff("main", 1)), terminal: true, initialized: true, want: corev1.PodFailed},
		{name: "exited 0 with a restart pending when the Pod ended", spec: phSpec(always, nil, "main"),
			regs: phStatuses(phBackoff("main", 0)), terminal: true, initialized: true, want: corev1.PodFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Phase(tc.spec, tc.init, tc.regs, tc.terminal, tc.initialized); got != tc.want {
				t.Fatalf("phase %s, want %s", got, tc.want)
			}
		})
	}
}

func TestKindOfContainers(t *testing.T) {
	spec := phSpec(corev1.RestartPolicyNever, phInits("init", "sidecar"), "main")
	// An init container with an explicit restartPolicy other than Always
	// is not a sidecar.
	spec.InitContainers = append(spec.InitContainers, corev1.Container{Name: "plain", RestartPolicy: new(corev1.ContainerRestartPolicy("Never"))})
	for name, want := range map[string]Kind{"init": KindInit, "sidecar": KindSidecar, "main": KindRegular, "plain": KindInit, "other": KindNone} {
		if got := KindOf(spec, name); got != want {
			t.Errorf("KindOf(%s) = %d, want %d", name, got, want)
		}
	}
}
