package podstatus

import (
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reaper-k8s/reaper/pkg/model"
)

// The acceptance shapes of multi-container Pods, each exit written in turn
// as Reaper would: the Pod carries what the previous Build wrote.

var accT0 = time.Date(2026, 5, 4, 9, 0, 0, 0, time.UTC)

// accPod is a Pod in phase under policy. An init container named
// "sidecar…" is a native sidecar. Every container listed in running shows
// as running; the others have no status yet.
func accPod(policy corev1.RestartPolicy, phase corev1.PodPhase, inits, regulars, running []string) *corev1.Pod {
	p := &corev1.Pod{Spec: corev1.PodSpec{RestartPolicy: policy}, Status: corev1.PodStatus{Phase: phase}}
	status := func(name string) (corev1.ContainerStatus, bool) {
		if !slices.Contains(running, name) {
			return corev1.ContainerStatus{}, false
		}
		return corev1.ContainerStatus{Name: name, Image: "repo/" + name + ":1", ContainerID: "containerd://" + name, Started: new(true),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(accT0)}}}, true
	}
	for _, n := range inits {
		c := corev1.Container{Name: n, Image: "repo/" + n + ":1"}
		if strings.HasPrefix(n, "sidecar") {
			c.RestartPolicy = new(corev1.ContainerRestartPolicyAlways)
		}
		p.Spec.InitContainers = append(p.Spec.InitContainers, c)
		if cs, ok := status(n); ok {
			p.Status.InitContainerStatuses = append(p.Status.InitContainerStatuses, cs)
		}
	}
	for _, n := range regulars {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: n, Image: "repo/" + n + ":1"})
		if cs, ok := status(n); ok {
			p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, cs)
		}
	}
	return p
}

func accExit(name string, code int, minute int, mutate ...func(*model.Exit)) model.Exit {
	at := accT0.Add(time.Duration(minute) * time.Minute)
	e := model.Exit{Container: name, ContainerID: "id-" + name, ExitCode: code, StartedAt: accT0, FinishedAt: at, ReceivedAt: at}
	for _, m := range mutate {
		m(&e)
	}
	return e
}

// accOutcome holds the latest exit of each container, in name order.
func accOutcome(exits ...model.Exit) model.Outcome {
	o := model.Outcome{InstanceID: "i-0123456789abcdef0", Exits: slices.Clone(exits)}
	slices.SortFunc(o.Exits, func(a, b model.Exit) int { return strings.Compare(a.Container, b.Container) })
	return o
}

// accWrite builds the Pod's status for o, wants phase, and leaves the Pod
// carrying it.
func accWrite(t *testing.T, pod *corev1.Pod, o model.Outcome, phase corev1.PodPhase) corev1.PodStatus {
	t.Helper()
	s, ok := Build(pod, o, accT0.Add(time.Hour))
	if !ok {
		t.Fatalf("no write planned for %+v", o)
	}
	if s.Phase != phase {
		t.Fatalf("phase %s, want %s", s.Phase, phase)
	}
	for _, cs := range append(slices.Clone(s.InitContainerStatuses), s.ContainerStatuses...) {
		if n := accStatesSet(cs.State); n != 1 {
			t.Fatalf("%s: %d states set", cs.Name, n)
		}
	}
	pod.Status = s
	return s
}

func accStatesSet(s corev1.ContainerState) int {
	n := 0
	for _, set := range []bool{s.Waiting != nil, s.Running != nil, s.Terminated != nil} {
		if set {
			n++
		}
	}
	return n
}

func accStatus(t *testing.T, s corev1.PodStatus, name string) corev1.ContainerStatus {
	t.Helper()
	for _, cs := range append(slices.Clone(s.InitContainerStatuses), s.ContainerStatuses...) {
		if cs.Name == name {
			return cs
		}
	}
	t.Fatalf("no status for %s", name)
	return corev1.ContainerStatus{}
}

// accTerminated wants name terminated with code and reason.
func accTerminated(t *testing.T, s corev1.PodStatus, name string, code int32, reason string) {
	t.Helper()
	cs := accStatus(t, s, name)
	if term := cs.State.Terminated; term == nil || term.ExitCode != code || term.Reason != reason {
		t.Fatalf("%s: %+v, want terminated %d %s", name, cs.State, code, reason)
	}
}

