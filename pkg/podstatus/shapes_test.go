package podstatus

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reaper-k8s/reaper/pkg/model"
)

// shapeState is what Reaper learned of one container.
type shapeState int

const (
	stNone        shapeState = iota // no exit reported: running, or not yet started
	stOK                            // exit 0, not restarted
	stFail                          // exit ≠ 0, not restarted
	stFailRestart                   // exit ≠ 0, restarted
	stOKRestart                     // exit 0, restarted (restartPolicy Always, or a sidecar)
)

func (s shapeState) String() string {
	return [...]string{"none", "0", "fail", "fail+restart", "0+restart"}[s]
}

func (s shapeState) exited() bool { return s != stNone }

func (s shapeState) restarts() bool { return s == stFailRestart || s == stOKRestart }

type shapeRole int

const (
	roleInit shapeRole = iota
	roleSidecar
	roleRegular
)

type shapeContainer struct {
	name string
	role shapeRole
}

// shapeEnd is how the run ended, beyond the exits.
type shapeEnd int

const (
	endAlive        shapeEnd = iota // the instance still runs
	endLost                         // the instance went away (Outcome.Lost)
	endSidecarsLost                 // the sidecars outlived the grace (Outcome.SidecarsLost)
)

func (e shapeEnd) String() string { return [...]string{"alive", "lost", "sidecars-lost"}[e] }

// shapeStart is what the Pod shows before Build.
type shapeStart int

const (
	startBare     shapeStart = iota // no container statuses yet
	startShown                      // the provider's view: the first container runs, the rest wait
	startStepwise                   // each exit written in turn, in spec order, then the end
)

func (s shapeStart) String() string { return [...]string{"bare", "shown", "stepwise"}[s] }

type shape struct {
	policy     corev1.RestartPolicy
	containers []shapeContainer // init containers in spec order, then the regular ones
}

func (sh shape) String() string {
	parts := []string{string(sh.policy)}
	for _, c := range sh.containers {
		parts = append(parts, c.name)
	}
	return strings.Join(parts, " ")
}

func (sh shape) pod(phase corev1.PodPhase) *corev1.Pod {
	p := &corev1.Pod{Spec: corev1.PodSpec{RestartPolicy: sh.policy}, Status: corev1.PodStatus{Phase: phase}}
	for _, c := range sh.containers {
		ctr := corev1.Container{Name: c.name, Image: "repo/" + c.name + ":1"}
		switch c.role {
		case roleInit:
			p.Spec.InitContainers = append(p.Spec.InitContainers, ctr)
		case roleSidecar:
			ctr.RestartPolicy = new(corev1.ContainerRestartPolicyAlways)
			p.Spec.InitContainers = append(p.Spec.InitContainers, ctr)
		case roleRegular:
			p.Spec.Containers = append(p.Spec.Containers, ctr)
		}
	}
	return p
}

func (sh shape) hasSidecar() bool {
	return slices.ContainsFunc(sh.containers, func(c shapeContainer) bool { return c.role == roleSidecar })
}

// shapes are the small shapes: up to two regular init containers, at most
// one sidecar (before, between or after them), one or two regular
// containers, under each restart policy.
func shapes() []shape {
	var out []shape
	for _, policy := range []corev1.RestartPolicy{corev1.RestartPolicyNever, corev1.RestartPolicyOnFailure, corev1.RestartPolicyAlways} {
		for inits := 0; inits <= 2; inits++ {
			for sidecarAt := -1; sidecarAt <= inits; sidecarAt++ {
				for regulars := 1; regulars <= 2; regulars++ {
					sh := shape{policy: policy}
					for i := 0; i <= inits; i++ {
						if i == sidecarAt {
							sh.containers = append(sh.containers, shapeContainer{"sidecar", roleSidecar})
						}
						if i < inits {
							sh.containers = append(sh.containers, shapeContainer{fmt.Sprintf("init-%d", i), roleInit})
						}
					}
					for i := 0; i < regulars; i++ {
						sh.containers = append(sh.containers, shapeContainer{fmt.Sprintf("main-%d", i), roleRegular})
					}
					out = append(out, sh)
				}
			}
		}
	}
	return out
}

