package deploy_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/reaper-k8s/reaper/internal/labstack"
	"github.com/reaper-k8s/reaper/pkg/kube"
	"github.com/reaper-k8s/reaper/pkg/model"
)

// virtualNode is the name of the virtual node in this repository's tests
// (VirtualNode in internal/replay), which the default of the policy must
// match.
const virtualNode = "reaper-virtual-node"

// containerID is the runtime's id of every fixture Pod's container.
const containerID = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// Parts of the policy's refusal messages, one per validation.
const (
	msgNotProvider = "reaper may write only the status of the provider Pods"
	msgTerminal    = "its status is final and reaper may not write it"
	msgMetadata    = "reaper may not change the labels, annotations or finalizers"
)

// TestAdmissionPolicy applies rbac.yaml and admission.yaml to a real
// kube-apiserver and writes Pod statuses as each identity rbac.yaml binds (a
// member of the group "reaper", with the stack's token for it, and the
// ServiceAccount reaper/reaper, with a token from the TokenRequest API), as
// another ServiceAccount of the namespace "reaper", and as an administrator.
// Every identity that may write gets the same refusals.
func TestAdmissionPolicy(t *testing.T) {
	ctx := t.Context()
	stack := labstack.MustStart(t, labstack.Options{Parts: labstack.Kube})
	admin := stack.Kube
	objs := append(decodeFile(t, "rbac.yaml"), decodeFile(t, "admission.yaml")...)
	for _, obj := range objs {
		create(t, admin, obj)
	}

	// One identity per subject of the binding, so a subject added to
	// rbac.yaml is tested against the policy too, then a ServiceAccount an
	// operator might bind in place of reaper/reaper.
	var ids []identity
	for _, obj := range objs {
		if b, ok := obj.(*rbacv1.ClusterRoleBinding); ok {
			for _, s := range b.Subjects {
				ids = append(ids, subjectIdentity(t, stack, s))
			}
		}
	}
	const otherSA = "other"
	create(t, admin, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: otherSA, Namespace: reaperNamespace}})
	create(t, admin, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "reaper-" + otherSA},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "reaper"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: otherSA, Namespace: reaperNamespace}},
	})
	ids = append(ids, newIdentity(t, serviceAccountConfig(t, stack, reaperNamespace, otherSA)))

	// Fixtures, made by the administrator as the provider would: every Pod
	// Running, then two of them ended. Each identity ends a Pod of its own.
	onOtherNode := runningPod(t, admin, "on-other-node", "node-a", nil)
	succeeded := runningPod(t, admin, "succeeded", virtualNode, nil)
	failed := runningPod(t, admin, "failed", virtualNode, nil)
	relabel := runningPod(t, admin, "relabel", virtualNode, nil)
	for pod, phase := range map[*corev1.Pod]corev1.PodPhase{succeeded: corev1.PodSucceeded, failed: corev1.PodFailed} {
		if err := patchStatus(ctx, admin, pod, map[string]any{"status": map[string]any{"phase": phase}}); err != nil {
			t.Fatalf("end %s: %v", pod.Name, err)
		}
	}
	onVirtualNode := make([]*corev1.Pod, len(ids))
	for i := range ids {
		onVirtualNode[i] = runningPod(t, admin, fmt.Sprintf("on-virtual-node-%d", i), virtualNode, nil)
	}

	// RBAC and the policy take effect once the apiserver's informers have
	// seen them: wait for each identity to read Pods, then for the write the
	// policy refuses to be refused by it for the group "reaper" (ids[0], the
	// binding's first subject), which every version of the policy covers, so
	// that a policy that leaves another identity out fails that identity's
	// checks below instead of this wait.
	for _, id := range ids {
		waitFor(t, id.name+" to read Pods", func() error {
			_, err := id.client.CoreV1().Pods(onOtherNode.Namespace).Get(ctx, onOtherNode.Name, metav1.GetOptions{})
			return err
		})
	}
	probe := map[string]any{"status": map[string]any{"phase": corev1.PodRunning}}
	waitFor(t, "the policy to refuse a Pod on node-a", func() error {
		err := patchStatus(ctx, ids[0].client, getPod(t, admin, onOtherNode), probe)
		if apierrors.IsForbidden(err) && strings.Contains(err.Error(), msgNotProvider) {
			return nil
		}
		return fmt.Errorf("write answered %v", err)
	})

	// Writes in the shape of Reaper's patch, each refused for Reaper by one
	// of the validations and accepted for the administrator: the policy
	// leaves every other user alone.
	writes := []struct {
		name  string
		pod   *corev1.Pod
		patch map[string]any
		want  string
	}{
		{"another node", onOtherNode, map[string]any{"status": map[string]any{"phase": corev1.PodFailed}}, msgNotProvider},
		{"Succeeded to Failed", succeeded, map[string]any{"status": map[string]any{"phase": corev1.PodFailed}}, msgTerminal},
		{"Failed to Running", failed, map[string]any{"status": map[string]any{"phase": corev1.PodRunning}}, msgTerminal},
		{"terminal Pod, phase kept", succeeded, map[string]any{"status": map[string]any{"message": "rewritten"}}, msgTerminal},
		{"labels", relabel, map[string]any{"metadata": map[string]any{"labels": map[string]string{"app": "other"}}}, msgMetadata},
		{"annotations", relabel, map[string]any{"metadata": map[string]any{"annotations": map[string]string{"example.com/note": "x"}}}, msgMetadata},
		{"finalizers", relabel, map[string]any{"metadata": map[string]any{"finalizers": []string{"example.com/keep"}}}, msgMetadata},
	}
	for i, id := range ids {
		t.Run(id.name, func(t *testing.T) {
			// The write Reaper makes for an exit, from pkg/kube itself.
			t.Run("exit on the virtual node", func(t *testing.T) {
				res, err := id.exit(ctx, onVirtualNode[i])
				if err != nil || res != kube.Patched {
					t.Fatalf("Apply = %q, %v; want %q", res, err, kube.Patched)
				}
				if phase := getPod(t, admin, onVirtualNode[i]).Status.Phase; phase != corev1.PodSucceeded {
					t.Errorf("phase %s after the exit, want Succeeded", phase)
				}
			})
			t.Run("exit on another node", func(t *testing.T) {
				_, err := id.exit(ctx, onOtherNode)
				assertRefused(t, err, msgNotProvider)
				if phase := getPod(t, admin, onOtherNode).Status.Phase; phase != corev1.PodRunning {
					t.Errorf("phase %s after the refused exit, want Running", phase)
				}
			})
			for _, w := range writes {
				t.Run(w.name, func(t *testing.T) {
					before := getPod(t, admin, w.pod)
					assertRefused(t, patchStatus(ctx, id.client, before, w.patch), w.want)
					if getPod(t, admin, w.pod).ResourceVersion != before.ResourceVersion {
						t.Errorf("Pod %s changed", w.pod.Name)
					}
				})
			}
		})
	}
	for _, w := range writes {
		t.Run("admin: "+w.name, func(t *testing.T) {
			before := getPod(t, admin, w.pod)
			if err := patchStatus(ctx, admin, before, w.patch); err != nil {
				t.Fatalf("administrator's write refused: %v", err)
			}
			// A write the apiserver drops would leave nothing to refuse.
			if getPod(t, admin, w.pod).ResourceVersion == before.ResourceVersion {
				t.Errorf("administrator's write changed nothing")
			}
		})
	}

	// The label edit point, used as an operator would: a Pod on node-a
	// becomes the provider's once it carries the configured label, which
	// Reaper cannot set itself.
	t.Run("provider label", func(t *testing.T) {
		policy, err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, "reaper-pod-status", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		setVariable(t, policy, "providerLabelKey", "'example.com/provider'")
		setVariable(t, policy, "providerLabelValue", "'reaper'")
		if _, err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicies().Update(ctx, policy, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		labels := map[string]string{"example.com/provider": "reaper"}
		unlabelled := runningPod(t, admin, "unlabelled", "node-a", nil)
		for i, id := range ids {
			t.Run(id.name, func(t *testing.T) {
				labelled := runningPod(t, admin, fmt.Sprintf("labelled-%d", i), "node-a", labels)
				waitFor(t, "the policy to admit a labelled Pod on node-a", func() error {
					return patchStatus(ctx, id.client, getPod(t, admin, labelled), probe)
				})
				if res, err := id.exit(ctx, labelled); err != nil || res != kube.Patched {
					t.Errorf("Apply = %q, %v; want %q", res, err, kube.Patched)
				}
				enroll := map[string]any{"metadata": map[string]any{"labels": labels}}
				assertRefused(t, patchStatus(ctx, id.client, getPod(t, admin, unlabelled), enroll), msgNotProvider)
			})
		}
	})
}

