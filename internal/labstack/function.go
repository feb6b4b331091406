package labstack

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Function is a Lambda bootstrap running under the runtime interface
// emulator (aws-lambda-rie).
type Function struct {
	// Name is AWS_LAMBDA_FUNCTION_NAME as the function sees it.
	Name string
	// URL is the emulator's base URL.
	URL string

	proc    *process
	dir     string
	invoke  sync.Mutex // the emulator serves one invocation at a time
	stopped sync.Once

	mu   sync.Mutex
	logs *string // snapshot taken by Stop, before the log file goes away
	// cgroup is the CPU cgroup LimitCPU made, removed by Stop.
	cgroup string
}

// lambdaMBPerVCPU is the memory at which Lambda gives a function the
// equivalent of one vCPU; it allocates CPU in proportion to memory
// (Lambda developer guide, "Configure Lambda function memory").
const lambdaMBPerVCPU = 1769

// LambdaVCPU is the CPU share, in vCPUs, Lambda gives a function with
// memoryMB of memory: what LimitCPU gives a lab function to run it as
// Lambda would.
func LambdaVCPU(memoryMB int) float64 { return float64(memoryMB) / lambdaMBPerVCPU }

// FunctionError is an error the function returned (or a crash or timeout
// of it), which Lambda reports as a function error rather than an API error.
type FunctionError struct {
	Type       string          `json:"errorType"`
	Message    string          `json:"errorMessage"`
	StackTrace json.RawMessage `json:"stackTrace,omitempty"`
}

func (e *FunctionError) Error() string { return e.Type + ": " + e.Message }

// StartFunction runs bootstrapPath under $REAPER_RIE on a free loopback port
// with env (typically Stack.Env() plus REAPER_* settings) and waits until
// the emulator accepts connections. On error the working directory, with
// the log the error points at, is kept.
//
// The function sees only env plus PATH, HOME (a fresh directory, so no
// ~/.aws files are read) and AWS_LAMBDA_FUNCTION_NAME (default: the name
// of the bootstrap's directory, e.g. "exitrecorder" for
// build/exitrecorder/bootstrap); env wins on conflicts. The emulator starts
// the bootstrap lazily, on the first Invoke, as Lambda does on a cold start.
func StartFunction(ctx context.Context, bootstrapPath string, env []string) (*Function, error) {
	rie, err := binary("REAPER_RIE")
	if err != nil {
		return nil, fmt.Errorf("labstack: %w", err)
	}
	bootstrap, err := filepath.Abs(bootstrapPath)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(bootstrap); err != nil {
		return nil, fmt.Errorf("labstack: bootstrap: %w (build it with `make build GOARCH=amd64`?)", err)
	}
	dir, err := os.MkdirTemp("", "reaper-function-")
	if err != nil {
		return nil, err
	}
	f := &Function{Name: filepath.Base(filepath.Dir(bootstrap)), dir: dir}
	fullEnv := append([]string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + dir,
		"AWS_LAMBDA_FUNCTION_NAME=" + f.Name,
	}, env...)
	for _, kv := range fullEnv {
		if v, ok := strings.CutPrefix(kv, "AWS_LAMBDA_FUNCTION_NAME="); ok {
			f.Name = v // the last one wins, as in exec
		}
	}

	err = retryPorts(func() error {
		// The runtime API port must be chosen too: the emulator's default,
		// 9001, would collide between two functions running at once.
		apiPort, err := freePort()
		if err != nil {
			return err
		}
		port, err := freePort()
		if err != nil {
			return err
		}
		p, err := launch("function", dir, fullEnv, rie,
			"--runtime-interface-emulator-address", hostPort(port),
			"--runtime-api-address", hostPort(apiPort),
			bootstrap)
		if err != nil {
			return err
		}
		f.proc, f.URL = p, "http://"+hostPort(port)
		return p.waitReady(ctx, 30*time.Second, dialProbe(hostPort(port)))
	})
	if err != nil {
		f.kill()
		return nil, fmt.Errorf("labstack: function %s: %w", f.Name, err)
	}
	return f, nil
}

