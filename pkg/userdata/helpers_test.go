package userdata

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/reaper-k8s/reaper/pkg/exitline"
)

// binDir holds the test doubles (docker, sleep, shutdown, systemctl,
// amazon-cloudwatch-agent-ctl) that go first on PATH.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "reaper-userdata-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ents, err := os.ReadDir("testdata/doubles")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("testdata/doubles", e.Name()))
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, e.Name()), b, 0o755)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// shellcheckBin finds shellcheck: $REAPER_SHELLCHECK, else PATH. Never skips.
func shellcheckBin(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("REAPER_SHELLCHECK"); p != "" {
		return p
	}
	p, err := exec.LookPath("shellcheck")
	if err != nil {
		t.Fatal(`shellcheck not found: run eval "$(hack/setup.sh)" (installs it and exports REAPER_SHELLCHECK)`)
	}
	return p
}

// shellcheck lints scripts (name -> text) as the given shell, in one run.
func shellcheck(t *testing.T, shell string, scripts map[string]string) {
	t.Helper()
	dir := t.TempDir()
	args := []string{"-s", shell}
	names := make([]string, 0, len(scripts))
	for n := range scripts {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		p := filepath.Join(dir, n)
		if err := os.WriteFile(p, []byte(scripts[n]), 0o644); err != nil {
			t.Fatal(err)
		}
		args = append(args, p)
	}
	out, err := exec.Command(shellcheckBin(t), args...).CombinedOutput()
	if err != nil {
		t.Errorf("shellcheck -s %s found problems (%v):\n%s", shell, err, out)
	}
}

const testInstanceID = "i-0123456789abcdef0"

// imdsServer is an IMDSv2 stand-in: a PUT for a token, then the instance id
// only with that token.
func imdsServer(t *testing.T) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodPut && r.URL.Path == "/latest/api/token":
			if r.Header.Get("X-aws-ec2-metadata-token-ttl-seconds") == "" {
				http.Error(w, "missing ttl", http.StatusBadRequest)
				return
			}
			fmt.Fprint(w, "tok-123")
		case r.Method == http.MethodGet && r.URL.Path == "/latest/meta-data/instance-id":
			if r.Header.Get("X-aws-ec2-metadata-token") != "tok-123" {
				http.Error(w, "unauthorized", http.StatusUnauthorized)
				return
			}
			fmt.Fprint(w, testInstanceID)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// fakeRun is what the docker double does on one "docker run".
type fakeRun struct {
	Exit              int
	OOM               bool
	Started, Finished string
	Outage            int  // the wait fails and dockerd is away for this many calls
	Live              bool // after the outage the container is still running (live-restore)
	StartError        string
	RunFail           string
	ClientFail        bool // docker run errors out although the container started
	Vanish            bool
	// Kill is where the docker double SIGKILLs the wrapper's process group,
	// the first time only: "wait" (the container runs), "rm-before" (the
	// container's line is written, the container not yet removed) or
	// "rm-after" (removed, and nothing done after that).
	Kill string
	// ExitedMeanwhile: the container ends while the wrapper killed at
	// "wait" is away.
	ExitedMeanwhile bool
	// Message is what the container writes to its termination message
	// file (MessagePath, default /dev/termination-log); Logs its log.
	Message, MessagePath, Logs string
	// UntilStop: the container runs until docker stop, and then exits
	// with StopExit (default 143).
	UntilStop bool
	StopExit  int
	// After: the container runs until the one of this name is created.
	After string
}

// writeRun writes the docker double's settings of one run into dir.
func writeRun(t *testing.T, dir string, r fakeRun) {
	t.Helper()
	set := func(k, v string) { writeFile(t, filepath.Join(dir, k), v) }
	set("exit", fmt.Sprint(r.Exit))
	set("oom", fmt.Sprint(r.OOM))
	for k, v := range map[string]string{"started": r.Started, "finished": r.Finished, "start_error": r.StartError,
		"run_fail": r.RunFail, "kill": r.Kill, "message": r.Message, "message_path": r.MessagePath, "logs": r.Logs, "after": r.After} {
		if v != "" {
			set(k, v)
		}
	}
	for k, v := range map[string]bool{"live": r.Live, "client_fail": r.ClientFail, "vanish": r.Vanish,
		"exited_meanwhile": r.ExitedMeanwhile, "until_stop": r.UntilStop} {
		if v {
			set(k, "1")
		}
	}
	if r.Outage > 0 {
		set("outage", fmt.Sprint(r.Outage))
	}
	if r.StopExit != 0 {
		set("stop_exit", fmt.Sprint(r.StopExit))
	}
}

// named gives the run of the container named name (reaper-<container>-<n>)
// its settings, whatever its run number: containers that run in parallel
// start in no fixed order.
func (h *harness) named(name string, r fakeRun) {
	h.t.Helper()
	writeRun(h.t, filepath.Join(h.fake, name), r)
}

