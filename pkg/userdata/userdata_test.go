package userdata

import (
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"flag"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/reaper-k8s/reaper/pkg/model"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

func hostilePod() Pod {
	return Pod{
		Namespace: "team-a", Name: "weird.pod-name-1", UID: "0b8f3c2e-1d4a-4c59-9a61-5e0f7d2b8c31",
		Container: "app",
		Image:     "registry.example.com:5000/team/app@sha256:" + strings.Repeat("ab", 32),
		Command:   []string{"/bin/sh", "-c", `echo "$HOME" 'q' ` + "`id`" + ` $(id) \ back; exit 3`},
		Args: []string{"", " lead", "trail ", "semi;colon&amp|pipe>redir<in", "new\nline", "l1\nREAPER_EOF\nl3", "REAPER_EOF", "'", "''",
			`"`, `\`, "*", "~", "$IFS", "#comment", "-e", "--entrypoint=evil", "ünïcödé ✓", "tab\there", "cr\rhere", "%s%n"},
		Env: []EnvVar{
			{"PLAIN", "v"}, {"SPACES", " a b  c "}, {"QUOTES", `it's "x"`},
			{"DOLLAR", "$HOME ${PATH} $(touch /tmp/pwned) `id`"}, {"HASH", "#x"}, {"EQ", "a=b=c"}, {"EMPTY", ""},
			{"TAB", "a\tb"}, {"lower.dot-dash", "ok"}, {"NAME#HASH", "h"},
		},
		RestartPolicy: RestartOnFailure,
	}
}

func hostileOptions() Options {
	return Options{
		Cluster:  "prod eu/1 ✓",
		LogGroup: "/team-a/reaper#exits", ExitLogPath: "/var/log/reaper-exits/exit.jsonl",
		MaxRestarts: 5, ShutdownDelay: 90 * time.Second,
		DockerRunArgs: []string{"--gpus", "all", "--label", `note=it's "fine"`},
		TagKeys:       model.TagKeys{Managed: "example.com/managed"},
	}
}

// testCluster is the cluster of the test Pods.
const testCluster = "prod-eu-1"

// testExitToken is an exit token as NewExitToken draws them.
const testExitToken = "9c0d6b1e2f3a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9012345678"

func podmanPod() Pod {
	return Pod{Namespace: "web", Name: "server", UID: "11111111-2222-4333-8444-555555555555",
		Container: "nginx", Image: "docker.io/library/nginx:1.27"}
}

var goldenCases = []struct {
	name string
	pod  func() Pod
	opts Options
}{
	{"basic", func() Pod { return jobPod(RestartNever) }, Options{Cluster: testCluster, ExitToken: testExitToken}},
	{"hostile", hostilePod, hostileOptions()},
	{"podman", podmanPod, Options{Cluster: testCluster, ContainerCLI: "podman"}},
}

// podGoldenCases are Pods of several containers: the seed's Job (an init
// container, then the regular one) and two regular containers with two
// sidecars.
var podGoldenCases = []struct {
	name string
	pod  func() Pod
	opts Options
}{
	{"seed-job", func() Pod { return seedPod(RestartNever) }, Options{Cluster: testCluster, ExitToken: testExitToken}},
	{"sidecars", func() Pod { return sidecarPod(RestartOnFailure, 45) }, Options{Cluster: testCluster, ExitToken: testExitToken}},
}

func TestGolden(t *testing.T) {
	t.Parallel()
	for _, tc := range slices.Concat(goldenCases, podGoldenCases) {
		got, err := Render(tc.pod(), tc.opts)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join("testdata", tc.name+".userdata.sh")
		if *update {
			if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (run go test ./pkg/userdata -update to create it)", err)
		}
		if got != string(want) {
			t.Errorf("%s: rendered user-data differs from %s (run go test ./pkg/userdata -update and review the diff)", tc.name, path)
		}
		if len(got) > MaxUserDataBytes && tc.name != "hostile" {
			t.Errorf("%s: user-data is %d bytes, over EC2's %d uncompressed", tc.name, len(got), MaxUserDataBytes)
		}
	}
}

// Every rendered script passes shellcheck: the user-data as bash, the
// wrapper (installed and source), the configurations it sources and the
// test doubles as POSIX sh.
func TestShellcheck(t *testing.T) {
	t.Parallel()
	bash := map[string]string{}
	sh := map[string]string{"wrapper": Wrapper(), "wrapper-source": wrapperScript}
	for _, tc := range slices.Concat(goldenCases, podGoldenCases) {
		ud, err := Render(tc.pod(), tc.opts)
		if err != nil {
			t.Fatal(err)
		}
		bash[tc.name+".userdata"] = ud
		conf, err := WrapperConfig(tc.pod(), tc.opts)
		if err != nil {
			t.Fatal(err)
		}
		sh[tc.name+".conf"] = conf
	}
	ents, err := os.ReadDir("testdata/doubles")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("testdata/doubles", e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		sh["double-"+e.Name()] = string(b)
	}
	shellcheck(t, "bash", bash)
	shellcheck(t, "sh", sh)
}

// runUserdata runs the user-data with bash under a scratch root, with the
// systemctl, agent and shutdown doubles on PATH.
func runUserdata(t *testing.T, script, root, fake string) (int, string) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "user-data")
	writeFile(t, p, script)
	cmd := exec.Command("bash", p)
	cmd.Env = []string{"PATH=" + binDir + string(os.PathListSeparator) + os.Getenv("PATH"),
		"REAPER_ROOT=" + root, "FAKE_DIR=" + fake, "LC_ALL=C"}
	out, err := cmd.CombinedOutput()
	if err != nil && cmd.ProcessState == nil {
		t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode(), string(out)
}

func checkFile(t *testing.T, path, want string, mode os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Error(err)
		return
	}
	if string(b) != want {
		t.Errorf("%s differs from what the API renders:\n got: %q\nwant: %q", path, b, want)
	}
	if fi, err := os.Stat(path); err == nil && fi.Mode().Perm() != mode {
		t.Errorf("%s has mode %v, want %v", path, fi.Mode().Perm(), mode)
	}
}

