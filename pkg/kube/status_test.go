package kube_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/reaper-k8s/reaper/internal/kubeproxy"
	"github.com/reaper-k8s/reaper/internal/labstack"
	"github.com/reaper-k8s/reaper/pkg/kube"
	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/model"
)

// The apiserver the tests of this file share: starting one takes seconds,
// and each test works in namespaces of its own.
var (
	stackOnce sync.Once
	stack     *labstack.Stack
	stackErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if stack != nil {
		stack.Stop()
	}
	os.Exit(code)
}

// rig is Reaper's identity ("reaper", group "reaper") on the shared
// apiserver through a counting proxy, and the administrator beside it.
type rig struct {
	admin  kubernetes.Interface
	proxy  *kubeproxy.Proxy
	writer *kube.StatusWriter
	// log and rec receive what the writer logs and counts.
	log *bytes.Buffer
	rec *metrics.Recorder
}

func newRig(t *testing.T) *rig {
	t.Helper()
	stackOnce.Do(func() {
		stack, stackErr = labstack.Start(context.Background(), labstack.Options{Parts: labstack.Kube})
	})
	if stackErr != nil {
		t.Fatal(stackErr)
	}
	proxy, err := kubeproxy.Start(stack.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	cfg := proxy.Config(stack.ReaperRESTConfig())
	cfg.QPS, cfg.Burst = 1000, 2000
	client, err := kube.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{admin: stack.Kube, proxy: proxy, writer: kube.NewStatusWriter(client), log: &bytes.Buffer{}}
	logger := slog.New(slog.NewJSONHandler(&syncWriter{w: r.log}, nil))
	r.rec = metrics.New(logger, "", metrics.FunctionReconciler)
	r.writer.Log, r.writer.Metrics = logger, r.rec
	return r
}

// syncWriter serialises writes from the writer's parallel reads.
type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// Roles the tests bind to Reaper's group per namespace.
const (
	// roleFull is what Reaper needs: read Pods (get, list), patch their
	// status, post Events.
	roleFull = "reaper-kube-test"
	// roleNoEvents is roleFull without Events.
	roleNoEvents = "reaper-kube-test-no-events"
)

var roleOnce sync.Once

// namespace creates a namespace named after the test and what, and binds
// role (if any) in it to Reaper's group, waiting until Reaper may read its
// Pods.
func (r *rig) namespace(t *testing.T, what, role string) string {
	t.Helper()
	ctx := t.Context()
	roleOnce.Do(func() {
		pods := rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list"}}
		status := rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods/status"}, Verbs: []string{"patch"}}
		events := rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create"}}
		for name, rules := range map[string][]rbacv1.PolicyRule{roleFull: {pods, status, events}, roleNoEvents: {pods, status}} {
			_, err := r.admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}, metav1.CreateOptions{})
			if err != nil && !apierrors.IsAlreadyExists(err) {
				t.Fatal(err)
			}
		}
	})
	ns := strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()) + "-" + what)
	if err := stack.EnsureNamespaces(ctx, ns); err != nil {
		t.Fatal(err)
	}
	if role == "" {
		return ns
	}
	_, err := r.admin.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "reaper"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: "reaper"}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The authorizer sees the binding once its informer has.
	reaper, err := kubernetes.NewForConfig(stack.ReaperRESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := reaper.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{Limit: 1})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("binding %s in %s not in effect: %v", role, ns, err)
	}
	return ns
}

// pods creates n Pods in ns named prefix-0000... as a provider would
// (scheduled on the virtual node, Pending) and returns their refs in name
// order.
func (r *rig) pods(t *testing.T, ns, prefix string, n int) []model.PodRef {
	t.Helper()
	refs := make([]model.PodRef, n)
	errs := make(chan error, n)
	next := make(chan int)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for i := range next {
				name := fmt.Sprintf("%s-%04d", prefix, i)
				pod, err := r.admin.CoreV1().Pods(ns).Create(t.Context(), newPod(name), metav1.CreateOptions{})
				if err != nil {
					errs <- err
					continue
				}
				refs[i] = model.PodRef{Namespace: ns, Name: name, UID: string(pod.UID)}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		t.Fatalf("create pods: %v", err)
	}
	return refs
}

func newPod(name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			NodeName:      "reaper-virtual-node",
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{{Name: "main", Image: "busybox"}},
		},
	}
}

