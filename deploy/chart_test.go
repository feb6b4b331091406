package deploy_test

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/loader"
	"helm.sh/helm/v4/pkg/cli"
	"helm.sh/helm/v4/pkg/kube"
	helmrelease "helm.sh/helm/v4/pkg/release"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/reaper-k8s/reaper/deploy"
	"github.com/reaper-k8s/reaper/internal/labstack"
)

// TestManifestsRenderedFromChart holds the manifests of this directory to
// what `helm template` makes of charts/reaper with its default values, so
// the two cannot drift: every manifest is the chart's rendering, byte for
// byte, and every template has its manifest.
func TestManifestsRenderedFromChart(t *testing.T) {
	want, err := deploy.Files(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if got := slices.Sorted(maps.Keys(want)); !slices.Equal(got, []string{"admission.yaml", "flowcontrol.yaml", "rbac.yaml"}) {
		t.Errorf("the chart renders the manifests %v", got)
	}
	onDisk, err := filepath.Glob("*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range onDisk {
		if _, ok := want[name]; !ok {
			t.Errorf("%s is not rendered from the chart: delete it, or add its template to charts/reaper/templates", name)
		}
	}
	for name, content := range want {
		got, err := os.ReadFile(name)
		if err != nil || !bytes.Equal(got, content) {
			t.Errorf("%s differs from the chart's rendering (%v): run `go generate ./deploy`", name, err)
		}
	}
}

// TestChartRefusesBadValues renders the chart with values, or into a
// namespace, it must refuse before anything reaches a cluster, and checks
// that the error names the value or the namespace.
func TestChartRefusesBadValues(t *testing.T) {
	for _, tc := range []struct {
		name      string
		namespace string // the release's; "" is deploy.Namespace
		values    map[string]any
		want      string
	}{
		{"misspelt name", "", map[string]any{"admission": map[string]any{"providerNodePrefx": "vk-"}}, "providerNodePrefx"},
		{"quote in a node prefix", "", map[string]any{"admission": map[string]any{"providerNodePrefix": "vk-' || true || '"}}, "providerNodePrefix"},
		{"upper case in a node prefix", "", map[string]any{"admission": map[string]any{"providerNodePrefix": "VK-"}}, "providerNodePrefix"},
		{"invalid label key", "", map[string]any{"admission": map[string]any{"providerLabel": map[string]any{"key": "a b"}}}, "key"},
		{"quote in the group", "", map[string]any{"identity": map[string]any{"group": "reaper'"}}, "group"},
		{"namespace no longer a value", "", map[string]any{"identity": map[string]any{"namespace": "reaper"}}, "namespace"},
		{"namespace.create not a boolean", "", map[string]any{"namespace": map[string]any{"create": "yes"}}, "create"},
		{"release namespace not a DNS label", "Reaper", nil, `namespace "Reaper"`},
		{"quote in the release namespace", "reaper'", nil, `namespace "reaper'"`},
		{"the default namespace", "default", nil, `namespace "default"`},
		{"kube-system", "kube-system", nil, `namespace "kube-system"`},
		{"kube-public", "kube-public", nil, `namespace "kube-public"`},
		{"kube-node-lease", "kube-node-lease", nil, `namespace "kube-node-lease"`},
		{"no way to recognise the provider's Pods", "", map[string]any{"admission": map[string]any{"providerNodePrefix": ""}},
			"admission.providerNodePrefix and admission.providerLabel.key are both empty"},
		{"a percentage over 100", "", map[string]any{"flowControl": map[string]any{"lendablePercent": 150}}, "lendablePercent"},
		{"a number as a string", "", map[string]any{"flowControl": map[string]any{"nominalConcurrencyShares": "30"}}, "nominalConcurrencyShares"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			namespace := cmp.Or(tc.namespace, deploy.Namespace)
			out, err := deploy.Template(t.Context(), namespace, tc.values)
			switch {
			case err == nil:
				t.Errorf("rendered:\n%s", out)
			case !strings.Contains(err.Error(), tc.want):
				t.Errorf("error %q does not name %q", err, tc.want)
			}
		})
	}
}

// standardLabels are the labels every object of the chart carries, for a
// release of the chart as Chart.yaml describes it: Kubernetes'
// recommended labels and Helm's own. Only the component differs between
// objects.
func standardLabels(t *testing.T, release string) map[string]string {
	t.Helper()
	meta, err := deploy.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	return map[string]string{
		"app.kubernetes.io/name":       meta.Name,
		"app.kubernetes.io/instance":   release,
		"app.kubernetes.io/version":    meta.AppVersion,
		"app.kubernetes.io/managed-by": "Helm",
		"app.kubernetes.io/part-of":    "reaper",
		"helm.sh/chart":                meta.Name + "-" + meta.Version,
	}
}