// The user-data, run for real, installs exactly the pieces the API renders,
// starts the agent and the unit, and the installed wrapper then reports.
func TestUserdataInstalls(t *testing.T) {
	t.Parallel()
	for _, tc := range goldenCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			root, fake := filepath.Join(dir, "root"), filepath.Join(dir, "fake")
			pod, opts := tc.pod(), tc.opts
			opts.ExitLogPath = filepath.Join(dir, "log", "exit.log")
			script, err := Render(pod, opts)
			if err != nil {
				t.Fatal(err)
			}
			writeFile(t, filepath.Join(fake, "events"), "")
			status, out := runUserdata(t, script, root, fake)
			if status != 0 {
				t.Fatalf("user-data exited %d:\n%s", status, out)
			}
			conf, _ := WrapperConfig(pod, opts)
			env, _ := EnvFile(pod)
			unit, _ := Unit(opts)
			agent, _ := AgentConfig(opts)
			checkFile(t, filepath.Join(root, WrapperPath), Wrapper(), 0o755)
			checkFile(t, filepath.Join(root, ConfigPath), conf, 0o600)
			if env != "" {
				checkFile(t, filepath.Join(root, EnvFilePath), env, 0o600)
			} else if _, err := os.Stat(filepath.Join(root, EnvFilePath)); err == nil {
				t.Errorf("%s written for a Pod without environment", EnvFilePath)
			}
			checkFile(t, filepath.Join(root, UnitPath), unit, 0o644)
			checkFile(t, filepath.Join(root, AgentConfigPath), string(agent), 0o644)
			checkFile(t, filepath.Join(root, opts.ExitLogPath), "", 0o644)

			h := &harness{t: t}
			h.fake = fake
			var want []string
			if opts.ContainerCLI == "" {
				checkFile(t, filepath.Join(root, "etc/docker/daemon.json"), "{\"live-restore\": true}\n", 0o644)
				want = append(want, "systemctl try-reload-or-restart docker.service")
			} else if _, err := os.Stat(filepath.Join(root, "etc/docker/daemon.json")); err == nil {
				t.Errorf("daemon.json written for %s", opts.ContainerCLI)
			}
			want = append(want,
				"amazon-cloudwatch-agent-ctl -a append-config -m ec2 -s -c file:"+filepath.Join(root, AgentConfigPath),
				"systemctl daemon-reload", "systemctl enable "+UnitName, "systemctl start --no-block "+UnitName)
			equalStrings(t, "calls", h.events(), want)

			// The installed wrapper, with the installed configuration.
			if opts.ContainerCLI != "" {
				return // the double speaks docker's name only
			}
			h = newHarness(t, pod, opts, fakeRun{Exit: 0})
			h.conf = filepath.Join(root, ConfigPath)
			installed, _ := os.ReadFile(filepath.Join(root, WrapperPath))
			h.run("sh", string(installed))
			runArgs, _ := RunArgs(pod, opts)
			equalStrings(t, "docker run argv", h.argv(1), append([]string{"-d", "--name", "reaper-" + pod.Container + "-0"}, runArgs...))
			lines := h.lines()
			if len(lines) != 1 || lines[0]["exitCode"] != json.Number("0") {
				t.Errorf("exit lines: %v", lines)
			}
			// The launch's exit token, from the configuration the
			// user-data wrote for root alone, is in the line.
			if token, _ := lines[0]["token"].(string); token != opts.ExitToken {
				t.Errorf("exit line token %q, want %q", token, opts.ExitToken)
			}
		})
	}
}

// An existing daemon.json is merged, not replaced.
func TestUserdataMergesDaemonJSON(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	root, fake := filepath.Join(dir, "root"), filepath.Join(dir, "fake")
	orig := `{"log-driver": "json-file", "live-restore": false, "default-ulimits": {"nofile": {"Name": "nofile", "Hard": 65536, "Soft": 65536}}}`
	writeFile(t, filepath.Join(root, "etc/docker/daemon.json"), orig)
	writeFile(t, filepath.Join(fake, "events"), "")
	script, err := Render(jobPod(RestartNever), Options{Cluster: testCluster, ExitLogPath: filepath.Join(dir, "exit.log")})
	if err != nil {
		t.Fatal(err)
	}
	if status, out := runUserdata(t, script, root, fake); status != 0 {
		t.Fatalf("user-data exited %d:\n%s", status, out)
	}
	b, err := os.ReadFile(filepath.Join(root, "etc/docker/daemon.json"))
	if err != nil {
		t.Fatal(err)
	}
	_, errJQ := exec.LookPath("jq")
	_, errPy := exec.LookPath("python3")
	if errJQ != nil && errPy != nil {
		if string(b) != orig {
			t.Errorf("daemon.json changed without jq or python3: %s", b)
		}
		return
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("merged daemon.json is not JSON: %v\n%s", err, b)
	}
	if got["live-restore"] != true || got["log-driver"] != "json-file" || got["default-ulimits"] == nil {
		t.Errorf("merged daemon.json lost settings or live-restore: %s", b)
	}
}

