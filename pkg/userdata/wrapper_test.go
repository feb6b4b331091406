package userdata

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reaper-k8s/reaper/pkg/exitline"
	"github.com/reaper-k8s/reaper/pkg/model"
)

// The wrapper is run for real (sh -u, and bash) against the docker double,
// with REAPER_TIME_SCALE=1000: a 10 s backoff is recorded as "sleep 0.01",
// the 600 s shutdown delay as "sleep 0.6", a 1 s poll as "sleep 0.001".

func jobPod(policy string) Pod {
	return Pod{
		Namespace: "batch", Name: "installer-7xk2p", UID: "6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b",
		Container: "main", Image: "registry.example.com/tools/installer:1.4",
		Command: []string{"/bin/install"}, Args: []string{"--all"},
		Env:           []EnvVar{{"MODE", "full"}},
		RestartPolicy: policy,
	}
}

const jobImage = "registry.example.com/tools/installer:1.4"

// eachShell runs body once per shell, in parallel subtests.
func eachShell(t *testing.T, body func(t *testing.T, shell string)) {
	t.Parallel()
	for _, sh := range shells(t) {
		t.Run(filepath.Base(sh), func(t *testing.T) {
			t.Parallel()
			body(t, sh)
		})
	}
}

// After a final line the agent double ships it within the wrapper's first
// 1 s poll; without a line (already terminal, bad configuration) the wrapper
// waits the delay.
var (
	shippedNow = []string{"sleep 0.001", "shutdown -P now"}
	afterDelay = []string{"sleep 0.6", "shutdown -P now"}
)

func TestWrapperExit0(t *testing.T) {
	eachShell(t, func(t *testing.T, sh string) {
		pod := jobPod(RestartNever)
		h := newHarness(t, pod, Options{}, fakeRun{Exit: 0})
		h.run(sh, Wrapper())
		checkLines(t, pod, h.lines(), []line{{run: 1, code: 0}})
		equalStrings(t, "calls", h.events(), []string{
			"docker info",
			"docker inspect reaper-main-0",
			"docker image inspect " + jobImage,
			"docker run reaper-main-0",
			"docker wait " + fakeCID(1),
			"docker inspect " + fakeCID(1),
			"sleep 0.001",
			"shutdown -P now",
		})
		runArgs, _ := RunArgs(pod, Options{})
		equalStrings(t, "docker run argv", h.argv(1), append([]string{"-d", "--name", "reaper-main-0"}, runArgs...))
		if h.status != 0 {
			t.Errorf("wrapper exit status %d, want 0", h.status)
		}
	})
}

func TestWrapperExit1Never(t *testing.T) {
	eachShell(t, func(t *testing.T, sh string) {
		pod := jobPod(RestartNever)
		h := newHarness(t, pod, Options{}, fakeRun{Exit: 1})
		h.run(sh, Wrapper())
		checkLines(t, pod, h.lines(), []line{{run: 1, code: 1}})
		equalStrings(t, "calls", h.events("docker run", "docker rm", "sleep", "shutdown"),
			[]string{"docker run reaper-main-0", "sleep 0.001", "shutdown -P now"})
	})
}

func TestWrapperOOM(t *testing.T) {
	eachShell(t, func(t *testing.T, sh string) {
		pod := jobPod(RestartNever)
		h := newHarness(t, pod, Options{}, fakeRun{Exit: 137, OOM: true})
		h.run(sh, Wrapper())
		checkLines(t, pod, h.lines(), []line{{run: 1, code: 137, oom: true, signal: "SIGKILL"}})
		equalStrings(t, "calls", h.events("sleep", "shutdown"), shippedNow)
	})
}

// The installer case: the runtime restarts under the workload (no
// live-restore, so the container finished while dockerd was away). The line
// carries what the workload did, not a synthetic 255.
func TestWrapperRuntimeRestart(t *testing.T) {
	eachShell(t, func(t *testing.T, sh string) {
		pod := jobPod(RestartOnFailure)
		h := newHarness(t, pod, Options{}, fakeRun{Exit: 0, Outage: 3})
		h.run(sh, Wrapper())
		checkLines(t, pod, h.lines(), []line{{run: 1, code: 0, rr: true}})
		c := fakeCID(1)
		equalStrings(t, "calls", h.events("docker wait", "docker info", "docker inspect c", "sleep", "shutdown"), []string{
			"docker info",
			"docker wait " + c,
			"sleep 0.001",
			"docker info (down)", "sleep 0.001",
			"docker info (down)", "sleep 0.001",
			"docker info (down)", "sleep 0.001",
			"docker info",
			"docker inspect " + c,
			"sleep 0.001", "shutdown -P now",
		})
	})
}

