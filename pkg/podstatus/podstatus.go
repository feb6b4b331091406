// Package podstatus computes the status a Pod must carry for an outcome
// Reaper learned about its containers or its instance (the tables of
// docs/concepts.md, "What the Pod ends with"). It is pure: no I/O, so
// every row is table-tested.
package podstatus

import (
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

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
	// ReasonPodInitializing is the kubelet's reason for a container
	// waiting for the Pod's init containers.
	ReasonPodInitializing = "PodInitializing"
	// ReasonNotInitialized is the kubelet's reason for an Initialized
	// condition that is False.
	ReasonNotInitialized = "ContainersNotInitialized"

	// ExitCodeUnknown is what the kubelet reports for a container it lost.
	ExitCodeUnknown = 137

	messageUnknown = "The container could not be located when the pod was terminated"
)

// The kubelet's bounds on termination messages: 4,096 bytes a container,
// and 12 KiB a Pod shared evenly among its containers.
const (
	MaxContainerMessageBytes = 4 << 10
	MaxPodMessageBytes       = 12 << 10
)

// messageBudget is how much of its termination message each container of
// spec shows.
func messageBudget(spec *corev1.PodSpec) int {
	n := len(spec.InitContainers) + len(spec.Containers)
	return min(MaxContainerMessageBytes, MaxPodMessageBytes/max(n, 1))
}

// tail is the last n bytes of s at most, cut at a UTF-8 boundary: the end
// of a message says most, as the kubelet keeps the end of a log.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[len(s)-n:]
	for len(s) > 0 && !utf8.RuneStart(s[0]) {
		s = s[1:]
	}
	return s
}

// Terminal reports whether a Pod phase is final. The apiserver does not stop
// a status write from flipping it, so Reaper must.
func Terminal(p corev1.PodPhase) bool { return p == corev1.PodSucceeded || p == corev1.PodFailed }

// Build returns the status the Pod must carry for o. ok=false means the
// Pod needs no write: it is terminal already, or it already shows later
// runs of every container o reports. The returned statuses are complete
// entries for every init and regular container in the spec, in spec
// order, because a strategic-merge patch replaces each list whole:
//
//   - a container with an exit in o shows it (terminated, or waiting to
//     restart with the exit as its last state);
//   - one that ended before keeps its status;
//   - one whose turn has come (every regular init container before it
//     completed) runs; one the instance took down with it (o.Lost), or a
//     sidecar outliving the grace (o.SidecarsLost), is lost (137,
//     ContainerStatusUnknown);
//   - one whose turn never came waits (PodInitializing).
//
// The phase is the kubelet's (Phase) over those statuses. Reaper ends
// Pods and never moves one between live phases, which are the provider's:
// a phase that is not terminal is written as the Pod has it. An instance
// gone (o.Lost) ends the Pod whatever its policy: nothing will restart;
// a container the host says it restarts keeps it live.
func Build(pod *corev1.Pod, o model.Outcome, now time.Time) (status corev1.PodStatus, ok bool) {
	if Terminal(pod.Status.Phase) {
		return corev1.PodStatus{}, false
	}
	b := builder{pod: pod, o: o, now: metav1.NewTime(now), budget: messageBudget(&pod.Spec), initialized: true,
		completed: completedByLater(pod, o)}
	for _, c := range pod.Spec.InitContainers {
		cs := b.container(c, pod.Status.InitContainerStatuses, isSidecar(&c))
		if !isSidecar(&c) {
			b.initialized = b.initialized && succeededStatus(cs)
			if t := cs.State.Terminated; t != nil && t.FinishedAt.After(b.stageEnd.Time) {
				b.stageEnd = t.FinishedAt
			}
		}
		status.InitContainerStatuses = append(status.InitContainerStatuses, cs)
	}
	regularsEnded := true
	for _, c := range pod.Spec.Containers {
		cs := b.container(c, pod.Status.ContainerStatuses, false)
		regularsEnded = regularsEnded && cs.State.Terminated != nil
		status.ContainerStatuses = append(status.ContainerStatuses, cs)
	}
	if len(o.Exits) > 0 && b.applied == 0 && o.Lost == nil && !o.SidecarsLost {
		return corev1.PodStatus{}, false // later runs are already shown
	}

	terminal := o.Lost != nil || regularsEnded
	status.Phase = Phase(&pod.Spec, status.InitContainerStatuses, status.ContainerStatuses, terminal, b.initialized)
	if o.Lost != nil && !Terminal(status.Phase) {
		status.Phase = corev1.PodFailed
	}
	if b.initFailed && !Terminal(status.Phase) {
		status.Phase = corev1.PodFailed
	}
	if b.restarting && o.Lost == nil && !b.initFailed {
		// The host restarts a container: the Pod lives on, whatever the
		// spec's policy says (a host can keep its own Pod live anyway, by
		// never reporting its end).
		status.Phase = ""
	}
	notReady := ReasonPodCompleted
	if !Terminal(status.Phase) {
		status.Phase, notReady = pod.Status.Phase, ReasonNotReady
		if status.Phase == "" {
			status.Phase = corev1.PodPending
		}
	}
	status.Conditions = []corev1.PodCondition{
		condition(pod, corev1.PodReady, corev1.ConditionFalse, notReady, "", b.now),
		condition(pod, corev1.ContainersReady, corev1.ConditionFalse, notReady, "", b.now),
	}
	if len(pod.Spec.InitContainers) > 0 {
		initialized, reason := corev1.ConditionTrue, ""
		if !b.initialized {
			initialized, reason = corev1.ConditionFalse, ReasonNotInitialized
		}
		status.Conditions = append(status.Conditions, condition(pod, corev1.PodInitialized, initialized, reason, "", b.now))
	}
	if o.Lost != nil && status.Phase == corev1.PodFailed {
		reason, msg := disruption(o)
		status.Conditions = append(status.Conditions, condition(pod, corev1.DisruptionTarget, corev1.ConditionTrue, reason, msg, b.now))
	}
	return status, true
}