// A failing step powers the host off after the delay instead of leaving it
// idle, and the unit is not started.
func TestUserdataFailurePowersOff(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	root, fake := filepath.Join(dir, "root"), filepath.Join(dir, "fake")
	writeFile(t, filepath.Join(fake, "events"), "")
	writeFile(t, filepath.Join(fake, "ctl_fail"), "")
	script, err := Render(jobPod(RestartNever), Options{Cluster: testCluster, ExitLogPath: filepath.Join(dir, "exit.log"), ShutdownDelay: 90 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	status, out := runUserdata(t, script, root, fake)
	if status == 0 {
		t.Fatalf("user-data succeeded although the agent failed:\n%s", out)
	}
	h := &harness{t: t, fake: fake}
	equalStrings(t, "calls", h.events("shutdown", "systemctl enable", "systemctl start"),
		[]string{"shutdown -P +2 reaper: user-data failed"})
}

func TestValidate(t *testing.T) {
	t.Parallel()
	ok := jobPod(RestartNever)
	for _, tc := range []struct {
		name string
		edit func(*Pod, *Options)
		want string
	}{
		{"namespace", func(p *Pod, _ *Options) { p.Namespace = "Bad_NS" }, "namespace"},
		{"name", func(p *Pod, _ *Options) { p.Name = "a..b" }, "name"},
		{"name quote", func(p *Pod, _ *Options) { p.Name = "x'y" }, "name"},
		{"uid", func(p *Pod, _ *Options) { p.UID = "not-a-uid" }, "uid"},
		{"container", func(p *Pod, _ *Options) { p.Container = "Main" }, "container"},
		{"image empty", func(p *Pod, _ *Options) { p.Image = "" }, "image is empty"},
		{"image flag", func(p *Pod, _ *Options) { p.Image = "--privileged" }, "image"},
		{"image space", func(p *Pod, _ *Options) { p.Image = "a b" }, "image"},
		{"policy", func(p *Pod, _ *Options) { p.RestartPolicy = "Sometimes" }, "restartPolicy"},
		{"command0", func(p *Pod, _ *Options) { p.Command = []string{""} }, "command[0]"},
		{"nul", func(p *Pod, _ *Options) { p.Args = []string{"a\x00b"} }, "NUL"},
		{"utf8", func(p *Pod, _ *Options) { p.Env = []EnvVar{{"A", "\xff"}} }, "UTF-8"},
		{"env name", func(p *Pod, _ *Options) { p.Env = []EnvVar{{"A B", "x"}} }, "env[0] name"},
		{"env name eq", func(p *Pod, _ *Options) { p.Env = []EnvVar{{"A=B", "x"}} }, "env[0] name"},
		{"env name hash", func(p *Pod, _ *Options) { p.Env = []EnvVar{{"#A", "x"}} }, `env[0] name "#A" starts with '#'`},
		{"cluster missing", func(_ *Pod, o *Options) { o.Cluster = "" }, "cluster is empty"},
		{"cluster aws", func(_ *Pod, o *Options) { o.Cluster = "AWS:eks" }, `cluster "AWS:eks" starts with aws:`},
		{"cluster long", func(_ *Pod, o *Options) { o.Cluster = strings.Repeat("é", 257) }, "cluster name has 257 characters"},
		{"cluster utf8", func(_ *Pod, o *Options) { o.Cluster = "a\xffb" }, `cluster "a\xffb" is not valid UTF-8`},
		{"cluster control", func(_ *Pod, o *Options) { o.Cluster = "a\nb" }, "cluster \"a\\nb\" has control characters"},
		{"cluster space", func(_ *Pod, o *Options) { o.Cluster = "prod " }, `cluster "prod " has control characters or leading or trailing spaces`},
		{"log group", func(_ *Pod, o *Options) { o.LogGroup = "bad group" }, "log group"},
		{"exit log", func(_ *Pod, o *Options) { o.ExitLogPath = "relative.log" }, "exit log path"},
		{"exit log glob", func(_ *Pod, o *Options) { o.ExitLogPath = "/var/log/*.log" }, "exit log path"},
		{"cli", func(_ *Pod, o *Options) { o.ContainerCLI = "docker; rm" }, "container CLI"},
		{"max restarts", func(_ *Pod, o *Options) { o.MaxRestarts = -1 }, "max restarts"},
		{"delay", func(_ *Pod, o *Options) { o.ShutdownDelay = -time.Second }, "shutdown delay"},
		{"shutdown mode", func(_ *Pod, o *Options) { o.ShutdownMode = "never" }, `shutdown mode "never" is not when-shipped, when-pod-written or after-delay`},
		{"pod-written mode without its tag", func(_ *Pod, o *Options) { o.ShutdownMode = ShutdownWhenPodWritten }, "needs TagKeys.PodWritten"},
		{"pod-written mode with a slash in a key", func(_ *Pod, o *Options) {
			o.ShutdownMode, o.TagKeys.PodWritten = ShutdownWhenPodWritten, "reaper.io:pod-written"
		}, `tag key "reaper.io/managed" cannot be`},
		{"tag key", func(_ *Pod, o *Options) { o.TagKeys.PodUID = "aws:uid" }, "tag key"},
		{"cluster tag key", func(_ *Pod, o *Options) { o.TagKeys.Cluster = "aws:cluster" }, `tag key "aws:cluster"`},
		{"run arg rm", func(_ *Pod, o *Options) { o.DockerRunArgs = []string{"--rm"} }, "owns --rm"},
		{"run arg restart", func(_ *Pod, o *Options) { o.DockerRunArgs = []string{"--restart=always"} }, "owns --restart"},
	} {
		p, o := ok, Options{Cluster: testCluster}
		tc.edit(&p, &o)
		_, err := Render(p, o)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Render error = %v, want one mentioning %q", tc.name, err, tc.want)
		}
	}
	// A cluster name that does not fit a log group name needs the group
	// named.
	for _, c := range []string{testCluster, strings.Repeat("é", 256), "prod eu/1 ✓", "a:aws:b"} {
		if _, err := Render(ok, Options{Cluster: c, LogGroup: "/reaper/exits"}); err != nil {
			t.Errorf("valid pod in cluster %q rejected: %v", c, err)
		}
	}
	if _, err := Render(ok, Options{Cluster: "prod eu"}); err == nil || !strings.Contains(err.Error(), `log group "/reaper/prod eu/exits"`) {
		t.Errorf("cluster that fits no log group name: %v", err)
	}
	// Every problem is reported at once.
	err := Pod{}.Validate()
	for _, w := range []string{"namespace", "name", "uid", "container", "image"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("Pod{}.Validate() = %v, want it to mention %s", err, w)
		}
	}
}

// Host networking hands the workload the instance role's credentials
// through IMDS: every entry point refuses it, in each spelling docker and
// podman take, unless AllowHostNetwork says it is meant. Other networks, and
// "host" as the value of another flag, pass.
func TestHostNetwork(t *testing.T) {
	t.Parallel()
	p := jobPod(RestartNever)
	for _, args := range [][]string{
		{"--network=host"}, {"--net=host"}, {"--network", "host"}, {"--net", "host"},
		{"--gpus", "all", "--network", "host"}, {"--network=bridge", "--net=host"},
		{"--network=ns:/proc/1/ns/net"},
	} {
		opts := Options{Cluster: testCluster, DockerRunArgs: args}
		_, errRender := Render(p, opts)
		_, errLaunch := Launch(p, opts)
		_, errArgs := RunArgs(p, opts)
		_, errConf := WrapperConfig(p, opts)
		for name, err := range map[string]error{"Render": errRender, "Launch": errLaunch, "RunArgs": errArgs, "WrapperConfig": errConf} {
			if err == nil || !strings.Contains(err.Error(), "host's network") || !strings.Contains(err.Error(), "instance role's credentials from IMDS") ||
				!strings.Contains(err.Error(), "AllowHostNetwork") {
				t.Errorf("%s with docker run args %q: error = %v, want a refusal naming IMDS credentials and AllowHostNetwork", name, args, err)
			}
		}
		opts.AllowHostNetwork = true
		ls, err := Launch(p, opts)
		if err != nil {
			t.Errorf("Launch with %q and AllowHostNetwork: %v", args, err)
			continue
		}
		runArgs, _ := RunArgs(p, opts)
		if !strings.Contains(strings.Join(runArgs, " "), strings.Join(args, " ")) || ls.MetadataHTTPPutResponseHopLimit != 1 {
			t.Errorf("with AllowHostNetwork: run args %q lack %q, or hop limit %d", runArgs, args, ls.MetadataHTTPPutResponseHopLimit)
		}
	}
	for _, args := range [][]string{
		{"--network=bridge"}, {"--network", "my-net"}, {"--net=none"}, {"--label", "host"}, {"--hostname", "host"},
		{"--network"}, {"--add-host", "host:10.0.0.1"}, {"--network-alias", "host"},
	} {
		if _, err := Launch(p, Options{Cluster: testCluster, DockerRunArgs: args}); err != nil {
			t.Errorf("Launch with docker run args %q: %v", args, err)
		}
	}
}

