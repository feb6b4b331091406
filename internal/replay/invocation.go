package replay

import (
	"context"
	"fmt"
	"time"

	"github.com/reaper-k8s/reaper/internal/labstack"
	"github.com/reaper-k8s/reaper/pkg/reaper"
)

// Invocation is one call of a function on a seeded world, the reconciler's
// work it led to, and what they changed.
type Invocation struct {
	Function string
	// Payload is what was sent: the event, restamped or moved in time.
	Payload  []byte
	Response []byte
	// Err is the function's error, if it returned one.
	Err      *labstack.FunctionError
	Duration time.Duration
	// Drain is how long the reconciler took, after the call, to clear the
	// work queue of what had been sent to it.
	Drain time.Duration
	// Logs is what the function and the emulator wrote from the call until
	// the queue was drained.
	Logs string
	// ReconcilerLogs is what the other reconciler environments wrote then.
	ReconcilerLogs string
	// Batches are the reconciler's "batch" lines: the invocation's own,
	// when the function is the reconciler, and those of the queued work.
	Batches []reaper.BatchSummary
	// NotBelieved are the exit claims the reconciler rejected then.
	NotBelieved []NotBelieved
	// Terminated are the instances of the TerminateInstances calls EC2
	// accepted, in call order.
	Terminated []string
	// World is the seeded Pods and instances, observed after the work.
	World
}

// InvokeEvent seeds the Pods and instances the event talks about (Seed),
// invokes the function once, waits until the reconciler has done the work
// sent to the queue until then, and looks at them again.
func (l *Lab) InvokeEvent(ctx context.Context, fn string, event []byte, opts SeedOptions) (*Invocation, error) {
	f, ok := l.Functions[fn]
	if !ok {
		return nil, fmt.Errorf("function %s is not running", fn)
	}
	payload, w, err := l.Seed(ctx, event, opts)
	if err != nil {
		return nil, err
	}

	inv := &Invocation{Function: fn, Payload: payload}
	logStart := len(f.Logs())
	reconcilerStart := map[*labstack.Function]int{}
	for _, r := range l.Reconcilers {
		if r != f {
			reconcilerStart[r] = len(r.Logs())
		}
	}
	start := time.Now()
	inv.Response, inv.Err, err = f.Invoke(ctx, payload)
	inv.Duration = time.Since(start)
	if err != nil {
		return nil, err
	}
	returned := time.Now()
	if err := l.DrainSent(ctx, returned); err != nil {
		return nil, fmt.Errorf("the reconciler did not finish the queued work: %w", err)
	}
	inv.Drain = time.Since(returned)
	inv.Logs = LogsSince(f, logStart, 1)
	for r, offset := range reconcilerStart {
		inv.ReconcilerLogs += LogsSince(r, offset, 0)
	}
	inv.Batches, inv.NotBelieved = ReconcilerLines(inv.Logs + inv.ReconcilerLogs)
	for _, c := range l.Stack.EC2.Calls() {
		if !c.Time.Before(start) {
			inv.Terminated = append(inv.Terminated, c.Terminated()...)
		}
	}
	if err := l.Observe(ctx, &w); err != nil {
		return nil, err
	}
	inv.World = w
	return inv, nil
}