// With live-restore the container outlives dockerd's restart: the wrapper
// waits on it again.
func TestWrapperRuntimeRestartLiveRestore(t *testing.T) {
	eachShell(t, func(t *testing.T, sh string) {
		pod := jobPod(RestartNever)
		h := newHarness(t, pod, Options{}, fakeRun{Exit: 0, Outage: 1, Live: true})
		h.run(sh, Wrapper())
		checkLines(t, pod, h.lines(), []line{{run: 1, code: 0, rr: true}})
		c := fakeCID(1)
		equalStrings(t, "calls", h.events("docker wait", "docker inspect c", "docker info"), []string{
			"docker info",
			"docker wait " + c, "docker info (down)", "docker info",
			"docker inspect " + c, // still running
			"docker wait " + c,
			"docker inspect " + c,
		})
	})
}

// The runtime never comes back: the outcome is unknown, said so, and the
// host still goes away.
func TestWrapperRuntimeGone(t *testing.T) {
	eachShell(t, func(t *testing.T, sh string) {
		pod := jobPod(RestartAlways)
		h := newHarness(t, pod, Options{}, fakeRun{Exit: 0, Outage: 1000})
		h.setenv("REAPER_RUNTIME_TIMEOUT=3")
		h.run(sh, Wrapper())
		checkLines(t, pod, h.lines(), []line{{run: 1, code: -1, started: zeroTime, finished: "now",
			err: "container runtime did not come back within 3s"}})
		equalStrings(t, "calls", h.events("docker info", "sleep", "shutdown"), []string{
			"docker info",
			"sleep 0.001",
			"docker info (down)", "sleep 0.001",
			"docker info (down)", "sleep 0.001",
			"docker info (down)",
			"sleep 0.001", "shutdown -P now",
		})
	})
}

// Repeated crashes under Always: restart in place with backoff 10 s doubling
// to 300 s, restartCount counting up, until maxRestarts ends the Pod.
func TestWrapperCrashLoop(t *testing.T) {
	eachShell(t, func(t *testing.T, sh string) {
		pod := jobPod(RestartAlways)
		runs := []fakeRun{{Exit: 0}}
		for range 7 {
			runs = append(runs, fakeRun{Exit: 1})
		}
		h := newHarness(t, pod, Options{MaxRestarts: 7}, runs...)
		h.run(sh, Wrapper())
		backoffs := []int{10, 20, 40, 80, 160, 300, 300}
		var want []line
		var calls []string
		for i := range 8 {
			l := line{run: i + 1, code: 1, restart: i}
			if i == 0 {
				l.code = 0 // Always restarts a clean exit too
			}
			calls = append(calls, fmt.Sprintf("docker run reaper-main-%d", i))
			if i < 7 {
				l.will, l.backoff = true, backoffs[i]
				calls = append(calls, "docker rm "+fakeCID(i+1), fmt.Sprintf("sleep %g", float64(backoffs[i])/1000))
			}
			want = append(want, l)
		}
		checkLines(t, pod, h.lines(), want)
		equalStrings(t, "calls", h.events("docker run", "docker rm", "sleep", "shutdown"), append(calls, shippedNow...))
	})
}

// A container that ran 10 minutes starts over at the initial backoff.
func TestWrapperBackoffReset(t *testing.T) {
	eachShell(t, func(t *testing.T, sh string) {
		pod := jobPod(RestartOnFailure)
		long := fakeRun{Exit: 2, Started: "2030-12-31T23:55:00Z", Finished: "2031-01-01T00:06:00.5Z"}
		h := newHarness(t, pod, Options{MaxRestarts: 3}, fakeRun{Exit: 1}, fakeRun{Exit: 1}, long, fakeRun{Exit: 3})
		h.run(sh, Wrapper())
		checkLines(t, pod, h.lines(), []line{
			{run: 1, code: 1, restart: 0, will: true, backoff: 10},
			{run: 2, code: 1, restart: 1, will: true, backoff: 20},
			{run: 3, code: 2, restart: 2, will: true, backoff: 10, started: long.Started, finished: long.Finished},
			{run: 4, code: 3, restart: 3},
		})
		equalStrings(t, "sleeps", h.events("sleep"), []string{"sleep 0.01", "sleep 0.02", "sleep 0.01", "sleep 0.001"})
	})
}

