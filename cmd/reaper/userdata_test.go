package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/reaper-k8s/reaper/pkg/model"
)

var userdataPodFlags = []string{"-namespace", "batch", "-name", "installer-7xk2p",
	"-uid", "6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b", "-container", "main", "-image", "registry.example.com/tools/installer:1.4"}

// runUserdataCLI runs "reaper userdata" with args and returns what it wrote.
func runUserdataCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "out")
	if err := runUserdata(t.Context(), append([]string{"-out", out}, args...)); err != nil {
		return "", err
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return string(b), nil
}

func TestUserdataCLICluster(t *testing.T) {
	out, err := runUserdataCLI(t, append([]string{"-o", "launch", "-cluster", "prod-eu-1"}, userdataPodFlags...)...)
	if err != nil {
		t.Fatal(err)
	}
	var ls struct {
		Tags     map[string]string `json:"tags"`
		HopLimit int               `json:"metadataHttpPutResponseHopLimit"`
	}
	if err := json.Unmarshal([]byte(out), &ls); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if ls.Tags["reaper.io/cluster"] != "prod-eu-1" || ls.HopLimit != 1 {
		t.Errorf("-o launch: tags %v, hop limit %d", ls.Tags, ls.HopLimit)
	}

	out, err = runUserdataCLI(t, append([]string{"-o", "tags", "-cluster", "prod-eu-1", "-tag-key-cluster", "example.com/cluster"}, userdataPodFlags...)...)
	if err != nil {
		t.Fatal(err)
	}
	var tags map[string]string
	if err := json.Unmarshal([]byte(out), &tags); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if tags["example.com/cluster"] != "prod-eu-1" || tags["reaper.io/cluster"] != "" || len(tags) != 5 {
		t.Errorf("-o tags -tag-key-cluster example.com/cluster: %v", tags)
	}

	for _, o := range []string{"userdata", "tags", "launch"} {
		if _, err := runUserdataCLI(t, append([]string{"-o", o}, userdataPodFlags...)...); err == nil || !strings.Contains(err.Error(), "needs -cluster") {
			t.Errorf("-o %s without -cluster: %v, want an error naming -cluster", o, err)
		}
	}
	if _, err := runUserdataCLI(t, append([]string{"-o", "tags", "-cluster", "aws:prod"}, userdataPodFlags...)...); err == nil || !strings.Contains(err.Error(), "aws:") {
		t.Errorf("-o tags -cluster aws:prod: %v, want an error", err)
	}
	// The host-side pieces do not carry the cluster.
	if _, err := runUserdataCLI(t, "-o", "wrapper"); err != nil {
		t.Errorf("-o wrapper without -cluster: %v", err)
	}
}

func TestUserdataCLIEnvLineBreak(t *testing.T) {
	_, err := runUserdataCLI(t, append([]string{"-cluster", "prod-eu-1", "-env", "PEM=a\nb"}, userdataPodFlags...)...)
	if err == nil || !strings.Contains(err.Error(), "env[0] (PEM) value contains a line break") {
		t.Errorf("-env with a line break: %v, want an error naming PEM", err)
	}
}

