package userdata

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/reaper-k8s/reaper/pkg/model"
)

// Pods of several containers, run for real against the docker double as
// the single-container ones are (wrapper_test.go).

// seedPod is the seed's Job shape: an init container that downloads, then
// the container that provisions, sharing an emptyDir volume.
func seedPod(policy string) Pod {
	return Pod{
		Namespace: "batch", Name: "provision-8fj2k", UID: "7a2b3c4d-5e6f-4a8b-9c0d-1e2f3a4b5c6d", RestartPolicy: policy,
		InitContainers: []Container{{
			Name: "downloader", Image: "registry.example.com/tools/fetch:2.1",
			Command: []string{"/bin/fetch"}, Args: []string{"--to", "/work", "s3://bucket/bundle.tgz"},
			Env:          []EnvVar{{"AWS_REGION", "eu-west-1"}},
			VolumeMounts: []VolumeMount{{Name: "work", MountPath: "/work"}},
		}},
		Containers: []Container{{
			Name: "provisioner", Image: "registry.example.com/tools/provision:3.0",
			Args:         []string{"--bundle", "/work/bundle.tgz"},
			Env:          []EnvVar{{"MODE", "full"}},
			VolumeMounts: []VolumeMount{{Name: "work", MountPath: "/work", ReadOnly: true}},
		}},
		Volumes: []Volume{{Name: "work", EmptyDir: &EmptyDir{}}},
	}
}

// sidecarPod has two sidecars (started in order, stopped in reverse) and
// two regular containers.
func sidecarPod(policy string, grace int64) Pod {
	return Pod{
		Namespace: "web", Name: "api-5d8f7", UID: "2c3d4e5f-6a7b-4c8d-9e0f-1a2b3c4d5e6f", RestartPolicy: policy,
		TerminationGracePeriodSeconds: &grace,
		InitContainers: []Container{
			{Name: "proxy", Image: "envoyproxy/envoy:v1.31", RestartPolicy: RestartAlways},
			{Name: "logger", Image: "fluent/fluent-bit:3.1", RestartPolicy: RestartAlways,
				VolumeMounts: []VolumeMount{{Name: "logs", MountPath: "/var/log/app", ReadOnly: true}}},
		},
		Containers: []Container{
			{Name: "api", Image: "registry.example.com/api:7", VolumeMounts: []VolumeMount{{Name: "logs", MountPath: "/var/log/app"}}},
			{Name: "worker", Image: "registry.example.com/worker:7", TerminationMessagePolicy: TerminationMessageFallbackToLogsOnError},
		},
		Volumes: []Volume{{Name: "logs", EmptyDir: &EmptyDir{}}},
	}
}

// podLine is an expected line of a Pod of several containers.
type podLine struct {
	container     string
	code, restart int
	will, others  bool
	signal        string
	backoff       int
	msg           string // the exact message; "" for none
	err           string // substring
}

// checkPodLines checks each line against want, field by field; the
// container id must be the one the double gave that run.
func checkPodLines(t *testing.T, h *harness, pod Pod, got []map[string]any, want []podLine) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d exit lines, want %d:\n%v\nstderr:\n%s", len(got), len(want), got, h.stderr)
	}
	for i, w := range want {
		g := got[i]
		exp := map[string]any{
			"reaper": "container-exit", "podNamespace": pod.Namespace, "podName": pod.Name, "podUID": pod.UID,
			"container": w.container, "exitCode": json.Number(fmt.Sprint(w.code)), "restartCount": json.Number(fmt.Sprint(w.restart)),
			"willRestart": w.will, "instanceId": testInstanceID,
		}
		if w.code >= 0 {
			exp["containerId"] = h.cidOf(fmt.Sprintf("reaper-%s-%d", w.container, w.restart))
		}
		for k, v := range exp {
			if g[k] != v {
				t.Errorf("line %d (%s): %s = %#v, want %#v", i, w.container, k, g[k], v)
			}
		}
		for k, v := range map[string]any{"othersRunning": w.others, "signal": w.signal, "message": w.msg,
			"backoffSeconds": w.backoff} {
			gv, ok := g[k]
			zero := v == false || v == "" || v == 0
			switch {
			case zero && ok:
				t.Errorf("line %d (%s): %s = %#v, want it left out", i, w.container, k, gv)
			case !zero && k == "backoffSeconds" && gv != json.Number(fmt.Sprint(v)):
				t.Errorf("line %d (%s): %s = %#v, want %v", i, w.container, k, gv, v)
			case !zero && k != "backoffSeconds" && gv != v:
				t.Errorf("line %d (%s): %s = %#v, want %#v", i, w.container, k, gv, v)
			}
		}
		if s, _ := g["error"].(string); (w.err == "") != (s == "") || !strings.Contains(s, w.err) {
			t.Errorf("line %d (%s): error = %q, want %q", i, w.container, s, w.err)
		}
	}
}

