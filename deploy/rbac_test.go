package deploy_test

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
)

// TestRBAC pins the chart's ClusterRole to the calls pkg/kube makes: get
// and list Pods, patch pods/status, create Events, read kube-system, and
// nothing more; and its binding to the two identities the admission policy
// covers, with the default values and with others: the group and the
// ServiceAccount, in the release's namespace.
func TestRBAC(t *testing.T) {
	want := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list"}},
		{APIGroups: []string{""}, Resources: []string{"pods/status"}, Verbs: []string{"patch"}},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create"}},
		{APIGroups: []string{""}, Resources: []string{"namespaces"}, ResourceNames: []string{"kube-system"}, Verbs: []string{"get"}},
	}
	for _, tc := range []struct {
		name                      string
		values                    map[string]any
		group, namespace, account string
	}{
		{"defaults", nil, "reaper", "reaper", "reaper"},
		{"other identities", map[string]any{"identity": map[string]any{
			"group": "ops:reaper", "serviceAccount": "reconciler",
		}}, "ops:reaper", "reaper-prod", "reconciler"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := renderObjects(t, tc.namespace, tc.values)
			role := only[*rbacv1.ClusterRole](t, objs)
			if !reflect.DeepEqual(role.Rules, want) {
				t.Errorf("rules %+v\nwant %+v", role.Rules, want)
			}
			binding := only[*rbacv1.ClusterRoleBinding](t, objs)
			if binding.RoleRef != (rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name}) {
				t.Errorf("binding refers to %+v", binding.RoleRef)
			}
			wantSubjects := []rbacv1.Subject{
				{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: tc.group},
				{Kind: rbacv1.ServiceAccountKind, Name: tc.account, Namespace: tc.namespace},
			}
			if !reflect.DeepEqual(binding.Subjects, wantSubjects) {
				t.Errorf("subjects %+v\nwant %+v", binding.Subjects, wantSubjects)
			}
			sa := only[*corev1.ServiceAccount](t, objs)
			if sa.Namespace != tc.namespace || sa.Name != tc.account {
				t.Errorf("ServiceAccount %s/%s, want %s/%s", sa.Namespace, sa.Name, tc.namespace, tc.account)
			}
		})
	}
}
