package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// The heartbeat says what is still going until it is stopped, and not
// after.
func TestHeartbeat(t *testing.T) {
	var out bytes.Buffer
	stop := heartbeatEach(&out, "building the functions", 10*time.Millisecond)
	time.Sleep(55 * time.Millisecond)
	stop()
	n := strings.Count(out.String(), "still building the functions: ")
	if n < 2 {
		t.Fatalf("%d heartbeats in %q, want several", n, out.String())
	}
	time.Sleep(30 * time.Millisecond)
	if after := strings.Count(out.String(), "still building the functions: "); after != n {
		t.Fatalf("%d heartbeats after stop, want none", after-n)
	}
}
