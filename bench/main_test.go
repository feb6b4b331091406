package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"k8s.io/client-go/rest"

	"github.com/reaper-k8s/reaper/internal/localstack"
	"github.com/reaper-k8s/reaper/internal/replay"
	"github.com/reaper-k8s/reaper/pkg/app"
	"github.com/reaper-k8s/reaper/pkg/config"
	"github.com/reaper-k8s/reaper/pkg/instances"
	"github.com/reaper-k8s/reaper/pkg/kube"
	"github.com/reaper-k8s/reaper/pkg/kubeclient"
	"github.com/reaper-k8s/reaper/pkg/ledger"
	"github.com/reaper-k8s/reaper/pkg/reaper"
)

// table is the ledger table the benchmarks write.
const table = "reaper-bench-ledger"

// Client-side rate limit for the apiserver clients of the in-process
// sandboxes. Production uses 50 QPS, burst 100 (pkg/kubeclient): a Lambda
// sandbox handles one payload at a time and, against AWS latencies, never
// reaches it. Against loopback a sandbox runs exits back to back fast
// enough for the limiter to become the bottleneck, which would measure the
// limiter instead of the code, so it is lifted here (REPORT.md, "Method").
const (
	benchQPS   = 5000
	benchBurst = 10000
)

// world is the stack every benchmark shares: started once, on first use,
// and stopped by TestMain.
type world struct {
	stack *localstack.Stack
	lab   *replay.Lab
	cfg   config.Config
	dir   string

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
		theWorld.stack.Stop()
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
	stack, err := localstack.Start(ctx, localstack.Options{})
	if err != nil {
		return nil, err
	}
	lab, err := replay.NewLab(ctx, stack, table, nil)
	if err != nil {
		stack.Stop()
		return nil, err
	}
	// The sandboxes are wired from the environment like app.New does, so
	// this process gets the environment the bootstrap gets under the
	// emulator, with no shared AWS config files and no other AWS_*
	// settings (an AWS_CA_BUNDLE, say, would be parsed at every wiring).
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "AWS_") {
			os.Unsetenv(k)
		}
	}
	env := append(stack.Env(), "REAPER_TABLE="+table,
		"AWS_CONFIG_FILE="+filepath.Join(dir, "aws-config"),
		"AWS_SHARED_CREDENTIALS_FILE="+filepath.Join(dir, "aws-credentials"))
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		if err := os.Setenv(k, v); err != nil {
			return nil, err
		}
	}
	cfg, err := config.FromEnv(os.Getenv)
	if err != nil {
		stack.Stop()
		return nil, err
	}
	w := &world{stack: stack, lab: lab, cfg: cfg, dir: dir}
	if err := w.warmUp(ctx); err != nil {
		stack.Stop()
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	return w, nil
}

// warmUpExits go through the handler (which makes every kind of call the
// floor makes, and more), untimed, before the first benchmark:
// a fresh stack is slower for a while (dynalite's JIT, the apiserver's and
// etcd's caches), which would otherwise count against whichever benchmark
// runs first.
const warmUpExits = 500

func (w *world) warmUp(ctx context.Context) error {
	sandboxes, err := w.newSandboxes(ctx, 8, variant{}, nil)
	if err != nil {
		return err
	}
	p, err := w.prepare(ctx, warmUpExits)
	if err != nil {
		return err
	}
	if _, err := drive(ctx, sandboxes, p, handlerPath); err != nil {
		return err
	}
	return w.cleanup(ctx, p)
}

// lambdaEnv is what a bootstrap under the emulator runs with.
func (w *world) lambdaEnv() []string {
	return append(w.stack.Env(), "REAPER_TABLE="+table)
}

// sandbox is one Lambda execution environment's worth of state: the Reaper
// app.New would build, with its own AWS HTTP clients and its own apiserver
// connection. A worker of the benchmark owns one, as a sandbox handles one
// invocation at a time.
type sandbox struct {
	r     *reaper.Reaper
	table *ledger.Table
	kube  *rest.RESTClient
	fleet *instances.Fleet
}

