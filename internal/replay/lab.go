// Package replay runs Reaper's functions, built as Lambda bootstraps, under
// the runtime interface emulator against a local stack, and replays recorded
// AWS event payloads through them. The integration tests, `reaper replay` and
// the benchmarks share it.
package replay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reaper-k8s/reaper/internal/ec2server"
	"github.com/reaper-k8s/reaper/internal/esm"
	"github.com/reaper-k8s/reaper/internal/labstack"
	"github.com/reaper-k8s/reaper/pkg/kube"
	"github.com/reaper-k8s/reaper/pkg/ledger"
	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/model"
	"github.com/reaper-k8s/reaper/pkg/statechange"
)

// Functions are Reaper's Lambda functions.
var Functions = []string{metrics.FunctionExitRecorder, metrics.FunctionStateChange, metrics.FunctionSweeper, metrics.FunctionReconciler}

// Build compiles the named functions for this machine (the emulator runs
// them natively) the way `make build` does for Lambda, into
// dir/<name>/bootstrap. One go command builds them all, so their shared
// dependencies compile once.
func Build(ctx context.Context, moduleRoot, dir string, names ...string) (map[string]string, error) {
	tmp := filepath.Join(dir, ".out")
	var pkgs []string
	for _, name := range names {
		pkgs = append(pkgs, "./functions/"+name)
	}
	if err := goBuild(ctx, moduleRoot, tmp+"/", nil, pkgs...); err != nil {
		return nil, fmt.Errorf("build functions: %w", err)
	}
	out := make(map[string]string, len(names))
	for _, name := range names {
		bin := filepath.Join(dir, name, "bootstrap")
		if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
			return nil, err
		}
		if err := os.Rename(filepath.Join(tmp, name), bin); err != nil {
			return nil, err
		}
		out[name] = bin
	}
	return out, os.Remove(tmp)
}

// BuildBootstrap compiles the main package pkg (a path relative to
// moduleRoot) into the file bin as Build compiles the functions, with the
// extra build tags.
func BuildBootstrap(ctx context.Context, moduleRoot, bin, pkg string, tags ...string) error {
	if err := goBuild(ctx, moduleRoot, bin, tags, pkg); err != nil {
		return fmt.Errorf("build %s (tags %v): %w", pkg, tags, err)
	}
	return nil
}

// goBuild runs go build as `make build` does for Lambda, for this machine's
// architecture, with the extra tags: out is a file, or a directory ending
// in "/" for several packages.
func goBuild(ctx context.Context, moduleRoot, out string, tags []string, pkgs ...string) error {
	args := append([]string{"build", "-trimpath", "-tags", strings.Join(append([]string{"lambda.norpc"}, tags...), ","),
		"-ldflags=-s -w", "-o", out}, pkgs...)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = moduleRoot
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%v\n%s", err, b)
	}
	return nil
}

// ModuleRoot finds the directory holding go.mod, from the working directory up.
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod above the working directory")
		}
		dir = parent
	}
}

// Lab is a local stack with a ledger table, a work queue and Reaper's
// functions running under the emulator, the reconciler behind an event
// source mapping on the queue.
type Lab struct {
	Stack     *labstack.Stack
	Table     string
	Ledger    *ledger.Table
	Functions map[string]*labstack.Function
	// Bootstraps are the built functions, to start more with other knobs.
	Bootstraps map[string]string
	// Env is what the functions run with.
	Env []string
	// ClusterUID is the identity of the stack's apiserver, which the lab's
	// instances carry in their cluster identity tag.
	ClusterUID string
	// QueueURL is the work queue; DeadLetterURL its dead-letter queue.
	QueueURL, DeadLetterURL string
	// Mapping feeds the queue to the reconcilers; nil when no reconciler
	// was built.
	Mapping *esm.Mapping
	// Reconcilers are the reconciler's execution environments (the
	// emulator runs one invocation at a time, so one per concurrent
	// invocation); Functions["reconciler"] is the first.
	Reconcilers []*labstack.Function
	idle        chan *labstack.Function
}