func TestWrapperOnFailure(t *testing.T) {
	eachShell(t, func(t *testing.T, sh string) {
		pod := jobPod(RestartOnFailure)
		h := newHarness(t, pod, Options{}, fakeRun{Exit: 1}, fakeRun{Exit: 0})
		h.run(sh, Wrapper())
		checkLines(t, pod, h.lines(), []line{
			{run: 1, code: 1, will: true, backoff: 10},
			{run: 2, code: 0, restart: 1},
		})
		equalStrings(t, "calls", h.events("docker run", "docker rm", "sleep", "shutdown"), []string{
			"docker run reaper-main-0", "docker rm " + fakeCID(1), "sleep 0.01",
			"docker run reaper-main-1", "sleep 0.001", "shutdown -P now",
		})
	})
}

// Every line carries the launch's exit token from the configuration, as
// Reaper's parser reads it, and it hashes to the exit-token tag the
// instance is launched with; the wrapper's own log never shows it.
func TestWrapperExitToken(t *testing.T) {
	eachShell(t, func(t *testing.T, sh string) {
		pod := jobPod(RestartOnFailure)
		opts := Options{Cluster: testCluster, ExitToken: testExitToken}
		h := newHarness(t, pod, opts, fakeRun{Exit: 1}, fakeRun{Exit: 0})
		h.run(sh, Wrapper())
		checkLines(t, pod, h.lines(), []line{
			{run: 1, code: 1, will: true, backoff: 10, token: testExitToken},
			{run: 2, code: 0, restart: 1, token: testExitToken},
		})
		raw, err := os.ReadFile(h.exit)
		if err != nil {
			t.Fatal(err)
		}
		tag := Tags(pod, opts)[model.DefaultTagExitToken]
		for _, l := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
			parsed, err := exitline.Parse([]byte(l))
			if err != nil || parsed.TokenHash() != tag {
				t.Errorf("Reaper reads the token hash %q (%v), the instance's tag is %q:\n%s", parsed.TokenHash(), err, tag, l)
			}
		}
		if n := strings.Count(h.stderr, "reaper-wrapper: exit line: {"); n != 2 {
			t.Errorf("the wrapper logged %d exit lines, want 2:\n%s", n, h.stderr)
		}
		if strings.Contains(h.stderr, testExitToken) {
			t.Errorf("the wrapper's log shows the token:\n%s", h.stderr)
		}
	})
}

// ShutdownAfterDelay waits the whole delay although the agent has shipped
// the line.
func TestWrapperOnFailureExit0(t *testing.T) {
	eachShell(t, func(t *testing.T, sh string) {
		pod := jobPod(RestartOnFailure)
		h := newHarness(t, pod, Options{ShutdownDelay: 90e9, ShutdownMode: ShutdownAfterDelay}, fakeRun{Exit: 0})
		h.run(sh, Wrapper())
		checkLines(t, pod, h.lines(), []line{{run: 1, code: 0}})
		equalStrings(t, "calls", h.events("docker run", "sleep", "shutdown"),
			[]string{"docker run reaper-main-0", "sleep 0.09", "shutdown -P now"})
	})
}

// The container is created but cannot start (bad entrypoint): the runtime's
// own code and message are reported.
func TestWrapperStartError(t *testing.T) {
	eachShell(t, func(t *testing.T, sh string) {
		pod := jobPod(RestartNever)
		msg := `exec: "/bin/install": stat /bin/install: no such file or directory`
		h := newHarness(t, pod, Options{}, fakeRun{StartError: msg})
		h.run(sh, Wrapper())
		checkLines(t, pod, h.lines(), []line{{run: 1, code: 127, started: zeroTime, finished: "now", err: msg}})
	})
}

