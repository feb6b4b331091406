package deploy_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/chart/loader"
	chartv2 "helm.sh/helm/v4/pkg/chart/v2"

	"github.com/reaper-k8s/reaper/deploy"
)

// TestChartREADMEValues holds the values table of the chart's README to
// values.yaml, so the two cannot drift: `go generate ./deploy` writes it.
func TestChartREADMEValues(t *testing.T) {
	path, want, err := deploy.ChartREADME()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("the values table of %s differs from values.yaml: run `go generate ./deploy`", path)
	}
}

// TestValuesTable: every value of values.yaml has a row, with its default
// as the chart has it and its `# --` description, and a value without a
// description is refused.
func TestValuesTable(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(deploy.ChartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	values, err := deploy.Values(data)
	if err != nil {
		t.Fatal(err)
	}
	source, err := loader.Load(deploy.ChartDir)
	if err != nil {
		t.Fatal(err)
	}
	var leaves []string
	var walk func(prefix string, m map[string]any)
	walk = func(prefix string, m map[string]any) {
		for k, v := range m {
			if sub, ok := v.(map[string]any); ok && len(sub) > 0 {
				walk(prefix+k+".", sub)
				continue
			}
			leaves = append(leaves, prefix+k)
		}
	}
	defaults := source.(*chartv2.Chart).Values
	walk("", defaults)
	var keys []string
	for _, v := range values {
		keys = append(keys, v.Key)
		var def any = defaults
		for _, k := range strings.Split(v.Key, ".") {
			def = def.(map[string]any)[k]
		}
		if js, _ := json.Marshal(def); string(js) != v.Default {
			t.Errorf("%s: default %s in the table, %s in the chart", v.Key, v.Default, js)
		}
		if len(v.Description) < 10 {
			t.Errorf("%s: description %q", v.Key, v.Description)
		}
	}
	slices.Sort(leaves)
	if !slices.Equal(slices.Sorted(slices.Values(keys)), leaves) {
		t.Errorf("the table's keys %v, the chart's values %v", keys, leaves)
	}
	table := deploy.ValuesTable(values)
	if n := strings.Count(table, "\n"); n != len(values)+2 {
		t.Errorf("the table has %d lines for %d values:\n%s", n, len(values), table)
	}

	_, err = deploy.Values([]byte("a:\n  # -- Documented.\n  b: 1\n  # Not a description.\n  c: x\n"))
	if err == nil || !strings.Contains(err.Error(), "a.c") {
		t.Errorf("an undocumented value: error %v, want one naming a.c", err)
	}
}