// LabOptions shape a Lab beyond NewLab's defaults.
type LabOptions struct {
	// Env is added to the functions' environment (REAPER_* knobs).
	Env []string
	// The event source mapping's settings (defaults: batch size 10,000,
	// window 50 ms, concurrency 2); the construct deploys a 1 s window.
	BatchSize      int
	BatchingWindow time.Duration
	MaxConcurrency int
	// QueueVisibility is the work queue's visibility timeout (default 5 s),
	// after which a failed batch's messages come back.
	QueueVisibility time.Duration
	// MaxReceiveCount receives move a message to the dead-letter queue
	// (default 5).
	MaxReceiveCount int
	// ReconcilerMemoryMB, when set, runs each reconciler with the CPU
	// Lambda gives a function of that much memory (labstack.LambdaVCPU,
	// through Function.LimitCPU). Unset, the reconcilers share the whole
	// machine, more CPU than a deployed reconciler of less than 1,769 MB
	// has.
	ReconcilerMemoryMB int
}

func (o LabOptions) withDefaults() LabOptions {
	if o.BatchSize == 0 {
		o.BatchSize = esm.MaxBatchSize
	}
	if o.BatchingWindow == 0 {
		o.BatchingWindow = 50 * time.Millisecond
	}
	if o.MaxConcurrency == 0 {
		o.MaxConcurrency = 2
	}
	if o.QueueVisibility == 0 {
		o.QueueVisibility = 5 * time.Second
	}
	if o.MaxReceiveCount == 0 {
		o.MaxReceiveCount = 5
	}
	return o
}

// NewLab creates the ledger table and the work queue and starts each
// bootstrap under the emulator with the stack's environment plus env
// (REAPER_* knobs), with NewLabWith's defaults.
func NewLab(ctx context.Context, stack *labstack.Stack, table string, bootstraps map[string]string, env ...string) (*Lab, error) {
	return NewLabWith(ctx, stack, table, bootstraps, LabOptions{Env: env})
}

// StartLab is how a test suite or a command gets a lab of its own: it
// builds Reaper's functions into a temporary directory, starts a local
// stack with opts and a lab on it with table and env (NewLab). stop stops
// the lab and the stack and removes the build.
func StartLab(ctx context.Context, opts labstack.Options, table string, env ...string) (lab *Lab, stop func(), err error) {
	root, err := ModuleRoot()
	if err != nil {
		return nil, nil, err
	}
	dir, err := os.MkdirTemp("", "reaper-lab-")
	if err != nil {
		return nil, nil, err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	bins, err := Build(ctx, root, filepath.Join(dir, "build"), Functions...)
	if err != nil {
		return nil, nil, err
	}
	stack, err := labstack.Start(ctx, opts)
	if err != nil {
		return nil, nil, err
	}
	if lab, err = NewLab(ctx, stack, table, bins, env...); err != nil {
		stack.Stop()
		return nil, nil, err
	}
	return lab, func() {
		lab.Stop()
		stack.Stop()
		os.RemoveAll(dir)
	}, nil
}

// RunTests is a test package's TestMain around a lab of its own: it starts
// the lab with StartLab within timeout and hands it to tests, which runs the
// package's tests (m.Run) with what else they need around them and returns
// their code. It exits with that code, or with 1 and the error on stderr
// when the lab or what tests sets up fails.
func RunTests(timeout time.Duration, opts labstack.Options, table string, env []string, tests func(context.Context, *Lab) (int, error)) {
	code, err := func() (int, error) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		lab, stop, err := StartLab(ctx, opts, table, env...)
		if err != nil {
			return 0, err
		}
		defer stop()
		return tests(ctx, lab)
	}()
	if err != nil {
		fmt.Fprintln(os.Stderr, "lab:", err)
		code = 1
	}
	os.Exit(code)
}