// The seed's Job: the init container runs to completion, then the regular
// one; both share the Pod's network (the pause container's) and the
// emptyDir volume, a host directory under the state directory; the init
// container's line says the Pod goes on, the last one that it is over,
// and the host powers off once that one has shipped.
func TestPodInitThenMain(t *testing.T) {
	eachShell(t, func(t *testing.T, sh string) {
		pod := seedPod(RestartNever)
		h := newHarness(t, pod, Options{})
		h.named("reaper-downloader-0", fakeRun{Exit: 0})
		h.named("reaper-provisioner-0", fakeRun{Exit: 0})
		h.run(sh, Wrapper())
		checkPodLines(t, h, pod, h.lines(), []podLine{
			{container: "downloader", others: true},
			{container: "provisioner"},
		})
		equalStrings(t, "calls", h.events("docker run", "docker rm", "docker stop", "sleep 0.0", "shutdown"), []string{
			"docker run reaper-pause", "docker run reaper-downloader-0", "docker run reaper-provisioner-0", "sleep 0.001", "shutdown -P now",
		})
		for n, c := range []string{"downloader", "provisioner"} {
			want, err := ContainerRunArgs(pod, Options{}, c)
			if err != nil {
				t.Fatal(err)
			}
			// The host mounts under its own state directory.
			for i := range want {
				want[i] = strings.Replace(want[i], StateDir, h.state, 1)
			}
			equalStrings(t, c+" docker run argv", h.argv(n+1), append([]string{"-d", "--name", "reaper-" + c + "-0"}, want...))
		}
		argv := strings.Join(h.argv(2), " ")
		for _, w := range []string{"--network container:reaper-pause", "-v " + h.state + "/volumes/work:/work:ro",
			"-v " + h.state + "/c/provisioner/termination-log:/dev/termination-log", "--env-file /etc/reaper/env/provisioner"} {
			if !strings.Contains(argv, w) {
				t.Errorf("provisioner's docker run lacks %q: %s", w, argv)
			}
		}
		if fi, err := os.Stat(filepath.Join(h.state, "volumes", "work")); err != nil || fi.Mode().Perm() != 0o777 {
			t.Errorf("emptyDir volume directory: %v, %v; want one with mode 0777", fi, err)
		}
		wantLog(t, h.stderr, fmt.Sprintf("exit line shipped after 1s (agent offset %d, line end %d)", h.exitSize(), h.exitSize()))
	})
}

// A failed init container under Never ends the Pod: the regular container
// never starts, and the failing line is the Pod's last. Under OnFailure it
// is restarted with the backoff until it succeeds.
func TestPodInitFails(t *testing.T) {
	t.Run("Never", func(t *testing.T) {
		eachShell(t, func(t *testing.T, sh string) {
			pod := seedPod(RestartNever)
			h := newHarness(t, pod, Options{})
			h.named("reaper-downloader-0", fakeRun{Exit: 3})
			h.run(sh, Wrapper())
			checkPodLines(t, h, pod, h.lines(), []podLine{{container: "downloader", code: 3}})
			equalStrings(t, "calls", h.events("docker run", "sleep 0.0", "shutdown"),
				[]string{"docker run reaper-pause", "docker run reaper-downloader-0", "sleep 0.001", "shutdown -P now"})
		})
	})
	t.Run("OnFailure", func(t *testing.T) {
		eachShell(t, func(t *testing.T, sh string) {
			pod := seedPod(RestartOnFailure)
			h := newHarness(t, pod, Options{})
			h.named("reaper-downloader-0", fakeRun{Exit: 3})
			h.named("reaper-downloader-1", fakeRun{Exit: 0})
			h.named("reaper-provisioner-0", fakeRun{Exit: 0})
			h.run(sh, Wrapper())
			checkPodLines(t, h, pod, h.lines(), []podLine{
				{container: "downloader", code: 3, will: true, backoff: 10, others: true},
				{container: "downloader", restart: 1, others: true},
				{container: "provisioner"},
			})
			equalStrings(t, "calls", h.events("docker run", "docker rm", "sleep 0.0", "shutdown"), []string{
				"docker run reaper-pause", "docker run reaper-downloader-0", "docker rm " + h.cidOf("reaper-downloader-0"), "sleep 0.01",
				"docker run reaper-downloader-1", "docker run reaper-provisioner-0", "sleep 0.001", "shutdown -P now",
			})
		})
	})
}

