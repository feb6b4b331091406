// Command render writes the manifests of the deploy directory from the
// chart charts/reaper, and the values table of the chart's README from
// its values.yaml. `go generate ./deploy` runs it in that directory;
// TestManifestsRenderedFromChart and TestChartREADMEValues fail until it
// has run after a change to the chart.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/reaper-k8s/reaper/deploy"
)

func main() {
	files, err := deploy.Files(context.Background())
	if err != nil {
		fail(err)
	}
	for name, content := range files {
		if err := os.WriteFile(name, content, 0o644); err != nil {
			fail(err)
		}
	}
	path, readme, err := deploy.ChartREADME()
	if err != nil {
		fail(err)
	}
	if err := os.WriteFile(path, readme, 0o644); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "render:", err)
	os.Exit(1)
}
