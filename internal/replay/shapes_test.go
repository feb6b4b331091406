package replay

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/reaper-k8s/reaper/deploy"
	"github.com/reaper-k8s/reaper/internal/ec2server"
	"github.com/reaper-k8s/reaper/pkg/exitline"
	"github.com/reaper-k8s/reaper/pkg/model"
	"github.com/reaper-k8s/reaper/pkg/podstatus"
)

// chartOnce applies the chart with its default values, the manifests of
// deploy/ as an operator applies them with kubectl, to the shared
// apiserver: its admission policy binds only Reaper's own identities, so
// the functions of the other tests, which run as an administrator, are
// not under it.
var chartOnce sync.Once

// underChart starts a deployment of its own whose functions run as
// Reaper's bound identity (the group "reaper"), under the chart's RBAC and
// admission policy.
func underChart(t *testing.T, cluster string) *Lab {
	t.Helper()
	var err error
	chartOnce.Do(func() {
		var root string
		if root, err = ModuleRoot(); err != nil {
			return
		}
		var objs []runtime.Object
		for _, file := range []string{"rbac.yaml", "admission.yaml", "flowcontrol.yaml"} {
			var manifest []byte
			if manifest, err = os.ReadFile(filepath.Join(root, "deploy", file)); err != nil {
				return
			}
			var more []runtime.Object
			if more, err = deploy.Decode(string(manifest)); err != nil {
				return
			}
			objs = append(objs, more...)
		}
		for _, obj := range objs {
			if err = deploy.Create(t.Context(), lab.Stack.Kube, obj); apierrors.IsAlreadyExists(err) {
				err = nil
			}
			if err != nil {
				return
			}
		}
	})
	if err != nil {
		t.Fatalf("apply the chart: %v", err)
	}
	kubeconfig, err := lab.Stack.ReaperKubeconfig()
	if err != nil {
		t.Fatal(err)
	}
	return deployment(t, cluster, LabOptions{Env: []string{"KUBECONFIG=" + kubeconfig}}, "exitrecorder", "statechange", "reconciler")
}

// shapeRun is one Pod of several containers on its instance, in a
// deployment under the chart.
type shapeRun struct {
	t   *testing.T
	d   *Lab
	id  string
	pod *corev1.Pod
	seq int
}

func newShapeRun(t *testing.T, d *Lab, cluster string, n int, name string, shape PodShape, running bool) *shapeRun {
	t.Helper()
	pod, err := lab.ShapedPod(t.Context(), "shapes", name, shape, running)
	if err != nil {
		t.Fatal(err)
	}
	id := hostileInstance(0xf10, n)
	d.AddTaggedInstance(id, lab.InstanceTags(pod, true, cluster))
	return &shapeRun{t: t, d: d, id: id, pod: pod}
}

// exit ships l, one container run's line, and waits until the queue has
// drained through the reconciler.
func (r *shapeRun) exit(l exitline.Line) {
	r.t.Helper()
	if err := r.d.Invoke(r.t.Context(), "exitrecorder", r.payload(l), nil); err != nil {
		r.t.Fatal(err)
	}
}

// exitOnly ships l and returns once the exitrecorder has queued it.
func (r *shapeRun) exitOnly(l exitline.Line) {
	r.t.Helper()
	if err := r.d.InvokeOnly(r.t.Context(), "exitrecorder", r.payload(l), nil); err != nil {
		r.t.Fatal(err)
	}
}

// payload is the subscription payload of l, the run's next line.
func (r *shapeRun) payload(l exitline.Line) []byte {
	r.t.Helper()
	r.seq++
	l.ContainerID = BareContainerID(r.pod) + l.Container
	ev, err := ExitLogsEvent(r.id, r.pod, l, r.seq)
	if err != nil {
		r.t.Fatal(err)
	}
	b, err := json.Marshal(ev)
	if err != nil {
		r.t.Fatal(err)
	}
	return b
}

// now is the Pod as the apiserver has it.
func (r *shapeRun) now() *corev1.Pod {
	r.t.Helper()
	return getPod(r.t, r.pod.Namespace, r.pod.Name)
}

