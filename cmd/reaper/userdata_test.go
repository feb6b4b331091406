package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