// newSandbox wires a Reaper the way app.New does (same configuration, same
// AWS retry tuning, same REST configuration) with the call counters added,
// and the variant's changes applied.
func (w *world) newSandbox(ctx context.Context, v variant, known knownInstances) (*sandbox, error) {
	awsCfg, err := app.AWSConfig(ctx)
	if err != nil {
		return nil, err
	}
	awsCfg.APIOptions = append(awsCfg.APIOptions, countAWS(v))
	rc, err := kubeclient.RESTConfig(ctx, w.cfg.Kube, awsCfg)
	if err != nil {
		return nil, err
	}
	rc.QPS, rc.Burst = benchQPS, benchBurst
	// A dial function of its own keeps client-go from sharing one cached
	// transport (and so one HTTP/2 connection) between the sandboxes.
	dialer := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	rc.Dial = dialer.DialContext
	rc.Wrap(func(rt http.RoundTripper) http.RoundTripper { return &kubeTransport{next: rt, v: v} })
	kc, err := kube.NewClient(rc)
	if err != nil {
		return nil, err
	}
	tbl := ledger.New(dynamodb.NewFromConfig(awsCfg), w.cfg.Table)
	fleet := instances.NewFleet(ec2.NewFromConfig(awsCfg), w.cfg.Tags, w.cfg.Cluster, w.cfg.DryRun)
	r := &reaper.Reaper{
		Ledger: tbl,
		Pods:   kube.NewStatusWriter(kc, w.cfg.DryRun),
		Fleet:  fleet,
		Policy: reaper.Policy{ExitWait: w.cfg.ExitWait, TerminateStopped: w.cfg.TerminateStopped},
		DryRun: w.cfg.DryRun,
		// app.Logger's JSON handler, writing where nobody reads.
		Log: slog.New(slog.NewJSONHandler(io.Discard, &slog.HandlerOptions{Level: w.cfg.LogLevel})),
		Now: time.Now,
	}
	if v.noMarkDone {
		r.Ledger = noMarkDone{tbl}
	}
	if v.noDescribe {
		r.Fleet = taggedFleet{Fleet: fleet, known: known}
	}
	sb := &sandbox{r: r, table: tbl, kube: kc, fleet: fleet}
	return sb, sb.warm(ctx)
}

// warm opens the sandbox's connections (TLS to the apiserver, HTTP to
// dynalite and the EC2 server), as the first invocations of a sandbox do.
func (sb *sandbox) warm(ctx context.Context) error {
	if _, _, err := sb.table.Get(ctx, "i-00000000"); err != nil {
		return err
	}
	if err := sb.kube.Get().Resource("namespaces").Name("default").Do(ctx).Error(); err != nil {
		return err
	}
	_, err := sb.fleet.Describe(ctx, []string{"i-00000000"})
	return err
}

// noMarkDone is the ledger without the mark-done write (a measurement of
// what that write costs, not a proposal on its own; see REPORT.md).
type noMarkDone struct{ reaper.Ledger }

func (noMarkDone) MarkDone(context.Context, string, ledger.Done) error { return nil }

// knownInstances answers what the tag lookup would: the fixtures know it.
type knownInstances func(id string) (instances.Instance, bool)

// taggedFleet answers the tag lookup from the fixtures, as a Fleet relying
// on the IAM policy's tag condition (UnauthorizedOperation for an instance
// not managed) and TerminateInstances' previous state would.
type taggedFleet struct {
	*instances.Fleet
	known knownInstances
}

func (f taggedFleet) Describe(_ context.Context, ids []string) (map[string]instances.Instance, error) {
	out := make(map[string]instances.Instance, len(ids))
	for _, id := range ids {
		if i, ok := f.known(id); ok {
			out[id] = i
		}
	}
	return out, nil
}

// newSandboxes builds n sandboxes concurrently.
func (w *world) newSandboxes(ctx context.Context, n int, v variant, known knownInstances) ([]*sandbox, error) {
	out := make([]*sandbox, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { out[i], errs[i] = w.newSandbox(ctx, v, known) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("sandbox: %w", err)
		}
	}
	return out, nil
}
