package replay

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reaper-k8s/reaper/internal/ec2server"
	"github.com/reaper-k8s/reaper/pkg/intake"
	"github.com/reaper-k8s/reaper/pkg/reaper"
	"github.com/reaper-k8s/reaper/pkg/statechange"
)

// A side is one of two Reaper deployments sharing an account (one EC2 test
// server) and, here, one apiserver: its own cluster name, ledger table and
// namespace, and a record of every EC2 and Kubernetes write it sends.
type side struct {
	cluster string
	ns      string
	intake  *intake.Intake
	core    *reaper.Reaper
	queue   *memQueue
	writes  *writeCounter

	mu         sync.Mutex
	terminated []string // instance ids named in its TerminateInstances
	patched    []string // namespace/name of the Pods whose status it patched
}

// A Pod of the two-cluster scenario: whose it is and what happens to it.
type twoPod struct {
	owner  int // index into the sides
	name   string
	world  ec2server.State
	orphan bool
	events []propEvent
}

var twoPods = []twoPod{
	{owner: 0, name: "done", world: ec2server.Running, events: []propEvent{
		exitEvent(0, 0, false, 0), stateEvent("shutting-down", time.Second), stateEvent("terminated", 2*time.Second)}},
	{owner: 0, name: "spot", world: ec2server.Terminated, events: []propEvent{
		stateEvent("shutting-down", 0), stateEvent("terminated", time.Second)}},
	{owner: 1, name: "done", world: ec2server.Running, events: []propEvent{
		exitEvent(3, 0, false, 0), stateEvent("shutting-down", time.Second), stateEvent("terminated", 2*time.Second)}},
	{owner: 1, name: "restarting", world: ec2server.Terminated, events: []propEvent{
		exitEvent(1, 0, true, 0), stateEvent("terminated", time.Second)}},
	{owner: 1, name: "orphan", world: ec2server.Running, orphan: true},
}

// TestTwoClusters runs two deployments against one account: EventBridge
// tells both of every state change, each one's exit lines also reach the
// other (a host writing into the wrong log group), and both sweep at random
// points. Every interleaving must end as the in-order run does, and neither
// deployment may ever terminate the other's instances or write its Pods.
func TestTwoClusters(t *testing.T) {
	t.Parallel()
	shared := ec2server.New()
	t.Cleanup(shared.Close)
	var clock atomic.Int64
	sides := []*side{{cluster: "alpha"}, {cluster: "beta"}}
	for _, s := range sides {
		s.ns = "two-" + s.cluster
		if err := lab.Stack.EnsureNamespaces(t.Context(), s.ns); err != nil {
			t.Fatal(err)
		}
		s.writes = watchWrites(t, lab.Stack.Kube, s.ns)
		s.queue = &memQueue{}
		s.intake, s.core = newPropCore(t, propCore{table: "two-" + s.cluster, ec2: shared, cluster: s.cluster, clock: &clock,
			queue: s.queue, ec2Wrap: s.recordEC2, kubeWrap: s.recordKube})
	}
	run := func(n int, rng *rand.Rand) string {
		return runTwoClusters(t, shared, &clock, sides, n, rng)
	}
	want := run(0, nil)
	for i := 1; i <= max(*interleavings/4, 10); i++ {
		if got := run(i, rand.New(rand.NewPCG(uint64(i), 0x2c1))); got != want {
			t.Fatalf("seed %d ends differently from the in-order run:\n got %s\nwant %s", i, got, want)
		}
	}
	for i, s := range sides {
		other := sides[1-i]
		s.mu.Lock()
		for _, id := range s.terminated {
			if ownerOf(t, id) != i {
				t.Errorf("%s terminated %s, an instance of %s", s.cluster, id, other.cluster)
			}
		}
		for _, p := range s.patched {
			if strings.HasPrefix(p, other.ns+"/") {
				t.Errorf("%s wrote the status of %s, a Pod of %s", s.cluster, p, other.cluster)
			}
		}
		if len(s.terminated) == 0 || len(s.patched) == 0 {
			t.Errorf("%s terminated %d instances and patched %d Pods: the scenario did not exercise it", s.cluster, len(s.terminated), len(s.patched))
		}
		s.mu.Unlock()
		s.writes.checkNoTerminalRewrite(t)
	}
}

// twoInstanceID gives side i's Pod p of run n an id that says whose it is.
func twoInstanceID(n, i, p int) string {
	return fmt.Sprintf("i-%017x", 0x0c0c000000000000+uint64(n)<<12+uint64(i)<<8+uint64(p))
}

// ownerOf reads the side back from an id made by twoInstanceID.
func ownerOf(t *testing.T, id string) int {
	v, err := strconv.ParseUint(strings.TrimPrefix(id, "i-"), 16, 64)
	if err != nil {
		t.Fatalf("instance id %q: %v", id, err)
	}
	return int(v >> 8 & 0xf)
}

