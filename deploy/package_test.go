package deploy_test

import (
	"bytes"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"helm.sh/helm/v4/pkg/chart/loader"
	chartv2 "helm.sh/helm/v4/pkg/chart/v2"

	"github.com/reaper-k8s/reaper/deploy"
)

// TestChartLint lints the chart with Helm's own linter, as `helm lint
// --strict -n reaper` does: no error and no warning.
func TestChartLint(t *testing.T) {
	if err := deploy.Lint(deploy.ChartDir); err != nil {
		t.Error(err)
	}
}

// TestChartPackage packages the chart as `make chart` does and checks the
// archive: named after Chart.yaml's version, the same chart as the
// directory (metadata, templates, values, schema, README), and linting as
// clean as the directory.
func TestChartPackage(t *testing.T) {
	dir := t.TempDir()
	path, err := deploy.Package(dir)
	if err != nil {
		t.Fatal(err)
	}
	meta, err := deploy.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "reaper-"+meta.Version+".tgz"); path != want {
		t.Errorf("packaged as %s, want %s", path, want)
	}
	if err := deploy.Lint(path); err != nil {
		t.Error(err)
	}
	packaged, err := loader.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	source, err := loader.Load(deploy.ChartDir)
	if err != nil {
		t.Fatal(err)
	}
	got, want := packaged.(*chartv2.Chart), source.(*chartv2.Chart)
	if !reflect.DeepEqual(got.Metadata, want.Metadata) {
		t.Errorf("packaged metadata %+v\nwant %+v", got.Metadata, want.Metadata)
	}
	files := func(c *chartv2.Chart) map[string][]byte {
		m := map[string][]byte{"values.schema.json": c.Schema}
		for _, f := range append(slices.Clone(c.Templates), c.Files...) {
			m[f.Name] = f.Data
		}
		for _, f := range c.Raw {
			if f.Name == "values.yaml" {
				m[f.Name] = f.Data
			}
		}
		return m
	}
	gotFiles, wantFiles := files(got), files(want)
	for _, name := range []string{"templates/NOTES.txt", "templates/_helpers.tpl", "README.md", "values.yaml", "values.schema.json"} {
		if len(wantFiles[name]) == 0 {
			t.Errorf("the chart has no %s", name)
		}
	}
	for name, data := range wantFiles {
		if !bytes.Equal(gotFiles[name], data) {
			t.Errorf("the packaged %s differs from the chart's", name)
		}
	}
	for name := range gotFiles {
		if _, ok := wantFiles[name]; !ok {
			t.Errorf("the package holds %s, which the chart does not", name)
		}
	}
}