// docker run fails on the client side although the container started: the
// wrapper finds it and waits on it rather than reporting a failure.
func TestWrapperRunClientError(t *testing.T) {
	eachShell(t, func(t *testing.T, sh string) {
		pod := jobPod(RestartNever)
		h := newHarness(t, pod, Options{}, fakeRun{Exit: 0, ClientFail: true})
		h.run(sh, Wrapper())
		checkLines(t, pod, h.lines(), []line{{run: 1, code: 0}})
		equalStrings(t, "calls", h.events("docker run", "docker inspect", "docker wait"), []string{
			"docker inspect reaper-main-0", "docker run reaper-main-0", "docker inspect reaper-main-0",
			"docker wait " + fakeCID(1), "docker inspect " + fakeCID(1),
		})
	})
}

// The image cannot be pulled: retried with backoff, then reported as an
// unknown exit with docker's message.
func TestWrapperPullFailure(t *testing.T) {
	eachShell(t, func(t *testing.T, sh string) {
		pod := jobPod(RestartNever)
		h := newHarness(t, pod, Options{}, fakeRun{RunFail: "Error response from daemon: pull access denied"})
		writeFile(t, filepath.Join(h.fake, "image_missing"), "")
		writeFile(t, filepath.Join(h.fake, "pull_fail"), "99")
		h.run(sh, Wrapper())
		checkLines(t, pod, h.lines(), []line{{code: -1, started: zeroTime, finished: "now",
			err: "docker run failed: docker: Error response from daemon: pull access denied."}})
		p := "docker pull " + jobImage
		equalStrings(t, "calls", h.events("docker pull", "docker run", "sleep"), []string{
			p, "sleep 0.01", p, "sleep 0.02", p, "sleep 0.04", p, "sleep 0.08", p,
			"docker run reaper-main-0", "sleep 0.001",
		})
	})
}

// The container is removed behind the wrapper's back: docker wait's code is
// all there is, and the line says so.
func TestWrapperVanished(t *testing.T) {
	eachShell(t, func(t *testing.T, sh string) {
		pod := jobPod(RestartNever)
		h := newHarness(t, pod, Options{}, fakeRun{Exit: 137, Vanish: true})
		h.run(sh, Wrapper())
		checkLines(t, pod, h.lines(), []line{{run: 1, code: 137, signal: "SIGKILL", started: zeroTime, finished: "now",
			err: "vanished before its state could be read"}})
	})
}

// After a reboot (or a restart of the unit) the wrapper finds the container
// of the current run instead of running the workload a second time.
func TestWrapperAdopts(t *testing.T) {
	for _, tc := range []struct {
		name, status string
		want         line
	}{
		{"exited", "exited", line{run: 1, code: 143, restart: 2, signal: "SIGTERM", err: "already exited when the supervisor started"}},
		{"running", "running", line{run: 1, code: 143, restart: 2, signal: "SIGTERM"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eachShell(t, func(t *testing.T, sh string) {
				pod := jobPod(RestartNever)
				h := newHarness(t, pod, Options{}, fakeRun{Exit: 143})
				writeFile(t, filepath.Join(h.state, "restarts"), "2\n")
				writeFile(t, filepath.Join(h.fake, "c", fakeCID(1)), "1")
				writeFile(t, filepath.Join(h.fake, "c", fakeCID(1)+".status"), tc.status)
				writeFile(t, filepath.Join(h.fake, "n", "reaper-main-2"), fakeCID(1))
				h.run(sh, Wrapper())
				checkLines(t, pod, h.lines(), []line{tc.want})
				equalStrings(t, "runs", h.events("docker run"), nil)
			})
		})
	}
}

// The wrapper SIGKILLed while its container runs (the OOM killer, kill -9):
// no trap runs, so nothing is written and nothing powers off. systemd
// restarts it as the rendered unit says, and the new wrapper adopts the
// container, still running or ended meanwhile, instead of running the
// workload again: the one exit line, then the power-off once it has shipped.
func TestWrapperKilledWhileRunning(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		meanwhile bool
		err       string
		waits     int // docker wait calls
	}{
		{"still-running", false, "", 2},
		{"exited-meanwhile", true, "already exited when the supervisor started", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eachShell(t, func(t *testing.T, sh string) {
				pod := jobPod(RestartNever)
				opts := Options{Cluster: testCluster}
				h := newHarness(t, pod, opts, fakeRun{Exit: 3, Kill: "wait", ExitedMeanwhile: tc.meanwhile})
				if n := h.runUnit(sh, Wrapper(), opts, 3); n != 2 {
					t.Errorf("wrapper started %d times, want 2 (killed once)", n)
				}
				checkLines(t, pod, h.lines(), []line{{run: 1, code: 3, err: tc.err}})
				want := []string{"docker run reaper-main-0", "docker wait " + fakeCID(1), "kill -9 at wait", "systemd restart after 5s (killed)"}
				if tc.waits == 2 {
					want = append(want, "docker wait "+fakeCID(1))
				}
				equalStrings(t, "calls", h.events("docker run", "docker wait", "kill", "systemd", "sleep", "shutdown"), append(want, shippedNow...))
				wantLog(t, h.stderr, "workload is terminal; powering off once the agent has shipped the exit line, at the latest in 600s")
			})
		})
	}
}