// Two regular containers start together, each with its own restart loop
// and count under OnFailure; every line but the Pod's last says others
// run, a restart line too; the host powers off once the last has shipped.
func TestPodTwoContainersOnFailure(t *testing.T) {
	eachShell(t, func(t *testing.T, sh string) {
		pod := seedPod(RestartOnFailure)
		pod.InitContainers = nil
		pod.Containers = append(pod.Containers, Container{Name: "reporter", Image: "registry.example.com/tools/report:1"})
		h := newHarness(t, pod, Options{})
		h.named("reaper-provisioner-0", fakeRun{Exit: 1})
		h.named("reaper-provisioner-1", fakeRun{Exit: 0})
		h.named("reaper-reporter-0", fakeRun{Exit: 2})
		h.named("reaper-reporter-1", fakeRun{Exit: 2})
		h.named("reaper-reporter-2", fakeRun{Exit: 0})
		h.run(sh, Wrapper())
		lines := h.lines()
		// Others run after a line while the other container's final line
		// is still to come: which ends first varies.
		final := map[string]int{}
		for i, l := range lines {
			if l["willRestart"] == false {
				final[l["container"].(string)] = i
			}
		}
		per := map[string][]map[string]any{}
		others := map[string][]bool{}
		for i, l := range lines {
			c := l["container"].(string)
			per[c] = append(per[c], l)
			o := map[string]string{"provisioner": "reporter", "reporter": "provisioner"}[c]
			others[c] = append(others[c], final[o] > i)
		}
		if len(others["provisioner"]) != 2 || len(others["reporter"]) != 3 {
			t.Fatalf("lines: %v", lines)
		}
		checkPodLines(t, h, pod, per["provisioner"], []podLine{
			{container: "provisioner", code: 1, will: true, backoff: 10, others: others["provisioner"][0]},
			{container: "provisioner", restart: 1, others: others["provisioner"][1]},
		})
		checkPodLines(t, h, pod, per["reporter"], []podLine{
			{container: "reporter", code: 2, will: true, backoff: 10, others: others["reporter"][0]},
			{container: "reporter", code: 2, restart: 1, will: true, backoff: 20, others: others["reporter"][1]},
			{container: "reporter", restart: 2, others: others["reporter"][2]},
		})
		if lines[len(lines)-1]["othersRunning"] != nil {
			t.Errorf("the Pod's last line says others run: %v", lines[len(lines)-1])
		}
		for _, c := range []string{"provisioner", "reporter"} {
			wantCountsIncrease(t, per[c])
		}
		runs := h.events("docker run")
		if len(runs) != 6 || runs[0] != "docker run reaper-pause" {
			t.Errorf("docker runs: %q, want the pause container and 5 runs", runs)
		}
		ev := h.events("shutdown")
		if len(ev) != 1 {
			t.Errorf("shutdowns: %q", ev)
		}
		wantLog(t, h.stderr, fmt.Sprintf("exit line shipped after 1s (agent offset %d, line end %d)", h.exitSize(), h.exitSize()))
	})
}

var stopCall = regexp.MustCompile(`^docker stop -t (\d+) (\S+)$`)