// builder carries what one Build has learned so far, container by
// container in spec order.
type builder struct {
	pod    *corev1.Pod
	o      model.Outcome
	now    metav1.Time
	budget int
	// initialized: every regular init container so far completed.
	initialized bool
	// stageEnd is when the latest regular init container so far ended:
	// when the containers after it started.
	stageEnd metav1.Time
	// applied counts the exits of o shown (not already shown later).
	applied int
	// restarting: an exit shown says the host restarts its container, one
	// that is not a sidecar (a sidecar's restarts keep nothing live).
	restarting bool
	// initFailed: a regular init container failed for good (the host will
	// not run it again, whatever the policy): nothing after it runs.
	initFailed bool
	// completed are the regular init containers a later container's start
	// proves completed (completedByLater).
	completed map[string]bool
}

// completedByLater are the regular init containers of pod that completed
// for a container after them to have started, whether or not their own
// exit has come: a line lost or late must not leave the Pod initializing
// once its main container ran.
func completedByLater(pod *corev1.Pod, o model.Outcome) map[string]bool {
	startedStatus := func(current []corev1.ContainerStatus, name string) bool {
		cs, ok := statusOf(current, name)
		return o.ExitOf(name) != nil ||
			(ok && (cs.State.Running != nil || cs.State.Terminated != nil || cs.LastTerminationState.Terminated != nil))
	}
	later := false
	for _, c := range pod.Spec.Containers {
		later = later || startedStatus(pod.Status.ContainerStatuses, c.Name)
	}
	completed := map[string]bool{}
	for i := len(pod.Spec.InitContainers) - 1; i >= 0; i-- {
		c := &pod.Spec.InitContainers[i]
		if isSidecar(c) {
			continue
		}
		if later {
			completed[c.Name] = true
		}
		later = later || startedStatus(pod.Status.InitContainerStatuses, c.Name)
	}
	return completed
}