// candidates are the states container c can report under the shape's
// policy. A failed regular init container is restarted under OnFailure and
// Always; only an instance gone leaves it failed for good. Nothing is
// restarted under Never but a sidecar, and only Always restarts a container
// that exited 0.
func (sh shape) candidates(c shapeContainer, end shapeEnd) []shapeState {
	switch c.role {
	case roleSidecar:
		return []shapeState{stNone, stOK, stFail, stFailRestart, stOKRestart}
	case roleInit:
		if sh.policy == corev1.RestartPolicyNever {
			return []shapeState{stNone, stOK, stFail}
		}
		if end == endLost {
			return []shapeState{stNone, stOK, stFail, stFailRestart}
		}
		return []shapeState{stNone, stOK, stFailRestart}
	}
	switch sh.policy {
	case corev1.RestartPolicyNever:
		return []shapeState{stNone, stOK, stFail}
	case corev1.RestartPolicyOnFailure:
		return []shapeState{stNone, stOK, stFail, stFailRestart}
	}
	return []shapeState{stNone, stOK, stFail, stFailRestart, stOKRestart}
}

// feasible: nothing after a regular init container that has not completed
// has run, and the sidecars are taken as lost only once every regular
// container ended for good.
func (sh shape) feasible(states []shapeState, end shapeEnd) bool {
	blocked := false
	for i, c := range sh.containers {
		if blocked && states[i].exited() {
			return false
		}
		if c.role == roleInit && states[i] != stOK {
			blocked = true
		}
	}
	if end == endSidecarsLost {
		if !sh.hasSidecar() {
			return false
		}
		for i, c := range sh.containers {
			if c.role == roleRegular && (!states[i].exited() || states[i].restarts()) {
				return false
			}
		}
	}
	return true
}

// shapeWant is the phase the rules give: terminal, or "" when the Pod is
// still live (Reaper leaves a live phase as it is).
//
// A regular init container that failed under Never fails the Pod. Until
// every regular init container exited 0 no regular container has started,
// so the Pod is pending, unless the instance is gone, which ends it. Once
// initialized, a Pod whose instance is gone succeeded only if every
// regular container had exited 0 for good: whatever else it ran is lost.
// Otherwise a regular container or a sidecar still running, or a regular
// container the policy restarts, keeps it live; and once every regular
// container ended for good it succeeded if all exited 0, and failed if
// not. A sidecar's exit never counts.
func shapeWant(sh shape, states []shapeState, end shapeEnd) corev1.PodPhase {
	initFailedUnderNever := false
	initialized := true
	somethingRuns := false
	regularsOver := true
	regularsAllZero := true
	for i, c := range sh.containers {
		st := states[i]
		switch c.role {
		case roleInit:
			if (st == stFail || st == stFailRestart) && sh.policy == corev1.RestartPolicyNever {
				initFailedUnderNever = true
			}
			if st != stOK {
				initialized = false
			}
		case roleSidecar:
			if st == stNone && end != endSidecarsLost {
				somethingRuns = true
			}
		case roleRegular:
			if st == stNone {
				somethingRuns = true
			}
			if st != stOK && st != stFail {
				regularsOver = false
			}
			if st != stOK {
				regularsAllZero = false
			}
		}
	}
	lost := end == endLost
	switch {
	case initFailedUnderNever:
		return corev1.PodFailed
	case !initialized && lost:
		return corev1.PodFailed
	case !initialized:
		return ""
	case lost && regularsOver && regularsAllZero:
		return corev1.PodSucceeded
	case lost:
		return corev1.PodFailed
	case somethingRuns, !regularsOver:
		return ""
	case regularsAllZero:
		return corev1.PodSucceeded
	}
	return corev1.PodFailed
}

// shapeCode is the exit code a failing container of role reports.
func shapeCode(role shapeRole) int {
	if role == roleSidecar {
		return 143
	}
	return 3
}

