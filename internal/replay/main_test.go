package replay

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/reaper-k8s/reaper/internal/labstack"
	"github.com/reaper-k8s/reaper/pkg/ledger"
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

// deployment starts a Reaper deployment of its own on the shared stack:
// the named functions with their own cluster name, ledger table and
// queues, and env besides, so that a knob or a sweep of one test reaches
// no other test's instances.
func deployment(t *testing.T, cluster string, opts LabOptions, functions ...string) *Lab {
	t.Helper()
	bins := map[string]string{}
	for _, fn := range functions {
		bins[fn] = lab.Bootstraps[fn]
	}
	opts.Env = append([]string{"REAPER_CLUSTER=" + cluster, "REAPER_EXIT_WAIT=" + exitWait.String(), "REAPER_ORPHAN_GRACE=1m"}, opts.Env...)
	d, err := NewLabWith(t.Context(), lab.Stack, cluster, bins, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)
	return d
}

// waitFor polls done every 100 ms until it holds, and fails the test with
// what once within has passed.
func waitFor(t *testing.T, within time.Duration, what string, done func() bool) {
	t.Helper()
	for deadline := time.Now().Add(within); !done(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, within)
		}
	}
}

// recordOf is the ledger record of instance id in deployment l.
func recordOf(t *testing.T, l *Lab, id string) ledger.Record {
	t.Helper()
	rec, ok, err := l.Ledger.Get(t.Context(), id)
	if err != nil || !ok {
		t.Fatalf("ledger record of %s: %+v ok=%v err=%v", id, rec, ok, err)
	}
	return rec
}
