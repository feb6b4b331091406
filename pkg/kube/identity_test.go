package kube_test

import (
	"context"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/reaper-k8s/reaper/pkg/kube"
)

// The cluster identity is the kube-system namespace's UID, read with the
// one permission deploy/rbac.yaml grants for it, once per writer.
func TestClusterIdentity(t *testing.T) {
	r := newRig(t)
	ctx := t.Context()
	rule := rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"namespaces"}, ResourceNames: []string{kube.IdentityNamespace}, Verbs: []string{"get"}}
	if _, err := r.admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "reaper-kube-identity"}, Rules: []rbacv1.PolicyRule{rule}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	_, err := r.admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "reaper-kube-identity"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "reaper-kube-identity"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: "reaper"}},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	ns, err := r.admin.CoreV1().Namespaces().Get(ctx, kube.IdentityNamespace, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var got string
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err = r.writer.ClusterIdentity(ctx)
		return err == nil, nil
	})
	if err != nil || got != string(ns.UID) {
		t.Fatalf("identity %q (%v), want %q", got, err, ns.UID)
	}
	before := r.counts()["get"]
	if again, err := r.writer.ClusterIdentity(ctx); err != nil || again != got || r.counts()["get"] != before {
		t.Fatalf("second read: %q %v, %d requests more", again, err, r.counts()["get"]-before)
	}
}

// Warn posts one Warning Event on the Pod, however often it is said.
func TestWarn(t *testing.T) {
	r := newRig(t)
	ns := r.namespace(t, "warn", roleFull)
	ref := r.pods(t, ns, "protected", 1)[0]
	for range 2 {
		if err := r.writer.Warn(t.Context(), ref, "i-0123456789abcdef0", "TerminationRefused", "EC2 refused"); err != nil {
			t.Fatal(err)
		}
	}
	list, err := r.admin.CoreV1().Events(ns).List(t.Context(), metav1.ListOptions{FieldSelector: "involvedObject.uid=" + ref.UID})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 1 || list.Items[0].Type != "Warning" || list.Items[0].Reason != "TerminationRefused" {
		t.Fatalf("events %+v, want one warning", list.Items)
	}
}