// NewLabWith is NewLab with options. A reconciler among the bootstraps
// runs in opts.MaxConcurrency environments behind an event source mapping.
func NewLabWith(ctx context.Context, stack *labstack.Stack, table string, bootstraps map[string]string, opts LabOptions) (*Lab, error) {
	opts = opts.withDefaults()
	awsCfg := stack.AWSConfig(ctx)
	db := dynamodb.NewFromConfig(awsCfg)
	if err := ledger.CreateTable(ctx, db, table); err != nil {
		return nil, err
	}
	l := &Lab{
		Stack: stack, Table: table, Ledger: ledger.New(db, table), Functions: map[string]*labstack.Function{},
		Bootstraps: bootstraps,
	}
	identity, err := stack.Kube.CoreV1().Namespaces().Get(ctx, kube.IdentityNamespace, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("read the cluster identity: %w", err)
	}
	l.ClusterUID = string(identity.UID)
	q := sqs.NewFromConfig(awsCfg)
	if l.QueueURL, l.DeadLetterURL, err = createQueues(ctx, q, table+"-work", opts); err != nil {
		return nil, err
	}
	// No power-off grace unless a test sets one (opts.Env comes last and
	// wins): the lab's hosts are the tests' own, and most of them say when
	// the instance goes.
	l.Env = append(append(stack.Env(), "REAPER_TABLE="+table, "REAPER_QUEUE_URL="+l.QueueURL, "REAPER_DEAD_LETTER_QUEUE_URL="+l.DeadLetterURL,
		fmt.Sprintf("REAPER_RECONCILER_CONCURRENCY=%d", opts.MaxConcurrency), "REAPER_POWER_OFF_GRACE=0s"), opts.Env...)
	for name, bin := range bootstraps {
		n := 1
		if name == metrics.FunctionReconciler {
			n = opts.MaxConcurrency
		}
		for range n {
			f, err := labstack.StartFunction(ctx, bin, l.Env)
			if err != nil {
				l.Stop()
				return nil, err
			}
			if name == metrics.FunctionReconciler {
				l.Reconcilers = append(l.Reconcilers, f)
				if opts.ReconcilerMemoryMB > 0 {
					if err := f.LimitCPU(labstack.LambdaVCPU(opts.ReconcilerMemoryMB)); err != nil {
						l.Stop()
						return nil, err
					}
				}
			}
			if l.Functions[name] == nil {
				l.Functions[name] = f
			}
		}
	}
	if len(l.Reconcilers) == 0 {
		return l, nil
	}
	l.idle = make(chan *labstack.Function, len(l.Reconcilers))
	for _, f := range l.Reconcilers {
		l.idle <- f
	}
	l.Mapping, err = esm.New(esm.Config{
		Client: q, QueueURL: l.QueueURL, Invoke: l.invokeReconciler,
		BatchSize: opts.BatchSize, MaximumBatchingWindow: opts.BatchingWindow, MaxConcurrency: opts.MaxConcurrency,
		ReportBatchItemFailures: true,
	})
	if err == nil {
		err = l.Mapping.Start(context.WithoutCancel(ctx))
	}
	if err != nil {
		l.Stop()
		return nil, err
	}
	return l, nil
}

// createQueues creates the work queue and its dead-letter queue, as the
// construct does.
func createQueues(ctx context.Context, q *sqs.Client, name string, opts LabOptions) (queueURL, deadLetterURL string, err error) {
	dead, err := q.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name + "-dead")})
	if err != nil {
		return "", "", fmt.Errorf("create dead-letter queue: %w", err)
	}
	attrs, err := q.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: dead.QueueUrl, AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn}})
	if err != nil {
		return "", "", err
	}
	redrive, err := json.Marshal(map[string]any{"deadLetterTargetArn": attrs.Attributes["QueueArn"], "maxReceiveCount": opts.MaxReceiveCount})
	if err != nil {
		return "", "", err
	}
	work, err := q.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name), Attributes: map[string]string{
		"VisibilityTimeout": fmt.Sprint(int(opts.QueueVisibility.Seconds())),
		"RedrivePolicy":     string(redrive),
	}})
	if err != nil {
		return "", "", fmt.Errorf("create work queue: %w", err)
	}
	return aws.ToString(work.QueueUrl), aws.ToString(dead.QueueUrl), nil
}