func runTwoClusters(t *testing.T, shared *ec2server.Server, clock *atomic.Int64, sides []*side, n int, rng *rand.Rand) string {
	ctx := t.Context()
	start := time.Now().Truncate(time.Second)
	clock.Store(start.UnixNano())
	type live struct {
		twoPod
		id  string
		pod *corev1.Pod
	}
	var pods []live
	for p, tp := range twoPods {
		s := sides[tp.owner]
		pod, err := lab.RunningPod(ctx, s.ns, fmt.Sprintf("%s-%03d", tp.name, n), corev1.RestartPolicyAlways)
		if err != nil {
			t.Fatal(err)
		}
		id := twoInstanceID(n, tp.owner, p)
		shared.AddInstance(ec2server.Instance{ID: id, State: ec2server.Running, LaunchTime: start.Add(-time.Hour),
			Tags: lab.InstanceTags(pod, true, s.cluster)})
		if tp.orphan {
			if err := lab.DeletePod(ctx, s.ns, pod.Name); err != nil {
				t.Fatal(err)
			}
		}
		pods = append(pods, live{tp, id, pod})
	}

	// Deliveries: each exit line to its own side and to the other; each
	// state change to both; sweeps and reconciler batches of either.
	const sweep, batch = -1, -2
	type delivery struct {
		to    int
		pod   int
		event int // or sweep, batch: of side to
	}
	var schedule []delivery
	for p, lp := range pods {
		for e := range lp.events {
			for to := range sides {
				schedule = append(schedule, delivery{to, p, e})
			}
		}
	}
	if rng != nil {
		for range rng.IntN(5) {
			schedule = append(schedule, delivery{rng.IntN(2), 0, sweep})
		}
		for range rng.IntN(6) {
			schedule = append(schedule, delivery{rng.IntN(2), 0, batch})
		}
		rng.Shuffle(len(schedule), func(i, j int) { schedule[i], schedule[j] = schedule[j], schedule[i] })
	}
	for _, lp := range pods {
		if lp.world != ec2server.Running {
			shared.SetState(lp.id, lp.world)
		}
	}
	for _, d := range schedule {
		in, core := sides[d.to].intake, sides[d.to].core
		switch d.event {
		case sweep:
			_, _ = core.Sweep(ctx, time.Minute) // errors are retried by the final sweeps
			continue
		case batch:
			sides[d.to].queue.batch(t, core, rng)
			continue
		}
		lp := pods[d.pod]
		e := lp.events[d.event]
		if e.exit != nil {
			if _, err := in.HandleExits(ctx, exitBatch(t, *e.exit, lp.id, lp.pod, start.Add(e.at), core.Now())); err != nil {
				t.Fatalf("exit: %v", err)
			}
			continue
		}
		if _, err := in.HandleStateChange(ctx, statechange.Message{InstanceID: lp.id, State: e.state, Time: start.Add(e.at)}); err != nil {
			t.Fatalf("state change: %v", err)
		}
	}
	for _, s := range sides {
		s.queue.drain(t, s.core)
	}
	clock.Store(start.Add(propWindow + time.Minute).UnixNano())
	for _, s := range sides {
		if _, err := s.core.Sweep(ctx, time.Minute); err != nil {
			t.Fatalf("final sweep of %s: %v", s.cluster, err)
		}
		s.queue.drain(t, s.core)
	}

	var b strings.Builder
	for _, lp := range pods {
		s := sides[lp.owner]
		fmt.Fprintf(&b, "[%s/%s: ", s.cluster, lp.name)
		p, err := lab.Stack.Kube.CoreV1().Pods(s.ns).Get(ctx, lp.pod.Name, metav1.GetOptions{})
		if err == nil {
			fmt.Fprintf(&b, "pod %s", p.Status.Phase)
			for _, cs := range p.Status.ContainerStatuses {
				fmt.Fprintf(&b, " restarts=%d %s", cs.RestartCount, stateString(cs.State))
			}
			s.writes.waitSeen(t, p.Name, p.ResourceVersion)
		} else {
			b.WriteString("pod absent")
		}
		i, _ := shared.Instance(lp.id)
		fmt.Fprintf(&b, "; instance %s] ", i.State)
	}
	return b.String()
}

// recordEC2 notes the instances named in every TerminateInstances the side
// sends.
func (s *side) recordEC2(next http.RoundTripper) http.RoundTripper {
	return roundTripper(func(r *http.Request) (*http.Response, error) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return nil, err
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		if form, err := url.ParseQuery(string(body)); err == nil && form.Get("Action") == "TerminateInstances" {
			s.mu.Lock()
			for k, v := range form {
				if strings.HasPrefix(k, "InstanceId.") {
					s.terminated = append(s.terminated, v...)
				}
			}
			s.mu.Unlock()
		}
		return next.RoundTrip(r)
	})
}

// recordKube notes every Pod status the side patches.
func (s *side) recordKube(next http.RoundTripper) http.RoundTripper {
	return roundTripper(func(r *http.Request) (*http.Response, error) {
		// /api/v1/namespaces/<ns>/pods/<name>/status
		parts := strings.Split(r.URL.Path, "/")
		if r.Method == http.MethodPatch && len(parts) == 8 && parts[7] == "status" {
			s.mu.Lock()
			if !slices.Contains(s.patched, parts[4]+"/"+parts[6]) {
				s.patched = append(s.patched, parts[4]+"/"+parts[6])
			}
			s.mu.Unlock()
		}
		return next.RoundTrip(r)
	})
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
