package deploy_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/reaper-k8s/reaper/deploy"
	"github.com/reaper-k8s/reaper/internal/labstack"
	"github.com/reaper-k8s/reaper/pkg/kube"
	"github.com/reaper-k8s/reaper/pkg/model"
)

// Parts of the policy's refusal messages, one per validation.
const (
	msgNotProvider = "reaper may write only the status of the provider Pods"
	msgTerminal    = "its status is final and reaper may not write it"
	msgMetadata    = "reaper may not change the labels, annotations or finalizers"
	msgIPs         = "reaper may not change the IPs"
	msgReady       = "reaper may not leave"
	msgPhase       = "reaper may write only the phase Succeeded or Failed"
)

// forbiddenWrite is a status write the policy refuses for Reaper's
// identities and leaves to everybody else.
type forbiddenWrite struct {
	name    string
	fixture fixture
	patch   map[string]any
	want    string // the refusal's message
}

// status is a patch of the Pod's status alone.
func status(fields map[string]any) map[string]any { return map[string]any{"status": fields} }

// forbiddenWrites are the writes Reaper never makes, each breaking exactly
// one of the policy's validations, on a Pod the policy would otherwise let
// it write (running on the virtual node, not ready), except where the
// Pod's state is what is tested.
func forbiddenWrites() []forbiddenWrite {
	live := fixture{node: virtualNode, phase: corev1.PodRunning}
	return []forbiddenWrite{
		{"another node", fixture{node: "node-a", phase: corev1.PodRunning}, status(map[string]any{"phase": corev1.PodFailed}), msgNotProvider},
		{"Succeeded to Failed", fixture{node: virtualNode, phase: corev1.PodSucceeded}, status(map[string]any{"phase": corev1.PodFailed}), msgTerminal},
		{"Failed to Running", fixture{node: virtualNode, phase: corev1.PodFailed}, status(map[string]any{"phase": corev1.PodRunning}), msgTerminal},
		{"terminal Pod, phase kept", fixture{node: virtualNode, phase: corev1.PodSucceeded}, status(map[string]any{"message": "rewritten"}), msgTerminal},
		{"labels", live, map[string]any{"metadata": map[string]any{"labels": map[string]string{"app": "other"}}}, msgMetadata},
		{"annotations", live, map[string]any{"metadata": map[string]any{"annotations": map[string]string{"example.com/note": "x"}}}, msgMetadata},
		{"finalizers", live, map[string]any{"metadata": map[string]any{"finalizers": []string{"example.com/keep"}}}, msgMetadata},
		{"podIP and podIPs changed", live, status(map[string]any{"podIP": "10.0.0.99", "podIPs": replaceIP("10.0.0.99", podIP)}), msgIPs},
		{"podIPs, a second family", live, status(map[string]any{"podIPs": []corev1.PodIP{{IP: podIP}, {IP: "fd00::5"}}}), msgIPs},
		{"podIP and podIPs removed", live, status(map[string]any{"podIP": nil, "podIPs": nil}), msgIPs},
		{"hostIP and hostIPs changed", live, status(map[string]any{"hostIP": "10.1.0.99", "hostIPs": replaceIP("10.1.0.99", hostIP)}), msgIPs},
		{"hostIPs, a second family", live, status(map[string]any{"hostIPs": []corev1.HostIP{{IP: hostIP}, {IP: "fd01::5"}}}), msgIPs},
		{"Ready True", live, status(map[string]any{"conditions": []map[string]any{{"type": corev1.PodReady, "status": corev1.ConditionTrue}}}), msgReady},
		{"ContainersReady True", live, status(map[string]any{"conditions": []map[string]any{{"type": corev1.ContainersReady, "status": corev1.ConditionTrue}}}), msgReady},
		{"a ready Pod left ready", fixture{node: virtualNode, phase: corev1.PodRunning, ready: true}, status(map[string]any{"message": "still ready"}), msgReady},
		{"Running to Pending", live, status(map[string]any{"phase": corev1.PodPending}), msgPhase},
		{"Running to Unknown", live, status(map[string]any{"phase": corev1.PodUnknown}), msgPhase},
		{"Pending to Running", fixture{node: virtualNode, phase: corev1.PodPending}, status(map[string]any{"phase": corev1.PodRunning}), msgPhase},
	}
}

// replaceIP is the strategic-merge patch of a list of IPs (merged by ip)
// that leaves it holding ip instead of old.
func replaceIP(ip, old string) []map[string]any {
	return []map[string]any{{"ip": ip}, {"ip": old, "$patch": "delete"}}
}