// Sidecars start in order before the regular containers and are kept
// running; once every regular container has ended for good, they are
// stopped in reverse order with the Pod's grace (SIGTERM, then SIGKILL
// after it: docker stop -t), and write their lines, the first sidecar's
// being the Pod's last.
func TestPodSidecarsStopped(t *testing.T) {
	eachShell(t, func(t *testing.T, sh string) {
		pod := sidecarPod(RestartNever, 45)
		h := newHarness(t, pod, Options{})
		h.named("reaper-proxy-0", fakeRun{UntilStop: true})                 // ends on SIGTERM: 143
		h.named("reaper-logger-0", fakeRun{UntilStop: true, StopExit: 137}) // ignores it: SIGKILL after the grace
		h.named("reaper-api-0", fakeRun{Exit: 0})
		h.named("reaper-worker-0", fakeRun{Exit: 0})
		h.run(sh, Wrapper())
		lines := h.lines()
		if len(lines) != 4 {
			t.Fatalf("%d lines:\n%v\n%s", len(lines), lines, h.stderr)
		}
		first := lines[0]["container"].(string)
		other := map[string]string{"api": "worker", "worker": "api"}[first]
		checkPodLines(t, h, pod, lines, []podLine{
			{container: first, others: true},
			{container: other, others: true},
			{container: "logger", code: 137, signal: "SIGKILL", others: true},
			{container: "proxy", code: 143, signal: "SIGTERM"},
		})
		runs := h.events("docker run")
		equalStrings(t, "sidecars start in order, before the regular containers", runs[:3],
			[]string{"docker run reaper-pause", "docker run reaper-proxy-0", "docker run reaper-logger-0"})
		var stops []string
		for _, e := range h.events("docker stop") {
			m := stopCall.FindStringSubmatch(e)
			if m == nil || (m[1] != "45" && m[1] != "44") {
				t.Errorf("%q: want docker stop -t 45 (what is left of the grace)", e)
				continue
			}
			stops = append(stops, m[2])
		}
		equalStrings(t, "sidecars stopped in reverse order", stops, []string{h.cidOf("reaper-logger-0"), h.cidOf("reaper-proxy-0")})
		ev := h.events("docker stop", "shutdown")
		if len(ev) != 3 || ev[2] != "shutdown -P now" {
			t.Errorf("the host powers off after the sidecars' lines: %q", ev)
		}
		wantLog(t, h.stderr, fmt.Sprintf("exit line shipped after 1s (agent offset %d, line end %d)", h.exitSize(), h.exitSize()))
	})
}

// A failed init container under Never with a sidecar running: the sidecar
// is stopped, and its line, not the init container's, is the Pod's last.
func TestPodInitFailsWithSidecar(t *testing.T) {
	eachShell(t, func(t *testing.T, sh string) {
		pod := seedPod(RestartNever)
		pod.InitContainers = append([]Container{{Name: "proxy", Image: "envoyproxy/envoy:v1.31", RestartPolicy: RestartAlways}}, pod.InitContainers...)
		h := newHarness(t, pod, Options{})
		h.named("reaper-proxy-0", fakeRun{UntilStop: true})
		h.named("reaper-downloader-0", fakeRun{Exit: 4})
		h.run(sh, Wrapper())
		checkPodLines(t, h, pod, h.lines(), []podLine{
			{container: "downloader", code: 4, others: true},
			{container: "proxy", code: 143, signal: "SIGTERM"},
		})
		equalStrings(t, "runs", h.events("docker run"), []string{"docker run reaper-pause", "docker run reaper-proxy-0", "docker run reaper-downloader-0"})
	})
}

// A sidecar that exits is restarted whatever the Pod's policy, while the
// regular container runs; once that has ended, it is stopped.
func TestPodSidecarRestarts(t *testing.T) {
	eachShell(t, func(t *testing.T, sh string) {
		pod := sidecarPod(RestartNever, 30)
		pod.InitContainers = pod.InitContainers[:1]
		pod.Containers = pod.Containers[:1]
		h := newHarness(t, pod, Options{})
		h.named("reaper-proxy-0", fakeRun{Exit: 1})
		h.named("reaper-proxy-1", fakeRun{UntilStop: true})
		h.named("reaper-api-0", fakeRun{Exit: 0, After: "reaper-proxy-1"})
		h.run(sh, Wrapper())
		checkPodLines(t, h, pod, h.lines(), []podLine{
			{container: "proxy", code: 1, will: true, backoff: 10, others: true},
			{container: "api", others: true},
			{container: "proxy", code: 143, restart: 1, signal: "SIGTERM"},
		})
	})
}

// A sidecar that exits about when the Pod ends is not restarted: whether
// it ends before the regular container (then it stays down between runs)
// or after (then its exit is final), no run follows, and the last line
// says nothing else runs.
func TestPodSidecarDownAtTheEnd(t *testing.T) {
	eachShell(t, func(t *testing.T, sh string) {
		pod := sidecarPod(RestartNever, 30)
		pod.InitContainers = pod.InitContainers[:1]
		pod.Containers = pod.Containers[:1]
		h := newHarness(t, pod, Options{})
		h.named("reaper-proxy-0", fakeRun{Exit: 1})
		h.named("reaper-api-0", fakeRun{Exit: 0})
		h.run(sh, Wrapper())
		lines := h.lines()
		if n := len(lines); n < 1 || n > 2 || lines[n-1]["othersRunning"] != nil {
			t.Fatalf("lines: %v", lines)
		}
		if runs := h.events("docker run reaper-proxy-1"); len(runs) != 0 {
			t.Errorf("the sidecar restarted after the Pod ended: %q", runs)
		}
	})
}

