package deploy_test

import (
	"bytes"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/reaper-k8s/reaper/deploy"
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