// reaperNamespace holds the ServiceAccount rbac.yaml binds.
const reaperNamespace = "reaper"

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

// subjectIdentity returns credentials for one subject of rbac.yaml's
// binding.
func subjectIdentity(t *testing.T, stack *labstack.Stack, s rbacv1.Subject) identity {
	t.Helper()
	switch {
	case s.Kind == rbacv1.GroupKind && s.Name == "reaper":
		id := newIdentity(t, stack.ReaperRESTConfig())
		if !slices.Contains(id.groups, s.Name) {
			t.Fatalf("%s is not in the group %s: %v", id.name, s.Name, id.groups)
		}
		id.name = "group " + s.Name
		return id
	case s.Kind == rbacv1.ServiceAccountKind:
		id := newIdentity(t, serviceAccountConfig(t, stack, s.Namespace, s.Name))
		if want := "system:serviceaccount:" + s.Namespace + ":" + s.Name; id.name != want {
			t.Fatalf("the token of %s/%s authenticates as %s, want %s", s.Namespace, s.Name, id.name, want)
		}
		// Covered for its own sake, not as a member of the group "reaper".
		if slices.Contains(id.groups, "reaper") {
			t.Fatalf("%s is in the group reaper: %v", id.name, id.groups)
		}
		return id
	}
	t.Fatalf("rbac.yaml binds %s %q, which this test has no credentials for: add them, and make admission.yaml cover it", s.Kind, s.Name)
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

// exit writes what Reaper writes for an exit, from pkg/kube itself: read
// the Pod, patch its status with UID and resourceVersion preconditions, post
// the Event.
func (id identity) exit(ctx context.Context, pod *corev1.Pod) (kube.Result, error) {
	now := time.Now().Truncate(time.Second)
	snap, err := id.writer.Read(ctx, model.PodRef{Namespace: pod.Namespace, Name: pod.Name, UID: string(pod.UID)})
	if err != nil {
		return "", err
	}
	applied, err := id.writer.ApplyTo(ctx, snap, model.Outcome{
		InstanceID: "i-0123456789abcdef0",
		Exit: &model.Exit{
			Container: "main", ContainerID: containerID, ExitCode: 0,
			StartedAt: now.Add(-time.Hour), FinishedAt: now, ReceivedAt: now,
		},
	})
	return applied.Result, err
}

// decodeFile decodes every object of a multi-document manifest.
func decodeFile(t *testing.T, name string) []runtime.Object {
	t.Helper()
	raw, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	var objs []runtime.Object
	docs := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(raw)))
	for {
		doc, err := docs.Read()
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		// The header of comments before the first "---" is a document too.
		js, err := yaml.YAMLToJSON(doc)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if string(js) == "null" {
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		objs = append(objs, obj)
	}
}

