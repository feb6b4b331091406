// Package podstatus computes the status a Pod must carry for an outcome
// Reaper learned about its container or its instance (the truth table in the
// design notes). It is pure: no I/O, so every row is table-tested.
package podstatus

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reaper-k8s/reaper/pkg/model"
)

// Reasons Reaper writes, matching the kubelet's where one exists.
const (
	ReasonCompleted        = "Completed"
	ReasonError            = "Error"
	ReasonOOMKilled        = "OOMKilled"
	ReasonCrashLoopBackOff = "CrashLoopBackOff"
	// ReasonStatusUnknown is the kubelet's reason for a container whose
	// end could not be observed.
	ReasonStatusUnknown = "ContainerStatusUnknown"
	ReasonPodCompleted  = "PodCompleted"
	ReasonNotReady      = "ContainersNotReady"

	// ExitCodeUnknown is what the kubelet reports for a container it lost.
	ExitCodeUnknown = 137

	messageUnknown = "The container could not be located when the pod was terminated"
)

// Terminal reports whether a Pod phase is final. The apiserver does not stop
// a status write from flipping it, so Reaper must.
func Terminal(p corev1.PodPhase) bool { return p == corev1.PodSucceeded || p == corev1.PodFailed }

// Build returns the status the Pod must carry. ok=false means the Pod needs
// no write: it is terminal already, or it already shows a later restart.
// The returned container statuses are complete entries for every container
// in the spec, because a strategic-merge patch replaces that list whole.
func Build(pod *corev1.Pod, o model.Outcome, now time.Time) (status corev1.PodStatus, ok bool) {
	if Terminal(pod.Status.Phase) {
		return corev1.PodStatus{}, false
	}
	ts := metav1.NewTime(now)
	existing := make(map[string]corev1.ContainerStatus, len(pod.Status.ContainerStatuses))
	for _, cs := range pod.Status.ContainerStatuses {
		existing[cs.Name] = cs
	}

	terminal := o.Terminal()
	allSucceeded := true
	statuses := make([]corev1.ContainerStatus, 0, len(pod.Spec.Containers))
	for _, c := range pod.Spec.Containers {
		cs, found := existing[c.Name]
		if !found {
			cs = corev1.ContainerStatus{Name: c.Name, Image: c.Image}
		}
		switch {
		case o.Exit != nil && o.Exit.Container == c.Name:
			if cs.RestartCount > o.Exit.RestartCount+boolInt(o.Exit.WillRestart) {
				return corev1.PodStatus{}, false // a later run is already shown
			}
			cs = exited(cs, *o.Exit)
		case cs.State.Terminated != nil:
			// Ended before; keep it as it is.
		case terminal:
			cs = lost(cs, now)
		}
		if cs.State.Terminated == nil || cs.State.Terminated.ExitCode != 0 {
			allSucceeded = false
		}
		statuses = append(statuses, cs)
	}

	status = corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: statuses}
	notReady := ReasonNotReady
	if terminal {
		status.Phase = corev1.PodFailed
		if allSucceeded && o.Exit != nil {
			status.Phase = corev1.PodSucceeded
		}
		notReady = ReasonPodCompleted
	}
	status.Conditions = []corev1.PodCondition{
		condition(pod, corev1.PodReady, corev1.ConditionFalse, notReady, "", ts),
		condition(pod, corev1.ContainersReady, corev1.ConditionFalse, notReady, "", ts),
	}
	if o.Lost != nil {
		reason, msg := disruption(o)
		status.Conditions = append(status.Conditions, condition(pod, corev1.DisruptionTarget, corev1.ConditionTrue, reason, msg, ts))
	}
	return status, true
}

// exited applies a reported exit to a container's status.
func exited(cs corev1.ContainerStatus, e model.Exit) corev1.ContainerStatus {
	term := &corev1.ContainerStateTerminated{
		ExitCode:    int32(e.ExitCode),
		Signal:      signalNumber(e.Signal),
		Reason:      exitReason(e),
		Message:     e.Error,
		StartedAt:   metav1.NewTime(e.StartedAt),
		FinishedAt:  metav1.NewTime(e.FinishedAt),
		ContainerID: containerID(cs.ContainerID, e.ContainerID),
	}
	if e.OOMKilled && e.ExitCode == 0 {
		term.ExitCode = ExitCodeUnknown // the kernel's SIGKILL
	}
	cs.ContainerID = term.ContainerID
	cs.Ready = false
	cs.Started = new(false)
	if e.WillRestart {
		cs.LastTerminationState = corev1.ContainerState{Terminated: term}
		cs.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{
			Reason:  ReasonCrashLoopBackOff,
			Message: fmt.Sprintf("back-off %s restarting failed container=%s", time.Duration(e.BackoffSeconds)*time.Second, cs.Name),
		}}
		cs.RestartCount = e.RestartCount + 1
		return cs
	}
	// The status is derived from the latest exit alone, so that exits
	// delivered in any order end the same; earlier runs are counted in
	// restartCount and told by their Events.
	cs.State = corev1.ContainerState{Terminated: term}
	cs.LastTerminationState = corev1.ContainerState{}
	cs.RestartCount = e.RestartCount
	return cs
}