func shapeExit(c shapeContainer, st shapeState, at time.Time) model.Exit {
	e := model.Exit{Container: c.name, ContainerID: "id-" + c.name, StartedAt: at.Add(-time.Minute), FinishedAt: at, ReceivedAt: at}
	if st == stFail || st == stFailRestart {
		e.ExitCode = shapeCode(c.role)
	}
	if st.restarts() {
		e.WillRestart, e.BackoffSeconds = true, 10
	}
	return e
}

var shapeT0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// shapeOutcome is what Reaper learned: the exits of the first n containers
// that reported one, in spec order, and then how the run ended.
func shapeOutcome(sh shape, states []shapeState, n int, end shapeEnd) model.Outcome {
	o := model.Outcome{InstanceID: "i-0123456789abcdef0"}
	for i, c := range sh.containers {
		if states[i].exited() && len(o.Exits) < n {
			o.Exits = append(o.Exits, shapeExit(c, states[i], shapeT0.Add(time.Duration(i+1)*time.Minute)))
		}
	}
	slices.SortFunc(o.Exits, func(a, b model.Exit) int { return strings.Compare(a.Container, b.Container) })
	switch end {
	case endLost:
		o.Lost, o.LostAfter = &model.Gone{State: model.StateTerminated, At: shapeT0.Add(time.Hour)}, 3*time.Minute
	case endSidecarsLost:
		o.SidecarsLost = true
	}
	return o
}

// shapeRun builds the Pod's status for one combination the way start says,
// and returns the status the Pod ends up carrying, the phase it had before
// Reaper's last word, and whether that last word was written.
func shapeRun(sh shape, states []shapeState, end shapeEnd, start shapeStart) (status corev1.PodStatus, live corev1.PodPhase, wrote bool, err error) {
	initialized := true
	hasInit := false
	for i, c := range sh.containers {
		if c.role == roleInit {
			hasInit = true
			initialized = initialized && states[i] == stOK
		}
	}
	exits := 0
	for _, st := range states {
		if st.exited() {
			exits++
		}
	}
	now := shapeT0.Add(2 * time.Hour)
	switch start {
	case startBare, startShown:
		live = corev1.PodRunning
		if !initialized {
			live = corev1.PodPending
		}
		pod := sh.pod(live)
		if start == startShown {
			for i, c := range sh.containers {
				cs := corev1.ContainerStatus{Name: c.name, Image: "repo/" + c.name + ":1", Started: new(false),
					State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: ReasonPodInitializing}}}
				if i == 0 {
					cs.ContainerID, cs.Started = "containerd://"+c.name, new(true)
					cs.State = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(shapeT0)}}
				}
				if c.role == roleRegular {
					pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, cs)
				} else {
					pod.Status.InitContainerStatuses = append(pod.Status.InitContainerStatuses, cs)
				}
			}
		}
		status, wrote = Build(pod, shapeOutcome(sh, states, exits, end), now)
		if !wrote {
			return status, live, false, fmt.Errorf("no write planned")
		}
		return status, live, true, nil
	}

	// Stepwise: the Pod starts pending when it has init containers, and
	// carries each status Reaper writes.
	live = corev1.PodRunning
	if hasInit {
		live = corev1.PodPending
	}
	pod := sh.pod(live)
	for n := 1; n <= exits; n++ {
		s, ok := Build(pod, shapeOutcome(sh, states, n, endAlive), now)
		if Terminal(pod.Status.Phase) {
			if ok {
				return s, live, true, fmt.Errorf("exit %d: a %s Pod rewritten", n, pod.Status.Phase)
			}
			continue
		}
		if !ok {
			return s, live, false, fmt.Errorf("exit %d: no write planned", n)
		}
		pod.Status = s
	}
	if end != endAlive || exits == 0 {
		live = pod.Status.Phase
		s, ok := Build(pod, shapeOutcome(sh, states, exits, end), now)
		if ok == Terminal(pod.Status.Phase) {
			return s, live, ok, fmt.Errorf("final write %v on a %s Pod", ok, pod.Status.Phase)
		}
		if ok {
			pod.Status = s
		}
		return pod.Status, live, ok, nil
	}
	return pod.Status, live, true, nil
}