func TestDefaultsAndPolicy(t *testing.T) {
	t.Parallel()
	p := podmanPod()
	conf, err := WrapperConfig(p, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"REAPER_RESTART_POLICY='Always'\n", "REAPER_SHUTDOWN_DELAY=600\n", "REAPER_SHUTDOWN_MODE='when-shipped'\n",
		"REAPER_EXIT_LOG='/var/log/reaper/exit.log'\n", "REAPER_CLI='docker'\n", "REAPER_MAX_RESTARTS=0\n"} {
		if !strings.Contains(conf, want) {
			t.Errorf("config lacks %q:\n%s", want, conf)
		}
	}
	conf, _ = WrapperConfig(p, Options{ShutdownDelay: 1500 * time.Millisecond, ShutdownMode: ShutdownAfterDelay})
	if !strings.Contains(conf, "REAPER_SHUTDOWN_DELAY=2\n") || !strings.Contains(conf, "REAPER_SHUTDOWN_MODE='after-delay'\n") {
		t.Errorf("shutdown delay not rounded up to whole seconds, or mode lost:\n%s", conf)
	}
}

func TestRunArgs(t *testing.T) {
	t.Parallel()
	base := []string{"--label", "reaper.io/pod-namespace=web", "--label", "reaper.io/pod-name=server",
		"--label", "reaper.io/pod-uid=11111111-2222-4333-8444-555555555555", "--label", "reaper.io/container=nginx"}
	for _, tc := range []struct {
		name string
		edit func(*Pod)
		opts Options
		want []string
	}{
		{"image only", func(*Pod) {}, Options{}, []string{"docker.io/library/nginx:1.27"}},
		{"args replace cmd", func(p *Pod) { p.Args = []string{"-g", "daemon off;"} }, Options{},
			[]string{"docker.io/library/nginx:1.27", "-g", "daemon off;"}},
		{"command replaces entrypoint", func(p *Pod) { p.Command = []string{"/bin/sh", "-c"}; p.Args = []string{"exit 0"} }, Options{},
			[]string{"--entrypoint", "/bin/sh", "docker.io/library/nginx:1.27", "-c", "exit 0"}},
		{"env and extra flags", func(p *Pod) { p.Env = []EnvVar{{"A", "1"}, {"B", "2"}} }, Options{DockerRunArgs: []string{"--gpus", "all"}},
			[]string{"--env-file", EnvFilePath, "--gpus", "all", "docker.io/library/nginx:1.27"}},
	} {
		p := podmanPod()
		tc.edit(&p)
		got, err := RunArgs(p, tc.opts)
		if err != nil {
			t.Fatal(err)
		}
		equalStrings(t, tc.name, got, append(append([]string{}, base...), tc.want...))
	}
	p := podmanPod()
	p.Env = []EnvVar{{"A", "1"}, {"B", " 2 "}, {"C#", "#3"}, {"D", ""}}
	env, err := EnvFile(p)
	if err != nil || env != "A=1\nB= 2 \nC#=#3\nD=\n" {
		t.Errorf("EnvFile = %q, %v", env, err)
	}
}

// A line break in an env value is refused by every entry point, naming the
// variable: docker's --env-file cannot carry it, and the environment goes
// nowhere else. Command and args keep theirs.
func TestEnvLineBreak(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"x\ny", "z\r", "\r\n", "-----BEGIN KEY-----\nMII\n-----END KEY-----\n"} {
		p := podmanPod()
		p.Env = []EnvVar{{"A", "1"}, {"PEM", v}}
		want := "env[1] (PEM) value contains a line break"
		opts := Options{Cluster: testCluster}
		_, errRender := Render(p, opts)
		_, errLaunch := Launch(p, opts)
		_, errEnv := EnvFile(p)
		_, errArgs := RunArgs(p, opts)
		_, errConf := WrapperConfig(p, opts)
		for name, err := range map[string]error{"Validate": p.Validate(), "Render": errRender, "Launch": errLaunch,
			"EnvFile": errEnv, "RunArgs": errArgs, "WrapperConfig": errConf} {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("%s with PEM=%q: error = %v, want %q", name, v, err, want)
			}
		}
	}
	p := podmanPod()
	p.Command = []string{"/bin/sh", "-c", "printf '%s\n' \"$1\"\r\n"}
	p.Args = []string{"two\nlines"}
	if _, err := Render(p, Options{Cluster: testCluster}); err != nil {
		t.Errorf("line breaks in command and args rejected: %v", err)
	}
}

func TestTags(t *testing.T) {
	t.Parallel()
	p := jobPod(RestartNever)
	got := Tags(p, Options{Cluster: testCluster})
	want := map[string]string{"reaper.io/managed": "true", "reaper.io/pod-namespace": "batch",
		"reaper.io/pod-name": "installer-7xk2p", "reaper.io/pod-uid": "6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b",
		"reaper.io/cluster": testCluster}
	if len(got) != len(want) {
		t.Errorf("Tags = %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("Tags[%s] = %q, want %q", k, got[k], v)
		}
	}
	got = Tags(p, Options{Cluster: testCluster, TagKeys: model.TagKeys{Managed: "x/managed", PodUID: "x/uid", Cluster: "x/cluster"}})
	if len(got) != 5 || got["x/managed"] != "true" || got["x/uid"] != p.UID || got["reaper.io/pod-name"] != p.Name ||
		got["x/cluster"] != testCluster {
		t.Errorf("Tags with custom keys = %v", got)
	}
}

// configToken is the exit token the wrapper's configuration in a user-data
// carries, as sh reads it.
var configToken = regexp.MustCompile(`(?m)^REAPER_EXIT_TOKEN='([^']*)'$`)

// tokenOf is the exit token of the user-data script, failing when there is
// not exactly one.
func tokenOf(t *testing.T, script string) string {
	t.Helper()
	m := configToken.FindAllStringSubmatch(script, -1)
	if len(m) != 1 {
		t.Fatalf("%d exit token settings in the user-data, want 1", len(m))
	}
	return m[0][1]
}