// lost marks a container whose end Reaper could not observe, the way the
// kubelet does.
func lost(cs corev1.ContainerStatus, now time.Time) corev1.ContainerStatus {
	started := metav1.Time{}
	if cs.State.Running != nil {
		started = cs.State.Running.StartedAt
	}
	cs.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
		ExitCode:    ExitCodeUnknown,
		Reason:      ReasonStatusUnknown,
		Message:     messageUnknown,
		StartedAt:   started,
		FinishedAt:  metav1.NewTime(now),
		ContainerID: cs.ContainerID,
	}}
	cs.Ready = false
	cs.Started = new(false)
	return cs
}

func exitReason(e model.Exit) string {
	switch {
	case e.OOMKilled:
		return ReasonOOMKilled
	case e.ExitCode == 0:
		return ReasonCompleted
	default:
		return ReasonError
	}
}

// disruption names what happened to the instance for the DisruptionTarget
// condition.
func disruption(o model.Outcome) (reason, message string) {
	state := o.Lost.State
	switch state {
	case model.StateStopping, model.StateStopped:
		reason = "InstanceStopped"
	default:
		reason = "InstanceTerminated"
	}
	message = fmt.Sprintf("EC2 instance %s went %s at %s and no container exit was reported within %s",
		o.InstanceID, state, o.Lost.At.UTC().Format(time.RFC3339), o.LostAfter)
	return reason, message
}

// condition keeps the transition time when the condition already has the
// status being written, as the kubelet does.
func condition(pod *corev1.Pod, t corev1.PodConditionType, s corev1.ConditionStatus, reason, msg string, now metav1.Time) corev1.PodCondition {
	c := corev1.PodCondition{Type: t, Status: s, Reason: reason, Message: msg, LastTransitionTime: now}
	for _, old := range pod.Status.Conditions {
		if old.Type == t && old.Status == s {
			c.LastTransitionTime = old.LastTransitionTime
		}
	}
	return c
}

// containerID prefers the ID the Pod already shows (it carries the
// runtime's scheme) and otherwise qualifies the wrapper's bare docker ID.
func containerID(current, reported string) string {
	switch {
	case current != "":
		return current
	case reported == "" || strings.Contains(reported, "://"):
		return reported
	default:
		return "docker://" + reported
	}
}

var signals = map[string]int32{
	"SIGHUP": 1, "SIGINT": 2, "SIGQUIT": 3, "SIGABRT": 6, "SIGKILL": 9, "SIGSEGV": 11, "SIGPIPE": 13, "SIGTERM": 15,
}

func signalNumber(name string) int32 { return signals[strings.ToUpper(name)] }

func boolInt(b bool) int32 {
	if b {
		return 1
	}
	return 0
}

// Reasons of the Events Reaper posts on a Pod it writes.
const (
	EventContainerExited    = "ContainerExited"
	EventContainerRestarted = "ContainerRestarting"
	EventInstanceLost       = "InstanceLost"
)

// Event is the Event Reaper posts on a Pod it writes the outcome to, now
// in phase: its reason, its message and its type (Normal or Warning).
func Event(o model.Outcome, phase corev1.PodPhase) (reason, msg, kind string) {
	if o.Exit == nil {
		return EventInstanceLost, fmt.Sprintf("Instance %s went %s with no container exit reported; container status unknown",
			o.InstanceID, o.Lost.State), corev1.EventTypeWarning
	}
	e := o.Exit
	kind = corev1.EventTypeNormal
	if e.ExitCode != 0 || e.OOMKilled {
		kind = corev1.EventTypeWarning
	}
	detail := fmt.Sprintf("container %s exited with code %d", e.Container, e.ExitCode)
	if e.OOMKilled {
		detail += " (OOMKilled)"
	}
	if e.RuntimeRestarted {
		detail += " after a container runtime restart"
	}
	if e.WillRestart {
		return EventContainerRestarted, fmt.Sprintf("%s on instance %s; restart %d in %ds",
			detail, o.InstanceID, e.RestartCount+1, e.BackoffSeconds), kind
	}
	return EventContainerExited, fmt.Sprintf("%s on instance %s; pod is %s", detail, o.InstanceID, phase), kind
}