// want checks the Pod's phase and the state of each container named in
// states: "running", "waiting:<reason>" or "exit:<code>".
func (r *shapeRun) want(phase corev1.PodPhase, states map[string]string) *corev1.Pod {
	r.t.Helper()
	pod := r.now()
	if pod.Status.Phase != phase {
		r.t.Fatalf("%s: phase %s, want %s; status %+v", r.pod.Name, pod.Status.Phase, phase, pod.Status)
	}
	all := append(slices.Clone(pod.Status.InitContainerStatuses), pod.Status.ContainerStatuses...)
	if len(all) != len(pod.Spec.InitContainers)+len(pod.Spec.Containers) {
		r.t.Fatalf("%s: %d statuses for %d containers", r.pod.Name, len(all), len(pod.Spec.InitContainers)+len(pod.Spec.Containers))
	}
	for name, want := range states {
		i := slices.IndexFunc(all, func(cs corev1.ContainerStatus) bool { return cs.Name == name })
		if i < 0 {
			r.t.Fatalf("%s: no status of %s", r.pod.Name, name)
		}
		if got := stateWord(all[i].State); got != want {
			r.t.Fatalf("%s: %s is %s, want %s", r.pod.Name, name, got, want)
		}
	}
	return pod
}

func stateWord(s corev1.ContainerState) string {
	switch {
	case s.Running != nil:
		return "running"
	case s.Waiting != nil:
		return "waiting:" + s.Waiting.Reason
	case s.Terminated != nil:
		return "exit:" + strconv.Itoa(int(s.Terminated.ExitCode))
	}
	return "none"
}

// terminated waits until the instance has been named in exactly one
// TerminateInstances and EC2 has it terminated.
func (r *shapeRun) terminated() {
	r.t.Helper()
	waitFor(r.t, 30*time.Second, r.pod.Name+"'s instance terminated", func() bool { return terminateCalls(r.id) == 1 })
	if s := instanceState(r.t, r.id); s != ec2server.Terminated {
		r.t.Fatalf("%s's instance is %s", r.pod.Name, s)
	}
}

// running checks the instance runs on, never named in a terminate.
func (r *shapeRun) running() {
	r.t.Helper()
	if n := terminateCalls(r.id); n != 0 || instanceState(r.t, r.id) != ec2server.Running {
		r.t.Fatalf("%s's instance: %d terminates, %s; its Pod still runs", r.pod.Name, n, instanceState(r.t, r.id))
	}
}