// The exit token: Launch draws a new one for every launch, puts it in the
// wrapper's configuration and its hash in the tags, and never anywhere
// else; a token given in the options is used as it is; Tags and Render
// without one give neither; a malformed one is refused without being
// quoted; and with the instance's tags in its metadata the token's tag key
// must be one the metadata can show.
func TestExitToken(t *testing.T) {
	t.Parallel()
	p := jobPod(RestartNever)
	first, err := Launch(p, Options{Cluster: testCluster})
	if err != nil {
		t.Fatal(err)
	}
	second, err := Launch(p, Options{Cluster: testCluster})
	if err != nil {
		t.Fatal(err)
	}
	token := tokenOf(t, first.UserData)
	if !model.ValidExitToken(token) || tokenOf(t, second.UserData) == token {
		t.Errorf("launches drew the tokens %q and %q: want two valid, different ones", token, tokenOf(t, second.UserData))
	}
	if got := first.Tags[model.DefaultTagExitToken]; got != model.ExitTokenHash(token) || len(first.Tags) != 6 {
		t.Errorf("launch tags %v, want %s=%s among 6", first.Tags, model.DefaultTagExitToken, model.ExitTokenHash(token))
	}
	if strings.Count(first.UserData, token) != 1 {
		t.Errorf("the user-data carries the token %d times, want once (the configuration)", strings.Count(first.UserData, token))
	}
	if js, _ := json.Marshal(first.Tags); strings.Contains(string(js), token) {
		t.Errorf("the tags carry the token: %s", js)
	}

	given, err := Launch(p, Options{Cluster: testCluster, ExitToken: testExitToken, TagKeys: model.TagKeys{ExitToken: "x/exit-token"}})
	if err != nil {
		t.Fatal(err)
	}
	if tokenOf(t, given.UserData) != testExitToken || given.Tags["x/exit-token"] != model.ExitTokenHash(testExitToken) {
		t.Errorf("launch with a token: user-data token %q, tags %v", tokenOf(t, given.UserData), given.Tags)
	}

	none, err := Render(p, Options{Cluster: testCluster})
	if err != nil {
		t.Fatal(err)
	}
	if tokenOf(t, none) != "" {
		t.Errorf("Render without a token rendered %q", tokenOf(t, none))
	}
	if _, ok := Tags(p, Options{Cluster: testCluster})[model.DefaultTagExitToken]; ok {
		t.Errorf("Tags without a token gave its tag")
	}

	for _, bad := range []string{testExitToken[:31], testExitToken + "'; reboot; '" + testExitToken, strings.Repeat(testExitToken, 3), testExitToken[:40] + " x"} {
		_, errLaunch := Launch(p, Options{Cluster: testCluster, ExitToken: bad})
		_, errConfig := WrapperConfig(p, Options{ExitToken: bad})
		for name, err := range map[string]error{"Launch": errLaunch, "WrapperConfig": errConfig} {
			if err == nil || !strings.Contains(err.Error(), "exit token") || strings.Contains(err.Error(), bad[:20]) {
				t.Errorf("%s with exit token %q: %v, want an error that does not quote it", name, bad, err)
			}
		}
	}

	keys := model.TagKeys{Managed: "reaper.io:managed", Cluster: "reaper.io:cluster", PodNamespace: "reaper.io:pod-namespace",
		PodName: "reaper.io:pod-name", PodUID: "reaper.io:pod-uid", ClusterUID: "reaper.io:cluster-uid", PodWritten: "reaper.io:pod-written"}
	if _, err := Launch(p, Options{Cluster: testCluster, ShutdownMode: ShutdownWhenPodWritten, TagKeys: keys}); err == nil ||
		!strings.Contains(err.Error(), `tag key "reaper.io/exit-token-sha256" cannot be`) {
		t.Errorf("when-pod-written with the default exit-token key: %v, want it refused", err)
	}
}

// testClusterUID is the UID of the test cluster's kube-system namespace.
const testClusterUID = "3f2a9c1e-7b4d-4e8f-9a6b-1c2d3e4f5a6b"

// The cluster identity tag: the UID of the cluster's kube-system namespace,
// under its key when set, nothing when not (launch still works, but Reaper
// never treats such an instance as an orphan). It must be a UID as the
// apiserver writes it: Reaper compares it byte for byte.
func TestClusterUIDTag(t *testing.T) {
	t.Parallel()
	p := jobPod(RestartNever)
	ls, err := Launch(p, Options{Cluster: testCluster, ClusterUID: testClusterUID})
	if err != nil {
		t.Fatal(err)
	}
	if ls.Tags["reaper.io/cluster-uid"] != testClusterUID || len(ls.Tags) != 7 {
		t.Errorf("launch tags %v, want reaper.io/cluster-uid=%s among 7 (with the exit token's)", ls.Tags, testClusterUID)
	}
	tags := Tags(p, Options{Cluster: testCluster, ClusterUID: testClusterUID, TagKeys: model.TagKeys{ClusterUID: "x/cluster-uid"}})
	if tags["x/cluster-uid"] != testClusterUID || tags["reaper.io/cluster-uid"] != "" {
		t.Errorf("Tags with a custom cluster identity key: %v", tags)
	}
	ls, err = Launch(p, Options{Cluster: testCluster})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := ls.Tags["reaper.io/cluster-uid"]; ok || len(ls.Tags) != 6 {
		t.Errorf("launch tags without a cluster UID: %v, want no identity tag", ls.Tags)
	}
	for _, bad := range []string{"kube-system", "3F2A9C1E-7B4D-4E8F-9A6B-1C2D3E4F5A6B", " " + testClusterUID, testClusterUID + "\n", "3f2a9c1e7b4d4e8f9a6b1c2d3e4f5a6b"} {
		_, errLaunch := Launch(p, Options{Cluster: testCluster, ClusterUID: bad})
		_, errRender := Render(p, Options{Cluster: testCluster, ClusterUID: bad})
		for name, err := range map[string]error{"Launch": errLaunch, "Render": errRender} {
			if err == nil || !strings.Contains(err.Error(), "cluster UID") || !strings.Contains(err.Error(), "kube-system") {
				t.Errorf("%s with cluster UID %q: %v, want an error naming the kube-system namespace's UID", name, bad, err)
			}
		}
	}
	if _, err := Launch(p, Options{Cluster: testCluster, ClusterUID: testClusterUID, TagKeys: model.TagKeys{ClusterUID: "aws:uid"}}); err == nil ||
		!strings.Contains(err.Error(), `tag key "aws:uid"`) {
		t.Errorf("Launch with cluster identity tag key aws:uid: %v, want an error", err)
	}
}