// TestAdmissionPolicy applies the chart with its default values to a real
// kube-apiserver and writes Pod statuses as each identity it binds (a
// member of the group "reaper", with the stack's token for it, and the
// ServiceAccount reaper/reaper, with a token from the TokenRequest API), as
// another ServiceAccount of the namespace "reaper", and as an
// administrator. Reaper's own writes, made with pkg/kube, go through; every
// write it never makes is refused, the same for every identity, and left
// to the administrator.
func TestAdmissionPolicy(t *testing.T) {
	ctx := t.Context()
	stack := labstack.MustStart(t, labstack.Options{Parts: labstack.Kube})
	admin := stack.Kube
	objs := applyChart(t, admin, deploy.Namespace, nil)

	// A ServiceAccount an operator might bind in place of reaper/reaper.
	ids := boundIdentities(t, stack, objs)
	const otherSA = "other"
	create(t, admin, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: otherSA, Namespace: "reaper"}})
	create(t, admin, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "reaper-" + otherSA},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "reaper"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: otherSA, Namespace: "reaper"}},
	})
	ids = append(ids, newIdentity(t, serviceAccountConfig(t, stack, "reaper", otherSA)))

	// Fixtures, made by the administrator as the provider would. A refused
	// write leaves its Pod as it was, so the identities share them.
	writes := forbiddenWrites()
	pods := make([]*corev1.Pod, len(writes))
	for i, w := range writes {
		pods[i] = newPod(t, admin, fmt.Sprintf("forbidden-%d", i), w.fixture)
	}
	waitForPolicy(t, ids, pods[0], status(map[string]any{"conditions": notReady}), msgNotProvider)

	for i, id := range ids {
		t.Run(id.name, func(t *testing.T) {
			// The writes Reaper makes, from pkg/kube itself, each on a Pod
			// of its own, running and ready on the virtual node.
			for _, w := range []struct {
				name    string
				outcome func(time.Time) model.Outcome
				phase   corev1.PodPhase
				check   func(*testing.T, *corev1.Pod)
			}{
				{"exit", exited, corev1.PodSucceeded, func(t *testing.T, pod *corev1.Pod) {
					if term := pod.Status.ContainerStatuses[0].State.Terminated; term == nil || term.Reason != "Completed" {
						t.Errorf("container state %+v, want terminated Completed", pod.Status.ContainerStatuses[0].State)
					}
				}},
				{"lost instance", lost, corev1.PodFailed, func(t *testing.T, pod *corev1.Pod) {
					if c := condition(pod, corev1.DisruptionTarget); c == nil || c.Status != corev1.ConditionTrue {
						t.Errorf("DisruptionTarget %+v, want True", c)
					}
				}},
				{"restart", restarting, corev1.PodRunning, func(t *testing.T, pod *corev1.Pod) {
					cs := pod.Status.ContainerStatuses[0]
					if cs.RestartCount != 1 || cs.LastTerminationState.Terminated == nil || cs.LastTerminationState.Terminated.ExitCode != 1 {
						t.Errorf("container status %+v, want restart 1 after exit code 1", cs)
					}
				}},
			} {
				t.Run(w.name, func(t *testing.T) {
					pod := newPod(t, admin, fmt.Sprintf("%s-%d", strings.ReplaceAll(w.name, " ", "-"), i), fixture{node: virtualNode, phase: corev1.PodRunning, ready: true})
					res, err := id.apply(ctx, pod, w.outcome)
					if err != nil || res != kube.Patched {
						t.Fatalf("Apply = %q, %v; want %q", res, err, kube.Patched)
					}
					after := getPod(t, admin, pod)
					if after.Status.Phase != w.phase {
						t.Errorf("phase %s, want %s", after.Status.Phase, w.phase)
					}
					assertIPsKept(t, pod, after)
					for _, ct := range []corev1.PodConditionType{corev1.PodReady, corev1.ContainersReady} {
						if c := condition(after, ct); c == nil || c.Status != corev1.ConditionFalse {
							t.Errorf("%s %+v, want False", ct, c)
						}
					}
					w.check(t, after)
				})
			}
			// An exit can reach Reaper before the provider has marked its
			// Pod Running: ending it from Pending is one of Reaper's writes.
			t.Run("exit of a Pending Pod", func(t *testing.T) {
				pod := newPod(t, admin, fmt.Sprintf("pending-exit-%d", i), fixture{node: virtualNode, phase: corev1.PodPending})
				if res, err := id.apply(ctx, pod, exited); err != nil || res != kube.Patched {
					t.Fatalf("Apply = %q, %v; want %q", res, err, kube.Patched)
				}
				if phase := getPod(t, admin, pod).Status.Phase; phase != corev1.PodSucceeded {
					t.Errorf("phase %s, want Succeeded", phase)
				}
			})
			// A restart keeps a Pod in its live phase; it starts none: a
			// Pending Pod stays Pending, and the write is admitted.
			t.Run("restart of a Pending Pod", func(t *testing.T) {
				pod := newPod(t, admin, fmt.Sprintf("pending-restart-%d", i), fixture{node: virtualNode, phase: corev1.PodPending})
				if res, err := id.apply(ctx, pod, restarting); err != nil || res != kube.Patched {
					t.Fatalf("Apply = %q, %v; want %q", res, err, kube.Patched)
				}
				after := getPod(t, admin, pod)
				if after.Status.Phase != corev1.PodPending || len(after.Status.ContainerStatuses) != 1 || after.Status.ContainerStatuses[0].RestartCount != 1 {
					t.Errorf("phase %s, statuses %+v: want Pending with the restart shown", after.Status.Phase, after.Status.ContainerStatuses)
				}
			})
			t.Run("init containers of a Pending Pod", func(t *testing.T) {
				pod := newPod(t, admin, fmt.Sprintf("pending-init-%d", i), fixture{node: virtualNode, phase: corev1.PodPending, init: []string{"fetch", "unpack"}})
				assertShapeWrites(t, id, admin, pod, []shapeStep{
					{exits: []string{"fetch"}, phase: corev1.PodPending},
					{exits: []string{"fetch", "unpack"}, phase: corev1.PodPending},
					{exits: []string{"fetch", "unpack", "main"}, phase: corev1.PodSucceeded},
				})
			})
			t.Run("native sidecar", func(t *testing.T) {
				pod := newPod(t, admin, fmt.Sprintf("sidecar-%d", i), fixture{node: virtualNode, phase: corev1.PodRunning, init: []string{"sidecar-proxy"}})
				assertShapeWrites(t, id, admin, pod, []shapeStep{
					{exits: []string{"main"}, phase: corev1.PodRunning},
					{exits: []string{"main", "sidecar-proxy"}, phase: corev1.PodSucceeded},
				})
			})
			t.Run("exit on another node", func(t *testing.T) {
				pod := pods[0]
				_, err := id.apply(ctx, pod, exited)
				assertRefused(t, err, msgNotProvider)
				if phase := getPod(t, admin, pod).Status.Phase; phase != corev1.PodRunning {
					t.Errorf("phase %s after the refused exit, want Running", phase)
				}
			})
			for j, w := range writes {
				t.Run(w.name, func(t *testing.T) {
					before := getPod(t, admin, pods[j])
					assertRefused(t, patchStatus(ctx, id.client, before, w.patch), w.want)
					if getPod(t, admin, pods[j]).ResourceVersion != before.ResourceVersion {
						t.Errorf("Pod %s changed", before.Name)
					}
				})
			}
		})
	}
	// The policy leaves every other user alone: each write it refuses
	// Reaper is a valid one, which the administrator makes.
	for j, w := range writes {
		t.Run("admin: "+w.name, func(t *testing.T) {
			before := getPod(t, admin, pods[j])
			if err := patchStatus(ctx, admin, before, w.patch); err != nil {
				t.Fatalf("administrator's write refused: %v", err)
			}
			// A write the apiserver drops would leave nothing to refuse.
			if getPod(t, admin, pods[j]).ResourceVersion == before.ResourceVersion {
				t.Errorf("administrator's write changed nothing")
			}
		})
	}
}