// cidOf is the id the docker double gave the container named name.
func (h *harness) cidOf(name string) string {
	h.t.Helper()
	b, err := os.ReadFile(filepath.Join(h.fake, "n", name))
	if err != nil {
		h.t.Fatalf("no container %s: %v", name, err)
	}
	return strings.TrimSpace(string(b))
}

func writeFile(t *testing.T, path, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

// harness runs the rendered wrapper for real against the doubles.
type harness struct {
	t                            *testing.T
	dir, fake, state, conf, exit string
	agentState                   string // the agent's state file for the exit log
	env                          []string
	stderr                       string
	status                       int
	noInstanceID                 bool // IMDS is down on purpose: lines lack the instance id
}

// agentStateName is the name the CloudWatch agent gives the state file of
// the log file at path.
func agentStateName(path string) string {
	return strings.NewReplacer("/", "_", " ", "_", ":", "_").Replace(path)
}

func newHarness(t *testing.T, pod Pod, opts Options, runs ...fakeRun) *harness {
	t.Helper()
	dir := t.TempDir()
	h := &harness{t: t, dir: dir, fake: filepath.Join(dir, "fake"), state: filepath.Join(dir, "state"),
		conf: filepath.Join(dir, "workload.conf"), exit: filepath.Join(dir, "log", "exit.log")}
	if opts.ExitLogPath == "" {
		opts.ExitLogPath = h.exit
	}
	h.exit = opts.ExitLogPath
	agentDir := filepath.Join(dir, "agent-state")
	h.agentState = filepath.Join(agentDir, agentStateName(h.exit))
	if err := os.MkdirAll(agentDir, 0o755); err != nil {
		t.Fatal(err)
	}
	// By default the agent ships every line while the wrapper sleeps.
	writeFile(t, filepath.Join(h.fake, "agent", "ship"), "")
	conf, err := WrapperConfig(pod, opts)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, h.conf, conf)
	writeFile(t, filepath.Join(h.fake, "events"), "")
	for i, r := range runs {
		writeRun(t, filepath.Join(h.fake, fmt.Sprintf("run%d", i+1)), r)
	}
	h.env = []string{
		"PATH=" + binDir + string(os.PathListSeparator) + os.Getenv("PATH"),
		"FAKE_DIR=" + h.fake,
		"REAPER_STATE_DIR=" + h.state,
		"REAPER_IMDS_URL=" + imdsServer(t).URL,
		"REAPER_INSTANCE_ID_FILE=" + filepath.Join(dir, "cloud-instance-id"),
		"REAPER_TIME_SCALE=1000",
		"REAPER_AGENT_STATE_DIR=" + agentDir,
		"FAKE_AGENT_STATE=" + h.agentState,
		"FAKE_EXIT_LOG=" + h.exit,
		"LC_ALL=C",
	}
	return h
}

// agentQuiet stops the agent double from shipping every line: it saves
// only what agentSaves scripts.
func (h *harness) agentQuiet() {
	h.t.Helper()
	if err := os.Remove(filepath.Join(h.fake, "agent", "ship")); err != nil {
		h.t.Fatal(err)
	}
}

// agentSaves makes the agent double save state on the sleep double's
// call-th call (1-based), with {size} and {size-1} standing for the exit
// log's size at that moment and one less.
func (h *harness) agentSaves(call int, state string) {
	h.t.Helper()
	writeFile(h.t, filepath.Join(h.fake, "agent", fmt.Sprint(call)), state)
}

// saved is the agent's state for the exit log at offset off (a number or
// {size}): the offset, the path, the byte range, no trailing newline.
func (h *harness) saved(off string) string { return off + "\n" + h.exit + "\n0-" + off }

// exitSize is the exit log's size in bytes.
func (h *harness) exitSize() int {
	h.t.Helper()
	fi, err := os.Stat(h.exit)
	if err != nil {
		h.t.Fatal(err)
	}
	return int(fi.Size())
}

func (h *harness) setenv(kv ...string) { h.env = append(h.env, kv...) }

// shells are the POSIX shells the wrapper is run with: sh (dash on Debian,
// bash on Amazon Linux), and bash when it is installed.
func shells(t *testing.T) []string {
	out := []string{"sh"}
	if p, err := exec.LookPath("bash"); err == nil {
		out = append(out, p)
	}
	return out
}

// run starts the wrapper with shell (-u: an unset variable is a bug) and
// waits for it to exit.
func (h *harness) run(shell string, wrapper string) {
	h.t.Helper()
	if sig := h.start(shell, wrapper); sig != 0 {
		h.t.Fatalf("wrapper killed by %v; stderr:\n%s", sig, h.stderr)
	}
}

