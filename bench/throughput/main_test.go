package main

import (
	"testing"
	"time"
)

// When the reconcilers, not the deliveries, set the pace and the batches
// are small, the last Pod is written about exits / (rate · concurrency)
// after the first delivery. With batches as large as the backlog, one
// reconciler takes most of it while the other has little. When they keep
// up, a Pod waits for its batch's window and setup and its place in the
// batch.
func TestRun(t *testing.T) {
	small := run(10000, 10*time.Second, 2, 100, time.Second, 0, 50)
	// 10,000 Pods at 2 · 50 a second: 100 s after the first delivery
	// (≈ 0.3 s); the last delivery comes at ≈ 11.5 s.
	if got := small.last.Seconds(); got < 85 || got > 92 {
		t.Errorf("rate-bound, small batches: last Pod %.1f s after the last delivery, want about 100 − 11.5", got)
	}
	large := run(10000, 10*time.Second, 2, 10000, time.Second, 0, 50)
	if large.last < small.last+30*time.Second {
		t.Errorf("rate-bound, batches of up to 10,000: last Pod %v after the last delivery, want well after %v (one reconciler takes the backlog)", large.last, small.last)
	}
	fast := run(1000, 10*time.Second, 2, 10000, time.Second, 1500*time.Millisecond, 10000)
	if got := fast.p50; got < 1500*time.Millisecond || got > 3500*time.Millisecond {
		t.Errorf("keeping up: p50 %v, want between the setup and setup + window + a batch's span", got)
	}
	if fast.batches < 5 {
		t.Errorf("keeping up: %d batches over 10 s with a 1 s window, want several", fast.batches)
	}
}
