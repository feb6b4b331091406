package deploy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/reaper-k8s/reaper/deploy"
	"github.com/reaper-k8s/reaper/internal/labstack"
	"github.com/reaper-k8s/reaper/pkg/kube"
	"github.com/reaper-k8s/reaper/pkg/model"
)

// virtualNode is the name of the virtual node in this repository's tests
// (VirtualNode in internal/replay), which the chart's default node prefix
// must match.
const virtualNode = "reaper-virtual-node"

// containerID is the runtime's id of every fixture Pod's container.
const containerID = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// The addresses a provider gives a fixture Pod and its instance.
const (
	podIP  = "10.0.0.5"
	hostIP = "10.1.0.5"
)

// renderObjects renders the chart for namespace with values over its
// defaults, as `helm template -n <namespace>` does, and decodes every
// object.
func renderObjects(t *testing.T, namespace string, values map[string]any) []runtime.Object {
	t.Helper()
	objs, err := deploy.Objects(t.Context(), namespace, values)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// withNamespaceCreated returns values with namespace.create set, as the
// manifests of deploy/ are rendered: nothing else creates the namespace
// when they are applied.
func withNamespaceCreated(values map[string]any) map[string]any {
	values = maps.Clone(values)
	if values == nil {
		values = map[string]any{}
	}
	values["namespace"] = map[string]any{"create": true}
	return values
}

// only returns the single object of type T among objs.
func only[T runtime.Object](t *testing.T, objs []runtime.Object) T {
	t.Helper()
	var found []T
	for _, obj := range objs {
		if o, ok := obj.(T); ok {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		var zero T
		t.Fatalf("the chart renders %d objects of type %T, want 1", len(found), zero)
	}
	return found[0]
}

// create creates one object of the kinds the chart renders.
func create(t *testing.T, client kubernetes.Interface, obj runtime.Object) {
	t.Helper()
	if err := deploy.Create(t.Context(), client, obj); err != nil {
		t.Fatal(err)
	}
}

// applyChart renders the chart for namespace with values, creating the
// namespace as deploy/ does, and creates its objects, as `kubectl apply`
// does with the rendering.
func applyChart(t *testing.T, client kubernetes.Interface, namespace string, values map[string]any) []runtime.Object {
	t.Helper()
	objs := renderObjects(t, namespace, withNamespaceCreated(values))
	for _, obj := range objs {
		create(t, client, obj)
	}
	return objs
}

// identity is one user the tests write Pod statuses as.
type identity struct {
	name   string // the username the apiserver sees, or "group <name>"
	groups []string
	client kubernetes.Interface
	writer *kube.StatusWriter
}

// newIdentity makes the clients for config and checks who the apiserver
// takes it for.
func newIdentity(t *testing.T, config *rest.Config) identity {
	t.Helper()
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		t.Fatal(err)
	}
	review, err := client.AuthenticationV1().SelfSubjectReviews().Create(t.Context(), &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("who am I: %v", err)
	}
	kc, err := kube.NewClient(config)
	if err != nil {
		t.Fatal(err)
	}
	user := review.Status.UserInfo
	t.Logf("identity %s, groups %v", user.Username, user.Groups)
	return identity{name: user.Username, groups: user.Groups, client: client, writer: kube.NewStatusWriter(kc)}
}

// boundIdentities returns credentials for each subject of the rendered
// binding, so that a subject added to the chart is tested against the
// policy too.
func boundIdentities(t *testing.T, stack *labstack.Stack, objs []runtime.Object) []identity {
	t.Helper()
	var ids []identity
	for _, s := range only[*rbacv1.ClusterRoleBinding](t, objs).Subjects {
		ids = append(ids, subjectIdentity(t, stack, s))
	}
	return ids
}

// subjectIdentity returns credentials for one subject of the binding: the
// stack's own token for the group "reaper", the apiserver's impersonation
// for another group, a token from the TokenRequest API for a
// ServiceAccount.
func subjectIdentity(t *testing.T, stack *labstack.Stack, s rbacv1.Subject) identity {
	t.Helper()
	switch s.Kind {
	case rbacv1.GroupKind:
		config := stack.ReaperRESTConfig()
		if s.Name != "reaper" {
			config = stack.RESTConfig()
			config.Impersonate = rest.ImpersonationConfig{UserName: "reaper-" + s.Name, Groups: []string{s.Name}}
		}
		id := newIdentity(t, config)
		if !slices.Contains(id.groups, s.Name) {
			t.Fatalf("%s is not in the group %s: %v", id.name, s.Name, id.groups)
		}
		id.name = "group " + s.Name
		return id
	case rbacv1.ServiceAccountKind:
		id := newIdentity(t, serviceAccountConfig(t, stack, s.Namespace, s.Name))
		if want := "system:serviceaccount:" + s.Namespace + ":" + s.Name; id.name != want {
			t.Fatalf("the token of %s/%s authenticates as %s, want %s", s.Namespace, s.Name, id.name, want)
		}
		// Covered for its own sake, not as a member of a bound group.
		if slices.Contains(id.groups, "reaper") {
			t.Fatalf("%s is in the group reaper: %v", id.name, id.groups)
		}
		return id
	}
	t.Fatalf("the chart binds %s %q, which this test has no credentials for: add them, and make the policy cover it", s.Kind, s.Name)
	return identity{}
}

// serviceAccountConfig returns a client configuration with a token of the
// ServiceAccount from the TokenRequest API, as a kubeconfig would carry.
func serviceAccountConfig(t *testing.T, stack *labstack.Stack, namespace, name string) *rest.Config {
	t.Helper()
	tr, err := stack.Kube.CoreV1().ServiceAccounts(namespace).CreateToken(t.Context(), name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for %s/%s: %v", namespace, name, err)
	}
	c := rest.AnonymousClientConfig(stack.RESTConfig())
	c.BearerToken = tr.Status.Token
	return c
}

// exited is the outcome of a container that exited 0 and will not
// restart, as pkg/reaper hands it to pkg/kube.
func exited(now time.Time) model.Outcome {
	return model.Outcome{InstanceID: "i-0123456789abcdef0", Exits: []model.Exit{{
		Container: "main", ContainerID: containerID, ExitCode: 0,
		StartedAt: now.Add(-time.Hour), FinishedAt: now, ReceivedAt: now,
	}}}
}

// restarting is the outcome of a container that exited 1 and that the host
// restarts.
func restarting(now time.Time) model.Outcome {
	return model.Outcome{InstanceID: "i-0123456789abcdef0", Exits: []model.Exit{{
		Container: "main", ContainerID: containerID, ExitCode: 1,
		StartedAt: now.Add(-time.Hour), FinishedAt: now, ReceivedAt: now,
		WillRestart: true, BackoffSeconds: 10,
	}}}
}

// lost is the outcome of an instance terminated with no exit line.
func lost(now time.Time) model.Outcome {
	return model.Outcome{InstanceID: "i-0123456789abcdef0",
		Lost: &model.Gone{State: model.StateTerminated, At: now.Add(-4 * time.Minute)}, LostAfter: 3 * time.Minute}
}

// apply writes what Reaper writes for an outcome, with pkg/kube itself:
// read the Pod, patch its status with UID and resourceVersion
// preconditions, post the Event.
func (id identity) apply(ctx context.Context, pod *corev1.Pod, outcome func(now time.Time) model.Outcome) (kube.Result, error) {
	snap, err := id.writer.Read(ctx, model.PodRef{Namespace: pod.Namespace, Name: pod.Name, UID: string(pod.UID)})
	if err != nil {
		return "", err
	}
	applied, err := id.writer.ApplyTo(ctx, snap, outcome(time.Now().Truncate(time.Second)))
	return applied.Result, err
}

// fixture is the state a test Pod is put in before a write is tried on
// it, as its provider would put it.
type fixture struct {
	node   string
	labels map[string]string
	// phase is Pending (created, never started), Running (started on its
	// instance: container running, IPs set), Succeeded or Failed (ended
	// after running).
	phase corev1.PodPhase
	// ready marks a Running Pod Ready and ContainersReady; otherwise both
	// are False, as after a failed readiness probe or a restart.
	ready bool
	// init are the Pod's init containers, in order, before "main"; those
	// whose name starts with "sidecar" are native sidecars.
	init []string
}

// newPod creates a Pod in the default namespace and brings it to f's
// state as an administrator.
func newPod(t *testing.T, client kubernetes.Interface, name string, f fixture) *corev1.Pod {
	t.Helper()
	ctx := t.Context()
	spec := corev1.PodSpec{
		NodeName:      f.node,
		RestartPolicy: corev1.RestartPolicyNever,
		Containers:    []corev1.Container{{Name: "main", Image: "busybox"}},
	}
	for _, c := range f.init {
		init := corev1.Container{Name: c, Image: "busybox"}
		if strings.HasPrefix(c, "sidecar") {
			init.RestartPolicy = new(corev1.ContainerRestartPolicyAlways)
		}
		spec.InitContainers = append(spec.InitContainers, init)
	}
	pod, err := client.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: f.labels},
		Spec:       spec,
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if f.phase == corev1.PodPending {
		return pod
	}
	started := metav1.NewTime(time.Now().Add(-time.Hour).Truncate(time.Second))
	ready := corev1.ConditionFalse
	if f.ready {
		ready = corev1.ConditionTrue
	}
	status := corev1.PodStatus{
		Phase:   corev1.PodRunning,
		PodIP:   podIP,
		PodIPs:  []corev1.PodIP{{IP: podIP}},
		HostIP:  hostIP,
		HostIPs: []corev1.HostIP{{IP: hostIP}},
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: started},
			{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: started},
			{Type: corev1.ContainersReady, Status: ready, LastTransitionTime: started},
			{Type: corev1.PodReady, Status: ready, LastTransitionTime: started},
		},
		ContainerStatuses: []corev1.ContainerStatus{{
			Name: "main", Image: "busybox", ImageID: "docker-pullable://busybox@sha256:0", ContainerID: "docker://" + containerID,
			Ready: f.ready, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: started}},
		}},
	}
	if err := patchStatus(ctx, client, pod, map[string]any{"status": status}); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	if f.phase != corev1.PodRunning {
		pod = getPod(t, client, pod)
		end := map[string]any{"status": map[string]any{"phase": f.phase, "conditions": notReady}}
		if err := patchStatus(ctx, client, pod, end); err != nil {
			t.Fatalf("end %s: %v", name, err)
		}
	}
	return getPod(t, client, pod)
}