func accRunning(t *testing.T, s corev1.PodStatus, name string) {
	t.Helper()
	if cs := accStatus(t, s, name); cs.State.Running == nil {
		t.Fatalf("%s: %+v, want running", name, cs.State)
	}
}

// accInitializing wants name waiting for the Pod's init containers: it
// never ran, so it was not lost either.
func accInitializing(t *testing.T, s corev1.PodStatus, name string) {
	t.Helper()
	if cs := accStatus(t, s, name); cs.State.Waiting == nil || cs.State.Waiting.Reason != ReasonPodInitializing {
		t.Fatalf("%s: %+v, want waiting %s", name, cs.State, ReasonPodInitializing)
	}
}

func accCondition(s corev1.PodStatus, ct corev1.PodConditionType) *corev1.PodCondition {
	for i := range s.Conditions {
		if s.Conditions[i].Type == ct {
			return &s.Conditions[i]
		}
	}
	return nil
}

func accInitialized(t *testing.T, s corev1.PodStatus, want corev1.ConditionStatus) {
	t.Helper()
	if c := accCondition(s, corev1.PodInitialized); c == nil || c.Status != want {
		t.Fatalf("Initialized %+v, want %s", c, want)
	}
}

func TestAcceptInitThenMain(t *testing.T) {
	for _, policy := range []corev1.RestartPolicy{corev1.RestartPolicyNever, corev1.RestartPolicyOnFailure, corev1.RestartPolicyAlways} {
		t.Run(string(policy), func(t *testing.T) {
			pod := accPod(policy, corev1.PodRunning, []string{"setup"}, []string{"main"}, []string{"setup", "main"})
			// The init container's exit says main runs on: the Pod
			// goes on, and its instance with it.
			setup := accExit("setup", 0, 1, func(e *model.Exit) { e.OthersRunning = true })
			o := accOutcome(setup)
			s := accWrite(t, pod, o, corev1.PodRunning)
			accTerminated(t, s, "setup", 0, ReasonCompleted)
			accRunning(t, s, "main")
			accInitialized(t, s, corev1.ConditionTrue)
			if _, ended := RegularsEnded(&pod.Spec, o); ended || HostSaysEnded(o.Exits) {
				t.Fatal("the init container's exit ends the instance")
			}

			o = accOutcome(setup, accExit("main", 0, 5))
			s = accWrite(t, pod, o, corev1.PodSucceeded)
			accTerminated(t, s, "setup", 0, ReasonCompleted)
			accTerminated(t, s, "main", 0, ReasonCompleted)
			accInitialized(t, s, corev1.ConditionTrue)
			if at, ended := RegularsEnded(&pod.Spec, o); !ended || !at.Equal(accT0.Add(5*time.Minute)) {
				t.Fatalf("regulars ended %v at %s", ended, at)
			}
		})
	}
}

func TestAcceptTwoRegulars(t *testing.T) {
	for _, policy := range []corev1.RestartPolicy{corev1.RestartPolicyNever, corev1.RestartPolicyOnFailure, corev1.RestartPolicyAlways} {
		t.Run(string(policy), func(t *testing.T) {
			pod := accPod(policy, corev1.PodRunning, nil, []string{"a", "b"}, []string{"a", "b"})
			first := accExit("a", 0, 1)
			s := accWrite(t, pod, accOutcome(first), corev1.PodRunning)
			accTerminated(t, s, "a", 0, ReasonCompleted)
			accRunning(t, s, "b")

			s = accWrite(t, pod, accOutcome(first, accExit("b", 3, 2)), corev1.PodFailed)
			accTerminated(t, s, "a", 0, ReasonCompleted)
			accTerminated(t, s, "b", 3, ReasonError)
		})
	}
}

func TestAcceptInitFailsUnderNever(t *testing.T) {
	pod := accPod(corev1.RestartPolicyNever, corev1.PodPending, []string{"setup"}, []string{"main"}, []string{"setup"})
	s := accWrite(t, pod, accOutcome(accExit("setup", 1, 1)), corev1.PodFailed)
	accTerminated(t, s, "setup", 1, ReasonError)
	accInitializing(t, s, "main")
	accInitialized(t, s, corev1.ConditionFalse)
	if accCondition(s, corev1.DisruptionTarget) != nil {
		t.Fatal("DisruptionTarget on a Pod whose instance is still there")
	}
}

