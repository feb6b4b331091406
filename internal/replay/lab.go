// Package replay runs Reaper's functions, built as Lambda bootstraps, under
// the runtime interface emulator against a local stack, and replays recorded
// AWS event payloads through them. The integration tests, `reaper replay` and
// the benchmarks share it.
package replay

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/aws/aws-lambda-go/events"
	"github.com/reaper-k8s/reaper/internal/ec2server"
	"github.com/reaper-k8s/reaper/pkg/statechange"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/reaper-k8s/reaper/internal/localstack"
	"github.com/reaper-k8s/reaper/pkg/ledger"
)

// Functions are Reaper's Lambda functions.
var Functions = []string{"exitrecorder", "statechange", "sweeper"}

// Build compiles the named functions for this machine (the emulator runs
// them natively) the way `make build` does for Lambda, into
// dir/<name>/bootstrap. One go command builds them all, so their shared
// dependencies compile once.
func Build(ctx context.Context, moduleRoot, dir string, names ...string) (map[string]string, error) {
	tmp := filepath.Join(dir, ".out")
	args := []string{"build", "-trimpath", "-tags", "lambda.norpc", "-ldflags=-s -w", "-o", tmp + "/"}
	for _, name := range names {
		args = append(args, "./functions/"+name)
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = moduleRoot
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build functions: %v\n%s", err, b)
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

// Lab is a local stack with a ledger table and Reaper's functions running
// under the emulator.
type Lab struct {
	Stack     *localstack.Stack
	Table     string
	Ledger    *ledger.Table
	Functions map[string]*localstack.Function
	// Bootstraps are the built functions, to start more with other knobs.
	Bootstraps map[string]string
	// Env is what the functions run with.
	Env []string
}

// NewLab creates the ledger table and starts each bootstrap under the
// emulator with the stack's environment plus env (REAPER_* knobs).
func NewLab(ctx context.Context, stack *localstack.Stack, table string, bootstraps map[string]string, env ...string) (*Lab, error) {
	db := dynamodb.NewFromConfig(stack.AWSConfig(ctx))
	if err := ledger.CreateTable(ctx, db, table); err != nil {
		return nil, err
	}
	l := &Lab{
		Stack: stack, Table: table, Ledger: ledger.New(db, table), Functions: map[string]*localstack.Function{},
		Bootstraps: bootstraps, Env: append(append(stack.Env(), "REAPER_TABLE="+table), env...),
	}
	for name, bin := range bootstraps {
		f, err := localstack.StartFunction(ctx, bin, l.Env)
		if err != nil {
			l.Stop()
			return nil, err
		}
		l.Functions[name] = f
	}
	return l, nil
}

// Stop stops the functions (the stack is the caller's).
func (l *Lab) Stop() {
	for _, f := range l.Functions {
		f.Stop()
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
		if i, ok := l.Stack.EC2.Instance(m.InstanceID); ok && statechange.Rank(m.State) > statechange.Rank(string(i.State)) {
			l.Stack.EC2.SetState(m.InstanceID, ec2server.State(m.State))
		}
	}
	return l.Invoke(ctx, st.Function, st.Payload, out)
}

// Invoke sends one event to a function and decodes its response into out
// (when not nil). A function error is returned as *localstack.FunctionError.
func (l *Lab) Invoke(ctx context.Context, function string, payload []byte, out any) error {
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