// Termination messages, as the kubelet reads them: the tail of the file at
// the container's terminationMessagePath, within the Pod's share (12 KiB
// over 4 containers: 3,072 bytes each) cut at a character boundary; under
// FallbackToLogsOnError, a failed container with an empty file gives the
// tail of its log (80 lines, 2,048 bytes); any byte reaches Reaper as valid
// JSON.
func TestPodTerminationMessages(t *testing.T) {
	eachShell(t, func(t *testing.T, sh string) {
		pod := sidecarPod(RestartNever, 30)
		pod.InitContainers[1].TerminationMessagePath = "/tmp/done"
		pod.Containers[0].TerminationMessagePolicy = TerminationMessageFallbackToLogsOnError
		h := newHarness(t, pod, Options{})
		// 3,071 bytes of ASCII after a 4-byte character: the cut falls
		// inside it, which is dropped whole.
		long := "start\n" + strings.Repeat("x", 5000) + "🚀" + strings.Repeat("é", 3) + strings.Repeat("y", 3065)
		var logs strings.Builder
		for i := range 100 {
			fmt.Fprintf(&logs, "line %03d: \"quoted\" \\ tab\there \x01 ünï \xff\n", i)
		}
		h.named("reaper-proxy-0", fakeRun{UntilStop: true, Message: "bye\n\"proxy\"\t\x7f done"})
		h.named("reaper-logger-0", fakeRun{UntilStop: true, Message: "flushed", MessagePath: "/tmp/done"})
		// Fails with an empty file: the log's tail.
		h.named("reaper-api-0", fakeRun{Exit: 1, Logs: logs.String()})
		// Fails, but wrote its file: the file.
		h.named("reaper-worker-0", fakeRun{Exit: 2, Message: long, Logs: "not this"})
		h.run(sh, Wrapper())
		got := map[string]string{}
		for _, l := range h.lines() {
			m, _ := l["message"].(string)
			got[l["container"].(string)] = m
		}
		tail := strings.Join(strings.SplitAfter(logs.String(), "\n")[20:], "")
		want := map[string]string{
			"proxy":  "bye\n\"proxy\"\t\x7f done",
			"logger": "flushed",
			// The log's cut may leave a partial "ü", and \xff becomes U+FFFD
			// (3 bytes for 1).
			"api":    boundMessage(tail, 2048),
			"worker": strings.Repeat("é", 3) + strings.Repeat("y", 3065),
		}
		for c, w := range want {
			if got[c] != w {
				t.Errorf("%s: message %q (%d bytes), want %q (%d bytes)", c, got[c], len(got[c]), w, len(w))
			}
			if len(got[c]) > 3072 || !utf8.ValidString(got[c]) {
				t.Errorf("%s: message of %d bytes, valid UTF-8 %v: want at most 3072, valid", c, len(got[c]), utf8.ValidString(got[c]))
			}
		}
		equalStrings(t, "logs read", h.events("docker logs"), []string{"docker logs --tail 80 " + h.cidOf("reaper-api-0")})
	})
}

// boundMessage keeps the tail of raw that fits max bytes once invalid
// bytes are U+FFFD, dropping a character cut at the front: the wrapper's
// rule, written plainly.
func boundMessage(raw string, max int) string {
	if len(raw) > max {
		raw = raw[len(raw)-max:]
	}
	for i := 0; i < 3 && len(raw) > 0 && raw[0]&0xc0 == 0x80; i++ {
		raw = raw[1:]
	}
	rs := []rune(raw) // invalid bytes decode as U+FFFD, one each
	n, i := 0, len(rs)
	for i > 0 && n+utf8.RuneLen(rs[i-1]) <= max {
		i--
		n += utf8.RuneLen(rs[i])
	}
	return string(rs[i:])
}

