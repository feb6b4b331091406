package replay

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/reaper-k8s/reaper/internal/ec2server"
	"github.com/reaper-k8s/reaper/internal/labstack"
	"github.com/reaper-k8s/reaper/pkg/app"
	"github.com/reaper-k8s/reaper/pkg/app/reaperapp"
	"github.com/reaper-k8s/reaper/pkg/config"
	"github.com/reaper-k8s/reaper/pkg/exitline"
	"github.com/reaper-k8s/reaper/pkg/intake"
	"github.com/reaper-k8s/reaper/pkg/ledger"
	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/model"
	"github.com/reaper-k8s/reaper/pkg/reaper"
	"github.com/reaper-k8s/reaper/pkg/statechange"
)

var interleavings = flag.Int("interleavings", 100, "random interleavings per scenario in TestInterleavings (two instances each)")

// An event of a property scenario, before it is bound to a run's instance.
type propEvent struct {
	exit  *exitline.Line // an exit line (one payload)
	state string         // or a state change
	at    time.Duration  // event time, from the run's start
}

type propScenario struct {
	name   string
	world  ec2server.State // what happened to the instance outside Reaper
	policy corev1.RestartPolicy
	events []propEvent
	// orphan deletes the Pod before anything happens.
	orphan bool
	// endedElsewhere makes the Pod Failed before anything happens, as a
	// provider or a person may: Reaper must leave it as it is.
	endedElsewhere bool
}

func exitEvent(code int, rc int32, willRestart bool, at time.Duration) propEvent {
	return propEvent{at: at, exit: &exitline.Line{ExitCode: code, RestartCount: rc, WillRestart: willRestart, BackoffSeconds: 10}}
}

func stateEvent(state string, at time.Duration) propEvent { return propEvent{state: state, at: at} }

var propScenarios = []propScenario{
	{name: "exit-then-terminated", world: ec2server.Running, policy: corev1.RestartPolicyNever, events: []propEvent{
		exitEvent(0, 0, false, 0), stateEvent("shutting-down", time.Second), stateEvent("terminated", 2*time.Second),
	}},
	{name: "terminated-before-exit", world: ec2server.Terminated, policy: corev1.RestartPolicyNever, events: []propEvent{
		stateEvent("shutting-down", 0), stateEvent("terminated", time.Second), exitEvent(1, 0, false, 2*time.Second),
	}},
	{name: "spot-no-exit", world: ec2server.Terminated, policy: corev1.RestartPolicyNever, events: []propEvent{
		stateEvent("shutting-down", 0), stateEvent("terminated", time.Second),
	}},
	{name: "manual-stop", world: ec2server.Stopped, policy: corev1.RestartPolicyNever, events: []propEvent{
		stateEvent("stopping", 0), stateEvent("stopped", time.Second),
	}},
	{name: "restarts", world: ec2server.Running, policy: corev1.RestartPolicyAlways, events: []propEvent{
		exitEvent(1, 0, true, 0), exitEvent(1, 1, true, time.Second), exitEvent(0, 2, false, 2*time.Second),
	}},
	{name: "orphan", world: ec2server.Running, policy: corev1.RestartPolicyNever, orphan: true},
	{name: "ended-elsewhere", world: ec2server.Running, policy: corev1.RestartPolicyNever, endedElsewhere: true, events: []propEvent{
		exitEvent(0, 0, false, 0), stateEvent("terminated", time.Second),
	}},
}

// TestInterleavings replays each scenario's events in many seeded random
// orders, with duplicates, with sweeps and reconciler batches at random
// points, with redelivered work items, and for two instances at once whose
// work shares the batches; it checks that every order ends where the
// in-order run ends, for both: the same Pod status, ledger and instance
// state. A watch counts the status writes the apiserver
// accepts: a Pod that is Succeeded or Failed must never be written again.
func TestInterleavings(t *testing.T) {
	t.Parallel()
	for _, sc := range propScenarios {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			h := newPropHarness(t, sc)
			want := h.run(t, 0, nil)
			for i := 1; i <= *interleavings; i++ {
				seed := uint64(i)
				if got := h.run(t, i, rand.New(rand.NewPCG(seed, 0x5eed))); got != want {
					t.Fatalf("seed %d ends differently from the in-order run:\n got %s\nwant %s", seed, got, want)
				}
			}
			h.writes.checkNoTerminalRewrite(t)
		})
	}
}

