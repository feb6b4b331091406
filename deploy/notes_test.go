package deploy_test

import (
	"slices"
	"strings"
	"testing"

	chartv2 "helm.sh/helm/v4/pkg/chart/v2"

	"github.com/reaper-k8s/reaper/deploy"
)

// TestChartMetadata holds Chart.yaml to what Helm users and tools read
// from it: the version of Reaper it deploys (appVersion, released with the
// chart, so the same as its version), where the project and its sources
// are, and the Kubernetes versions it supports, the oldest of which
// deploy/ is rendered for.
func TestChartMetadata(t *testing.T) {
	meta, err := deploy.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	if meta.APIVersion != chartv2.APIVersionV2 || meta.Type != "application" {
		t.Errorf("apiVersion %q, type %q; want %q, application", meta.APIVersion, meta.Type, chartv2.APIVersionV2)
	}
	if meta.AppVersion == "" || meta.AppVersion != meta.Version {
		t.Errorf("appVersion %q, version %q: the chart is released with Reaper, under one version", meta.AppVersion, meta.Version)
	}
	const repo = "https://github.com/reaper-k8s/reaper"
	if meta.Home != repo || !slices.Contains(meta.Sources, repo) {
		t.Errorf("home %q, sources %v; want %s for both", meta.Home, meta.Sources, repo)
	}
	if meta.KubeVersion != ">=1.30.0-0" {
		t.Errorf("kubeVersion %q: the admission policy needs Kubernetes 1.30 (README.md's support matrix)", meta.KubeVersion)
	}
	if err := meta.Validate(); err != nil {
		t.Error(err)
	}
}

// TestChartNotes renders NOTES.txt, what `helm install` prints, with the
// defaults and with other identities: the identities to give the
// functions, in the release's namespace, the doctor with the flags those
// identities need, and where the docs are.
func TestChartNotes(t *testing.T) {
	for _, tc := range []struct {
		name      string
		namespace string
		values    map[string]any
		want      []string
		not       []string
	}{
		{"defaults", deploy.Namespace, nil, []string{
			"eksAccessEntryGroup=reaper",
			"--kubernetes-groups reaper",
			"kubectl -n reaper create token reaper",
			"nodes whose name starts with \"reaper-virtual-\"",
			"reaper doctor -cluster <cluster> -provider-nodes type=virtual-kubelet\n",
			"https://github.com/reaper-k8s/reaper/blob/main/docs/deploy.md",
		}, []string{" -service-account", " -group ", "labelled"}},
		{"other identities", "reaper-prod", map[string]any{
			"identity":  map[string]any{"group": "ops", "serviceAccount": "reconciler"},
			"admission": map[string]any{"providerNodePrefix": "", "providerLabel": map[string]any{"key": "example.com/provider", "value": "reaper"}},
		}, []string{
			"eksAccessEntryGroup=ops",
			"kubectl -n reaper-prod create token reconciler",
			"Pods labelled example.com/provider=reaper",
			"reaper doctor -cluster <cluster> -provider-nodes type=virtual-kubelet -group ops -service-account reaper-prod/reconciler\n",
		}, []string{"nodes whose name"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			notes, err := deploy.Notes(t.Context(), tc.namespace, tc.values)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(notes, w) {
					t.Errorf("the notes do not say %q:\n%s", w, notes)
				}
			}
			for _, w := range tc.not {
				if strings.Contains(notes, w) {
					t.Errorf("the notes say %q:\n%s", w, notes)
				}
			}
		})
	}
}