// wrapperTimeout bounds one run of the wrapper. The machine running the
// tests may be busy: a crash loop forks a few hundred processes.
const wrapperTimeout = 60 * time.Second

// start runs the wrapper once, in a process group of its own as systemd
// runs it in a cgroup of its own, and returns the signal that killed it (0
// when it exited). The doubles may kill the whole group with SIGKILL, as
// the OOM killer and then systemd do. stderr accumulates over the starts.
func (h *harness) start(shell string, wrapper string) syscall.Signal {
	h.t.Helper()
	script := filepath.Join(h.dir, "reaper-wrapper")
	writeFile(h.t, script, wrapper)
	ctx, cancel := context.WithTimeout(context.Background(), wrapperTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, shell, "-u", script, h.conf)
	cmd.Env = append(append([]string{}, h.env...), "FAKE_OWN_PGRP=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	h.stderr += stderr.String()
	if ctx.Err() != nil {
		h.t.Fatalf("wrapper did not finish in time; stderr:\n%s", h.stderr)
	}
	if m := shellTrouble.FindString(stderr.String()); m != "" {
		h.t.Errorf("wrapper stderr has %q:\n%s", m, h.stderr)
	}
	h.status = cmd.ProcessState.ExitCode()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return ws.Signal()
	}
	if err != nil && h.status < 0 {
		h.t.Fatalf("wrapper: %v", err)
	}
	return 0
}

// runUnit runs the wrapper as systemd runs the unit that opts render: once,
// and again each time the unit's Restart= setting restarts it (recorded as
// "systemd restart" in the events), at most maxStarts times in all. It
// returns how many times the wrapper started.
func (h *harness) runUnit(shell, wrapper string, opts Options, maxStarts int) int {
	h.t.Helper()
	u, err := Unit(opts)
	if err != nil {
		h.t.Fatal(err)
	}
	svc := unitSettings(h.t, u, "Service")
	if got, want := svc["ExecStart"], WrapperPath+" "+ConfigPath; got != want {
		h.t.Fatalf("unit ExecStart=%q, want %q", got, want)
	}
	for n := 1; ; n++ {
		sig := h.start(shell, wrapper)
		if !systemdRestarts(h.t, svc["Restart"], h.status, sig) {
			return n
		}
		if n == maxStarts {
			h.t.Fatalf("wrapper started %d times; stderr:\n%s", n, h.stderr)
		}
		appendFile(h.t, filepath.Join(h.fake, "events"), fmt.Sprintf("systemd restart after %ss (%v)\n", svc["RestartSec"], sig))
	}
}

// unitSettings returns the settings of one section of a systemd unit.
func unitSettings(t *testing.T, unit, section string) map[string]string {
	t.Helper()
	out := map[string]string{}
	in := false
	for _, l := range strings.Split(unit, "\n") {
		switch {
		case strings.HasPrefix(l, "["):
			in = l == "["+section+"]"
		case in && l != "" && !strings.HasPrefix(l, "#"):
			k, v, ok := strings.Cut(l, "=")
			if !ok {
				t.Fatalf("unit line %q is not KEY=VALUE", l)
			}
			out[k] = v
		}
	}
	return out
}

// systemdRestarts tells whether systemd restarts a service whose main
// process ended with status, or was killed by sig, under the Restart=
// setting restart (systemd.service(5), "Exit causes"). SIGHUP, SIGINT,
// SIGTERM and SIGPIPE are clean signals.
func systemdRestarts(t *testing.T, restart string, status int, sig syscall.Signal) bool {
	t.Helper()
	cleanSig := sig == syscall.SIGHUP || sig == syscall.SIGINT || sig == syscall.SIGTERM || sig == syscall.SIGPIPE
	clean := (sig == 0 && status == 0) || cleanSig
	switch restart {
	case "", "no":
		return false
	case "always":
		return true
	case "on-success":
		return clean
	case "on-failure":
		return !clean
	case "on-abnormal", "on-abort":
		return sig != 0 && !cleanSig
	}
	t.Fatalf("unit has Restart=%s, which this test does not know", restart)
	return false
}

func appendFile(t *testing.T, path, s string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
	if err == nil {
		_, err = f.WriteString(s)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		t.Fatal(err)
	}
}

// lines returns the exit lines, each checked against exit line v1.
func (h *harness) lines() []map[string]any {
	h.t.Helper()
	b, err := os.ReadFile(h.exit)
	if err != nil {
		h.t.Fatalf("exit log: %v\nstderr:\n%s", err, h.stderr)
	}
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		if l == "" {
			continue
		}
		d := json.NewDecoder(strings.NewReader(l))
		d.UseNumber()
		var m map[string]any
		if err := d.Decode(&m); err != nil {
			h.t.Fatalf("exit line is not JSON: %v\n%s", err, l)
		}
		if !h.noInstanceID {
			checkContract(h.t, l)
		}
		out = append(out, m)
	}
	return out
}