func TestAgentConfig(t *testing.T) {
	t.Parallel()
	if _, err := AgentConfig(Options{}); err == nil || !strings.Contains(err.Error(), "no log group") {
		t.Fatalf("agent config with neither cluster nor log group: %v", err)
	}
	b, err := AgentConfig(Options{Cluster: "prod"})
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Logs struct {
			LogsCollected struct {
				Files struct {
					CollectList []map[string]any `json:"collect_list"`
				} `json:"files"`
			} `json:"logs_collected"`
			ForceFlushInterval float64 `json:"force_flush_interval"`
		} `json:"logs"`
	}
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	l := c.Logs.LogsCollected.Files.CollectList
	if c.Logs.ForceFlushInterval != 1 || len(l) != 1 || l[0]["file_path"] != DefaultExitLogPath ||
		l[0]["log_group_name"] != "/reaper/prod/exits" || l[0]["log_stream_name"] != "{instance_id}" {
		t.Errorf("agent config:\n%s", b)
	}
	// Nothing else: logs.concurrency or a multi_line_start_pattern would
	// change what the agent's saved offset tells the wrapper.
	var top map[string]map[string]any
	if err := json.Unmarshal(b, &top); err != nil {
		t.Fatal(err)
	}
	if len(top) != 1 || len(top["logs"]) != 2 || len(l) != 1 || len(l[0]) != 3 {
		t.Errorf("agent config has settings beyond the file, group, stream and flush interval:\n%s", b)
	}
}

func TestUnit(t *testing.T) {
	t.Parallel()
	for cli, want := range map[string]string{"": "docker.service", "/usr/bin/nerdctl": "containerd.service", "podman": ""} {
		u, err := Unit(Options{ContainerCLI: cli})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(u, "Wants=network-online.target"+strings.TrimSuffix(" "+want, " ")+"\n") ||
			strings.Contains(u, "Requires=") || strings.Contains(u, "BindsTo=") {
			t.Errorf("unit for %q:\n%s", cli, u)
		}
	}
}

// systemd restarts a killed wrapper (no trap runs on SIGKILL: no exit line,
// no power-off), after a pause, and never one that exited (it exits only
// once it has powered the host off). The OOM killer picks the workload
// before the wrapper.
func TestUnitRestartsKilledWrapper(t *testing.T) {
	t.Parallel()
	u, err := Unit(Options{})
	if err != nil {
		t.Fatal(err)
	}
	svc := unitSettings(t, u, "Service")
	if svc["Restart"] != "on-failure" || svc["RestartSec"] != "5" || svc["OOMScoreAdjust"] != "-900" {
		t.Errorf("unit [Service] Restart=%q RestartSec=%q OOMScoreAdjust=%q, want on-failure, 5, -900:\n%s",
			svc["Restart"], svc["RestartSec"], svc["OOMScoreAdjust"], u)
	}
	if !systemdRestarts(t, svc["Restart"], -1, syscall.SIGKILL) || systemdRestarts(t, svc["Restart"], 0, 0) {
		t.Errorf("Restart=%s: want a restart after SIGKILL and none after exit 0", svc["Restart"])
	}
}

func TestLaunch(t *testing.T) {
	t.Parallel()
	p := jobPod(RestartNever)
	opts := Options{Cluster: testCluster}
	ls, err := Launch(p, opts)
	if err != nil {
		t.Fatal(err)
	}
	dec, _ := base64.StdEncoding.DecodeString(ls.UserDataBase64)
	if string(dec) != ls.UserData || ls.InstanceInitiatedShutdownBehavior != "terminate" ||
		ls.MetadataHTTPTokens != "required" || ls.Tags["reaper.io/pod-uid"] != p.UID {
		t.Errorf("launch settings: %+v", ls)
	}
	// Hop limit 1: a container behind a bridge network gets no IMDS token.
	if ls.MetadataHTTPPutResponseHopLimit != 1 {
		t.Errorf("MetadataHTTPPutResponseHopLimit = %d, want 1", ls.MetadataHTTPPutResponseHopLimit)
	}
	if ls.Tags["reaper.io/cluster"] != testCluster {
		t.Errorf("launch tags %v lack reaper.io/cluster=%s", ls.Tags, testCluster)
	}
	var asJSON map[string]any
	js, _ := json.Marshal(ls)
	if err := json.Unmarshal(js, &asJSON); err != nil || asJSON["metadataHttpPutResponseHopLimit"] != 1.0 {
		t.Errorf("launch settings JSON: metadataHttpPutResponseHopLimit = %v, want 1 (%v)", asJSON["metadataHttpPutResponseHopLimit"], err)
	}
	custom, err := Launch(p, Options{Cluster: "other", TagKeys: model.TagKeys{Cluster: "example.com/cluster"}})
	if err != nil || custom.Tags["example.com/cluster"] != "other" || custom.Tags["reaper.io/cluster"] != "" {
		t.Errorf("launch with a custom cluster tag key: %v, %v", custom.Tags, err)
	}
	if _, err := Launch(p, Options{}); err == nil || !strings.Contains(err.Error(), "cluster is empty") {
		t.Errorf("Launch without a cluster: %v, want an error", err)
	}

	// Over 16 KiB: gzip, which cloud-init unpacks.
	p.Env = []EnvVar{{"BIG", strings.Repeat("compressible ", 1000)}}
	ls, err = Launch(p, opts)
	if err != nil {
		t.Fatal(err)
	}
	dec, _ = base64.StdEncoding.DecodeString(ls.UserDataBase64)
	zr, err := gzip.NewReader(bytes.NewReader(dec))
	if err != nil {
		t.Fatalf("large user-data not gzipped: %v", err)
	}
	if un, _ := io.ReadAll(zr); string(un) != ls.UserData || len(dec) > MaxUserDataBytes {
		t.Errorf("gzipped user-data does not round-trip or is too big (%d)", len(dec))
	}

	// Too big even compressed.
	noise := make([]byte, 20000)
	_, _ = rand.Read(noise)
	p.Env = []EnvVar{{"NOISE", hex.EncodeToString(noise)}}
	if _, err := Launch(p, opts); err == nil || !strings.Contains(err.Error(), "over EC2") {
		t.Errorf("Launch with 40 KB of noise: %v", err)
	}
}

