package reaper

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/reaper-k8s/reaper/internal/fakes"
	"github.com/reaper-k8s/reaper/pkg/ledger"
	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/model"
	"github.com/reaper-k8s/reaper/pkg/workqueue"
)

// livePod is pod n, Running on its instance, of the init containers init
// (a name starting with "sidecar" is a native sidecar) and the regular
// containers regular, each shown running.
func livePod(n int, init, regular []string) *corev1.Pod {
	ref := podOf(n)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ref.Namespace, Name: ref.Name, UID: types.UID(ref.UID)},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	running := corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
	for _, c := range init {
		ic := corev1.Container{Name: c}
		st := corev1.ContainerStatus{Name: c, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "Completed"}}}
		if len(c) > 7 && c[:7] == "sidecar" {
			ic.RestartPolicy = new(corev1.ContainerRestartPolicyAlways)
			st.State = running
		}
		pod.Spec.InitContainers = append(pod.Spec.InitContainers, ic)
		pod.Status.InitContainerStatuses = append(pod.Status.InitContainerStatuses, st)
	}
	for _, c := range regular {
		pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{Name: c})
		pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, corev1.ContainerStatus{Name: c, State: running})
	}
	return pod
}

// containerExit is the exit message of pod n's container.
func containerExit(n int, container string, code int, othersRunning bool) workqueue.Message {
	return workqueue.Exit(instanceOf(n), podOf(n), model.Exit{Container: container, ExitCode: code, OthersRunning: othersRunning,
		FinishedAt: testNow().Add(-time.Minute)})
}

// shapeWorld is a world of one Pod of several containers on its instance.
func shapeWorld(pod *corev1.Pod) *fakes.World {
	w := fakes.NewWorld(owned(instanceOf(1), podOf(1)))
	w.Live = map[model.PodRef]*corev1.Pod{podOf(1): pod}
	return w
}

// terminates counts the terminates of the world's log.
func terminates(w *fakes.World) int {
	return len(slices.DeleteFunc(slices.Clone(w.Log), func(s string) bool { return len(s) < 9 || s[:9] != "terminate" }))
}

// One container's end while another regular container runs, or before the
// main container has run, is written and ends nothing; the last regular
// container's end ends the Pod and its instance. A line for a container
// the Pod does not have is refused and changes nothing.
func TestShapesInABatch(t *testing.T) {
	for _, tc := range []struct {
		name  string
		pod   *corev1.Pod
		lines []workqueue.Message
		phase corev1.PodPhase
		ends  bool
		waits bool // for the sidecars' grace: the record stays pending
	}{
		{"init container done, main runs", livePod(1, []string{"setup"}, []string{"main"}),
			[]workqueue.Message{containerExit(1, "setup", 0, true)}, corev1.PodRunning, false, false},
		{"first of two regular containers", livePod(1, nil, []string{"main", "shipper"}),
			[]workqueue.Message{containerExit(1, "main", 0, true)}, corev1.PodRunning, false, false},
		{"both regular containers", livePod(1, nil, []string{"main", "shipper"}),
			[]workqueue.Message{containerExit(1, "main", 0, true), containerExit(1, "shipper", 3, false)}, corev1.PodFailed, true, false},
		{"main done, sidecar runs", livePod(1, []string{"sidecar-proxy"}, []string{"main"}),
			[]workqueue.Message{containerExit(1, "main", 0, true)}, corev1.PodRunning, false, true},
		{"main done, sidecar stopped", livePod(1, []string{"sidecar-proxy"}, []string{"main"}),
			[]workqueue.Message{containerExit(1, "main", 0, true), containerExit(1, "sidecar-proxy", 143, false)}, corev1.PodSucceeded, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := shapeWorld(tc.pod)
			core, l, _ := newBatchCore(w)
			for _, m := range tc.lines {
				if resp, err := core.HandleQueueEvent(t.Context(), batch(t, m)); err != nil || len(resp.BatchItemFailures) != 0 {
					t.Fatalf("failures %v, %v", failures(resp), err)
				}
			}
			if got := w.Live[podOf(1)].Status.Phase; got != tc.phase {
				t.Fatalf("phase %s, want %s", got, tc.phase)
			}
			if n := terminates(w); n != map[bool]int{true: 1, false: 0}[tc.ends] {
				t.Fatalf("%d terminates (log %q); the Pod ends: %v", n, w.Log, tc.ends)
			}
			rec := l.Recs[instanceOf(1)]
			// Nothing is left to do, ended or not, but wait for the
			// sidecars: the record settles, and the next line brings it
			// back.
			if rec.PodEnded == nil || *rec.PodEnded != tc.ends || (rec.Pending != "") != tc.waits {
				t.Fatalf("record %+v: want the Pod ended: %v, the record pending: %v", rec, tc.ends, tc.waits)
			}
		})
	}
	t.Run("a container the Pod does not have", func(t *testing.T) {
		w := shapeWorld(livePod(1, nil, []string{"main"}))
		core, l, _ := newBatchCore(w)
		if resp, err := core.HandleQueueEvent(t.Context(), batch(t, containerExit(1, "mian", 0, false))); err != nil || len(resp.BatchItemFailures) != 0 {
			t.Fatalf("failures %v, %v", failures(resp), err)
		}
		if len(w.Log) != 0 || len(l.Recs[instanceOf(1)].Exits) != 0 {
			t.Fatalf("steps %q, record %+v: want none", w.Log, l.Recs[instanceOf(1)])
		}
	})
}