// shellTrouble matches what a shell or the doubles print on a script bug.
var shellTrouble = regexp.MustCompile(`parameter not set|unbound variable|exiting unexpectedly|syntax error|command not found|: [0-9]+: [^:\n]*: not found|double: .*`)

// checkContract feeds an exit line to Reaper's own parser, the one the
// exitrecorder runs on it: the wrapper's lines must be exit line v1 as
// Reaper reads it, within every input limit.
func checkContract(t *testing.T, raw string) {
	t.Helper()
	if _, err := exitline.Parse([]byte(raw)); err != nil {
		t.Errorf("the exitrecorder would reject the line: %v\n%s", err, raw)
	}
}

// events returns the calls recorded by the doubles, optionally only those
// starting with one of prefixes.
func (h *harness) events(prefixes ...string) []string {
	h.t.Helper()
	b, err := os.ReadFile(filepath.Join(h.fake, "events"))
	if err != nil {
		h.t.Fatal(err)
	}
	var out []string
	for _, e := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		keep := len(prefixes) == 0
		for _, p := range prefixes {
			keep = keep || strings.HasPrefix(e, p)
		}
		if keep && e != "" {
			out = append(out, e)
		}
	}
	return out
}

// argv returns the arguments of the n-th docker run (1-based).
func (h *harness) argv(n int) []string {
	h.t.Helper()
	b, err := os.ReadFile(filepath.Join(h.fake, fmt.Sprintf("run%d.argv", n)))
	if err != nil {
		h.t.Fatal(err)
	}
	return strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
}

// line describes an expected exit line; anyTime/anyError accept values the
// wrapper takes from its own clock or from docker's words.
type line struct {
	run               int // the docker run it reports (container id), 0: none
	code, restart     int
	oom, will, rr     bool
	signal            string
	backoff           int
	err               string // substring
	started, finished string // "" = the double's defaults; "now" = the wrapper's clock
	token             string // "": the line carries none
}

const (
	defStarted  = "2030-01-01T00:00:00.123456789Z"
	defFinished = "2030-01-01T00:00:05.987654321Z"
	zeroTime    = "0001-01-01T00:00:00Z"
)

func fakeCID(run int) string { return fmt.Sprintf("c0ffee%058d", run) }

func checkLines(t *testing.T, pod Pod, got []map[string]any, want []line) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d exit lines, want %d:\n%v", len(got), len(want), got)
	}
	for i, w := range want {
		g := got[i]
		cid := ""
		if w.run > 0 {
			cid = fakeCID(w.run)
		}
		exp := map[string]any{
			"reaper": "container-exit", "v": json.Number("1"), "instanceId": testInstanceID,
			"podNamespace": pod.Namespace, "podName": pod.Name, "podUID": pod.UID, "container": pod.Container,
			"containerId": cid, "exitCode": json.Number(fmt.Sprint(w.code)), "oomKilled": w.oom,
			"startedAt": or(w.started, defStarted), "finishedAt": or(w.finished, defFinished),
			"restartCount": json.Number(fmt.Sprint(w.restart)), "willRestart": w.will, "runtimeRestarted": w.rr,
		}
		if w.signal != "" {
			exp["signal"] = w.signal
		}
		if w.backoff != 0 {
			exp["backoffSeconds"] = json.Number(fmt.Sprint(w.backoff))
		}
		if w.err != "" {
			exp["error"] = w.err
		}
		if w.token != "" {
			exp["token"] = w.token
		}
		for k, v := range exp {
			gv, ok := g[k]
			switch {
			case !ok:
				t.Errorf("line %d: missing %q", i, k)
			case k == "error":
				if s, _ := gv.(string); !strings.Contains(s, v.(string)) {
					t.Errorf("line %d: error = %q, want it to contain %q", i, gv, v)
				}
			case v == "now":
				ts, err := time.Parse(time.RFC3339Nano, fmt.Sprint(gv))
				if err != nil || time.Since(ts) > time.Minute || time.Since(ts) < -time.Minute {
					t.Errorf("line %d: %s = %v, want the current time", i, k, gv)
				}
			case gv != v:
				t.Errorf("line %d: %s = %#v, want %#v", i, k, gv, v)
			}
		}
		for k := range g {
			if _, ok := exp[k]; !ok {
				t.Errorf("line %d: unexpected field %q = %v", i, k, g[k])
			}
		}
	}
}

func or(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func equalStrings(t *testing.T, what string, got, want []string) {
	t.Helper()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("%s:\n got: %q\nwant: %q", what, got, want)
	}
}