// Invoke sends payload as a synchronous invocation and returns the
// function's response. The emulator sets no X-Amz-Function-Error header:
// a returned error comes back as HTTP 200 with an
// {"errorType","errorMessage"} body, a crash (panic, exit) as HTTP 502 with
// the same shape, a timeout (AWS_LAMBDA_FUNCTION_TIMEOUT, default 300 s) as
// plain text. Invoke reports all three as functionErr, with response
// holding the raw body; err is for failures to invoke at all. Concurrent
// calls are served one at a time.
func (f *Function) Invoke(ctx context.Context, payload []byte) (response []byte, functionErr *FunctionError, err error) {
	f.invoke.Lock()
	defer f.invoke.Unlock()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost,
		f.URL+"/2015-03-31/functions/function/invocations", bytes.NewReader(payload))
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, fmt.Errorf("invoke %s: %w", f.Name, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, nil, fmt.Errorf("invoke %s: %w", f.Name, err)
	}
	if fe := parseFunctionError(body); fe != nil {
		return body, fe, nil
	}
	if resp.StatusCode != http.StatusOK {
		return body, nil, fmt.Errorf("invoke %s: HTTP %d: %s\nlog %s:\n%s",
			f.Name, resp.StatusCode, body, f.proc.logPath, f.proc.tail(20))
	}
	return body, nil, nil
}

// parseFunctionError recognises the error shapes the emulator passes on.
func parseFunctionError(body []byte) *FunctionError {
	// The emulator answers a timeout with plain text, not JSON.
	if msg := string(body); strings.HasPrefix(msg, "Task timed out after") {
		return &FunctionError{Type: "Sandbox.Timedout", Message: msg}
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(body, &fields) != nil {
		return nil
	}
	_, hasType := fields["errorType"]
	_, hasMessage := fields["errorMessage"]
	if !hasType || !hasMessage {
		return nil
	}
	var fe FunctionError
	if json.Unmarshal(body, &fe) != nil {
		return nil
	}
	return &fe
}

// Logs returns everything the emulator and the function wrote so far:
// the function's stdout/stderr (its slog lines) and the emulator's
// START/END/REPORT lines. It still works after Stop.
func (f *Function) Logs() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.logs != nil {
		return *f.logs
	}
	if f.proc == nil {
		return ""
	}
	b, _ := os.ReadFile(f.proc.logPath)
	return string(b)
}

var initReportRE = regexp.MustCompile(`INIT REPORT\(durationMs: ([0-9.]+)\)`)

// InitDurations lists how long each cold start of the bootstrap took (from
// exec until it asked for its first event), as the emulator reports it.
// There is one per start: the first invocation, and the one after each
// crash.
func (f *Function) InitDurations() []time.Duration {
	var out []time.Duration
	for _, m := range initReportRE.FindAllStringSubmatch(f.Logs(), -1) {
		if ms, err := strconv.ParseFloat(m[1], 64); err == nil {
			out = append(out, time.Duration(ms*float64(time.Millisecond)))
		}
	}
	return out
}

// PID is the emulator's process id; the bootstrap runs as its child
// (ChildPIDs), once the first Invoke has started it.
func (f *Function) PID() int { return f.proc.cmd.Process.Pid }

// Stop kills the emulator and the bootstrap and removes the working
// directory. Logs stay readable. It is idempotent.
func (f *Function) Stop() {
	f.stopped.Do(func() {
		f.kill()
		f.removeCgroup()
		logs := f.Logs()
		f.mu.Lock()
		f.logs = &logs
		f.mu.Unlock()
		os.RemoveAll(f.dir)
	})
}

func (f *Function) kill() {
	if f.proc == nil {
		return
	}
	// The emulator starts the bootstrap in a process group of its own, so
	// killing the emulator's group does not reach it: find it among the
	// emulator's children first.
	children := ChildPIDs(f.proc.cmd.Process.Pid)
	f.proc.stop()
	killGroups(children)
}
