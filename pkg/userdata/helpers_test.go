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
		rd := filepath.Join(h.fake, fmt.Sprintf("run%d", i+1))
		set := func(k, v string) { writeFile(t, filepath.Join(rd, k), v) }
		set("exit", fmt.Sprint(r.Exit))
		set("oom", fmt.Sprint(r.OOM))
		if r.Started != "" {
			set("started", r.Started)
		}
		if r.Finished != "" {
			set("finished", r.Finished)
		}
		if r.Outage > 0 {
			set("outage", fmt.Sprint(r.Outage))
		}
		if r.Live {
			set("live", "1")
		}
		if r.StartError != "" {
			set("start_error", r.StartError)
		}
		if r.RunFail != "" {
			set("run_fail", r.RunFail)
		}
		if r.ClientFail {
			set("client_fail", "1")
		}
		if r.Vanish {
			set("vanish", "1")
		}
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
	script := filepath.Join(h.dir, "reaper-wrapper")
	writeFile(h.t, script, wrapper)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, shell, "-u", script, h.conf)
	cmd.Env = h.env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	h.stderr = stderr.String()
	if ctx.Err() != nil {
		h.t.Fatalf("wrapper did not finish in time; stderr:\n%s", h.stderr)
	}
	h.status = cmd.ProcessState.ExitCode()
	if err != nil && h.status < 0 {
		h.t.Fatalf("wrapper: %v", err)
	}
	if m := shellTrouble.FindString(h.stderr); m != "" {
		h.t.Errorf("wrapper stderr has %q:\n%s", m, h.stderr)
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