func TestAcceptInitSequence(t *testing.T) {
	pod := accPod(corev1.RestartPolicyNever, corev1.PodPending, []string{"fetch", "migrate"}, []string{"main"}, []string{"fetch"})
	fetch, migrate := accExit("fetch", 0, 1), accExit("migrate", 0, 2)

	// Reaper never moves a Pod between live phases: it stays Pending
	// until the provider says otherwise, or the Pod ends.
	s := accWrite(t, pod, accOutcome(fetch), corev1.PodPending)
	accTerminated(t, s, "fetch", 0, ReasonCompleted)
	accRunning(t, s, "migrate")
	accInitializing(t, s, "main")
	accInitialized(t, s, corev1.ConditionFalse)

	s = accWrite(t, pod, accOutcome(fetch, migrate), corev1.PodPending)
	accTerminated(t, s, "fetch", 0, ReasonCompleted)
	accTerminated(t, s, "migrate", 0, ReasonCompleted)
	accRunning(t, s, "main")
	accInitialized(t, s, corev1.ConditionTrue)

	s = accWrite(t, pod, accOutcome(fetch, migrate, accExit("main", 0, 3)), corev1.PodSucceeded)
	accTerminated(t, s, "fetch", 0, ReasonCompleted)
	accTerminated(t, s, "migrate", 0, ReasonCompleted)
	accTerminated(t, s, "main", 0, ReasonCompleted)
	accInitialized(t, s, corev1.ConditionTrue)
}

func TestAcceptSidecar(t *testing.T) {
	sidecarPod := func() *corev1.Pod {
		return accPod(corev1.RestartPolicyNever, corev1.PodRunning, []string{"sidecar"}, []string{"main"}, []string{"sidecar", "main"})
	}
	main := accExit("main", 0, 1)
	// The host stops the sidecar once main ended: SIGTERM, 143.
	stopped := accExit("sidecar", 143, 2, func(e *model.Exit) { e.Signal = "SIGTERM" })

	t.Run("main then sidecar", func(t *testing.T) {
		pod := sidecarPod()
		s := accWrite(t, pod, accOutcome(main), corev1.PodRunning)
		accTerminated(t, s, "main", 0, ReasonCompleted)
		accRunning(t, s, "sidecar")
		if _, ended := RegularsEnded(&pod.Spec, accOutcome(main)); !ended {
			t.Fatal("main's exit does not end the regular containers")
		}
		s = accWrite(t, pod, accOutcome(main, stopped), corev1.PodSucceeded)
		accTerminated(t, s, "main", 0, ReasonCompleted)
		accTerminated(t, s, "sidecar", 143, ReasonError)
		if sig := accStatus(t, s, "sidecar").State.Terminated.Signal; sig != 15 {
			t.Fatalf("signal %d", sig)
		}
	})
	t.Run("both at once", func(t *testing.T) {
		s := accWrite(t, sidecarPod(), accOutcome(main, stopped), corev1.PodSucceeded)
		accTerminated(t, s, "sidecar", 143, ReasonError)
	})
	// An instance gone after main's exit 0 takes only the sidecar with it:
	// the Pod succeeded, and no disruption failed it.
	t.Run("instance lost", func(t *testing.T) {
		pod := sidecarPod()
		accWrite(t, pod, accOutcome(main), corev1.PodRunning)
		o := accOutcome(main)
		o.Lost, o.LostAfter = &model.Gone{State: model.StateTerminated, At: accT0.Add(10 * time.Minute)}, 3*time.Minute
		s := accWrite(t, pod, o, corev1.PodSucceeded)
		accTerminated(t, s, "main", 0, ReasonCompleted)
		accTerminated(t, s, "sidecar", ExitCodeUnknown, ReasonStatusUnknown)
		if c := accCondition(s, corev1.DisruptionTarget); c != nil {
			t.Fatalf("DisruptionTarget %+v on a Pod that succeeded", c)
		}
	})
	t.Run("sidecars lost", func(t *testing.T) {
		pod := sidecarPod()
		accWrite(t, pod, accOutcome(main), corev1.PodRunning)
		o := accOutcome(main)
		o.SidecarsLost = true
		s := accWrite(t, pod, o, corev1.PodSucceeded)
		accTerminated(t, s, "main", 0, ReasonCompleted)
		accTerminated(t, s, "sidecar", ExitCodeUnknown, ReasonStatusUnknown)
		if c := accCondition(s, corev1.DisruptionTarget); c != nil {
			t.Fatalf("DisruptionTarget %+v", c)
		}
	})
}

