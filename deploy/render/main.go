// Command render writes the manifests of the deploy directory from the
// chart charts/reaper with its default values. `go generate ./deploy` runs
// it in that directory; TestManifestsRenderedFromChart fails until it has
// run after a change to the chart.
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
		fmt.Fprintln(os.Stderr, "render:", err)
		os.Exit(1)
	}
	for name, content := range files {
		if err := os.WriteFile(name, content, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "render:", err)
			os.Exit(1)
		}
	}
}