// create creates one object of the kinds the manifests hold.
func create(t *testing.T, client kubernetes.Interface, obj runtime.Object) {
	t.Helper()
	ctx, opts := t.Context(), metav1.CreateOptions{}
	var err error
	switch obj := obj.(type) {
	case *corev1.Namespace:
		_, err = client.CoreV1().Namespaces().Create(ctx, obj, opts)
	case *corev1.ServiceAccount:
		_, err = client.CoreV1().ServiceAccounts(obj.Namespace).Create(ctx, obj, opts)
	case *rbacv1.ClusterRole:
		_, err = client.RbacV1().ClusterRoles().Create(ctx, obj, opts)
	case *rbacv1.ClusterRoleBinding:
		_, err = client.RbacV1().ClusterRoleBindings().Create(ctx, obj, opts)
	case *admissionregistrationv1.ValidatingAdmissionPolicy:
		_, err = client.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, obj, opts)
	case *admissionregistrationv1.ValidatingAdmissionPolicyBinding:
		_, err = client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, obj, opts)
	case *flowcontrolv1.FlowSchema:
		_, err = client.FlowcontrolV1().FlowSchemas().Create(ctx, obj, opts)
	case *flowcontrolv1.PriorityLevelConfiguration:
		_, err = client.FlowcontrolV1().PriorityLevelConfigurations().Create(ctx, obj, opts)
	default:
		t.Fatalf("unexpected object %T", obj)
	}
	if err != nil {
		t.Fatalf("create %T: %v", obj, err)
	}
}

// runningPod creates a Pod bound to node and gives it the status a provider
// writes once the instance runs it.
func runningPod(t *testing.T, client kubernetes.Interface, name, node string, labels map[string]string) *corev1.Pod {
	t.Helper()
	ctx := t.Context()
	pod, err := client.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: corev1.PodSpec{
			NodeName:      node,
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{{Name: "main", Image: "busybox"}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	started := metav1.NewTime(time.Now().Add(-time.Hour).Truncate(time.Second))
	status := corev1.PodStatus{
		Phase: corev1.PodRunning,
		ContainerStatuses: []corev1.ContainerStatus{{
			Name: "main", Image: "busybox", ImageID: "docker-pullable://busybox@sha256:0", ContainerID: "docker://" + containerID,
			Ready: true, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: started}},
		}},
	}
	if err := patchStatus(ctx, client, pod, map[string]any{"status": status}); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	return getPod(t, client, pod)
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

// setVariable replaces the expression of one of the policy's variables.
func setVariable(t *testing.T, policy *admissionregistrationv1.ValidatingAdmissionPolicy, name, expression string) {
	t.Helper()
	for i, v := range policy.Spec.Variables {
		if v.Name == name {
			policy.Spec.Variables[i].Expression = expression
			return
		}
	}
	t.Fatalf("policy has no variable %s", name)
}