// The wrapper SIGKILLed right after a restart line, before the container
// is removed (rm-before) or right after (rm-after): the count the line used
// is already saved, so the restarted wrapper neither reports that exit again
// nor runs the workload again under that count. Every line's restartCount is
// greater than the one before.
func TestWrapperKilledAfterRestartLine(t *testing.T) {
	t.Parallel()
	for _, kill := range []string{"rm-before", "rm-after"} {
		t.Run(kill, func(t *testing.T) {
			eachShell(t, func(t *testing.T, sh string) {
				pod := jobPod(RestartOnFailure)
				opts := Options{Cluster: testCluster}
				h := newHarness(t, pod, opts, fakeRun{Exit: 1, Kill: kill}, fakeRun{Exit: 0})
				if n := h.runUnit(sh, Wrapper(), opts, 3); n != 2 {
					t.Errorf("wrapper started %d times, want 2 (killed once)", n)
				}
				lines := h.lines()
				wantCountsIncrease(t, lines)
				checkLines(t, pod, lines, []line{{run: 1, code: 1, will: true, backoff: 10}, {run: 2, restart: 1}})
				want := []string{"docker run reaper-main-0", "docker rm " + fakeCID(1), "kill -9 at " + kill, "systemd restart after 5s (killed)"}
				if kill == "rm-before" {
					// The restarted wrapper removes what the killed one left.
					want = append(want, "docker rm "+fakeCID(1))
				}
				equalStrings(t, "calls", h.events("docker run", "docker rm", "kill", "systemd", "shutdown"),
					append(want, "docker run reaper-main-1", "shutdown -P now"))
			})
		})
	}
	// Killed after saving the next count, before the line: the container of
	// that run is still there and its exit unreported; the restarted wrapper
	// reports it under its own count, then runs the next.
	t.Run("before-line", func(t *testing.T) {
		eachShell(t, func(t *testing.T, sh string) {
			pod := jobPod(RestartOnFailure)
			h := newHarness(t, pod, Options{}, fakeRun{Exit: 1}, fakeRun{Exit: 0})
			writeFile(t, filepath.Join(h.state, "restarts"), "1\n")
			writeFile(t, filepath.Join(h.fake, "runs"), "1\n")
			writeFile(t, filepath.Join(h.fake, "c", fakeCID(1)), "1")
			writeFile(t, filepath.Join(h.fake, "c", fakeCID(1)+".status"), "exited")
			writeFile(t, filepath.Join(h.fake, "n", "reaper-main-0"), fakeCID(1))
			h.run(sh, Wrapper())
			checkLines(t, pod, h.lines(), []line{
				{run: 1, code: 1, will: true, backoff: 10, err: "already exited when the supervisor started"},
				{run: 2, restart: 1},
			})
			equalStrings(t, "calls", h.events("docker run", "docker rm"), []string{"docker rm " + fakeCID(1), "docker run reaper-main-1"})
		})
	})
}

// wantCountsIncrease checks that each line's restartCount is greater than
// the one before: Reaper takes a line with a count it has seen for a
// duplicate.
func wantCountsIncrease(t *testing.T, lines []map[string]any) {
	t.Helper()
	last := int64(-1)
	for i, l := range lines {
		n, err := l["restartCount"].(json.Number).Int64()
		if err != nil || n <= last {
			t.Errorf("line %d: restartCount %v after %d, want a greater one", i, l["restartCount"], last)
		}
		last = n
	}
}

// Killed while waiting to power off after the final line: the restarted
// wrapper finds the terminal marker and powers off as soon as the agent has
// shipped the exit log, not only after the whole delay.
func TestWrapperKilledWhilePoweringOff(t *testing.T) {
	eachShell(t, func(t *testing.T, sh string) {
		pod := jobPod(RestartNever)
		h := newHarness(t, pod, Options{}, fakeRun{})
		writeFile(t, filepath.Join(h.state, "terminal"), "")
		writeFile(t, h.exit, `{"reaper":"container-exit","v":1,"restartCount":0}`+"\n")
		h.run(sh, Wrapper())
		equalStrings(t, "calls", h.events(), shippedNow)
	})
}

