// Package callrecord is the record of the requests an in-process AWS test
// server (ec2server, sqsserver) or a test proxy (kubeproxy, the replay
// lab's counters) answered: what every server notes of a request, and one
// way to keep and count them, so that a count of calls means the same on
// each.
package callrecord

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/aws/smithy-go"
)

// Call is what a server notes of every request it answers. A server's own
// call type embeds it and adds what its service's requests carry.
type Call struct {
	Action    string    // e.g. "TerminateInstances"
	Time      time.Time // when the request arrived
	ErrorCode string    // the error code the SDK reports for the answer (see APIErrorCode); "" on success
	Injected  bool      // answered by a fault the test set up (FailNext and the like)
}

// recorded is a server's call type: embedding Call gives it this method.
type recorded interface{ call() Call }

func (c Call) call() Call { return c }

// Record keeps a server's calls in the order it answered them. The zero
// Record is empty and ready to use; it is safe for concurrent use.
type Record[C recorded] struct {
	mu    sync.Mutex
	calls []C
}

// Add notes one answered request.
func (r *Record[C]) Add(c C) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, c)
}

// Calls returns a copy of the calls since the start or Reset.
func (r *Record[C]) Calls() []C {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]C(nil), r.calls...)
}

// Count is how many requests for action were answered: every one counts,
// whatever the answer, faults and refusals included.
func (r *Record[C]) Count(action string) int {
	return r.CountFunc(func(c C) bool { return c.call().Action == action })
}

// CountFunc is how many of the calls match.
func (r *Record[C]) CountFunc(match func(C) bool) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.calls {
		if match(c) {
			n++
		}
	}
	return n
}

// Counts is how many requests were answered by action, every one counting
// as in Count.
func (r *Record[C]) Counts() map[string]int {
	return r.CountsFunc(func(C) bool { return true })
}

// CountsFunc is how many of the calls that match were answered, by action.
func (r *Record[C]) CountsFunc(match func(C) bool) map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]int{}
	for _, c := range r.calls {
		if match(c) {
			out[c.call().Action]++
		}
	}
	return out
}

// Reset forgets the calls.
func (r *Record[C]) Reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = nil
}

// APIErrorCode is the error code the SDK reports for err, the code a Call
// notes; it fails the test when err is not an API error.
func APIErrorCode(t testing.TB, err error) string {
	t.Helper()
	var apiErr smithy.APIError
	if !errors.As(err, &apiErr) {
		t.Fatalf("want an API error, got %v", err)
	}
	return apiErr.ErrorCode()
}