// propHarness runs Reaper's core in-process, wired as the handlers wire it,
// against the real apiserver and dynalite, with its own ledger table and EC2
// test server per scenario, and a clock the test moves.
type propHarness struct {
	sc     propScenario
	ns     string
	ec2    *ec2server.Server
	intake *intake.Intake
	core   *reaper.Reaper
	queue  *memQueue
	clock  atomic.Int64 // unix nanos
	writes *writeCounter
}

const propWindow = time.Minute

func newPropHarness(t *testing.T, sc propScenario) *propHarness {
	ctx := t.Context()
	h := &propHarness{sc: sc, ns: "prop-" + sc.name, ec2: ec2server.New(), queue: &memQueue{}}
	t.Cleanup(h.ec2.Close)
	kc, err := kubernetes.NewForConfig(lab.Stack.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := lab.Stack.EnsureNamespaces(ctx, h.ns); err != nil {
		t.Fatal(err)
	}
	h.writes = watchWrites(t, kc, h.ns)
	h.intake, h.core = newPropCore(t, propCore{table: "prop-" + sc.name, ec2: h.ec2, cluster: labstack.Cluster, clock: &h.clock, queue: h.queue})
	return h
}

// propCore says how to wire one in-process Reaper for a property test.
type propCore struct {
	table   string
	ec2     *ec2server.Server
	cluster string
	clock   *atomic.Int64 // unix nanos
	queue   intake.Queue
	// dryRun wires the core of a dry run (REAPER_DRY_RUN).
	dryRun bool
	// ec2Wrap and kubeWrap, when set, see every request the core sends.
	ec2Wrap, kubeWrap func(http.RoundTripper) http.RoundTripper
}

// newPropCore wires Reaper's intake and core as the functions wire them
// (app.NewIntake, reaperapp.New), against the real apiserver and dynalite,
// with its own ledger table, and the given EC2 test server, cluster, queue
// and clock.
func newPropCore(t *testing.T, c propCore) (*intake.Intake, *reaper.Reaper) {
	ctx := t.Context()
	setup := app.Setup{
		Function: metrics.FunctionReconciler,
		Config: config.Config{
			Table: c.table, Cluster: c.cluster, Tags: model.DefaultTagKeys(), DryRun: c.dryRun,
			ExitWait: propWindow, TerminateStopped: true,
			// The scenarios' EC2 test servers have no buckets to pace to.
			EC2Budget: model.Budget{Describe: unpaced, Terminate: unpaced, TerminateInstances: unpaced}, EC2Share: 1, ReconcilerConcurrency: 1,
		},
		AWS: lab.Stack.AWSConfig(ctx),
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Now: func() time.Time { return time.Unix(0, c.clock.Load()) },
	}
	setup.AWS.Retryer = app.Retryer // as the functions have it
	db := dynamodb.NewFromConfig(setup.AWS)
	if err := ledger.CreateTable(ctx, db, c.table); err != nil {
		t.Fatal(err)
	}
	rc := lab.Stack.RESTConfig()
	if c.kubeWrap != nil {
		rc.Wrap(c.kubeWrap)
	}
	ec2Client := ec2.NewFromConfig(setup.AWS, func(o *ec2.Options) {
		o.BaseEndpoint = new(c.ec2.URL())
		if c.ec2Wrap != nil {
			o.HTTPClient = &http.Client{Transport: c.ec2Wrap(http.DefaultTransport.(*http.Transport).Clone())}
		}
	})
	clients := reaperapp.Clients{Clients: app.Clients{Queue: c.queue}, DynamoDB: db, EC2: ec2Client, Kube: rc}
	core, err := reaperapp.New(ctx, setup, clients)
	if err != nil {
		t.Fatal(err)
	}
	return app.NewIntake(setup, clients.Clients), core
}

// unpaced is a bucket no scenario empties.
var unpaced = model.Bucket{Capacity: 1 << 30, Refill: 1 << 30}

// subject is one instance of a run and its Pod.
type subject struct {
	id  string
	pod *corev1.Pod
}

// run plays one interleaving (rng nil: in order, once each, a batch after
// each event) for two fresh Pods and instances, and returns the normalized
// end state, which must be the same for both.
func (h *propHarness) run(t *testing.T, n int, rng *rand.Rand) string {
	ctx := t.Context()
	start := time.Now().Truncate(time.Second)
	h.clock.Store(start.UnixNano())
	var subjects []subject
	for k := range 2 {
		name := fmt.Sprintf("%s-%03d-%d", h.sc.name, n, k)
		pod, err := lab.RunningPod(ctx, h.ns, name, h.sc.policy)
		if err != nil {
			t.Fatal(err)
		}
		id := fmt.Sprintf("i-%017x", 0x0b0b000000000000+uint64(2*n+k)+uint64(len(h.sc.name))<<32)
		h.ec2.AddInstance(ec2server.Instance{ID: id, State: ec2server.Running, LaunchTime: start.Add(-time.Hour),
			Tags: lab.InstanceTags(pod, true, labstack.Cluster)})
		if h.sc.endedElsewhere {
			patch := []byte(`{"status":{"phase":"Failed","reason":"Evicted","containerStatuses":[{"name":"main","image":"busybox","imageID":"","ready":false,"restartCount":0,"state":{"terminated":{"exitCode":2,"reason":"Error"}}}]}}`)
			if _, err := lab.Stack.Kube.CoreV1().Pods(h.ns).Patch(ctx, name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
				t.Fatal(err)
			}
		}
		if h.sc.orphan {
			if err := lab.DeletePod(ctx, h.ns, name); err != nil {
				t.Fatal(err)
			}
		}
		subjects = append(subjects, subject{id: id, pod: pod})
	}

	// The schedule: every event of each instance once in order, or
	// shuffled with duplicates, sweeps and reconciler batches mixed in.
	const sweep, batch = -1, -2
	type step struct{ subject, event int }
	var schedule []step
	for k := range subjects {
		for i := range h.sc.events {
			schedule = append(schedule, step{k, i})
			if rng == nil {
				schedule = append(schedule, step{k, batch})
			}
			if rng != nil {
				for range rng.IntN(3) {
					schedule = append(schedule, step{k, i})
				}
			}
		}
	}
	if rng != nil {
		for range rng.IntN(4) {
			schedule = append(schedule, step{0, sweep})
		}
		for range 1 + rng.IntN(4) {
			schedule = append(schedule, step{0, batch})
		}
		rng.Shuffle(len(schedule), func(i, j int) { schedule[i], schedule[j] = schedule[j], schedule[i] })
	}
	// The world: what happened to the instances outside Reaper.
	if h.sc.world != ec2server.Running {
		for _, s := range subjects {
			h.ec2.SetState(s.id, h.sc.world)
		}
	}
	for _, st := range schedule {
		switch st.event {
		case sweep:
			_, _ = h.core.Sweep(ctx, time.Minute) // errors are retried by the final sweep
		case batch:
			h.queue.batch(t, h.core, rng)
		default:
			s := subjects[st.subject]
			h.play(t, h.sc.events[st.event], s.id, s.pod, start)
		}
	}
	// After the window: the final sweep settles what is left.
	h.queue.drain(t, h.core)
	h.clock.Store(start.Add(propWindow + time.Minute).UnixNano())
	if _, err := h.core.Sweep(ctx, time.Minute); err != nil {
		t.Fatalf("final sweep: %v", err)
	}
	h.queue.drain(t, h.core)
	first := h.endState(t, subjects[0].id, subjects[0].pod, start)
	if second := h.endState(t, subjects[1].id, subjects[1].pod, start); second != first {
		t.Fatalf("the two instances of one run end differently:\n%s\n%s", first, second)
	}
	return first
}

func (h *propHarness) play(t *testing.T, e propEvent, id string, pod *corev1.Pod, start time.Time) {
	ctx := t.Context()
	if e.exit != nil {
		if _, err := h.intake.HandleExits(ctx, exitBatch(t, *e.exit, id, pod, start.Add(e.at), h.core.Now())); err != nil {
			t.Fatalf("exit: %v", err)
		}
		return
	}
	if i, ok := h.ec2.Instance(id); ok && model.StateRank(e.state) > model.StateRank(string(i.State)) && model.StateRank(e.state) <= model.StateRank(string(h.sc.world)) {
		h.ec2.SetState(id, ec2server.State(e.state))
	}
	if _, err := h.intake.HandleStateChange(ctx, statechange.Message{InstanceID: id, State: e.state, Time: start.Add(e.at)}); err != nil {
		t.Fatalf("state change: %v", err)
	}
}

// exitBatch is the batch the exitrecorder makes of one exit line for the
// Pod on instance id, finished at finished and received at now.
func exitBatch(t *testing.T, l exitline.Line, id string, pod *corev1.Pod, finished, now time.Time) exitline.Batch {
	t.Helper()
	l.StartedAt, l.FinishedAt = finished.Add(-time.Hour), finished
	ev, err := ExitLogsEvent(id, pod, l, 1)
	if err != nil {
		t.Fatal(err)
	}
	b, err := exitline.FromLogsEvent(ev, now)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// endState renders what must not depend on the order: the Pod's phase,
// container state and conditions, the ledger's knowledge and steps, and the
// instance's state.
func (h *propHarness) endState(t *testing.T, id string, pod *corev1.Pod, start time.Time) string {
	ctx := t.Context()
	var b strings.Builder
	p, err := lab.Stack.Kube.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	switch {
	case err == nil:
		fmt.Fprintf(&b, "pod %s", p.Status.Phase)
		for _, cs := range p.Status.ContainerStatuses {
			fmt.Fprintf(&b, " %s(restarts=%d %s last=%s)", cs.Name, cs.RestartCount, stateString(cs.State), stateString(cs.LastTerminationState))
		}
		for _, c := range p.Status.Conditions {
			fmt.Fprintf(&b, " %s=%s/%s", c.Type, c.Status, c.Reason)
		}
		h.writes.waitSeen(t, pod.Name, p.ResourceVersion)
	default:
		fmt.Fprintf(&b, "pod absent")
	}
	rec, ok, err := h.core.Ledger.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if ok {
		fmt.Fprintf(&b, "; ledger synced=%s terminated=%v last=%s", rec.PodSynced, !rec.Terminated.IsZero(), rec.LastState)
		if rec.Latest() != nil {
			fmt.Fprintf(&b, " exit=%d/rc%d", rec.Latest().ExitCode, rec.Latest().RestartCount)
		}
		if rec.Gone != nil {
			fmt.Fprintf(&b, " gone=%s@+%s", rec.Gone.State, rec.Gone.At.Sub(start))
		}
	}
	i, _ := h.ec2.Instance(id)
	fmt.Fprintf(&b, "; instance %s", i.State)
	return b.String()
}

func stateString(s corev1.ContainerState) string {
	switch {
	case s.Terminated != nil:
		return fmt.Sprintf("terminated:%d:%s", s.Terminated.ExitCode, s.Terminated.Reason)
	case s.Waiting != nil:
		return "waiting:" + s.Waiting.Reason
	case s.Running != nil:
		return "running"
	}
	return "-"
}

// writeCounter watches a namespace's Pods and counts, per Pod, the writes
// the apiserver accepted after the Pod had become terminal.
type writeCounter struct {
	mu       sync.Mutex
	terminal map[string]bool
	late     map[string]int
	seen     map[string]int64
	cond     *sync.Cond
}

func watchWrites(t *testing.T, kc kubernetes.Interface, ns string) *writeCounter {
	w := &writeCounter{terminal: map[string]bool{}, late: map[string]int{}, seen: map[string]int64{}}
	w.cond = sync.NewCond(&w.mu)
	ctx, cancel := context.WithCancel(context.Background())
	watcher, err := kc.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); watcher.Stop() })
	go func() {
		for ev := range watcher.ResultChan() {
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			rv, _ := strconv.ParseInt(pod.ResourceVersion, 10, 64)
			w.mu.Lock()
			if ev.Type == watch.Modified && w.terminal[pod.Name] {
				w.late[pod.Name]++
			}
			if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
				w.terminal[pod.Name] = true
			}
			w.seen[pod.Name] = rv
			w.cond.Broadcast()
			w.mu.Unlock()
		}
	}()
	return w
}

// waitSeen waits until the watch has delivered the Pod at resourceVersion rv.
func (w *writeCounter) waitSeen(t *testing.T, name, rv string) {
	want, _ := strconv.ParseInt(rv, 10, 64)
	deadline := time.AfterFunc(10*time.Second, func() { w.mu.Lock(); w.cond.Broadcast(); w.mu.Unlock() })
	defer deadline.Stop()
	start := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	for w.seen[name] < want {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("watch did not deliver pod %s at %s", name, rv)
		}
		w.cond.Wait()
	}
}

func (w *writeCounter) checkNoTerminalRewrite(t *testing.T) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for name, n := range w.late {
		t.Errorf("pod %s was written %d times after it had ended", name, n)
	}
}