// container is the status of container c, from its current one among
// current and what o reports.
func (b *builder) container(c corev1.Container, current []corev1.ContainerStatus, sidecar bool) corev1.ContainerStatus {
	cs, found := statusOf(current, c.Name)
	if !found {
		cs = corev1.ContainerStatus{Name: c.Name, Image: c.Image}
	}
	started := b.initialized || cs.State.Running != nil || cs.State.Terminated != nil || cs.LastTerminationState.Terminated != nil
	if e := b.o.ExitOf(c.Name); e != nil && cs.RestartCount <= e.RestartCount+boolInt(e.WillRestart) {
		b.applied++
		cs = exited(cs, *e, b.budget)
		switch {
		case e.WillRestart && (b.o.Lost != nil || (sidecar && b.o.SidecarsLost)):
			// The restart never happened: its instance, or the Pod, ended
			// first.
			return lost(cs, b.now.Time)
		case e.WillRestart:
			b.restarting = b.restarting || !sidecar
		case !sidecar && b.kind(c.Name) == KindInit && cs.State.Terminated.ExitCode != 0:
			b.initFailed = true
		}
		return cs
	}
	switch {
	case cs.State.Terminated != nil:
		return cs // ended before; keep it as it is
	case b.completed[c.Name]:
		cs.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: ReasonCompleted, ContainerID: cs.ContainerID}}
		cs.Ready, cs.Started = false, new(false)
		return cs
	case !started:
		return waiting(cs, ReasonPodInitializing)
	case b.o.Lost != nil || (sidecar && b.o.SidecarsLost):
		return lost(cs, b.now.Time)
	case cs.State.Running == nil && cs.LastTerminationState.Terminated == nil:
		// Its turn has come and the host starts it then: it runs, though
		// the Pod may not show it yet.
		cs.State = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: b.stageEnd}}
		cs.Started = new(true)
	}
	return cs
}

// kind is what the container called name is in the Pod's spec.
func (b *builder) kind(name string) Kind { return KindOf(&b.pod.Spec, name) }

// succeededStatus says whether cs shows a container that completed.
func succeededStatus(cs corev1.ContainerStatus) bool {
	return cs.State.Terminated != nil && cs.State.Terminated.ExitCode == 0
}

// waiting is cs waiting to start for reason.
func waiting(cs corev1.ContainerStatus, reason string) corev1.ContainerStatus {
	cs.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason}}
	cs.Ready = false
	cs.Started = new(false)
	return cs
}

// RegularsEnded says whether every regular container of spec has a
// terminal exit in o, and when Reaper received the last of them: from then
// on the host stops the sidecars.
func RegularsEnded(spec *corev1.PodSpec, o model.Outcome) (at time.Time, ok bool) {
	for _, c := range spec.Containers {
		e := o.ExitOf(c.Name)
		if e == nil || !e.Terminal() {
			return time.Time{}, false
		}
		if e.ReceivedAt.After(at) {
			at = e.ReceivedAt
		}
	}
	return at, true
}

// HasSidecars says whether spec declares a native sidecar.
func HasSidecars(spec *corev1.PodSpec) bool {
	for i := range spec.InitContainers {
		if isSidecar(&spec.InitContainers[i]) {
			return true
		}
	}
	return false
}

// HostSaysEnded is the host's word on whether the Pod ended: one of its
// exits is terminal and the host ran nothing of the Pod after it (no other
// container running, model.Exit.OthersRunning). A one-container wrapper
// never says others run, so its terminal exit ends the Pod. Reaper falls
// back on it only when it cannot read the Pod's spec.
func HostSaysEnded(exits []model.Exit) bool {
	for _, e := range exits {
		if e.Terminal() && !e.OthersRunning {
			return true
		}
	}
	return false
}

// exited applies a reported exit to a container's status.
func exited(cs corev1.ContainerStatus, e model.Exit, budget int) corev1.ContainerStatus {
	message := e.Message
	if message == "" {
		message = e.Error
	}
	term := &corev1.ContainerStateTerminated{
		ExitCode:    int32(e.ExitCode),
		Signal:      signalNumber(e.Signal),
		Reason:      exitReason(e),
		Message:     tail(message, budget),
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
	EventSidecarsLost       = "SidecarsLost"
)

// Event is the Event Reaper posts on a Pod it writes the outcome to, now
// in phase: its reason, its message and its type (Normal or Warning).
func Event(o model.Outcome, phase corev1.PodPhase) (reason, msg, kind string) {
	if o.Lost != nil {
		return EventInstanceLost, fmt.Sprintf("Instance %s went %s with no container exit reported; container status unknown",
			o.InstanceID, o.Lost.State), corev1.EventTypeWarning
	}
	e := o.Latest()
	if o.SidecarsLost || e == nil {
		return EventSidecarsLost, fmt.Sprintf("Sidecars on instance %s did not report their end within the pod's termination grace period after its containers ended; pod is %s",
			o.InstanceID, phase), corev1.EventTypeWarning
	}
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