// A terminal marker from before a reboot: no second run, straight to the
// power-off.
func TestWrapperAlreadyTerminal(t *testing.T) {
	eachShell(t, func(t *testing.T, sh string) {
		h := newHarness(t, jobPod(RestartNever), Options{}, fakeRun{})
		writeFile(t, filepath.Join(h.state, "terminal"), "")
		h.run(sh, Wrapper())
		equalStrings(t, "calls", h.events(), afterDelay)
	})
}

func TestWrapperBadConfig(t *testing.T) {
	eachShell(t, func(t *testing.T, sh string) {
		h := newHarness(t, jobPod(RestartNever), Options{}, fakeRun{})
		h.conf = filepath.Join(h.dir, "missing.conf")
		h.run(sh, Wrapper())
		equalStrings(t, "calls", h.events(), afterDelay)
	})
}

func TestWrapperShutdownRetried(t *testing.T) {
	eachShell(t, func(t *testing.T, sh string) {
		h := newHarness(t, jobPod(RestartNever), Options{}, fakeRun{})
		writeFile(t, filepath.Join(h.fake, "shutdown_fail"), "1")
		h.setenv("REAPER_SHUTDOWN_CMD=shutdown -h +0")
		h.run(sh, Wrapper())
		equalStrings(t, "calls", h.events("sleep", "shutdown"),
			[]string{"sleep 0.001", "shutdown -h +0", "sleep 0.06", "shutdown -h +0"})
		if h.status != 0 {
			t.Errorf("wrapper exit status %d, want 0", h.status)
		}
	})
}

// Without IMDS the instance id comes from cloud-init's record.
func TestWrapperInstanceIDFallback(t *testing.T) {
	eachShell(t, func(t *testing.T, sh string) {
		pod := jobPod(RestartNever)
		h := newHarness(t, pod, Options{}, fakeRun{})
		writeFile(t, filepath.Join(h.dir, "cloud-instance-id"), testInstanceID+"\n")
		h.setenv("REAPER_IMDS_URL=http://127.0.0.1:9")
		h.run(sh, Wrapper())
		checkLines(t, pod, h.lines(), []line{{run: 1}})
	})
}

// Hostile command and args reach docker run byte for byte.
func TestWrapperHostileArgv(t *testing.T) {
	eachShell(t, func(t *testing.T, sh string) {
		pod, opts := hostilePod(), hostileOptions()
		opts.ExitLogPath = ""
		h := newHarness(t, pod, opts, fakeRun{Exit: 3}, fakeRun{Exit: 0})
		h.run(sh, Wrapper())
		want, err := RunArgs(pod, opts)
		if err != nil {
			t.Fatal(err)
		}
		equalStrings(t, "first docker run argv", h.argv(1), append([]string{"-d", "--name", "reaper-app-0"}, want...))
		equalStrings(t, "second docker run argv", h.argv(2), append([]string{"-d", "--name", "reaper-app-1"}, want...))
		checkLines(t, pod, h.lines(), []line{{run: 1, code: 3, will: true, backoff: 10}, {run: 2, restart: 1}})
		equalStrings(t, "sleeps", h.events("sleep"), []string{"sleep 0.01", "sleep 0.001"})
	})
}

// Neither IMDS nor cloud-init's record answers: the wrapper retries, then
// still writes the line and powers off (Reaper rejects a line without a
// valid instanceId; the instance-state path then decides the Pod).
func TestWrapperNoInstanceID(t *testing.T) {
	eachShell(t, func(t *testing.T, sh string) {
		pod := jobPod(RestartNever)
		h := newHarness(t, pod, Options{}, fakeRun{})
		h.setenv("REAPER_IMDS_URL=http://127.0.0.1:9")
		h.noInstanceID = true
		h.run(sh, Wrapper())
		lines := h.lines()
		if len(lines) != 1 || lines[0]["instanceId"] != "" || lines[0]["exitCode"] != json.Number("0") {
			t.Errorf("lines: %v", lines)
		}
		var want []string
		for range 15 { // 5 tries at start, 10 before the line
			want = append(want, "sleep 0.001")
		}
		equalStrings(t, "calls", h.events("sleep", "shutdown"), append(want, shippedNow...))
	})
}