// When the Pod cannot be read, the decision falls back on the host's word:
// a line saying other containers run ends nothing (no terminate under a
// running workload), the Pod's last line ends the instance even though
// its Pod is not written (an apiserver outage must not keep it billing),
// and the exits are recorded for the write that follows.
func TestShapesWithoutTheSpec(t *testing.T) {
	w := shapeWorld(livePod(1, []string{"setup"}, []string{"main"}))
	w.ReadFails = errors.New("apiserver unreachable")
	core, l, _ := newBatchCore(w)
	core.HandleQueueEvent(t.Context(), batch(t, containerExit(1, "setup", 0, true)))
	if n := terminates(w); n != 0 {
		t.Fatalf("%d terminates after the init container's line", n)
	}
	core.HandleQueueEvent(t.Context(), batch(t, containerExit(1, "main", 0, false)))
	if n := terminates(w); n != 1 {
		t.Fatalf("%d terminates after the Pod's last line, want 1", n)
	}
	if rec := l.Recs[instanceOf(1)]; len(rec.Exits) != 2 || rec.PodSynced != "" {
		t.Fatalf("record %+v: both exits recorded, the Pod not written", rec)
	}
	w.ReadFails = nil
	core.HandleQueueEvent(t.Context(), batch(t, workqueue.Sweep(instanceOf(1))))
	if got := w.Live[podOf(1)].Status.Phase; got != corev1.PodSucceeded {
		t.Fatalf("phase %s once the apiserver answers, want Succeeded", got)
	}
}

// The sidecars are left the Pod's termination grace once its regular
// containers ended for good; a sidecar that has not reported by then is
// written lost and the Pod ends, with its instance.
func TestHungSidecar(t *testing.T) {
	pod := livePod(1, []string{"sidecar-proxy"}, []string{"main"})
	pod.Spec.TerminationGracePeriodSeconds = new(int64(20))
	w := shapeWorld(pod)
	core, _, q := newBatchCore(w)
	core.HandleQueueEvent(t.Context(), batch(t, containerExit(1, "main", 0, true)))
	if terminates(w) != 0 || pod.Status.Phase != corev1.PodRunning {
		t.Fatalf("phase %s, log %q: the sidecar still runs", pod.Status.Phase, w.Log)
	}
	var wake *workqueue.Message
	var delay time.Duration
	for _, s := range q.Sent {
		for _, m := range s.Msgs {
			if m.Kind == workqueue.KindSweep {
				wake, delay = &m, s.Delay
			}
		}
	}
	if wake == nil || delay < 19*time.Second || delay > 21*time.Second+DeferDelay {
		t.Fatalf("sent %+v: want a wake-up when the 20 s grace ends", q.Sent)
	}
	later := testNow().Add(21 * time.Second)
	core.Now = func() time.Time { return later }
	core.HandleQueueEvent(t.Context(), batch(t, *wake))
	if pod.Status.Phase != corev1.PodSucceeded || terminates(w) != 1 {
		t.Fatalf("phase %s, log %q: want Succeeded and one terminate", pod.Status.Phase, w.Log)
	}
	if term := pod.Status.InitContainerStatuses[0].State.Terminated; term == nil || term.ExitCode != 137 {
		t.Fatalf("sidecar %+v, want lost", pod.Status.InitContainerStatuses[0].State)
	}
}