// Host networking is refused with the reason, unless -allow-host-network.
func TestUserdataCLIHostNetwork(t *testing.T) {
	args := append([]string{"-o", "run-args", "-cluster", "prod-eu-1", "-docker-run-arg", "--network", "-docker-run-arg", "host"}, userdataPodFlags...)
	if _, err := runUserdataCLI(t, args...); err == nil || !strings.Contains(err.Error(), "instance role's credentials from IMDS") {
		t.Errorf("-docker-run-arg --network host: %v, want a refusal naming IMDS", err)
	}
	out, err := runUserdataCLI(t, append([]string{"-allow-host-network"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	var runArgs []string
	if err := json.Unmarshal([]byte(out), &runArgs); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if !strings.Contains(strings.Join(runArgs, " "), "--network host") {
		t.Errorf("-allow-host-network: run args %q lack --network host", runArgs)
	}
}

// -cluster-uid puts the cluster identity tag on the instance; a value that
// is not a UID is refused.
func TestUserdataCLIClusterUID(t *testing.T) {
	const uid = "3f2a9c1e-7b4d-4e8f-9a6b-1c2d3e4f5a6b"
	out, err := runUserdataCLI(t, append([]string{"-o", "tags", "-cluster", "prod-eu-1", "-cluster-uid", uid}, userdataPodFlags...)...)
	if err != nil {
		t.Fatal(err)
	}
	var tags map[string]string
	if err := json.Unmarshal([]byte(out), &tags); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if tags["reaper.io/cluster-uid"] != uid || len(tags) != 6 {
		t.Errorf("-o tags -cluster-uid: %v", tags)
	}
	out, err = runUserdataCLI(t, append([]string{"-o", "tags", "-cluster", "prod-eu-1", "-cluster-uid", uid, "-tag-key-cluster-uid", "example.com/cluster-uid"}, userdataPodFlags...)...)
	if err != nil {
		t.Fatal(err)
	}
	tags = nil
	if err := json.Unmarshal([]byte(out), &tags); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if tags["example.com/cluster-uid"] != uid || tags["reaper.io/cluster-uid"] != "" {
		t.Errorf("-o tags -tag-key-cluster-uid example.com/cluster-uid: %v", tags)
	}
	if _, err := runUserdataCLI(t, append([]string{"-o", "launch", "-cluster", "prod-eu-1", "-cluster-uid", "kube-system"}, userdataPodFlags...)...); err == nil ||
		!strings.Contains(err.Error(), "cluster UID") {
		t.Errorf("-cluster-uid kube-system: %v, want an error", err)
	}
}

// metadataTagKeyFlags set every tag key to one the instance metadata can
// show, as a provider in the when-pod-written mode must (and Reaper's
// REAPER_TAG_* to match).
var metadataTagKeyFlags = []string{
	"-tag-key-managed", "reaper.io:managed", "-tag-key-namespace", "reaper.io:pod-namespace",
	"-tag-key-name", "reaper.io:pod-name", "-tag-key-uid", "reaper.io:pod-uid",
	"-tag-key-cluster", "reaper.io:cluster", "-tag-key-cluster-uid", "reaper.io:cluster-uid",
	"-tag-key-exit-token", "reaper.io:exit-token-sha256", "-tag-key-pod-written", "reaper.io:pod-written",
}

// Every shutdown mode renders through the CLI, so a provider not written in
// Go can follow any row of the provider-style table: the user-data passes
// shellcheck as bash and the wrapper's configuration as sh, the
// configuration, read by sh as the wrapper reads it, carries the mode, the
// Pod-written tag and the delay, and the launch settings enable the
// instance's tags in its metadata exactly for when-pod-written.
func TestUserdataCLIShutdownModes(t *testing.T) {
	const clusterUID = "3f2a9c1e-7b4d-4e8f-9a6b-1c2d3e4f5a6b"
	for _, tc := range []struct {
		mode          string
		extra         []string
		podTag        string
		delay         string
		metaTags      string
		clusterTagKey string
	}{
		{mode: "", delay: "600", metaTags: "disabled", clusterTagKey: "reaper.io/cluster"},
		{mode: "when-shipped", extra: []string{"-shutdown-delay", "5m"}, delay: "300", metaTags: "disabled", clusterTagKey: "reaper.io/cluster"},
		{mode: "when-pod-written", extra: metadataTagKeyFlags, podTag: "reaper.io:pod-written", delay: "600", metaTags: "enabled", clusterTagKey: "reaper.io:cluster"},
		{mode: "after-delay", extra: []string{"-shutdown-delay", "90s"}, delay: "90", metaTags: "disabled", clusterTagKey: "reaper.io/cluster"},
	} {
		name := tc.mode
		if name == "" {
			name = "default"
		}
		t.Run(name, func(t *testing.T) {
			args := append([]string{"-cluster", "prod-eu-1", "-cluster-uid", clusterUID}, userdataPodFlags...)
			if tc.mode != "" {
				args = append(args, "-shutdown-mode", tc.mode)
			}
			args = append(args, tc.extra...)
			render := func(o string) string {
				t.Helper()
				out, err := runUserdataCLI(t, append([]string{"-o", o}, args...)...)
				if err != nil {
					t.Fatalf("-o %s: %v", o, err)
				}
				return out
			}
			ud, conf := render("userdata"), render("config")
			shellcheckScripts(t, "bash", map[string]string{"user-data": ud})
			shellcheckScripts(t, "sh", map[string]string{"workload.conf": conf})

			wantMode := tc.mode
			if wantMode == "" {
				wantMode = "when-shipped"
			}
			got := sourceConfig(t, conf, "REAPER_SHUTDOWN_MODE", "REAPER_POD_WRITTEN_TAG", "REAPER_SHUTDOWN_DELAY")
			if want := []string{wantMode, tc.podTag, tc.delay}; !slices.Equal(got, want) {
				t.Errorf("configuration read by sh: mode, pod-written tag, delay = %q, want %q", got, want)
			}
			if !strings.Contains(ud, conf) {
				t.Errorf("the user-data does not install the configuration -o config prints:\n%s", conf)
			}

			var ls struct {
				Tags         map[string]string `json:"tags"`
				MetadataTags string            `json:"metadataTags"`
			}
			if out := render("launch"); json.Unmarshal([]byte(out), &ls) != nil {
				t.Fatalf("-o launch is not JSON:\n%s", out)
			}
			if ls.MetadataTags != tc.metaTags || ls.Tags[tc.clusterTagKey] != "prod-eu-1" || len(ls.Tags) != 7 {
				t.Errorf("-o launch: metadataTags %q (want %q), tags %v (want 7, %s=prod-eu-1)", ls.MetadataTags, tc.metaTags, ls.Tags, tc.clusterTagKey)
			}
		})
	}
}

// -exit-token-file gives every output of one launch the same token: the
// configuration carries it (read by sh, as the wrapper reads it), the tags
// its hash, and the files that carry it are the owner's alone. -o launch
// takes it too, and draws one without it, consistent between its user-data
// and tags; -o tags never draws one, whose secret no user-data would carry.
// A malformed token is refused without being printed.
func TestUserdataCLIExitToken(t *testing.T) {
	token := strings.Repeat("c0ffee", 10) + "beef"
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"-cluster", "prod-eu-1", "-exit-token-file", file}, userdataPodFlags...)
	out, err := runUserdataCLI(t, append([]string{"-o", "config"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	if got := sourceConfig(t, out, "REAPER_EXIT_TOKEN"); got[0] != token {
		t.Errorf("-o config: REAPER_EXIT_TOKEN=%q, want the file's token", got[0])
	}
	tags := map[string]string{}
	if out, err = runUserdataCLI(t, append([]string{"-o", "tags"}, args...)...); err != nil || json.Unmarshal([]byte(out), &tags) != nil {
		t.Fatalf("-o tags: %v\n%s", err, out)
	}
	if tags["reaper.io/exit-token-sha256"] != model.ExitTokenHash(token) || strings.Contains(out, token) {
		t.Errorf("-o tags: %v, want the token's hash and not the token", tags)
	}

	launchToken := func(extra ...string) (token, hash string) {
		t.Helper()
		out, err := runUserdataCLI(t, append(append([]string{"-o", "launch", "-cluster", "prod-eu-1"}, userdataPodFlags...), extra...)...)
		if err != nil {
			t.Fatal(err)
		}
		var ls struct {
			UserData string            `json:"userData"`
			Tags     map[string]string `json:"tags"`
		}
		if err := json.Unmarshal([]byte(out), &ls); err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(`(?m)^REAPER_EXIT_TOKEN='([^']*)'$`).FindStringSubmatch(ls.UserData)
		if m == nil {
			t.Fatalf("-o launch %v: no exit token in the user-data", extra)
		}
		return m[1], ls.Tags["reaper.io/exit-token-sha256"]
	}
	if got, hash := launchToken("-exit-token-file", file); got != token || hash != model.ExitTokenHash(token) {
		t.Errorf("-o launch -exit-token-file: token %q, tag %q", got, hash)
	}
	drawn, hash := launchToken()
	if drawn == token || !model.ValidExitToken(drawn) || hash != model.ExitTokenHash(drawn) {
		t.Errorf("-o launch without a token: drew %q, tag %q", drawn, hash)
	}
	tags = map[string]string{}
	if out, err = runUserdataCLI(t, append([]string{"-o", "tags", "-cluster", "prod-eu-1"}, userdataPodFlags...)...); err != nil || json.Unmarshal([]byte(out), &tags) != nil {
		t.Fatalf("-o tags: %v\n%s", err, out)
	}
	if _, ok := tags["reaper.io/exit-token-sha256"]; ok {
		t.Errorf("-o tags without a token: %v, want no exit-token tag", tags)
	}

	for _, o := range []string{"userdata", "config", "launch"} {
		out := filepath.Join(t.TempDir(), "out")
		if err := runUserdata(t.Context(), append([]string{"-o", o, "-out", out}, args...)); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(out)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("-o %s -out: mode %v, want 0600: it carries the token", o, fi.Mode().Perm())
		}
	}

	if err := os.WriteFile(file, []byte(token[:20]+" "+token[:20]), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := runUserdataCLI(t, append([]string{"-o", "config"}, args...)...); err == nil || !strings.Contains(err.Error(), "exit token") || strings.Contains(err.Error(), token[:20]) {
		t.Errorf("a malformed token: %v, want an error that does not print it", err)
	}
}

// A mode the CLI cannot render as asked is refused with what to set.
func TestUserdataCLIShutdownModeRefusals(t *testing.T) {
	base := append([]string{"-o", "userdata", "-cluster", "prod-eu-1"}, userdataPodFlags...)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown mode", []string{"-shutdown-mode", "when-done"}, `shutdown mode "when-done" is not when-shipped, when-pod-written or after-delay`},
		{"no pod-written tag", append([]string{"-shutdown-mode", "when-pod-written"}, metadataTagKeyFlags[:len(metadataTagKeyFlags)-2]...), "needs TagKeys.PodWritten"},
		{"default keys with a slash", []string{"-shutdown-mode", "when-pod-written", "-tag-key-pod-written", "reaper.io:pod-written"}, `tag key "reaper.io/managed" cannot be`},
	} {
		if _, err := runUserdataCLI(t, append(base, tc.args...)...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}

// sourceConfig reads the wrapper's configuration with sh, as the wrapper
// does, and returns the values of vars.
func sourceConfig(t *testing.T, conf string, vars ...string) []string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "workload.conf")
	if err := os.WriteFile(p, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
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

// shellcheckScripts lints scripts (name -> text) as shell with shellcheck:
// $REAPER_SHELLCHECK, else PATH. It fails, never skips, without it.
func shellcheckScripts(t *testing.T, shell string, scripts map[string]string) {
	t.Helper()
	bin := os.Getenv("REAPER_SHELLCHECK")
	if bin == "" {
		var err error
		if bin, err = exec.LookPath("shellcheck"); err != nil {
			t.Fatal(`shellcheck not found: run eval "$(hack/setup.sh)" (installs it and exports REAPER_SHELLCHECK)`)
		}
	}
	dir := t.TempDir()
	args := []string{"-s", shell}
	for name, text := range scripts {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		args = append(args, p)
	}
	if out, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
		t.Errorf("shellcheck -s %s found problems (%v):\n%s", shell, err, out)
	}
}

// A Pod of several containers, from its JSON: the configuration, read by
// sh as the wrapper reads it, carries each container in spec order, and
// the user-data passes shellcheck.
func TestUserdataCLIPodOfSeveral(t *testing.T) {
	pod := `{"namespace": "batch", "name": "provision-8fj2k", "uid": "7a2b3c4d-5e6f-4a8b-9c0d-1e2f3a4b5c6d", "restartPolicy": "Never",
		"volumes": [{"name": "work", "emptyDir": {}}],
		"initContainers": [{"name": "downloader", "image": "fetch:2", "volumeMounts": [{"name": "work", "mountPath": "/work"}]}],
		"containers": [{"name": "provisioner", "image": "provision:3", "env": [{"name": "MODE", "value": "full"}],
			"volumeMounts": [{"name": "work", "mountPath": "/work", "readOnly": true}], "terminationMessagePolicy": "FallbackToLogsOnError"}]}`
	file := filepath.Join(t.TempDir(), "pod.json")
	if err := os.WriteFile(file, []byte(pod), 0o600); err != nil {
		t.Fatal(err)
	}
	conf, err := runUserdataCLI(t, "-o", "config", "-f", file, "-pause-image", "registry.example.com/pause:3.10")
	if err != nil {
		t.Fatal(err)
	}
	got := sourceConfig(t, conf, "REAPER_CONTAINERS", "REAPER_C1_NAME", "REAPER_C1_KIND", "REAPER_C2_NAME", "REAPER_C2_MSG", "REAPER_VOLUMES", "REAPER_PAUSE_IMAGE")
	if want := []string{"2", "downloader", "init", "provisioner", "FallbackToLogsOnError", "work", "registry.example.com/pause:3.10"}; !slices.Equal(got, want) {
		t.Errorf("configuration read by sh: %q, want %q", got, want)
	}
	ud, err := runUserdataCLI(t, "-o", "userdata", "-cluster", "prod-eu-1", "-f", file)
	if err != nil {
		t.Fatal(err)
	}
	shellcheckScripts(t, "bash", map[string]string{"user-data": ud})
	shellcheckScripts(t, "sh", map[string]string{"workload.conf": conf})
	if _, err := runUserdataCLI(t, "-o", "userdata", "-cluster", "prod-eu-1", "-f", file, "-image", "x"); err == nil ||
		!strings.Contains(err.Error(), "single-container form") {
		t.Errorf("-image with containers in the file: %v, want a refusal", err)
	}
}