// invokeReconciler runs one batch in an idle reconciler environment.
func (l *Lab) invokeReconciler(ctx context.Context, payload []byte) ([]byte, error) {
	var f *labstack.Function
	select {
	case f = <-l.idle:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { l.idle <- f }()
	resp, fnErr, err := f.Invoke(ctx, payload)
	if err == nil && fnErr != nil {
		err = fnErr
	}
	return resp, err
}

// Drain waits until the work queue is empty and no batch is running: the
// effects of every event handed to the functions are then complete. It
// gives up once drainTimeout passes with no batch finished, not while the
// reconcilers keep finishing them (a burst's batches take minutes).
func (l *Lab) Drain(ctx context.Context) error {
	if l.Mapping == nil {
		return nil
	}
	for {
		before := l.Mapping.Stats().Invocations
		wait, cancel := context.WithTimeout(ctx, drainTimeout)
		err := l.Mapping.WaitDrained(wait)
		cancel()
		if err == nil || ctx.Err() != nil || l.Mapping.Stats().Invocations == before {
			return err
		}
	}
}

// drainTimeout bounds a wait for the queue in which no batch finishes:
// longer than a few visibility timeouts, so a batch item failure's
// redelivery is waited for.
const drainTimeout = 2 * time.Minute

// DrainSent waits until every message sent to the work queue up to t has
// left it: its batch has run and succeeded, or it went to the dead-letter
// queue. Unlike Drain it does not wait for work queued later, so tests
// sharing the lab do not wait for each other.
func (l *Lab) DrainSent(ctx context.Context, t time.Time) error {
	if l.Mapping == nil {
		return nil
	}
	name := l.QueueURL[strings.LastIndex(l.QueueURL, "/")+1:]
	ctx, cancel := context.WithTimeout(ctx, drainTimeout)
	defer cancel()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		n, ok := l.Stack.SQS.SentBefore(name, t)
		if !ok {
			return fmt.Errorf("no work queue %s", name)
		}
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d work items sent by %s still queued: %w", n, t.Format(time.StampMicro), ctx.Err())
		case <-tick.C:
		}
	}
}

// Stop stops the mapping and the functions (the stack is the caller's).
func (l *Lab) Stop() {
	if l.Mapping != nil {
		l.Mapping.Stop()
	}
	for _, f := range l.Reconcilers {
		f.Stop()
	}
	for name, f := range l.Functions {
		if name != metrics.FunctionReconciler {
			f.Stop()
		}
	}
}

// Play replays one step: for a state change, the EC2 test server's
// instance first reaches that state (the world changes, then EventBridge
// tells), unless it is already further along its lifecycle.
func (l *Lab) Play(ctx context.Context, st LiveStep, out any) error {
	if st.Function == "statechange" {
		var ev events.CloudWatchEvent
		if err := json.Unmarshal(st.Payload, &ev); err != nil {
			return err
		}
		m, err := statechange.Parse(ev)
		if err != nil {
			return err
		}
		if i, ok := l.Stack.EC2.Instance(m.InstanceID); ok && model.StateRank(m.State) > model.StateRank(string(i.State)) {
			l.Stack.EC2.SetState(m.InstanceID, ec2server.State(m.State))
		}
	}
	return l.Invoke(ctx, st.Function, st.Payload, out)
}

// Invoke sends one event to a function, waits until the work it handed to
// the queue is done (DrainSent), and decodes its response into out (when not
// nil). A function error is returned as *labstack.FunctionError, after
// the drain: what the function queued before it failed is done too.
func (l *Lab) Invoke(ctx context.Context, function string, payload []byte, out any) error {
	err := l.InvokeOnly(ctx, function, payload, out)
	var fnErr *labstack.FunctionError
	if err != nil && !errors.As(err, &fnErr) {
		return err
	}
	if err := l.DrainSent(ctx, time.Now()); err != nil {
		return err
	}
	return err
}

// InvokeOnly is Invoke without the wait: it returns once the function has,
// with its work possibly still on the queue.
func (l *Lab) InvokeOnly(ctx context.Context, function string, payload []byte, out any) error {
	f, ok := l.Functions[function]
	if !ok {
		return fmt.Errorf("function %s is not running", function)
	}
	resp, fnErr, err := f.Invoke(ctx, payload)
	if err != nil {
		return err
	}
	if fnErr != nil {
		return fnErr
	}
	if out != nil {
		if err := json.Unmarshal(resp, out); err != nil {
			return fmt.Errorf("decode %s response %s: %w", function, resp, err)
		}
	}
	return nil
}
