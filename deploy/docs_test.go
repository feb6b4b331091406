package deploy_test

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/reaper-k8s/reaper/deploy"
)

// TestHelmVersionDocumented: the docs say which Helm the chart is tested
// with, the version of the Helm library go.mod builds the tests with.
func TestHelmVersionDocumented(t *testing.T) {
	gomod, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`helm\.sh/helm/v4 (v\S+)`).FindSubmatch(gomod)
	if m == nil {
		t.Fatal("go.mod requires no helm.sh/helm/v4")
	}
	version := string(m[1])
	for _, doc := range []string{"../README.md", "../docs/deploy.md", filepath.Join(deploy.ChartDir, "README.md")} {
		text, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(text, []byte("Helm "+version)) {
			t.Errorf("%s does not name Helm %s, the version the tests run", doc, version)
		}
		if bytes.Contains(text, []byte("Helm 3 for")) {
			t.Errorf("%s still requires Helm 3", doc)
		}
	}
}