func TestHeredocDelimiter(t *testing.T) {
	t.Parallel()
	if d := heredoc("a\nREAPER_EOF\nREAPER_EOF_\nb\n"); d != "REAPER_EOF__" {
		t.Errorf("heredoc delimiter = %q", d)
	}
	if d := heredoc("x REAPER_EOF\n"); d != "REAPER_EOF" {
		t.Errorf("heredoc delimiter = %q", d)
	}
}

// ShutdownWhenPodWritten launches with the instance's tags in its metadata,
// where the host reads Reaper's tag, and tells the wrapper which tag.
func TestLaunchWhenPodWritten(t *testing.T) {
	t.Parallel()
	p := jobPod(RestartNever)
	ls, err := Launch(p, Options{Cluster: testCluster})
	if err != nil || ls.MetadataTags != "disabled" {
		t.Fatalf("default launch: metadata tags %q, %v", ls.MetadataTags, err)
	}
	keys := model.TagKeys{Managed: "reaper.io:managed", Cluster: "reaper.io:cluster", PodNamespace: "reaper.io:pod-namespace",
		PodName: "reaper.io:pod-name", PodUID: "reaper.io:pod-uid", ClusterUID: "reaper.io:cluster-uid", ExitToken: "reaper.io:exit-token-sha256",
		PodWritten: "reaper.io:pod-written"}
	ls, err = Launch(p, Options{Cluster: testCluster, ShutdownMode: ShutdownWhenPodWritten, TagKeys: keys})
	if err != nil {
		t.Fatal(err)
	}
	if ls.MetadataTags != "enabled" || ls.Tags["reaper.io:pod-uid"] != p.UID {
		t.Fatalf("launch settings %+v", ls)
	}
	for k := range ls.Tags {
		if !model.ValidMetadataTagKey(k) {
			t.Errorf("tag key %q cannot be in the instance metadata", k)
		}
	}
	if !strings.Contains(ls.UserData, "REAPER_POD_WRITTEN_TAG='reaper.io:pod-written'") {
		t.Errorf("the wrapper's configuration does not name the tag")
	}
}

// The user-data of a Pod of several containers, run for real, installs
// the wrapper (unpacked), the configuration and one environment file per
// container with an environment, and the installed wrapper runs the Pod.
func TestUserdataInstallsPod(t *testing.T) {
	t.Parallel()
	for _, tc := range podGoldenCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			root, fake := filepath.Join(dir, "root"), filepath.Join(dir, "fake")
			pod, opts := tc.pod(), tc.opts
			opts.ExitLogPath = filepath.Join(dir, "log", "exit.log")
			script, err := Render(pod, opts)
			if err != nil {
				t.Fatal(err)
			}
			writeFile(t, filepath.Join(fake, "events"), "")
			if status, out := runUserdata(t, script, root, fake); status != 0 {
				t.Fatalf("user-data exited %d:\n%s", status, out)
			}
			conf, _ := WrapperConfig(pod, opts)
			envs, err := EnvFiles(pod)
			if err != nil {
				t.Fatal(err)
			}
			checkFile(t, filepath.Join(root, WrapperPath), Wrapper(), 0o755)
			checkFile(t, filepath.Join(root, ConfigPath), conf, 0o600)
			for p, env := range envs {
				if !strings.HasPrefix(p, EnvDir+"/") {
					t.Errorf("environment file %s, want it under %s", p, EnvDir)
				}
				checkFile(t, filepath.Join(root, p), env, 0o600)
			}
			if len(envs) == 0 && tc.name == "seed-job" {
				t.Errorf("no environment files for %s", tc.name)
			}
			h := newHarness(t, pod, opts)
			h.conf = filepath.Join(root, ConfigPath)
			for _, c := range pod.containers() {
				h.named("reaper-"+c.Name+"-0", fakeRun{UntilStop: c.kind == kindSidecar})
			}
			installed, _ := os.ReadFile(filepath.Join(root, WrapperPath))
			h.run("sh", string(installed))
			lines := h.lines()
			if len(lines) != len(pod.containers()) {
				t.Errorf("exit lines: %v", lines)
			}
			for _, l := range lines {
				if token, _ := l["token"].(string); token != opts.ExitToken {
					t.Errorf("exit line token %q, want %q", token, opts.ExitToken)
				}
			}
		})
	}
}

// What a Pod of several containers may say, and what it is told.
func TestValidatePod(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		edit func(*Pod)
		want string
	}{
		{"both forms", func(p *Pod) { p.Image = "x" }, "single-container form"},
		{"no regular container", func(p *Pod) { p.Containers = nil }, "containers is empty"},
		{"name twice", func(p *Pod) { p.Containers[0].Name = "downloader" }, `containers[0] (downloader): name "downloader" is used twice`},
		{"bad name", func(p *Pod) { p.InitContainers[0].Name = "Down" }, `initContainers[0] (Down): name "Down" is not a DNS label`},
		{"image", func(p *Pod) { p.Containers[0].Image = "" }, "containers[0] (provisioner): image is empty"},
		{"env", func(p *Pod) { p.InitContainers[0].Env = []EnvVar{{"PEM", "a\nb"}} }, "initContainers[0] (downloader): env[0] (PEM) value contains a line break"},
		{"init policy", func(p *Pod) { p.InitContainers[0].RestartPolicy = RestartNever }, "an init container takes Always"},
		{"regular policy", func(p *Pod) { p.Containers[0].RestartPolicy = RestartAlways }, "a regular container follows the Pod's"},
		{"volume kind", func(p *Pod) { p.Volumes[0].EmptyDir = nil }, "only emptyDir volumes"},
		{"volume twice", func(p *Pod) { p.Volumes = append(p.Volumes, p.Volumes[0]) }, `name "work" is used twice`},
		{"unknown volume", func(p *Pod) { p.Containers[0].VolumeMounts[0].Name = "cache" }, `no emptyDir volume "cache"`},
		{"mount path colon", func(p *Pod) { p.Containers[0].VolumeMounts[0].MountPath = "/a:b" }, `mountPath "/a:b" must be absolute`},
		{"mount path relative", func(p *Pod) { p.Containers[0].VolumeMounts[0].MountPath = "work" }, `mountPath "work" must be absolute`},
		{"mount path dotdot", func(p *Pod) { p.Containers[0].VolumeMounts[0].MountPath = "/a/../etc" }, "must be absolute"},
		{"mounted twice", func(p *Pod) {
			p.Containers[0].VolumeMounts = append(p.Containers[0].VolumeMounts, VolumeMount{Name: "work", MountPath: "/work/"})
		}, "mounted twice"},
		{"message on a mount", func(p *Pod) { p.Containers[0].VolumeMounts[0].MountPath = DefaultTerminationMessagePath }, "mounted twice"},
		{"message policy", func(p *Pod) { p.Containers[0].TerminationMessagePolicy = "Always" }, "terminationMessagePolicy"},
		{"message path", func(p *Pod) { p.Containers[0].TerminationMessagePath = "relative" }, "terminationMessagePath"},
		{"grace", func(p *Pod) { g := int64(-1); p.TerminationGracePeriodSeconds = &g }, "terminationGracePeriodSeconds -1"},
	} {
		p := seedPod(RestartNever)
		tc.edit(&p)
		_, err := Render(p, Options{Cluster: testCluster})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Render error = %v, want one mentioning %q", tc.name, err, tc.want)
		}
	}
	if _, err := Render(seedPod(RestartNever), Options{Cluster: testCluster, PauseImage: "-x"}); err == nil || !strings.Contains(err.Error(), "pause image") {
		t.Errorf("a bad pause image: %v", err)
	}
}