// shapeCheckContainers holds the statuses to the containers' states: a
// reported exit shows as terminated, or as waiting to restart with the
// exit as its last state (lost, its restart counted, when the instance or
// the Pod ended first); a container whose turn never came waits for the
// Pod's init containers; one that started and reported nothing runs,
// unless the instance is gone, or it is a sidecar that outlived the grace:
// then it is lost.
func shapeCheckContainers(sh shape, states []shapeState, end shapeEnd, status corev1.PodStatus) error {
	var specOrder, got []string
	for _, cs := range status.InitContainerStatuses {
		got = append(got, cs.Name)
	}
	for _, cs := range status.ContainerStatuses {
		got = append(got, cs.Name)
	}
	for _, c := range sh.containers {
		specOrder = append(specOrder, c.name)
	}
	if !slices.Equal(got, specOrder) {
		return fmt.Errorf("statuses for %v, want %v", got, specOrder)
	}
	all := append(slices.Clone(status.InitContainerStatuses), status.ContainerStatuses...)
	turnCame := true
	for i, c := range sh.containers {
		st, cs := states[i], all[i]
		if n := shapeStatesSet(cs.State); n != 1 {
			return fmt.Errorf("%s: %d states set", c.name, n)
		}
		term, wait := cs.State.Terminated, cs.State.Waiting
		lostNow := end == endLost || (end == endSidecarsLost && c.role == roleSidecar)
		switch {
		case st.restarts() && lostNow:
			// The restart never happened: the instance, or the Pod, ended
			// first. It is lost, its restart counted.
			last := cs.LastTerminationState.Terminated
			if term == nil || term.Reason != ReasonStatusUnknown || last == nil || int(last.ExitCode) != shapeExit(c, st, shapeT0).ExitCode || cs.RestartCount != 1 {
				return fmt.Errorf("%s (%s, %s): %+v, want lost after its last exit", c.name, st, end, cs)
			}
		case st.restarts():
			last := cs.LastTerminationState.Terminated
			if wait == nil || wait.Reason != ReasonCrashLoopBackOff || last == nil || int(last.ExitCode) != shapeExit(c, st, shapeT0).ExitCode || cs.RestartCount != 1 {
				return fmt.Errorf("%s (%s): %+v, want waiting to restart", c.name, st, cs)
			}
		case st.exited():
			if term == nil || int(term.ExitCode) != shapeExit(c, st, shapeT0).ExitCode || term.Reason == ReasonStatusUnknown {
				return fmt.Errorf("%s (%s): %+v, want terminated", c.name, st, cs.State)
			}
		case !turnCame:
			if wait == nil || wait.Reason != ReasonPodInitializing {
				return fmt.Errorf("%s never started: %+v, want waiting %s", c.name, cs.State, ReasonPodInitializing)
			}
		case end == endLost || (end == endSidecarsLost && c.role == roleSidecar):
			if term == nil || term.ExitCode != ExitCodeUnknown || term.Reason != ReasonStatusUnknown {
				return fmt.Errorf("%s (%s, %s): %+v, want lost", c.name, st, end, cs.State)
			}
		default:
			if cs.State.Running == nil {
				return fmt.Errorf("%s started and reported nothing: %+v, want running", c.name, cs.State)
			}
		}
		if c.role == roleInit && st != stOK {
			turnCame = false
		}
	}
	return nil
}