// TestPodShapes: Pods of several containers, their lines through the
// built functions, written as Reaper's own identity under the chart's
// admission policy. One container's end while another runs, or while init
// is incomplete, is shown and ends nothing; the Pod ends as the kubelet
// would end it, and its instance with it, once. No write is refused and
// nothing comes back to the queue.
func TestPodShapes(t *testing.T) {
	t.Parallel()
	const cluster = "reaper-shapes"
	d := underChart(t, cluster)
	t.Cleanup(func() {
		for _, b := range batchesOf(d) {
			if b.Failed > 0 || b.Deferred > 0 || b.DeadLettered > 0 {
				t.Errorf("a batch failed, deferred or dead-lettered work: %+v", b)
			}
		}
	})
	never, onFailure := corev1.RestartPolicyNever, corev1.RestartPolicyOnFailure

	t.Run("init then main", func(t *testing.T) {
		t.Parallel()
		r := newShapeRun(t, d, cluster, 1, "init-then-main", PodShape{Init: []string{"setup"}, Containers: []string{"main"}, Policy: never}, true)
		r.exit(exitline.Line{Container: "setup", OthersRunning: true})
		r.want(corev1.PodRunning, map[string]string{"setup": "exit:0", "main": "running"})
		r.running()
		r.exit(exitline.Line{Container: "main"})
		r.want(corev1.PodSucceeded, map[string]string{"setup": "exit:0", "main": "exit:0"})
		r.terminated()
	})
	t.Run("two regular containers", func(t *testing.T) {
		t.Parallel()
		r := newShapeRun(t, d, cluster, 2, "two-containers", PodShape{Containers: []string{"main", "shipper"}, Policy: never}, true)
		r.exit(exitline.Line{Container: "main", OthersRunning: true})
		r.want(corev1.PodRunning, map[string]string{"main": "exit:0", "shipper": "running"})
		r.running()
		r.exit(exitline.Line{Container: "shipper", ExitCode: 3})
		r.want(corev1.PodFailed, map[string]string{"main": "exit:0", "shipper": "exit:3"})
		r.terminated()
	})
	t.Run("init fails under Never", func(t *testing.T) {
		t.Parallel()
		r := newShapeRun(t, d, cluster, 3, "init-fails", PodShape{Init: []string{"setup"}, Containers: []string{"main"}, Policy: never}, false)
		r.exit(exitline.Line{Container: "setup", ExitCode: 1})
		r.want(corev1.PodFailed, map[string]string{"setup": "exit:1", "main": "waiting:" + podstatus.ReasonPodInitializing})
		r.terminated()
	})
	t.Run("init containers on a Pending Pod", func(t *testing.T) {
		t.Parallel()
		r := newShapeRun(t, d, cluster, 4, "pending-inits", PodShape{Init: []string{"fetch", "unpack"}, Containers: []string{"main"}, Policy: never}, false)
		r.exit(exitline.Line{Container: "fetch", OthersRunning: true})
		r.want(corev1.PodPending, map[string]string{"fetch": "exit:0", "unpack": "running", "main": "waiting:" + podstatus.ReasonPodInitializing})
		r.exit(exitline.Line{Container: "unpack", OthersRunning: true})
		r.want(corev1.PodPending, map[string]string{"fetch": "exit:0", "unpack": "exit:0", "main": "running"})
		r.running()
		r.exit(exitline.Line{Container: "main"})
		r.want(corev1.PodSucceeded, map[string]string{"fetch": "exit:0", "unpack": "exit:0", "main": "exit:0"})
		r.terminated()
	})
	t.Run("restart of a Pending Pod", func(t *testing.T) {
		t.Parallel()
		// The host restarts the container of a Pod the provider still
		// shows Pending: Reaper writes the run and keeps the phase (the
		// policy admits nothing else), settles, and nothing circles:
		// no 403, no deferral, no dead letter (the Cleanup above).
		r := newShapeRun(t, d, cluster, 11, "pending-restart", PodShape{Containers: []string{"main"}, Policy: onFailure}, false)
		r.exit(exitline.Line{Container: "main", ExitCode: 1, WillRestart: true, BackoffSeconds: 10})
		r.want(corev1.PodPending, map[string]string{"main": "waiting:" + podstatus.ReasonCrashLoopBackOff})
		r.running()
		r.exit(exitline.Line{Container: "main", RestartCount: 1})
		r.want(corev1.PodSucceeded, map[string]string{"main": "exit:0"})
		r.terminated()
	})
	t.Run("native sidecar stopped", func(t *testing.T) {
		t.Parallel()
		// A grace far longer than the test, loaded as it may be: the
		// sidecar's own line, not the grace's end, decides here.
		r := newShapeRun(t, d, cluster, 5, "sidecar-stopped", PodShape{Init: []string{"sidecar-proxy"}, Containers: []string{"main"}, Policy: never, Grace: 60}, true)
		r.exit(exitline.Line{Container: "main", OthersRunning: true})
		r.want(corev1.PodRunning, map[string]string{"sidecar-proxy": "running", "main": "exit:0"})
		r.running()
		r.exit(exitline.Line{Container: "sidecar-proxy", ExitCode: 143, Signal: "SIGTERM"})
		r.want(corev1.PodSucceeded, map[string]string{"sidecar-proxy": "exit:143", "main": "exit:0"})
		r.terminated()
	})
	t.Run("sidecar's line never comes, host powers off", func(t *testing.T) {
		t.Parallel()
		// The sidecars' grace is long enough for the power-off to come
		// first: the main container's exit is not waited on to drain,
		// since the wake-up at the grace's end would be.
		const grace = 20
		r := newShapeRun(t, d, cluster, 6, "sidecar-power-off", PodShape{Init: []string{"sidecar-proxy"}, Containers: []string{"main"}, Policy: never, Grace: grace}, true)
		start := time.Now()
		r.exitOnly(exitline.Line{Container: "main", OthersRunning: true})
		waitFor(t, 10*time.Second, "the main container's end shown", func() bool {
			return stateWord(r.now().Status.ContainerStatuses[0].State) == "exit:0"
		})
		r.want(corev1.PodRunning, map[string]string{"sidecar-proxy": "running", "main": "exit:0"})
		lab.Stack.EC2.SetState(r.id, ec2server.Terminated)
		for _, state := range []string{model.StateShuttingDown, model.StateTerminated} {
			b, err := json.Marshal(StateChangeEvent("power-off-"+state, r.id, state, time.Now()))
			if err != nil {
				t.Fatal(err)
			}
			// Not drained: the drain would wait for the wake-up at the end
			// of the sidecars' grace.
			if err := d.InvokeOnly(t.Context(), "statechange", b, nil); err != nil {
				t.Fatal(err)
			}
		}
		waitFor(t, 60*time.Second, "the Pod ended", func() bool { return podstatus.Terminal(r.now().Status.Phase) })
		if took := time.Since(start); took >= grace*time.Second {
			t.Fatalf("the Pod ended %s after the main container's exit: the sidecars' grace, not the power-off, ended it", took)
		}
		pod := r.want(corev1.PodSucceeded, map[string]string{"sidecar-proxy": "exit:137", "main": "exit:0"})
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.DisruptionTarget {
				t.Fatalf("DisruptionTarget on a Pod whose containers succeeded: %+v", c)
			}
		}
	})
	t.Run("hung sidecar", func(t *testing.T) {
		t.Parallel()
		const grace = 3
		r := newShapeRun(t, d, cluster, 10, "hung-sidecar", PodShape{Init: []string{"sidecar-proxy"}, Containers: []string{"main"}, Policy: never, Grace: grace}, true)
		start := time.Now()
		r.exit(exitline.Line{Container: "main", OthersRunning: true})
		r.want(corev1.PodRunning, map[string]string{"sidecar-proxy": "running", "main": "exit:0"})
		// The host never stops it: once the Pod's grace has passed, it is
		// taken as lost, and the Pod ends with its main container's truth.
		waitFor(t, 60*time.Second, "the Pod ended", func() bool { return podstatus.Terminal(r.now().Status.Phase) })
		if took := time.Since(start); took < grace*time.Second {
			t.Fatalf("ended %s after the main container's exit, before the %ds grace", took, grace)
		}
		r.want(corev1.PodSucceeded, map[string]string{"sidecar-proxy": "exit:137", "main": "exit:0"})
		r.terminated()
	})
	t.Run("a container the Pod does not have", func(t *testing.T) {
		t.Parallel()
		r := newShapeRun(t, d, cluster, 7, "unknown-container", PodShape{Containers: []string{"main"}, Policy: never}, true)
		before := r.now()
		r.exit(exitline.Line{Container: "mian"})
		if n := rejectionsOf(d, r.id, model.ReasonUnknownContainer); n != 1 {
			t.Fatalf("%d claims refused as %s, want 1", n, model.ReasonUnknownContainer)
		}
		if after := r.now(); after.ResourceVersion != before.ResourceVersion {
			t.Fatalf("the Pod was written: %+v", after.Status)
		}
		r.running()
	})
	t.Run("OnFailure, one restarts while the other succeeded", func(t *testing.T) {
		t.Parallel()
		r := newShapeRun(t, d, cluster, 8, "on-failure", PodShape{Containers: []string{"a", "b"}, Policy: onFailure}, true)
		r.exit(exitline.Line{Container: "a", ExitCode: 1, WillRestart: true, BackoffSeconds: 10, OthersRunning: true})
		r.exit(exitline.Line{Container: "b", OthersRunning: true})
		r.want(corev1.PodRunning, map[string]string{"a": "waiting:" + podstatus.ReasonCrashLoopBackOff, "b": "exit:0"})
		r.running()
		r.exit(exitline.Line{Container: "a", RestartCount: 1})
		r.want(corev1.PodSucceeded, map[string]string{"a": "exit:0", "b": "exit:0"})
		r.terminated()
	})
	t.Run("termination message", func(t *testing.T) {
		t.Parallel()
		r := newShapeRun(t, d, cluster, 9, "message", PodShape{Containers: []string{"main", "b", "c", "d"}, Policy: never}, true)
		message := strings.Repeat("x", exitline.MaxMessageBytes-len("the end")) + "the end"
		r.exit(exitline.Line{Container: "main", ExitCode: 2, Message: message, OthersRunning: true})
		pod := r.want(corev1.PodRunning, map[string]string{"main": "exit:2"})
		// Four containers share the Pod's 12 KiB: 3 KiB each, the end kept.
		got := pod.Status.ContainerStatuses[0].State.Terminated.Message
		if want := message[len(message)-podstatus.MaxPodMessageBytes/4:]; got != want {
			t.Fatalf("message of %d bytes ending %q, want the last %d bytes", len(got), got[max(0, len(got)-10):], len(want))
		}
	})
}

// The demo's seed Job (make replay), through the built functions: the
// init container's end ends nothing, the installer's ends the Pod
// Succeeded with both containers' truth, and its instance once.
func TestSeedJob(t *testing.T) {
	t.Parallel()
	res, err := lab.SeedJob(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rows) != 2 || res.Finalized() != 2 || res.Terminated() != 2 || res.Leaked() != 0 {
		t.Fatalf("rows %+v", res.Rows)
	}
	for _, row := range res.Rows {
		if row.Phase != corev1.PodSucceeded || row.ExitCode != "0" || row.Reason != podstatus.ReasonCompleted {
			t.Fatalf("row %+v", row)
		}
	}
	if n := terminateCalls(res.Rows[0].Instance); n != 1 {
		t.Fatalf("instance terminated %d times", n)
	}
}