// notReady is what every status write of Reaper's says of readiness.
var notReady = []map[string]any{
	{"type": corev1.ContainersReady, "status": corev1.ConditionFalse, "reason": "ContainersNotReady"},
	{"type": corev1.PodReady, "status": corev1.ConditionFalse, "reason": "ContainersNotReady"},
}

// patchStatus sends a strategic-merge patch of pods/status shaped like
// Reaper's (pkg/kube): patch with the Pod's UID and resourceVersion added as
// preconditions.
func patchStatus(ctx context.Context, client kubernetes.Interface, pod *corev1.Pod, patch map[string]any) error {
	doc := maps.Clone(patch)
	meta := map[string]any{"uid": pod.UID, "resourceVersion": pod.ResourceVersion}
	if m, ok := patch["metadata"].(map[string]any); ok {
		maps.Copy(meta, m)
	}
	doc["metadata"] = meta
	body, err := json.Marshal(doc)
	if err != nil {
		return err
	}
	_, err = client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.StrategicMergePatchType, body,
		metav1.PatchOptions{FieldManager: "reaper"}, "status")
	return err
}

func getPod(t *testing.T, client kubernetes.Interface, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	got, err := client.CoreV1().Pods(pod.Namespace).Get(t.Context(), pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// assertRefused checks that err is the policy's refusal with the message
// of the validation expected to fail, not RBAC's or another validation's.
func assertRefused(t *testing.T, err error, msg string) {
	t.Helper()
	switch {
	case err == nil:
		t.Errorf("write went through, want it refused with %q", msg)
	case !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), msg):
		t.Errorf("write refused with %v, want 403 with %q", err, msg)
	}
}