// After the final line the wrapper polls the agent's saved offset once a
// second and powers off as soon as it covers the line, at the latest after
// the delay. The agent double saves at scripted sleeps; each case says on
// which poll the wrapper must power off (0: never, the delay runs out).
func TestWrapperPowerOffWhenShipped(t *testing.T) {
	t.Parallel()
	const shipped = "{size}\nPATH\n0-{size}"
	for _, tc := range []struct {
		name  string
		saves map[int]string // sleep call -> state (PATH: the exit log's path)
		delay int            // seconds (default 600)
		off   string         // the offset the wrapper's last word names, with {size} and {size-1}; "" for none
		after int            // polls before the power-off; 0: the delay runs out
	}{
		// No state file until the third poll.
		{name: "appears", saves: map[int]string{3: shipped}, off: "{size}", after: 3},
		// Caught mid-write: empty, garbage, line 1 without its newline.
		{name: "torn", saves: map[int]string{1: "", 2: "garbage\nPATH\n0-1", 3: "{size}", 4: shipped}, off: "{size}", after: 4},
		// One byte short of the line's newline: not shipped.
		{name: "short", saves: map[int]string{1: "{size-1}\nPATH\n0-{size-1}"}, delay: 5, off: "{size-1}"},
		{name: "never", delay: 3},
		{name: "beyond", saves: map[int]string{1: "1000000\nPATH\n0-1000000"}, off: "1000000", after: 1},
		// With logs.concurrency the agent lists ranges with gaps; line 1 is their highest end.
		{name: "ranges", saves: map[int]string{2: "{size}\nPATH\n0-5,20-{size}"}, off: "{size}", after: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eachShell(t, func(t *testing.T, sh string) {
				pod := jobPod(RestartNever)
				opts := Options{ShutdownDelay: time.Duration(tc.delay) * time.Second}
				h := newHarness(t, pod, opts, fakeRun{Exit: 0})
				h.agentQuiet()
				for call, st := range tc.saves {
					h.agentSaves(call, strings.ReplaceAll(st, "PATH", h.exit))
				}
				h.run(sh, Wrapper())
				checkLines(t, pod, h.lines(), []line{{run: 1}})
				end := h.exitSize()
				off := strings.NewReplacer("{size}", fmt.Sprint(end), "{size-1}", fmt.Sprint(end-1)).Replace(tc.off)
				polls, msg := tc.after, fmt.Sprintf("exit line shipped after %ds (agent offset %s, line end %d)", tc.after, off, end)
				if tc.after == 0 {
					polls = tc.delay
					msg = fmt.Sprintf("exit line not shipped within %ds (agent offset %s, line end %d)", tc.delay, or(off, "none"), end)
				}
				var want []string
				for range polls {
					want = append(want, "sleep 0.001")
				}
				equalStrings(t, "calls", h.events("sleep", "shutdown"), append(want, "shutdown -P now"))
				wantLog(t, h.stderr, msg, "powering off: shutdown -P now")
			})
		})
	}
}

// A restart line the agent has shipped before the final one: its offset
// is the exit log's size before the final append, not stale.
func TestWrapperShippedAfterRestart(t *testing.T) {
	eachShell(t, func(t *testing.T, sh string) {
		pod := jobPod(RestartOnFailure)
		h := newHarness(t, pod, Options{}, fakeRun{Exit: 1}, fakeRun{Exit: 0})
		h.run(sh, Wrapper())
		checkLines(t, pod, h.lines(), []line{{run: 1, code: 1, will: true, backoff: 10}, {run: 2, restart: 1}})
		equalStrings(t, "calls", h.events("sleep", "shutdown"), []string{"sleep 0.01", "sleep 0.001", "shutdown -P now"})
		end := h.exitSize()
		wantLog(t, h.stderr, fmt.Sprintf("exit line shipped after 1s (agent offset %d, line end %d)", end, end))
	})
}