func TestAcceptOnFailureRestart(t *testing.T) {
	pod := accPod(corev1.RestartPolicyOnFailure, corev1.PodRunning, nil, []string{"a", "b"}, []string{"a", "b"})
	retry := accExit("a", 1, 1, func(e *model.Exit) { e.WillRestart, e.BackoffSeconds = true, 10 })
	b := accExit("b", 0, 2)
	s := accWrite(t, pod, accOutcome(retry, b), corev1.PodRunning)
	a := accStatus(t, s, "a")
	if a.State.Waiting == nil || a.State.Waiting.Reason != ReasonCrashLoopBackOff || a.LastTerminationState.Terminated == nil ||
		a.LastTerminationState.Terminated.ExitCode != 1 || a.RestartCount != 1 {
		t.Fatalf("a: %+v, want waiting to restart after exit 1", a)
	}
	accTerminated(t, s, "b", 0, ReasonCompleted)

	s = accWrite(t, pod, accOutcome(accExit("a", 0, 3, func(e *model.Exit) { e.RestartCount = 1 }), b), corev1.PodSucceeded)
	accTerminated(t, s, "a", 0, ReasonCompleted)
	accTerminated(t, s, "b", 0, ReasonCompleted)
	if n := accStatus(t, s, "a").RestartCount; n != 1 {
		t.Fatalf("a restarted %d times, want 1", n)
	}
}

// TestAcceptMessageBudget: a termination message keeps its end, at most
// 4,096 bytes a container and 12 KiB a Pod shared among its containers,
// cut where a character starts.
func TestAcceptMessageBudget(t *testing.T) {
	ascii := strings.Repeat("0123456789", 500) // 5,000 bytes
	// Two bytes and then three-byte characters: the last 4,096 bytes
	// start inside one.
	wide := "xx" + strings.Repeat("€", 1666)
	if len(ascii) != 5000 || len(wide) != 5000 {
		t.Fatal("messages are not 5,000 bytes")
	}
	withMessage := func(m string) func(*model.Exit) { return func(e *model.Exit) { e.Message = m } }

	for _, tc := range []struct {
		name     string
		inits    []string
		regulars []string
		budget   int
	}{
		{name: "one container", regulars: []string{"main"}, budget: 4096},
		{name: "four containers", regulars: []string{"a", "b", "c", "d"}, budget: 3072},
		{name: "init, sidecar and two containers", inits: []string{"setup", "sidecar"}, regulars: []string{"a", "b"}, budget: 3072},
	} {
		for kind, msg := range map[string]string{"ascii": ascii, "wide": wide} {
			t.Run(tc.name+"/"+kind, func(t *testing.T) {
				names := append(slices.Clone(tc.inits), tc.regulars...)
				pod := accPod(corev1.RestartPolicyNever, corev1.PodRunning, tc.inits, tc.regulars, names)
				var exits []model.Exit
				for i, n := range names {
					code := 1
					if n == "setup" {
						code = 0 // the containers after it ran
					}
					exits = append(exits, accExit(n, code, i+1, withMessage(msg)))
				}
				s := accWrite(t, pod, accOutcome(exits...), corev1.PodFailed)
				for _, n := range names {
					got := accStatus(t, s, n).State.Terminated.Message
					switch {
					case !strings.HasSuffix(msg, got) || !utf8.ValidString(got):
						t.Fatalf("%s: message is not a whole-character tail", n)
					case len(got) > tc.budget || len(got) <= tc.budget-utf8.UTFMax:
						t.Fatalf("%s: %d bytes kept, want the last %d", n, len(got), tc.budget)
					case msg == ascii && got != ascii[len(ascii)-tc.budget:]:
						t.Fatalf("%s: not the last %d bytes", n, tc.budget)
					}
				}
			})
		}
	}
}