// waitFor polls try until it returns nil.
func waitFor(t *testing.T, what string, try func() error) {
	t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		last = try()
		return last == nil, nil
	})
	if err != nil {
		t.Fatalf("waiting for %s: %v (last: %v)", what, err, last)
	}
}

// waitForPolicy waits until RBAC and the policy have taken effect for
// every identity, which the apiserver's informers take a moment to do:
// each identity reads Pods, then probe, a write the policy refuses with
// msg, is refused for the first identity (the binding's group, which every
// version of the policy covers), so that a policy that leaves another
// identity out fails that identity's checks instead of this wait. The
// probe must change nothing: RBAC may let it through before the policy is
// in force.
func waitForPolicy(t *testing.T, ids []identity, pod *corev1.Pod, probe map[string]any, msg string) {
	t.Helper()
	ctx := t.Context()
	for _, id := range ids {
		waitFor(t, id.name+" to read Pods", func() error {
			_, err := id.client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
			return err
		})
	}
	waitFor(t, fmt.Sprintf("the policy to refuse a write to Pod %s", pod.Name), func() error {
		current, err := ids[0].client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		err = patchStatus(ctx, ids[0].client, current, probe)
		if apierrors.IsForbidden(err) && strings.Contains(err.Error(), msg) {
			return nil
		}
		return fmt.Errorf("write answered %v", err)
	})
}