// shapeStep is one write of a Pod of several containers: the containers
// whose exits (0, but a sidecar's 143 after SIGTERM) Reaper knows by then,
// and the phase the Pod must have after it.
type shapeStep struct {
	exits []string
	phase corev1.PodPhase
}

// assertShapeWrites makes each step's write as Reaper makes it (pkg/kube,
// as id) and checks it is admitted, leaves the Pod in the step's phase and
// shows every exit known, with every container's status in spec order.
func assertShapeWrites(t *testing.T, id identity, admin kubernetes.Interface, pod *corev1.Pod, steps []shapeStep) {
	t.Helper()
	for _, step := range steps {
		outcome := func(now time.Time) model.Outcome {
			o := model.Outcome{InstanceID: "i-0123456789abcdef0"}
			for _, c := range step.exits {
				code := 0
				if strings.HasPrefix(c, "sidecar") {
					code = 143
				}
				o.Exits = append(o.Exits, model.Exit{Container: c, ExitCode: code, StartedAt: now.Add(-time.Hour), FinishedAt: now, ReceivedAt: now})
			}
			slices.SortFunc(o.Exits, func(a, b model.Exit) int { return strings.Compare(a.Container, b.Container) })
			return o
		}
		if res, err := id.apply(t.Context(), pod, outcome); err != nil || res != kube.Patched {
			t.Fatalf("after %v: Apply = %q, %v; want %q", step.exits, res, err, kube.Patched)
		}
		after := getPod(t, admin, pod)
		if after.Status.Phase != step.phase {
			t.Errorf("after %v: phase %s, want %s", step.exits, after.Status.Phase, step.phase)
		}
		statuses := append(slices.Clone(after.Status.InitContainerStatuses), after.Status.ContainerStatuses...)
		if len(statuses) != len(pod.Spec.InitContainers)+len(pod.Spec.Containers) {
			t.Fatalf("after %v: %d statuses for %d containers", step.exits, len(statuses), len(pod.Spec.InitContainers)+len(pod.Spec.Containers))
		}
		for _, c := range step.exits {
			i := slices.IndexFunc(statuses, func(cs corev1.ContainerStatus) bool { return cs.Name == c })
			if i < 0 || statuses[i].State.Terminated == nil {
				t.Errorf("after %v: %s not shown ended: %+v", step.exits, c, statuses)
			}
		}
	}
}

