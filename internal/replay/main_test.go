package replay

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/reaper-k8s/reaper/internal/labstack"
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
	env := []string{"REAPER_EXIT_WAIT=" + exitWait.String(), "REAPER_ORPHAN_GRACE=1m"}
	RunTests(30*time.Minute, labstack.Options{}, "reaper-ledger", env, func(_ context.Context, l *Lab) (int, error) {
		lab = l
		code := m.Run()
		if code != 0 {
			for name, f := range lab.Functions {
				fmt.Fprintf(os.Stderr, "--- %s output (tail):\n%s\n", name, Tail(f.Logs(), 40))
			}
		}
		return code, nil
	})
}