// The configuration of a Pod of several containers: each container in
// spec order with its kind, its share of the termination messages, the
// grace, the volumes, and the pause container with the network flags the
// containers leave to it; with the host's network there is none.
func TestWrapperConfigPod(t *testing.T) {
	t.Parallel()
	pod := sidecarPod(RestartOnFailure, 45)
	opts := Options{DockerRunArgs: []string{"--gpus", "all", "--network", "my-net"}}
	conf, err := WrapperConfig(pod, opts)
	if err != nil {
		t.Fatal(err)
	}
	got := sourceConf(t, conf, "REAPER_CONTAINERS", "REAPER_C1_KIND", "REAPER_C2_NAME", "REAPER_C3_KIND", "REAPER_C4_MSG",
		"REAPER_GRACE", "REAPER_MSG_MAX", "REAPER_VOLUMES", "REAPER_PAUSE_IMAGE")
	equalStrings(t, "configuration", got, []string{"4", "sidecar", "logger", "main", "FallbackToLogsOnError", "45", "3072", "logs", DefaultPauseImage})
	if !strings.Contains(conf, "--network my-net registry.k8s.io/pause:3.10") {
		t.Errorf("the pause container does not get the network flags:\n%s", conf)
	}
	args, err := ContainerRunArgs(pod, opts, "logger")
	if err != nil {
		t.Fatal(err)
	}
	equalStrings(t, "logger's run args", args, []string{
		"--label", "reaper.io/pod-namespace=web", "--label", "reaper.io/pod-name=api-5d8f7",
		"--label", "reaper.io/pod-uid=2c3d4e5f-6a7b-4c8d-9e0f-1a2b3c4d5e6f", "--label", "reaper.io/container=logger",
		"-v", StateDir + "/volumes/logs:/var/log/app:ro", "-v", StateDir + "/c/logger/termination-log:/dev/termination-log",
		"--network", "container:reaper-pause", "--gpus", "all", "fluent/fluent-bit:3.1",
	})
	if a, _ := RunArgs(pod, opts); len(a) == 0 || !slices.Contains(a, "reaper.io/container=api") {
		t.Errorf("RunArgs gives the first regular container's: %q", a)
	}
	if _, err := ContainerRunArgs(pod, opts, "nope"); err == nil {
		t.Errorf("ContainerRunArgs of an unknown container: no error")
	}

	host := Options{DockerRunArgs: []string{"--network=host"}, AllowHostNetwork: true}
	conf, err = WrapperConfig(pod, host)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(conf, "REAPER_PAUSE") || !strings.Contains(conf, "--network=host") || strings.Contains(conf, "container:reaper-pause") {
		t.Errorf("with the host's network: no pause container, every container on the host's:\n%s", conf)
	}
	if _, err := WrapperConfig(pod, Options{DockerRunArgs: []string{"--network=host"}}); err == nil || !strings.Contains(err.Error(), "AllowHostNetwork") {
		t.Errorf("host network without AllowHostNetwork: %v", err)
	}
	// One container in the spec form: no pause container, its files in the
	// state directory itself, a termination message.
	one := seedPod(RestartNever)
	one.InitContainers = nil
	a, err := RunArgs(one, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if j := strings.Join(a, " "); strings.Contains(j, "--network") || !strings.Contains(j, "-v "+StateDir+"/termination-log:/dev/termination-log") ||
		!strings.Contains(j, "--env-file "+EnvFilePath) {
		t.Errorf("run args of a Pod of one container: %s", j)
	}
}

// sourceConf reads the configuration with sh, as the wrapper does.
func sourceConf(t *testing.T, conf string, vars ...string) []string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "workload.conf")
	writeFile(t, p, conf)
	script := `. "$1"`
	for _, v := range vars {
		script += `; printf '%s\n' "$` + v + `"`
	}
	out, err := exec.Command("sh", "-u", "-c", script, "sh", p).Output()
	if err != nil {
		t.Fatalf("sh reading the configuration: %v", err)
	}
	return strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
}

// The user-data sizes, for the record, and a Pod too large for EC2 even
// gzip-compressed: Render and Launch say what to shrink.
func TestPodUserdataSize(t *testing.T) {
	t.Parallel()
	for _, tc := range podGoldenCases {
		ls, err := Launch(tc.pod(), tc.opts)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := base64.StdEncoding.DecodeString(ls.UserDataBase64)
		t.Logf("%s: user-data %d bytes, %d sent", tc.name, len(ls.UserData), len(raw))
		if len(raw) > MaxUserDataBytes {
			t.Errorf("%s: %d bytes", tc.name, len(raw))
		}
	}
	pod := sidecarPod(RestartNever, 30)
	noise := make([]byte, 3000)
	for i := range pod.Containers {
		_, _ = rand.Read(noise)
		pod.Containers[i].Env = []EnvVar{{"NOISE", hex.EncodeToString(noise)}}
	}
	for _, i := range []int{0, 1} {
		_, _ = rand.Read(noise)
		pod.InitContainers[i].Args = []string{hex.EncodeToString(noise)}
	}
	_, errRender := Render(pod, Options{Cluster: testCluster})
	_, errLaunch := Launch(pod, Options{Cluster: testCluster})
	for name, err := range map[string]error{"Render": errRender, "Launch": errLaunch} {
		if err == nil || !strings.Contains(err.Error(), "gzip-compressed, over EC2's 16384") || !strings.Contains(err.Error(), "of its 4 containers") {
			t.Errorf("%s of a Pod too large: %v", name, err)
		}
	}
}