// TestAdmissionPolicyValues applies the chart with other values than its
// defaults: other identities (the group "gpu-reaper", the release's
// namespace "gpu-reaper"), another node prefix and a provider label. Each identity
// may write a Pod on a node of the new prefix or carrying the label, and
// no other, not even one on the default prefix's nodes.
func TestAdmissionPolicyValues(t *testing.T) {
	ctx := t.Context()
	stack := labstack.MustStart(t, labstack.Options{Parts: labstack.Kube})
	admin := stack.Kube
	const labelKey, labelValue = "example.com/provider", "reaper"
	objs := applyChart(t, admin, "gpu-reaper", map[string]any{
		"identity": map[string]any{"group": "gpu-reaper"},
		"admission": map[string]any{
			"providerNodePrefix": "gpu-vk-",
			"providerLabel":      map[string]any{"key": labelKey, "value": labelValue},
		},
	})
	ids := boundIdentities(t, stack, objs)
	if len(ids) != 2 || ids[0].name != "group gpu-reaper" || ids[1].name != "system:serviceaccount:gpu-reaper:reaper" {
		t.Fatalf("the chart binds %v", ids)
	}

	live := fixture{phase: corev1.PodRunning, ready: true}
	onDefaultPrefix := newPod(t, admin, "on-default-prefix", fixture{node: virtualNode, phase: corev1.PodRunning})
	waitForPolicy(t, ids, onDefaultPrefix, status(map[string]any{"conditions": notReady}), msgNotProvider)
	unlabelled := newPod(t, admin, "unlabelled", fixture{node: "node-a", phase: corev1.PodRunning})
	for i, id := range ids {
		t.Run(id.name, func(t *testing.T) {
			for _, f := range []fixture{
				{node: "gpu-vk-1"},
				{node: "node-a", labels: map[string]string{labelKey: labelValue}},
			} {
				f.phase, f.ready = live.phase, live.ready
				t.Run(fmt.Sprintf("exit on %s labelled %v", f.node, f.labels), func(t *testing.T) {
					pod := newPod(t, admin, fmt.Sprintf("%s-%d", f.node, i), f)
					if res, err := id.apply(ctx, pod, exited); err != nil || res != kube.Patched {
						t.Fatalf("Apply = %q, %v; want %q", res, err, kube.Patched)
					}
				})
			}
			t.Run("exit on the default prefix's node", func(t *testing.T) {
				_, err := id.apply(ctx, onDefaultPrefix, exited)
				assertRefused(t, err, msgNotProvider)
			})
			t.Run("exit on another node, unlabelled", func(t *testing.T) {
				_, err := id.apply(ctx, unlabelled, exited)
				assertRefused(t, err, msgNotProvider)
			})
			// The policy reads the label from the stored Pod: Reaper cannot
			// make a Pod the provider's by labelling it.
			t.Run("label itself in", func(t *testing.T) {
				enroll := map[string]any{"metadata": map[string]any{"labels": map[string]string{labelKey: labelValue}}}
				assertRefused(t, patchStatus(ctx, id.client, getPod(t, admin, unlabelled), enroll), msgNotProvider)
			})
		})
	}
}

// condition returns the Pod's condition of type ct, nil if it has none.
func condition(pod *corev1.Pod, ct corev1.PodConditionType) *corev1.PodCondition {
	i := slices.IndexFunc(pod.Status.Conditions, func(c corev1.PodCondition) bool { return c.Type == ct })
	if i < 0 {
		return nil
	}
	return &pod.Status.Conditions[i]
}

// assertIPsKept checks that a write left the Pod's addresses as the
// provider set them.
func assertIPsKept(t *testing.T, before, after *corev1.Pod) {
	t.Helper()
	b, a := before.Status, after.Status
	if a.PodIP != b.PodIP || !slices.Equal(a.PodIPs, b.PodIPs) || a.HostIP != b.HostIP || !slices.Equal(a.HostIPs, b.HostIPs) {
		t.Errorf("IPs %s %v %s %v, want %s %v %s %v as before", a.PodIP, a.PodIPs, a.HostIP, a.HostIPs, b.PodIP, b.PodIPs, b.HostIP, b.HostIPs)
	}
}
