package deploy_test

import (
	"os"
	"reflect"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

// TestRBAC pins rbac.yaml to the calls pkg/kube makes: get and list Pods, patch
// pods/status, create Events, and nothing more.
func TestRBAC(t *testing.T) {
	raw, err := os.ReadFile("rbac.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var (
		role    rbacv1.ClusterRole
		binding rbacv1.ClusterRoleBinding
	)
	for _, doc := range strings.Split(string(raw), "\n---\n")[1:] {
		var meta struct{ Kind string }
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatal(err)
		}
		var dst any
		switch meta.Kind {
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
	}
	if !reflect.DeepEqual(role.Rules, want) {
		t.Errorf("rules %+v\nwant %+v", role.Rules, want)
	}
	if binding.RoleRef != (rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name}) {
		t.Errorf("binding refers to %+v", binding.RoleRef)
	}
	if want := []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: "reaper"}}; !reflect.DeepEqual(binding.Subjects, want) {
		t.Errorf("subjects %+v", binding.Subjects)
	}
}
