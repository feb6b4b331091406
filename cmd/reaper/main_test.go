package main

import (
	"os/exec"
	"strings"
	"testing"
)

// The operator's tool runs against a real account: it must not carry the
// lab (the local stack's launchers, the test servers, the replay harness).
// internal/cli, the verb registry, is the only internal package it may
// link.
func TestLinksNoLab(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	var lab []string
	for _, pkg := range strings.Fields(string(out)) {
		if strings.HasPrefix(pkg, "github.com/reaper-k8s/reaper/internal/") && pkg != "github.com/reaper-k8s/reaper/internal/cli" {
			lab = append(lab, pkg)
		}
	}
	if len(lab) > 0 {
		t.Fatalf("cmd/reaper links lab packages: %v", lab)
	}
	if !strings.Contains(string(out), "github.com/reaper-k8s/reaper/pkg/ledger") {
		t.Fatalf("go list -deps printed no pkg/ledger: %s", out)
	}
}