// The wrapper SIGKILLed while the regular container runs, after the init
// container is done: systemd restarts it, and it neither runs the init
// container again nor starts a second network container or regular
// container; it adopts the running one and reports its exit once.
func TestPodKilledMidPod(t *testing.T) {
	t.Parallel()
	for _, meanwhile := range []bool{false, true} {
		name := "running"
		if meanwhile {
			name = "exited-meanwhile"
		}
		t.Run(name, func(t *testing.T) {
			eachShell(t, func(t *testing.T, sh string) {
				pod := seedPod(RestartNever)
				pod.InitContainers = append([]Container{{Name: "proxy", Image: "envoyproxy/envoy:v1.31", RestartPolicy: RestartAlways}}, pod.InitContainers...)
				opts := Options{Cluster: testCluster}
				h := newHarness(t, pod, opts)
				h.named("reaper-proxy-0", fakeRun{UntilStop: true})
				h.named("reaper-downloader-0", fakeRun{Exit: 0})
				h.named("reaper-provisioner-0", fakeRun{Exit: 5, Kill: "wait", ExitedMeanwhile: meanwhile})
				if n := h.runUnit(sh, Wrapper(), opts, 3); n != 2 {
					t.Errorf("wrapper started %d times, want 2 (killed once)", n)
				}
				err := ""
				if meanwhile {
					err = "already exited when the supervisor started"
				}
				checkPodLines(t, h, pod, h.lines(), []podLine{
					{container: "downloader", others: true},
					{container: "provisioner", code: 5, others: true, err: err},
					{container: "proxy", code: 143, signal: "SIGTERM"},
				})
				calls := h.events("docker run", "kill", "systemd", "docker stop", "shutdown")
				// What is left of the grace: a second may have passed.
				if len(calls) == 8 {
					calls[6] = strings.Replace(calls[6], "-t 29 ", "-t 30 ", 1)
				}
				equalStrings(t, "calls", calls, []string{
					"docker run reaper-pause", "docker run reaper-proxy-0", "docker run reaper-downloader-0", "docker run reaper-provisioner-0",
					"kill -9 at wait", "systemd restart after 5s (killed)",
					"docker stop -t 30 " + h.cidOf("reaper-proxy-0"), "shutdown -P now",
				})
			})
		})
	}
}

// Power-off comes only after the Pod's last line has shipped: the agent
// double ships nothing until a scripted save, and a save that covers an
// earlier line only does not do.
func TestPodPowerOffAfterLastLine(t *testing.T) {
	eachShell(t, func(t *testing.T, sh string) {
		pod := sidecarPod(RestartNever, 30)
		h := newHarness(t, pod, Options{ShutdownDelay: 20e9})
		h.agentQuiet()
		h.named("reaper-proxy-0", fakeRun{UntilStop: true})
		h.named("reaper-logger-0", fakeRun{UntilStop: true})
		h.named("reaper-api-0", fakeRun{Exit: 0})
		h.named("reaper-worker-0", fakeRun{Exit: 0})
		// The wrapper's sleeps before the power-off vary (polls for the
		// sidecars' start, the lock); the agent saves on every one of the
		// first 200 only the first line's end, then the whole log.
		first := filepath.Join(h.fake, "agent")
		for i := 1; i <= 400; i++ {
			writeFile(t, filepath.Join(first, fmt.Sprint(i)), "1\n"+h.exit+"\n0-1")
		}
		h.run(sh, Wrapper())
		lines := h.lines()
		if len(lines) != 4 || lines[3]["container"] != "proxy" || lines[3]["othersRunning"] != nil {
			t.Fatalf("lines: %v", lines)
		}
		wantLog(t, h.stderr, fmt.Sprintf("exit line not shipped within 20s (agent offset 1, line end %d)", h.exitSize()))
		if ev := h.events("shutdown"); !slices.Equal(ev, []string{"shutdown -P now"}) {
			t.Errorf("shutdowns: %q", ev)
		}
	})
}

// A Pod of more containers than Reaper keeps the exits of is refused at
// launch, with the bound in the error.
func TestPodTooManyContainers(t *testing.T) {
	pod := Pod{Namespace: "jobs", Name: "wide", UID: "6b9a1c2e-0000-4000-8000-000000000001"}
	for i := range model.MaxContainers + 1 {
		pod.Containers = append(pod.Containers, Container{Name: fmt.Sprintf("c%d", i), Image: "busybox"})
	}
	if err := pod.Validate(); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%d containers", model.MaxContainers+1)) {
		t.Fatalf("Validate = %v, want the container count refused", err)
	}
	pod.Containers = pod.Containers[:model.MaxContainers]
	if err := pod.Validate(); err != nil {
		t.Fatalf("%d containers: %v", model.MaxContainers, err)
	}
}
