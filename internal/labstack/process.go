package labstack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// setupHint is appended to every "binary not found" error: hack/setup.sh
// builds or installs everything and prints the REAPER_* variables.
const setupHint = `run: eval "$(hack/setup.sh)"`

// binary returns the path in the environment variable name, checking that
// it exists: a missing tool must fail loudly, never skip a test.
func binary(name string) (string, error) {
	path := os.Getenv(name)
	if path == "" {
		return "", fmt.Errorf("%s is not set; %s", name, setupHint)
	}
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("%s=%s: %v; %s", name, path, err, setupHint)
	}
	return path, nil
}

// process is one child process whose output goes to a log file.
type process struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{} // closed once the process has exited
	waitErr error         // valid after done is closed
}

// launch starts bin in dir with stdout and stderr appended to dir/<name>.log
// (appending keeps the history of a restarted process in one file).
func launch(name, dir string, env []string, bin string, args ...string) (*process, error) {
	logPath := filepath.Join(dir, name+".log")
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer log.Close() // the child has its own copy of the descriptor

	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, logPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop kills the process group and waits for the process to be reaped. It
// is safe on a nil or already stopped process.
func (p *process) stop() {
	if p == nil || p.exited() {
		return
	}
	// Negative pid: the whole group, so helpers a child forked die with it.
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// tail returns the last n lines of the log.
func (p *process) tail(n int) string {
	return tailFile(p.logPath, n)
}

func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// errPortInUse marks a start that lost the race for a port: ports are picked
// by binding :0 and releasing it, so another process may grab one before the
// child binds it. The caller retries with fresh ports.
var errPortInUse = errors.New("port already in use")

// waitReady polls probe until it succeeds, the process exits, or timeout.
// Errors name the log file and include its tail.
func (p *process) waitReady(ctx context.Context, timeout time.Duration, probe func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		if p.exited() {
			log := p.tail(40)
			err := fmt.Errorf("%s exited (%v) before it was ready; log %s:\n%s", p.name, p.waitErr, p.logPath, log)
			if strings.Contains(log, "address already in use") || strings.Contains(log, "EADDRINUSE") {
				err = fmt.Errorf("%w: %w", errPortInUse, err)
			}
			return err
		}
		probeCtx, cancelProbe := context.WithTimeout(ctx, time.Second)
		last = probe(probeCtx)
		cancelProbe()
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			p.stop()
			return fmt.Errorf("%s not ready after %v (last probe: %v); log %s:\n%s", p.name, timeout, last, p.logPath, p.tail(40))
		case <-tick.C:
		}
	}
}

// retryPorts runs start, which picks its own ports, until it does not lose
// a port race; three attempts are plenty in practice.
func retryPorts(start func() error) error {
	var err error
	for range 3 {
		if err = start(); !errors.Is(err, errPortInUse) {
			return err
		}
	}
	return err
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func hostPort(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

// dialProbe succeeds once something accepts TCP connections on addr.
func dialProbe(addr string) func(context.Context) error {
	return func(ctx context.Context) error {
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		return c.Close()
	}
}

// killGroups kills the process groups led by pids.
func killGroups(pids []int) {
	for _, pid := range pids {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
}