// checkLabels checks that obj carries the standard labels and a component.
func checkLabels(t *testing.T, obj metav1.Object, kind string, want map[string]string) {
	t.Helper()
	got := obj.GetLabels()
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s %s: label %s=%q, want %q", kind, obj.GetName(), k, got[k], v)
		}
	}
	if got["app.kubernetes.io/component"] == "" {
		t.Errorf("%s %s has no label app.kubernetes.io/component: %v", kind, obj.GetName(), got)
	}
}

// TestChartLabels renders the chart, with its defaults and as deploy/
// is, and checks that every object carries the standard labels.
func TestChartLabels(t *testing.T) {
	want := standardLabels(t, "reaper")
	for name, values := range map[string]map[string]any{"defaults": nil, "deploy/": deploy.ManifestValues()} {
		t.Run(name, func(t *testing.T) {
			objs := renderObjects(t, deploy.Namespace, values)
			if len(objs) == 0 {
				t.Fatal("the chart renders nothing")
			}
			for _, obj := range objs {
				m, err := apimeta.Accessor(obj)
				if err != nil {
					t.Fatal(err)
				}
				checkLabels(t, m, fmt.Sprintf("%T", obj), want)
			}
		})
	}
}

// TestChartNamespace: the chart puts Reaper's ServiceAccount in the
// release's namespace and binds, admits and classifies exactly it there;
// it owns no Namespace unless namespace.create asks for one, as deploy/
// does for kubectl.
func TestChartNamespace(t *testing.T) {
	const namespace = "reaper-prod"
	for _, tc := range []struct {
		name    string
		values  map[string]any
		created bool
	}{
		{"defaults", nil, false},
		{"namespace.create=false", map[string]any{"namespace": map[string]any{"create": false}}, false},
		{"namespace.create=true", map[string]any{"namespace": map[string]any{"create": true}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := renderObjects(t, namespace, tc.values)
			var namespaces []string
			for _, obj := range objs {
				if ns, ok := obj.(*corev1.Namespace); ok {
					namespaces = append(namespaces, ns.Name)
				}
			}
			if want := map[bool][]string{true: {namespace}}[tc.created]; !slices.Equal(namespaces, want) {
				t.Errorf("the chart renders the Namespaces %v, want %v", namespaces, want)
			}
			if sa := only[*corev1.ServiceAccount](t, objs); sa.Namespace != namespace {
				t.Errorf("ServiceAccount %s/%s, want it in %s", sa.Namespace, sa.Name, namespace)
			}
			for _, s := range only[*rbacv1.ClusterRoleBinding](t, objs).Subjects {
				if s.Kind == rbacv1.ServiceAccountKind && s.Namespace != namespace {
					t.Errorf("the binding's ServiceAccount is %s/%s, want it in %s", s.Namespace, s.Name, namespace)
				}
			}
			policy := only[*admissionregistrationv1.ValidatingAdmissionPolicy](t, objs)
			if len(policy.Spec.MatchConditions) != 1 || !strings.Contains(policy.Spec.MatchConditions[0].Expression, "'system:serviceaccounts:"+namespace+"'") {
				t.Errorf("the policy's match conditions %+v do not cover the ServiceAccounts of %s", policy.Spec.MatchConditions, namespace)
			}
			var accounts []string
			for _, rule := range only[*flowcontrolv1.FlowSchema](t, objs).Spec.Rules {
				for _, s := range rule.Subjects {
					if s.ServiceAccount != nil {
						accounts = append(accounts, s.ServiceAccount.Namespace+"/"+s.ServiceAccount.Name)
					}
				}
			}
			if want := []string{namespace + "/*"}; !slices.Equal(accounts, want) {
				t.Errorf("the FlowSchema classifies the ServiceAccounts %v, want %v", accounts, want)
			}
		})
	}
}

