package deploy_test

import (
	"os"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

// TestRBAC pins rbac.yaml to the calls pkg/kube makes: get and list Pods, patch
// pods/status, create Events, and nothing more; and its binding to the two
// identities deploy/admission.yaml covers: the group "reaper" and the
// ServiceAccount reaper/reaper, which the file creates with its namespace.
func TestRBAC(t *testing.T) {
	raw, err := os.ReadFile("rbac.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var (
		namespace      corev1.Namespace
		serviceAccount corev1.ServiceAccount
		role           rbacv1.ClusterRole
		binding        rbacv1.ClusterRoleBinding
	)
	for _, doc := range strings.Split(string(raw), "\n---\n")[1:] {
		var meta struct{ Kind string }
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatal(err)
		}
		var dst any
		switch meta.Kind {
		case "Namespace":
			dst = &namespace
		case "ServiceAccount":
			dst = &serviceAccount
		case "ClusterRole":
			dst = &role
		case "ClusterRoleBinding":
			dst = &binding
		default:
			t.Fatalf("unexpected kind %q", meta.Kind)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), dst); err != nil {
			t.Fatalf("%s: %v", meta.Kind, err)
		}
	}
	want := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list"}},
		{APIGroups: []string{""}, Resources: []string{"pods/status"}, Verbs: []string{"patch"}},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create"}},
		{APIGroups: []string{""}, Resources: []string{"namespaces"}, ResourceNames: []string{"kube-system"}, Verbs: []string{"get"}},
	}
	if !reflect.DeepEqual(role.Rules, want) {
		t.Errorf("rules %+v\nwant %+v", role.Rules, want)
	}
	if binding.RoleRef != (rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name}) {
		t.Errorf("binding refers to %+v", binding.RoleRef)
	}
	wantSubjects := []rbacv1.Subject{
		{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: "reaper"},
		{Kind: rbacv1.ServiceAccountKind, Name: "reaper", Namespace: "reaper"},
	}
	if !reflect.DeepEqual(binding.Subjects, wantSubjects) {
		t.Errorf("subjects %+v\nwant %+v", binding.Subjects, wantSubjects)
	}
	if namespace.Name != "reaper" || serviceAccount.Namespace != namespace.Name || serviceAccount.Name != "reaper" {
		t.Errorf("ServiceAccount %s/%s in Namespace %s, want reaper/reaper", serviceAccount.Namespace, serviceAccount.Name, namespace.Name)
	}
}
