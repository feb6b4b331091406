package main

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestSetupDeployProfile runs `eval "$(hack/setup.sh deploy)"` as the deploy
// page and `make synth` do, in an environment without the local stack's
// variables: it gives the CDK CLI the lock pins, on PATH as cdk, and nothing
// of the stack. An unknown profile is refused with the list of profiles,
// each of which the script's usage documents.
func TestSetupDeployProfile(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "REAPER_") || strings.HasPrefix(kv, "REAPER_CACHE=") {
			env = append(env, kv)
		}
	}
	cmd := exec.Command("bash", "-c", `set -e; eval "$(hack/setup.sh deploy)"; echo "cdk=$(command -v cdk)"; cdk --version; env`)
	cmd.Dir = root
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("hack/setup.sh deploy: %v\n%s", err, out)
	}
	vars := map[string]string{}
	for line := range strings.Lines(string(out)) {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), "="); ok {
			vars[k] = v
		}
	}
	if vars["REAPER_CDK"] == "" || vars["cdk"] != vars["REAPER_CDK"] {
		t.Errorf("REAPER_CDK=%q, cdk on PATH is %q: want the same CLI", vars["REAPER_CDK"], vars["cdk"])
	}
	for _, stack := range []string{"REAPER_KUBE_APISERVER", "REAPER_ETCD", "REAPER_DYNALITE", "REAPER_RIE", "REAPER_KUBE_CONTROLLER_MANAGER", "REAPER_STATICCHECK", "REAPER_SHELLCHECK"} {
		if v, ok := vars[stack]; ok {
			t.Errorf("the deploy profile exports %s=%s, a tool of the local stack", stack, v)
		}
	}
	var lock struct {
		Packages map[string]struct{ Version string } `json:"packages"`
	}
	raw, err := os.ReadFile(filepath.Join(root, "tools/node/package-lock.json"))
	if err == nil {
		err = json.Unmarshal(raw, &lock)
	}
	if err != nil {
		t.Fatal(err)
	}
	pinned := lock.Packages["node_modules/aws-cdk"].Version
	if pinned == "" || !regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(pinned)+` `).Match(out) {
		t.Errorf("cdk --version does not report %q, the version tools/node/package-lock.json pins:\n%s", pinned, out)
	}

	cmd = exec.Command(filepath.Join(root, "hack/setup.sh"), "nope")
	out, err = cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 {
		t.Fatalf("hack/setup.sh nope: %v, want exit status 2\n%s", err, out)
	}
	m := regexp.MustCompile(`usage: hack/setup.sh \[([a-z|]+)\]`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("hack/setup.sh nope says %q, want the usage with its profiles", out)
	}
	script, err := os.ReadFile(filepath.Join(root, "hack/setup.sh"))
	if err != nil {
		t.Fatal(err)
	}
	profiles := strings.Split(string(m[1]), "|")
	if !slices.Contains(profiles, "deploy") {
		t.Errorf("profiles %v, want deploy among them", profiles)
	}
	for _, p := range profiles {
		usage := `eval "$(hack/setup.sh ` + p + `)"`
		if p == "all" {
			usage = `eval "$(hack/setup.sh)"` // the default
		}
		if !strings.Contains(string(script), usage) {
			t.Errorf("the usage in hack/setup.sh's header does not show the profile %s (%s)", p, usage)
		}
	}
}