// exit is the outcome of a container that exited 0.
func exit() model.Outcome {
	now := time.Now().Truncate(time.Second)
	return model.Outcome{
		InstanceID: "i-0123456789abcdef0",
		Exits:      []model.Exit{{Container: "main", ExitCode: 0, StartedAt: now.Add(-time.Hour), FinishedAt: now, ReceivedAt: now}},
	}
}

// counts is the proxy's calls by action.
func (r *rig) counts() map[string]int {
	out := map[string]int{}
	for _, c := range r.proxy.Calls.Calls() {
		out[c.Action]++
	}
	return out
}

// setPhase writes the Pod's phase as the administrator.
func (r *rig) setPhase(t *testing.T, ref model.PodRef, phase corev1.PodPhase) {
	t.Helper()
	patch := fmt.Sprintf(`{"status":{"phase":%q}}`, phase)
	_, err := r.admin.CoreV1().Pods(ref.Namespace).Patch(t.Context(), ref.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "status")
	if err != nil {
		t.Fatal(err)
	}
}

func (r *rig) phase(t *testing.T, ref model.PodRef) corev1.PodPhase {
	t.Helper()
	pod, err := r.admin.CoreV1().Pods(ref.Namespace).Get(t.Context(), ref.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pod.Status.Phase
}

// events are the Events on the Pod with uid.
func (r *rig) events(t *testing.T, ns string, uid string) []corev1.Event {
	t.Helper()
	list, err := r.admin.CoreV1().Events(ns).List(t.Context(), metav1.ListOptions{FieldSelector: "involvedObject.uid=" + uid})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// eventsNotPosted is what the writer counted as EventsNotPosted since the
// last call.
func (r *rig) eventsNotPosted(t *testing.T) float64 {
	t.Helper()
	r.log.Reset()
	if err := r.rec.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	var n float64
	for line := range strings.SplitSeq(r.log.String(), "\n") {
		var root map[string]any
		if json.Unmarshal([]byte(line), &root) == nil {
			if v, ok := root[metrics.EventsNotPosted].(float64); ok {
				n += v
			}
		}
	}
	return n
}

func TestReadManyPages(t *testing.T) {
	r := newRig(t)
	ctx := t.Context()
	full := r.namespace(t, "full", roleFull)
	refs := r.pods(t, full, "pod", 1200)
	// Besides the Pods as they are: one turned Succeeded, one ref whose
	// Pod was replaced (another UID), one whose Pod never existed.
	r.setPhase(t, refs[7], corev1.PodSucceeded)
	replaced := model.PodRef{Namespace: full, Name: refs[8].Name, UID: "11111111-2222-3333-4444-555555555555"}
	gone := model.PodRef{Namespace: full, Name: "pod-9999", UID: "66666666-7777-8888-9999-000000000000"}

	r.proxy.Calls.Reset()
	snaps, err := r.writer.ReadMany(ctx, append(refs, replaced, gone))
	if err != nil {
		t.Fatal(err)
	}
	counts := r.counts()
	t.Logf("1,200 Pods: %v", counts)
	if counts["LIST pods"] > 3 || counts["GET pods"] != 0 || len(r.proxy.Calls.Calls()) != counts["LIST pods"] {
		t.Errorf("reading 1,200 Pods made %v; want at most 3 LIST pods and nothing else", counts)
	}
	if len(snaps) != len(refs)+2 {
		t.Fatalf("%d snapshots, want %d", len(snaps), len(refs)+2)
	}
	for i, ref := range refs {
		want := kube.Current
		if i == 7 {
			want = kube.AlreadyTerminal
		}
		if got := snaps[ref]; got.Result != want || got.Ref != ref {
			t.Errorf("%s: %+v, want %s", ref, got, want)
		}
	}
	if got := snaps[replaced].Result; got != kube.PodReplaced {
		t.Errorf("replaced: %s, want %s", got, kube.PodReplaced)
	}
	if got := snaps[gone].Result; got != kube.PodGone {
		t.Errorf("gone: %s, want %s", got, kube.PodGone)
	}
}

// TestReadManySparse: a few Pods wanted from a namespace of many cost about
// one GET each, not a LIST of the whole namespace, counted in the seats
// API Priority and Fairness charges: ten for a LIST page of 500, one for
// a GET.
func TestReadManySparse(t *testing.T) {
	const seatsPerPage = 10 // a LIST page of 500: 2 × 500 objects, 100 a seat
	r := newRig(t)
	ctx := t.Context()
	crowded := r.namespace(t, "crowded", roleFull)
	refs := r.pods(t, crowded, "pod", 2000)
	for _, c := range []struct {
		what   string
		wanted []model.PodRef
		// most is the most seats the reads may take.
		most int
	}{
		{"one Pod", refs[1999:], 1},
		{"two Pods past the first page", refs[1998:], 2},
		{"three Pods, one on the first page", []model.PodRef{refs[3], refs[1000], refs[1999]}, 3},
		{"ten Pods past the first page", refs[1990:], 10},
		// One page tells the namespace's size; 1,500 Pods left to list
		// would take 30 seats, 20 GETs take 20.
		{"twenty Pods past the first page", refs[1980:], seatsPerPage + 20},
		// 30 seats of pages against 100 GETs: the pages.
		{"a hundred Pods past the first page", refs[1900:], 4 * seatsPerPage},
	} {
		r.proxy.Calls.Reset()
		snaps, err := r.writer.ReadMany(ctx, c.wanted)
		if err != nil {
			t.Fatal(err)
		}
		n, counts := len(r.proxy.Calls.Calls()), r.counts()
		seats := n + (seatsPerPage-1)*counts["LIST pods"]
		t.Logf("%s of 2,000: %d requests %v, %d seats", c.what, n, counts, seats)
		if seats > c.most {
			t.Errorf("%s of 2,000: %d requests %v, %d seats; want at most %d seats", c.what, n, counts, seats, c.most)
		}
		for _, ref := range c.wanted {
			if snaps[ref].Result != kube.Current {
				t.Errorf("%s: %s is %q, want %s", c.what, ref, snaps[ref].Result, kube.Current)
			}
		}
	}
}

// TestReadManyFailures: a read that fails costs the refs it concerns only.
func TestReadManyFailures(t *testing.T) {
	r := newRig(t)
	ctx := t.Context()
	readable := r.namespace(t, "readable", roleFull)
	forbidden := r.namespace(t, "forbidden", "")
	failing := r.namespace(t, "failing", roleFull)
	good := r.pods(t, readable, "pod", 4)
	hidden := r.pods(t, forbidden, "pod", 1)
	broken := r.pods(t, failing, "pod", 3)

	// Every request in failing answers 500, and so does the GET of one
	// Pod of readable.
	r.proxy.Fail(func(c kubeproxy.Call) int {
		if c.Namespace == failing || c.Name == good[3].Name && c.Action == "GET pods" {
			return http.StatusInternalServerError
		}
		return 0
	})
	// Three Pods of readable (read by LIST), the forbidden one (by GET),
	// the three of failing (a LIST that fails).
	r.proxy.Calls.Reset()
	snaps, err := r.writer.ReadMany(ctx, append(append(append([]model.PodRef(nil), good[:3]...), hidden...), broken...))
	if err == nil {
		t.Fatal("no error for the refs that could not be read")
	}
	t.Logf("error: %v; requests %v", err, r.counts())
	for _, ref := range good[:3] {
		if snaps[ref].Result != kube.Current {
			t.Errorf("%s: %q, want %s", ref, snaps[ref].Result, kube.Current)
		}
	}
	for _, ref := range append(append([]model.PodRef(nil), hidden...), broken...) {
		if snap, ok := snaps[ref]; ok {
			t.Errorf("%s could not be read, yet has a snapshot %+v", ref, snap)
		}
	}
	if !strings.Contains(err.Error(), forbidden) || !strings.Contains(err.Error(), failing) || strings.Contains(err.Error(), readable) {
		t.Errorf("error %q: want it to name %s and %s, not %s", err, forbidden, failing, readable)
	}
	if n := r.proxy.Calls.CountFunc(func(c kubeproxy.Call) bool { return c.Namespace == forbidden }); n != 1 {
		t.Errorf("the forbidden ref cost %d requests, want 1", n)
	}

	// Read alone, a Pod is read by GET: its failure costs it only, and the
	// forbidden namespace's GET is refused as before.
	r.proxy.Calls.Reset()
	snaps, err = r.writer.ReadMany(ctx, []model.PodRef{good[3], hidden[0]})
	if err == nil || !strings.Contains(err.Error(), good[3].Name) {
		t.Fatalf("error %v: want it to name %s", err, good[3])
	}
	if len(snaps) != 0 {
		t.Errorf("snapshots %v for reads that failed", snaps)
	}
}

// TestApplyToFromReadMany: the writes from a batch read cost one patch and
// one Event per Pod, and no read.
func TestApplyToFromReadMany(t *testing.T) {
	r := newRig(t)
	ctx := t.Context()
	ns := r.namespace(t, "batch", roleFull)
	refs := r.pods(t, ns, "pod", 20)
	snaps, err := r.writer.ReadMany(ctx, refs)
	if err != nil {
		t.Fatal(err)
	}
	r.proxy.Calls.Reset()
	o := exit()
	for _, ref := range refs {
		res, err := result(r.writer.ApplyTo(ctx, snaps[ref], o))
		if err != nil || res != kube.Patched {
			t.Fatalf("%s: ApplyTo = %q, %v; want %s", ref, res, err, kube.Patched)
		}
	}
	counts := r.counts()
	want := map[string]int{"PATCH pods/status": len(refs), "POST events": len(refs)}
	if fmt.Sprint(counts) != fmt.Sprint(want) {
		t.Errorf("requests %v, want %v", counts, want)
	}
	for _, ref := range refs {
		if phase := r.phase(t, ref); phase != corev1.PodSucceeded {
			t.Errorf("%s is %s, want Succeeded", ref, phase)
		}
		evs := r.events(t, ns, ref.UID)
		if len(evs) != 1 || evs[0].Reason != "ContainerExited" || !strings.HasSuffix(evs[0].Message, "pod is Succeeded") {
			t.Errorf("%s: events %+v, want one ContainerExited saying the Pod is Succeeded", ref, evs)
		}
	}

	// The same step again (a redelivery): the Pods are terminal, nothing
	// is written.
	snaps, err = r.writer.ReadMany(ctx, refs)
	if err != nil {
		t.Fatal(err)
	}
	r.proxy.Calls.Reset()
	for _, ref := range refs {
		if res, err := result(r.writer.ApplyTo(ctx, snaps[ref], o)); err != nil || res != kube.AlreadyTerminal {
			t.Errorf("%s again: %q, %v; want %s", ref, res, err, kube.AlreadyTerminal)
		}
	}
	if n := len(r.proxy.Calls.Calls()); n != 0 {
		t.Errorf("the repeated step made %d requests %v, want none", n, r.counts())
	}
}

// TestApplyToGuards: a Pod that changed after the read is read again and,
// ended or replaced, not written, and no Event says otherwise.
func TestApplyToGuards(t *testing.T) {
	r := newRig(t)
	ctx := t.Context()
	ns := r.namespace(t, "guards", roleFull)
	refs := r.pods(t, ns, "pod", 2)
	ended, replaced := refs[0], refs[1]
	snaps, err := r.writer.ReadMany(ctx, refs)
	if err != nil {
		t.Fatal(err)
	}

	// After the read: one Pod ends (Failed, as the provider sees it), the
	// other is deleted and created again under its name.
	r.setPhase(t, ended, corev1.PodFailed)
	zero := int64(0)
	if err := r.admin.CoreV1().Pods(ns).Delete(ctx, replaced.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	successor, err := r.admin.CoreV1().Pods(ns).Create(ctx, newPod(replaced.Name), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	r.proxy.Calls.Reset()
	if res, err := result(r.writer.ApplyTo(ctx, snaps[ended], exit())); err != nil || res != kube.AlreadyTerminal {
		t.Errorf("ended after the read: %q, %v; want %s", res, err, kube.AlreadyTerminal)
	}
	if phase := r.phase(t, ended); phase != corev1.PodFailed {
		t.Errorf("ended Pod rewritten: %s, want Failed", phase)
	}
	want := map[string]int{"PATCH pods/status": 1, "GET pods": 1}
	if counts := r.counts(); fmt.Sprint(counts) != fmt.Sprint(want) {
		t.Errorf("ended after the read: requests %v, want %v (a conflict, one read again)", counts, want)
	}

	r.proxy.Calls.Reset()
	if res, err := result(r.writer.ApplyTo(ctx, snaps[replaced], exit())); err != nil || res != kube.PodReplaced {
		t.Errorf("replaced after the read: %q, %v; want %s", res, err, kube.PodReplaced)
	}
	if phase := r.phase(t, replaced); phase != corev1.PodPending {
		t.Errorf("replacement Pod written: %s, want Pending", phase)
	}
	if r.proxy.Calls.Count("POST events") != 0 {
		t.Errorf("requests %v: an Event for a Pod that was not written", r.counts())
	}
	for _, uid := range []string{ended.UID, replaced.UID, string(successor.UID)} {
		if evs := r.events(t, ns, uid); len(evs) != 0 {
			t.Errorf("events %+v on a Pod Reaper did not write", evs)
		}
	}
}

// TestEventFailures: an Event that cannot be posted leaves the step done,
// logged and counted.
func TestEventFailures(t *testing.T) {
	r := newRig(t)
	ctx := t.Context()
	allowed := r.namespace(t, "allowed", roleFull)
	denied := r.namespace(t, "denied", roleNoEvents)
	refused := r.pods(t, allowed, "pod", 1)[0]
	forbidden := r.pods(t, denied, "pod", 1)[0]
	r.proxy.Fail(func(c kubeproxy.Call) int {
		if c.Action == "POST events" && c.Namespace == allowed {
			return http.StatusInternalServerError
		}
		return 0
	})
	r.eventsNotPosted(t)
	for what, ref := range map[string]model.PodRef{"apiserver error": refused, "RBAC denies events": forbidden} {
		snap, err := r.writer.Read(ctx, ref)
		if err != nil {
			t.Fatal(err)
		}
		if res, err := result(r.writer.ApplyTo(ctx, snap, exit())); err != nil || res != kube.Patched {
			t.Errorf("%s: ApplyTo = %q, %v; want %s and no error", what, res, err, kube.Patched)
		}
		if phase := r.phase(t, ref); phase != corev1.PodSucceeded {
			t.Errorf("%s: Pod is %s, want Succeeded", what, phase)
		}
	}
	if !strings.Contains(r.log.String(), "event not posted") {
		t.Errorf("log %q: want the failed Events logged", r.log)
	}
	if n := r.eventsNotPosted(t); n != 2 {
		t.Errorf("%s = %v, want 2", metrics.EventsNotPosted, n)
	}
}

// TestEventLongPodName: a Pod whose name has the 253 characters a name may
// have gets its Event.
func TestEventLongPodName(t *testing.T) {
	r := newRig(t)
	ctx := t.Context()
	ns := r.namespace(t, "long", roleFull)
	// Labels of 63 characters, as long as a DNS label may be.
	label := strings.Repeat("a", 62) + "b"
	name := strings.Join([]string{label, label, label, strings.Repeat("c", 253-3*64)}, ".")
	if len(name) != 253 || len(validation.IsDNS1123Subdomain(name)) != 0 {
		t.Fatalf("fixture name %q (%d characters) is not a longest valid name", name, len(name))
	}
	pod, err := r.admin.CoreV1().Pods(ns).Create(ctx, newPod(name), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ref := model.PodRef{Namespace: ns, Name: name, UID: string(pod.UID)}
	snap, err := r.writer.Read(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	res, err := result(r.writer.ApplyTo(ctx, snap, exit()))
	if err != nil || res != kube.Patched {
		t.Fatalf("ApplyTo = %q, %v; want %s", res, err, kube.Patched)
	}
	evs := r.events(t, ns, ref.UID)
	if len(evs) != 1 {
		t.Fatalf("events %+v, want one (log: %s)", evs, r.log)
	}
	// The apiserver takes a core/v1 Event whatever its name (it skips
	// their name validation for compatibility; events.k8s.io/v1 does
	// not), so the test checks the name itself.
	got := evs[0].Name
	if errs := validation.IsDNS1123Subdomain(got); len(errs) != 0 || !strings.HasPrefix(name, got[:strings.LastIndexByte(got, '.')]) {
		t.Errorf("event name %q (%d characters): %v; want a valid name made of the Pod's, shortened", got, len(got), errs)
	}
}

// result is the Result of an ApplyTo.
func result(a kube.Applied, err error) (kube.Result, error) { return a.Result, err }
