package deploy_test

import (
	"bytes"
	"context"
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
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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

// TestChartRefusesBadValues renders the chart with values it must refuse
// before anything reaches a cluster, and checks that the error names the
// value.
func TestChartRefusesBadValues(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values map[string]any
		want   string
	}{
		{"misspelt name", map[string]any{"admission": map[string]any{"providerNodePrefx": "vk-"}}, "providerNodePrefx"},
		{"quote in a node prefix", map[string]any{"admission": map[string]any{"providerNodePrefix": "vk-' || true || '"}}, "providerNodePrefix"},
		{"upper case in a node prefix", map[string]any{"admission": map[string]any{"providerNodePrefix": "VK-"}}, "providerNodePrefix"},
		{"invalid label key", map[string]any{"admission": map[string]any{"providerLabel": map[string]any{"key": "a b"}}}, "key"},
		{"quote in the group", map[string]any{"identity": map[string]any{"group": "reaper'"}}, "group"},
		{"namespace not a DNS label", map[string]any{"identity": map[string]any{"namespace": "Reaper"}}, "namespace"},
		{"no way to recognise the provider's Pods", map[string]any{"admission": map[string]any{"providerNodePrefix": ""}},
			"admission.providerNodePrefix and admission.providerLabel.key are both empty"},
		{"a percentage over 100", map[string]any{"flowControl": map[string]any{"lendablePercent": 150}}, "lendablePercent"},
		{"a number as a string", map[string]any{"flowControl": map[string]any{"nominalConcurrencyShares": "30"}}, "nominalConcurrencyShares"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := deploy.Template(t.Context(), tc.values)
			switch {
			case err == nil:
				t.Errorf("rendered:\n%s", out)
			case !strings.Contains(err.Error(), tc.want):
				t.Errorf("error %q does not name %q", err, tc.want)
			}
		})
	}
}

// TestChartInstall installs the chart with Helm's own install, upgrade and
// uninstall actions on a real kube-apiserver, as `helm install` would: every
// object the chart renders is created under the release, an upgrade with
// another node prefix rewrites the policy, and an uninstall deletes them.
func TestChartInstall(t *testing.T) {
	ctx := t.Context()
	stack := labstack.MustStart(t, labstack.Options{Parts: labstack.Kube})
	settings := cli.New()
	settings.KubeConfig = stack.KubeconfigPath
	cfg := action.NewConfiguration()
	if err := cfg.Init(settings.RESTClientGetter(), "default", "secret"); err != nil {
		t.Fatal(err)
	}
	chart, err := loader.Load(deploy.ChartDir)
	if err != nil {
		t.Fatal(err)
	}
	const release = "reaper"

	install := action.NewInstall(cfg)
	install.ReleaseName, install.Namespace = release, "default"
	install.WaitStrategy = kube.HookOnlyStrategy // the CLI's default
	if _, err := install.RunWithContext(ctx, chart, nil); err != nil {
		t.Fatalf("install: %v", err)
	}
	objects := chartObjects(stack.Kube)
	for kind, get := range objects {
		obj, err := get(ctx)
		if err != nil {
			t.Errorf("%s after the install: %v", kind, err)
			continue
		}
		if got := obj.GetAnnotations()["meta.helm.sh/release-name"]; got != release {
			t.Errorf("%s %s belongs to release %q, want %q", kind, obj.GetName(), got, release)
		}
	}

	upgrade := action.NewUpgrade(cfg)
	upgrade.Namespace = "default"
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
		// No namespace controller runs here to finish deleting the
		// namespace and what it holds: being deleted is as far as it gets.
		case obj.GetDeletionTimestamp() == nil:
			t.Errorf("%s %s is still there after the uninstall", kind, obj.GetName())
		}
	}
}

// chartObjects reads each object the chart renders with its default
// values, by kind.
func chartObjects(c kubernetes.Interface) map[string]func(context.Context) (metav1.Object, error) {
	get := metav1.GetOptions{}
	return map[string]func(context.Context) (metav1.Object, error){
		"Namespace": func(ctx context.Context) (metav1.Object, error) {
			return c.CoreV1().Namespaces().Get(ctx, "reaper", get)
		},
		"ServiceAccount": func(ctx context.Context) (metav1.Object, error) {
			return c.CoreV1().ServiceAccounts("reaper").Get(ctx, "reaper", get)
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