// A saved offset past the exit log's end before the final append belongs to
// an earlier file of that name: the wrapper does not trust it and waits the
// delay, although the agent double would ship the line.
func TestWrapperShippedStaleState(t *testing.T) {
	eachShell(t, func(t *testing.T, sh string) {
		pod := jobPod(RestartNever)
		h := newHarness(t, pod, Options{}, fakeRun{Exit: 0})
		writeFile(t, h.agentState, h.saved("1000000"))
		h.run(sh, Wrapper())
		checkLines(t, pod, h.lines(), []line{{run: 1}})
		equalStrings(t, "calls", h.events("sleep", "shutdown"), afterDelay)
		wantLog(t, h.stderr, "agent offset 1000000 is past the end of "+h.exit+" (0 bytes): stale, not waiting for it",
			"workload is terminal; powering off in 600s unless terminated first")
	})
}

// The wrapper finds the agent's state file by the exit log's path, with /,
// space and : turned into _.
func TestAgentStateName(t *testing.T) {
	t.Parallel()
	if got := agentStateName(DefaultExitLogPath); got != "_var_log_reaper_exit.log" {
		t.Errorf("agentStateName(%q) = %q", DefaultExitLogPath, got)
	}
}

// wantLog checks that the wrapper logged each of msgs as a whole line.
func wantLog(t *testing.T, stderr string, msgs ...string) {
	t.Helper()
	for _, m := range msgs {
		if !strings.Contains("\n"+stderr, "\nreaper-wrapper: "+m+"\n") {
			t.Errorf("wrapper did not log %q; stderr:\n%s", m, stderr)
		}
	}
}

// In ShutdownWhenPodWritten the wrapper powers off once its instance
// carries Reaper's Pod-written tag, read through the instance metadata
// once a second, and at the latest after the delay; it does not wait for
// the agent, whose line Reaper must have had to write the Pod.
func TestWrapperPowerOffWhenPodWritten(t *testing.T) {
	t.Parallel()
	const tag = "reaper.io:pod-written"
	keys := model.TagKeys{Managed: "reaper.io:managed", Cluster: "reaper.io:cluster", PodNamespace: "reaper.io:pod-namespace",
		PodName: "reaper.io:pod-name", PodUID: "reaper.io:pod-uid", ClusterUID: "reaper.io:cluster-uid", ExitToken: "reaper.io:exit-token-sha256",
		PodWritten: tag}
	for _, tc := range []struct {
		name     string
		taggedAt int // the tag read that first finds it (0: never)
		delay    int
		polls    int // sleeps before the power-off
		msg      string
	}{
		{name: "written", taggedAt: 3, delay: 600, polls: 2, msg: "waited 2s for tag " + tag},
		{name: "at once", taggedAt: 1, delay: 600, polls: 0, msg: "waited 0s for tag " + tag},
		{name: "never", delay: 4, polls: 4, msg: "waited 4s for tag " + tag},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eachShell(t, func(t *testing.T, sh string) {
				var reads atomic.Int32
				imds := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					switch {
					case r.Method == http.MethodPut && r.URL.Path == "/latest/api/token":
						fmt.Fprint(w, "tok-123")
					case r.Header.Get("X-aws-ec2-metadata-token") != "tok-123":
						http.Error(w, "unauthorized", http.StatusUnauthorized)
					case r.URL.Path == "/latest/meta-data/instance-id":
						fmt.Fprint(w, testInstanceID)
					case r.URL.Path == "/latest/meta-data/tags/instance/"+tag:
						if n := reads.Add(1); tc.taggedAt == 0 || int(n) < tc.taggedAt {
							http.NotFound(w, r)
							return
						}
						fmt.Fprint(w, "2026-12-02T10:00:00Z")
					default:
						http.NotFound(w, r)
					}
				}))
				defer imds.Close()
				pod := jobPod(RestartNever)
				h := newHarness(t, pod, Options{ShutdownMode: ShutdownWhenPodWritten, TagKeys: keys, ShutdownDelay: time.Duration(tc.delay) * time.Second}, fakeRun{Exit: 0})
				h.agentQuiet() // the agent never ships: the wrapper must not wait for it
				h.setenv("REAPER_IMDS_URL=" + imds.URL)
				h.run(sh, Wrapper())
				checkLines(t, pod, h.lines(), []line{{run: 1}})
				var want []string
				for range tc.polls {
					want = append(want, "sleep 0.001")
				}
				equalStrings(t, "calls", h.events("sleep", "shutdown"), append(want, "shutdown -P now"))
				wantLog(t, h.stderr, tc.msg, "powering off: shutdown -P now")
			})
		})
	}
}
