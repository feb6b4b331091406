package podstatus

import (
	corev1 "k8s.io/api/core/v1"
)

// Kind is what a container is in its Pod's spec, which decides how its
// end counts towards the Pod's.
type Kind int

const (
	// KindNone: the Pod's spec has no container of that name.
	KindNone Kind = iota
	// KindInit: a regular init container, run to completion before the
	// next one starts.
	KindInit
	// KindSidecar: an init container with restartPolicy Always (a native
	// sidecar), started in turn and kept running beside the regular
	// containers; its end never decides the Pod's.
	KindSidecar
	// KindRegular: a container of spec.containers.
	KindRegular
)

// KindOf is what the container called name is in spec.
func KindOf(spec *corev1.PodSpec, name string) Kind {
	for i := range spec.InitContainers {
		if spec.InitContainers[i].Name == name {
			if isSidecar(&spec.InitContainers[i]) {
				return KindSidecar
			}
			return KindInit
		}
	}
	for i := range spec.Containers {
		if spec.Containers[i].Name == name {
			return KindRegular
		}
	}
	return KindNone
}

func isSidecar(c *corev1.Container) bool {
	return c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
}

// Phase is the kubelet's rule for a Pod's phase (getPhase in
// pkg/kubelet/kubelet_pods.go), over the spec and the statuses of every
// container: regular init containers, sidecars and regular containers,
// each read where the spec declares it. podIsTerminal says nothing of the
// Pod will run again (its containers are not restarted whatever the
// policy); podHasInitialized that its init containers completed once.
//
//   - A regular init container that failed under restartPolicy Never fails
//     the Pod.
//   - While a regular init container has not completed, or a sidecar has
//     not started before the Pod first initialized, or a container waits
//     to start, the Pod is Pending.
//   - While any regular container or sidecar runs, it is Running.
//   - Once no container runs and every regular container has stopped
//     (terminated sidecars do not count): Succeeded when all exited 0,
//     Failed when one did not under Never or when the Pod is terminal,
//     Running while the policy restarts them.
func Phase(spec *corev1.PodSpec, initStatuses, statuses []corev1.ContainerStatus, podIsTerminal, podHasInitialized bool) corev1.PodPhase {
	pendingInit, failedInit := 0, 0
	pendingSidecars := 0
	unknown, running, waiting, stopped, succeeded := 0, 0, 0, 0, 0
	for i := range spec.InitContainers {
		c := &spec.InitContainers[i]
		cs, ok := statusOf(initStatuses, c.Name)
		if isSidecar(c) {
			switch {
			case !ok:
				unknown++
			case cs.State.Running != nil:
				if cs.Started == nil || !*cs.Started {
					pendingSidecars++
				}
				running++
			case cs.State.Terminated != nil:
				// A terminated sidecar does not count.
			case cs.State.Waiting != nil && cs.LastTerminationState.Terminated == nil:
				pendingSidecars++
				waiting++
			case cs.State.Waiting == nil:
				pendingSidecars++
				unknown++
			}
			continue
		}
		switch {
		case !ok, cs.State.Running != nil:
			pendingInit++
		case cs.State.Terminated != nil:
			if cs.State.Terminated.ExitCode != 0 {
				failedInit++
			}
		case cs.State.Waiting != nil && cs.LastTerminationState.Terminated != nil:
			if cs.LastTerminationState.Terminated.ExitCode != 0 {
				failedInit++
			}
		default:
			pendingInit++
		}
	}
	for i := range spec.Containers {
		cs, ok := statusOf(statuses, spec.Containers[i].Name)
		switch {
		case !ok:
			unknown++
		case cs.State.Running != nil:
			running++
		case cs.State.Terminated != nil:
			stopped++
			if cs.State.Terminated.ExitCode == 0 {
				succeeded++
			}
		case cs.State.Waiting != nil && cs.LastTerminationState.Terminated != nil:
			stopped++
		case cs.State.Waiting != nil:
			waiting++
		default:
			unknown++
		}
	}

	if failedInit > 0 && spec.RestartPolicy == corev1.RestartPolicyNever {
		return corev1.PodFailed
	}
	switch {
	case pendingInit > 0 || (pendingSidecars > 0 && !podHasInitialized) || waiting > 0:
		return corev1.PodPending
	case running > 0 && unknown == 0:
		return corev1.PodRunning
	case running == 0 && stopped > 0 && unknown == 0:
		switch {
		case podIsTerminal && stopped == succeeded:
			return corev1.PodSucceeded
		case podIsTerminal:
			return corev1.PodFailed
		case spec.RestartPolicy == corev1.RestartPolicyAlways:
			return corev1.PodRunning
		case stopped == succeeded:
			return corev1.PodSucceeded
		case spec.RestartPolicy == corev1.RestartPolicyNever:
			return corev1.PodFailed
		}
		return corev1.PodRunning // OnFailure restarts the failed ones
	}
	return corev1.PodPending
}

func statusOf(statuses []corev1.ContainerStatus, name string) (corev1.ContainerStatus, bool) {
	for _, cs := range statuses {
		if cs.Name == name {
			return cs, true
		}
	}
	return corev1.ContainerStatus{}, false
}