// An instance gone once every regular container ended, its sidecar
// unaccounted for: the sidecar decides nothing, so the Pod ends at once,
// its regular containers' truth, the sidecar lost, no exit-wait window and
// no DisruptionTarget. Sidecar lines after the Pod ended move no grace.
func TestSidecarsOfAGoneInstance(t *testing.T) {
	w := shapeWorld(livePod(1, []string{"sidecar-proxy"}, []string{"main"}))
	core, l, _ := newBatchCore(w)
	core.Policy.ExitWait = time.Hour
	core.HandleQueueEvent(t.Context(), batch(t, containerExit(1, "main", 0, true)))
	inst := w.Instances[instanceOf(1)]
	inst.State = model.StateTerminated
	w.Instances[instanceOf(1)] = inst
	core.HandleQueueEvent(t.Context(), batch(t, workqueue.State(instanceOf(1), model.StateTerminated, testNow())))
	pod := w.Live[podOf(1)]
	if pod.Status.Phase != corev1.PodSucceeded {
		t.Fatalf("phase %s, want Succeeded without waiting the window", pod.Status.Phase)
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.DisruptionTarget {
			t.Fatalf("DisruptionTarget %+v on a Pod its containers ended", c)
		}
	}
	if term := pod.Status.InitContainerStatuses[0].State.Terminated; term == nil || term.ExitCode != 137 {
		t.Fatalf("sidecar %+v, want lost", pod.Status.InitContainerStatuses[0].State)
	}
	if rec := l.Recs[instanceOf(1)]; rec.Pending != "" {
		t.Fatalf("record %+v: want settled", rec)
	}
}

// The power-off grace runs from the exit that ended the Pod: the restart
// lines of a sidecar that keeps crashing, coming after it, do not move
// it, and the instance is terminated when it ends.
func TestSidecarLinesMoveNoGrace(t *testing.T) {
	w := shapeWorld(livePod(1, []string{"sidecar-proxy"}, []string{"main"}))
	core, l, _ := newBatchCore(w)
	l.Now = func() time.Time { return core.Now() } // receipts on the batch's clock
	core.Policy.PowerOffGrace = 30 * time.Second
	restarting := containerExit(1, "sidecar-proxy", 1, true)
	restarting.Exit.WillRestart = true
	core.HandleQueueEvent(t.Context(), batch(t, restarting, containerExit(1, "main", 0, true)))
	if w.Live[podOf(1)].Status.Phase != corev1.PodSucceeded || terminates(w) != 0 {
		t.Fatalf("phase %s, log %q: want Succeeded, the instance left its grace", w.Live[podOf(1)].Status.Phase, w.Log)
	}
	for i := range 4 {
		at := testNow().Add(time.Duration(10*(i+1)) * time.Second)
		core.Now = func() time.Time { return at }
		restart := containerExit(1, "sidecar-proxy", 143, true)
		restart.Exit.RestartCount, restart.Exit.WillRestart = int32(i+1), true
		core.HandleQueueEvent(t.Context(), batch(t, restart))
	}
	if n := terminates(w); n != 1 {
		t.Fatalf("%d terminates 40 s after the Pod ended with a 30 s grace, want 1 (log %q)", n, w.Log)
	}
}

// A record keeps at most ledger.MaxContainers containers' exits: a claim
// for one more container is refused, counted, and changes nothing.
func TestTooManyContainers(t *testing.T) {
	w := fakes.NewWorld(owned(instanceOf(1), podOf(1)))
	w.Pods[podOf(1)] = true
	core, l, _ := newBatchCore(w)
	var emf bytes.Buffer
	core.Metrics = metrics.New(slog.New(slog.NewJSONHandler(&emf, nil)), "Reaper", metrics.FunctionReconciler)
	exits := map[string]model.Exit{}
	for i := range ledger.MaxContainers {
		name := fmt.Sprintf("c%d", i)
		exits[name] = model.Exit{Container: name, OthersRunning: true, FinishedAt: testNow().Add(-time.Hour)}
	}
	l.Recs[instanceOf(1)] = ledger.Record{InstanceID: instanceOf(1), Pod: podOf(1), Exits: exits, Version: 1}
	core.HandleQueueEvent(t.Context(), batch(t, containerExit(1, "one-more", 0, false)))
	if n := countOf(t, emf.String(), metrics.LinesRejected, model.ReasonTooManyContainers); n != 1 {
		t.Fatalf("%d claims refused as %s, want 1", n, model.ReasonTooManyContainers)
	}
	if rec := l.Recs[instanceOf(1)]; len(rec.Exits) != ledger.MaxContainers || terminates(w) != 0 {
		t.Fatalf("%d exits recorded, log %q: want the record and the instance untouched", len(rec.Exits), w.Log)
	}
}
