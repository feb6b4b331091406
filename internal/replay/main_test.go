package replay

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/reaper-k8s/reaper/internal/localstack"
)

// lab is shared by the tests of this package: one stack, one ledger table,
// the three functions under the emulator. Scenarios keep out of each
// other's way by namespace and instance id.
var lab *Lab

// exitWait is the window the functions run with: short, so the tests of
// the window do not wait minutes.
const exitWait = 3 * time.Second

// recordingsDir holds the recorded scenarios (see package recordings).
const recordingsDir = "../../testdata/replay"

func TestMain(m *testing.M) {
	code, err := run(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "replay tests:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

func run(m *testing.M) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	root, err := ModuleRoot()
	if err != nil {
		return 0, err
	}
	dir, err := os.MkdirTemp("", "reaper-replay-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	bins, err := Build(ctx, root, filepath.Join(dir, "build"), Functions...)
	if err != nil {
		return 0, err
	}
	stack, err := localstack.Start(ctx, localstack.Options{})
	if err != nil {
		return 0, err
	}
	defer stack.Stop()
	lab, err = NewLab(ctx, stack, "reaper-ledger", bins, "REAPER_EXIT_WAIT="+exitWait.String(), "REAPER_ORPHAN_GRACE=1m")
	if err != nil {
		return 0, err
	}
	defer lab.Stop()
	code := m.Run()
	if code != 0 {
		for name, f := range lab.Functions {
			fmt.Fprintf(os.Stderr, "--- %s output (tail):\n%s\n", name, tail(f.Logs(), 40))
		}
	}
	return code, nil
}

func tail(s string, lines int) string {
	n := 0
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == '\n' {
			n++
			if n > lines {
				return s[i+1:]
			}
		}
	}
	return s
}