// shapeCheckConditions: Initialized (with init containers) is True exactly
// when every regular init container exited 0; a Pod failed by its
// instance going away says so in DisruptionTarget.
func shapeCheckConditions(sh shape, states []shapeState, end shapeEnd, status corev1.PodStatus) error {
	conds := map[corev1.PodConditionType]corev1.PodCondition{}
	for _, c := range status.Conditions {
		if _, dup := conds[c.Type]; dup {
			return fmt.Errorf("condition %s twice", c.Type)
		}
		conds[c.Type] = c
	}
	hasInit, initialized := false, true
	for i, c := range sh.containers {
		if c.role != roleRegular {
			hasInit = true
		}
		if c.role == roleInit && states[i] != stOK {
			initialized = false
		}
	}
	cond, found := conds[corev1.PodInitialized]
	switch {
	case !hasInit && found:
		return fmt.Errorf("Initialized on a Pod without init containers")
	case hasInit && !found:
		return fmt.Errorf("no Initialized condition")
	case hasInit && (cond.Status == corev1.ConditionTrue) != initialized:
		return fmt.Errorf("Initialized %s, want %v", cond.Status, initialized)
	case hasInit && !initialized && cond.Reason != ReasonNotInitialized:
		return fmt.Errorf("Initialized False for %q", cond.Reason)
	}
	if ready, ok := conds[corev1.PodReady]; !ok || ready.Status != corev1.ConditionFalse {
		return fmt.Errorf("Ready %+v", ready)
	}
	_, disrupted := conds[corev1.DisruptionTarget]
	if want := end == endLost && status.Phase == corev1.PodFailed; disrupted != want {
		return fmt.Errorf("DisruptionTarget %v, want %v", disrupted, want)
	}
	return nil
}

// TestShapes builds the status of every small Pod shape in every state its
// containers can reach, from three starting points, and holds each to the
// rules written out again here (shapeWant), apart from Phase: the phase
// Reaper writes, one state per container in spec order, and the
// conditions.
func TestShapes(t *testing.T) {
	ran, failures, refused := 0, 0, 0
	perPhase := map[corev1.PodPhase]int{}
	for _, sh := range shapes() {
		for _, end := range []shapeEnd{endAlive, endLost, endSidecarsLost} {
			var choices [][]shapeState
			for _, c := range sh.containers {
				choices = append(choices, sh.candidates(c, end))
			}
			for states := range shapeProduct(choices) {
				if !sh.feasible(states, end) {
					continue
				}
				want := shapeWant(sh, states, end)
				for _, start := range []shapeStart{startBare, startShown, startStepwise} {
					ran++
					status, live, wrote, err := shapeRun(sh, states, end, start)
					if err == nil {
						wantPhase := want
						if wantPhase == "" {
							wantPhase = live
						}
						if status.Phase != wantPhase {
							err = fmt.Errorf("phase %s, want %s", status.Phase, wantPhase)
						}
					}
					checkEnd := end
					if !wrote {
						refused++
						// The Pod had ended before Reaper's last word,
						// which it then refused: it carries what was
						// written before that word.
						checkEnd = endAlive
					}
					if err == nil {
						err = shapeCheckContainers(sh, states, checkEnd, status)
					}
					if err == nil && wrote {
						err = shapeCheckConditions(sh, states, end, status)
					}
					if err != nil {
						failures++
						if failures <= 20 {
							t.Errorf("[%s] states %v, %s, %s: %v", sh, states, end, start, err)
						}
						continue
					}
					perPhase[status.Phase]++
				}
			}
		}
	}
	if failures > 20 {
		t.Errorf("%d failures in all", failures)
	}
	t.Logf("%d combinations over %d shapes; phases written %v; %d last words refused on an ended Pod", ran, len(shapes()), perPhase, refused)
	// Every phase must be reached, or the enumeration lost a branch.
	for _, p := range []corev1.PodPhase{corev1.PodPending, corev1.PodRunning, corev1.PodSucceeded, corev1.PodFailed} {
		if perPhase[p] == 0 {
			t.Errorf("no combination ends %s", p)
		}
	}
}

func shapeStatesSet(s corev1.ContainerState) int {
	n := 0
	for _, set := range []bool{s.Waiting != nil, s.Running != nil, s.Terminated != nil} {
		if set {
			n++
		}
	}
	return n
}

// shapeProduct yields every choice of one state a container.
func shapeProduct(choices [][]shapeState) func(yield func([]shapeState) bool) {
	return func(yield func([]shapeState) bool) {
		states := make([]shapeState, len(choices))
		var walk func(i int) bool
		walk = func(i int) bool {
			if i == len(choices) {
				return yield(slices.Clone(states))
			}
			for _, s := range choices[i] {
				states[i] = s
				if !walk(i + 1) {
					return false
				}
			}
			return true
		}
		walk(0)
	}
}