// TestChartInstall installs the chart with Helm's own install, upgrade and
// uninstall actions on a real kube-apiserver, as `helm install -n
// <namespace> --create-namespace` would: every object the chart renders is
// created under the release with the standard labels, the ServiceAccount in
// the release's namespace, an upgrade with another node prefix rewrites the
// policy, and an uninstall deletes them and leaves the namespace, which
// the chart does not own.
func TestChartInstall(t *testing.T) {
	ctx := t.Context()
	stack := labstack.MustStart(t, labstack.Options{Parts: labstack.Kube})
	const release, namespace = "reaper-test", "reaper-release"
	settings := cli.New()
	settings.KubeConfig = stack.KubeconfigPath
	cfg := action.NewConfiguration()
	if err := cfg.Init(settings.RESTClientGetter(), namespace, "secret"); err != nil {
		t.Fatal(err)
	}
	chart, err := loader.Load(deploy.ChartDir)
	if err != nil {
		t.Fatal(err)
	}

	install := action.NewInstall(cfg)
	install.ReleaseName, install.Namespace = release, namespace
	install.CreateNamespace = true
	install.WaitStrategy = kube.HookOnlyStrategy // the CLI's default
	rel, err := install.RunWithContext(ctx, chart, nil)
	if err != nil {
		t.Fatalf("install: %v", err)
	}
	if acc, err := helmrelease.NewAccessor(rel); err != nil || !strings.Contains(acc.Notes(), "kubectl -n "+namespace+" create token reaper") {
		t.Errorf("the install's notes do not tell how to get the ServiceAccount's token (%v):\n%s", err, acc.Notes())
	}
	labels := standardLabels(t, release)
	objects := chartObjects(stack.Kube, namespace)
	for kind, get := range objects {
		obj, err := get(ctx)
		if err != nil {
			t.Errorf("%s after the install: %v", kind, err)
			continue
		}
		if got := obj.GetAnnotations()["meta.helm.sh/release-name"]; got != release {
			t.Errorf("%s %s belongs to release %q, want %q", kind, obj.GetName(), got, release)
		}
		checkLabels(t, obj, kind, labels)
	}

	upgrade := action.NewUpgrade(cfg)
	upgrade.Namespace = namespace
	upgrade.WaitStrategy = kube.HookOnlyStrategy
	if _, err := upgrade.RunWithContext(ctx, release, chart, map[string]any{
		"admission": map[string]any{"providerNodePrefix": "gpu-vk-"},
	}); err != nil {
		t.Fatalf("upgrade: %v", err)
	}
	policy, err := stack.Kube.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, "reaper-pod-status", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if i := slices.IndexFunc(policy.Spec.Variables, func(v admissionregistrationv1.Variable) bool { return v.Name == "providerNodePrefix" }); i < 0 ||
		policy.Spec.Variables[i].Expression != "'gpu-vk-'" {
		t.Errorf("after the upgrade the policy's variables are %+v, want providerNodePrefix 'gpu-vk-'", policy.Spec.Variables)
	}

	uninstall := action.NewUninstall(cfg)
	uninstall.WaitStrategy = kube.HookOnlyStrategy
	if _, err := uninstall.Run(release); err != nil {
		t.Fatalf("uninstall: %v", err)
	}
	for kind, get := range objects {
		obj, err := get(ctx)
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			t.Errorf("%s after the uninstall: %v", kind, err)
		default:
			t.Errorf("%s %s is still there after the uninstall", kind, obj.GetName())
		}
	}
	ns, err := stack.Kube.CoreV1().Namespaces().Get(ctx, namespace, metav1.GetOptions{})
	switch {
	case err != nil:
		t.Errorf("the release's namespace after the uninstall: %v", err)
	case ns.DeletionTimestamp != nil:
		t.Errorf("the uninstall deletes the release's namespace %s", namespace)
	}
}

// chartObjects reads each object the chart renders with its default
// values into namespace, by kind.
func chartObjects(c kubernetes.Interface, namespace string) map[string]func(context.Context) (metav1.Object, error) {
	get := metav1.GetOptions{}
	return map[string]func(context.Context) (metav1.Object, error){
		"ServiceAccount": func(ctx context.Context) (metav1.Object, error) {
			return c.CoreV1().ServiceAccounts(namespace).Get(ctx, "reaper", get)
		},
		"ClusterRole": func(ctx context.Context) (metav1.Object, error) {
			return c.RbacV1().ClusterRoles().Get(ctx, "reaper", get)
		},
		"ClusterRoleBinding": func(ctx context.Context) (metav1.Object, error) {
			return c.RbacV1().ClusterRoleBindings().Get(ctx, "reaper", get)
		},
		"ValidatingAdmissionPolicy": func(ctx context.Context) (metav1.Object, error) {
			return c.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, "reaper-pod-status", get)
		},
		"ValidatingAdmissionPolicyBinding": func(ctx context.Context) (metav1.Object, error) {
			return c.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Get(ctx, "reaper-pod-status", get)
		},
		"FlowSchema": func(ctx context.Context) (metav1.Object, error) {
			return c.FlowcontrolV1().FlowSchemas().Get(ctx, "reaper", get)
		},
		"PriorityLevelConfiguration": func(ctx context.Context) (metav1.Object, error) {
			return c.FlowcontrolV1().PriorityLevelConfigurations().Get(ctx, "reaper", get)
		},
	}
}
