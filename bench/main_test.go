package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/reaper-k8s/reaper/internal/labstack"
	"github.com/reaper-k8s/reaper/internal/replay"
	"github.com/reaper-k8s/reaper/pkg/app"
	"github.com/reaper-k8s/reaper/pkg/app/reaperapp"
	"github.com/reaper-k8s/reaper/pkg/intake"
	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/reaper"
)

// table is the ledger table the in-process functions write; NewLab gives
// it the work queue table+"-work".
const table = "reaper-bench-ledger"

// unpaced is REAPER_EC2_LIMITS for the in-process reconciler: buckets so
// large its pacing never waits. The per-exit benchmarks measure the work of
// an exit; BenchmarkBurst measures the buckets.
const unpaced = "describe=1000000/1000000,terminate=1000000/1000000,terminate-instances=1000000/1000000"

// world is the stack every benchmark shares: started once, on first use,
// and stopped by TestMain.
type world struct {
	stack *labstack.Stack
	// lab holds the ledger table and the work queue of the in-process
	// functions; it runs no function itself.
	lab *replay.Lab
	// dynamo counts the in-process functions' DynamoDB requests.
	dynamo *replay.OperationCounter
	dir    string
	// devNull is where the in-process functions log.
	devNull *os.File

	mu     sync.Mutex
	passes int
}

var (
	worldOnce sync.Once
	theWorld  *world
	worldErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if theWorld != nil {
		theWorld.lab.Stop()
		theWorld.dynamo.Close()
		theWorld.stack.Stop()
		theWorld.devNull.Close()
		os.RemoveAll(theWorld.dir)
	}
	os.Exit(code)
}

func getWorld(b *testing.B) *world {
	b.Helper()
	worldOnce.Do(func() { theWorld, worldErr = startWorld() })
	if worldErr != nil {
		b.Fatal(worldErr)
	}
	return theWorld
}

func startWorld() (*world, error) {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "reaper-bench-")
	if err != nil {
		return nil, err
	}
	devNull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		return nil, err
	}
	stack, err := labstack.Start(ctx, labstack.Options{})
	if err != nil {
		return nil, err
	}
	w := &world{stack: stack, dir: dir, devNull: devNull}
	if w.dynamo, err = replay.NewOperationCounter(stack.DynamoEndpoint); err != nil {
		stack.Stop()
		return nil, err
	}
	if w.lab, err = replay.NewLab(ctx, stack, table, nil); err != nil {
		stack.Stop()
		return nil, err
	}
	// The in-process functions are wired from the environment as their mains wire them,
	// so this process gets the environment the bootstraps get under the
	// emulator, with no shared AWS config files and no other AWS_*
	// settings (an AWS_CA_BUNDLE, say, would be parsed at every wiring).
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "AWS_") {
			os.Unsetenv(k)
		}
	}
	env := append(w.lambdaEnv(),
		"AWS_ENDPOINT_URL_DYNAMODB="+w.dynamo.URL(),
		"REAPER_EC2_LIMITS="+unpaced,
		"AWS_CONFIG_FILE="+filepath.Join(dir, "aws-config"),
		"AWS_SHARED_CREDENTIALS_FILE="+filepath.Join(dir, "aws-credentials"))
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		if err := os.Setenv(k, v); err != nil {
			return nil, err
		}
	}
	if err := w.warmUp(ctx); err != nil {
		stack.Stop()
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	return w, nil
}

// warmUpExits go through the in-process exitrecorder and reconciler,
// untimed, before the first benchmark: a fresh stack is slower for a while
// (dynalite's JIT, the apiserver's and etcd's caches), which would
// otherwise count against whichever benchmark runs first.
const warmUpExits = 500

func (w *world) warmUp(ctx context.Context) error {
	recorders, err := w.newRecorders(ctx, 8)
	if err != nil {
		return err
	}
	reconciler, err := w.newReconciler(ctx)
	if err != nil {
		return err
	}
	p, err := w.prepare(ctx, warmUpExits)
	if err != nil {
		return err
	}
	if _, err := record(ctx, recorders, p); err != nil {
		return err
	}
	batches, err := w.receive(ctx, warmUpExits, warmUpExits)
	if err != nil {
		return err
	}
	for _, ev := range batches {
		if err := reconcile(ctx, reconciler, ev); err != nil {
			return err
		}
	}
	return w.cleanup(ctx, p)
}

// lambdaEnv is what a bootstrap of the bench lab runs with under the
// emulator (a copy, to append to).
func (w *world) lambdaEnv() []string { return slices.Clone(w.lab.Env) }

// setup reads a function's environment with app.Load, as its main does,
// from this process's environment (startWorld). Its log, and the metrics
// written through it, go to /dev/null: under Lambda they go to stdout, and
// this process's stdout is for the results. app.Load takes os.Stdout when
// it builds the logger, hence the swap, one setup at a time.
func (w *world) setup(ctx context.Context, function string) (app.Setup, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	stdout := os.Stdout
	os.Stdout = w.devNull
	defer func() { os.Stdout = stdout }()
	return app.Load(ctx, function)
}

// newRecorders wires n exitrecorders as functions/exitrecorder/main.go
// does: one per Lambda execution environment, each with its own clients
// and connections.
func (w *world) newRecorders(ctx context.Context, n int) ([]*intake.Intake, error) {
	out := make([]*intake.Intake, n)
	for i := range out {
		s, err := w.setup(ctx, metrics.FunctionExitRecorder)
		if err != nil {
			return nil, err
		}
		out[i] = app.NewIntake(s, app.Clients{})
	}
	return out, nil
}

// newReconciler wires a reconciler as functions/reconciler/main.go does.
func (w *world) newReconciler(ctx context.Context) (*reaper.Reaper, error) {
	s, err := w.setup(ctx, metrics.FunctionReconciler)
	if err != nil {
		return nil, err
	}
	return reaperapp.New(ctx, s, reaperapp.Clients{})
}
