// Command packagechart lints the chart charts/reaper as `helm lint
// --strict` does and packages it as `helm package` does, with Helm's Go
// library: `make chart` runs it, and it writes
// build/charts/reaper-<version>.tgz, the version being Chart.yaml's.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/reaper-k8s/reaper/deploy"
)

func main() {
	dest := flag.String("dest", "build/charts", "directory to write the packaged chart to")
	flag.Parse()
	// The chart's path is relative to the deploy directory, as for go
	// generate: run there, from the module's root.
	abs, err := filepath.Abs(*dest)
	if err == nil {
		err = os.Chdir("deploy")
	}
	var path string
	if err == nil {
		path, err = deploy.Package(abs)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "packagechart:", err)
		os.Exit(1)
	}
	fmt.Println("packaged", filepath.Join(*dest, filepath.Base(path)))
}
