package reaper

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Workers bound the calls a batch has in flight at once, per outside
// system. Pod writes go at the apiserver's pace (the Kubernetes client's
// own QPS limit is the brake: 32 workers keep its 600 a second, 300 Pods,
// while a request takes up to 50 ms), ledger writes at DynamoDB's.
const (
	podWorkers    = 32
	ledgerWorkers = 16
)

// errNoTime marks work a batch did not start, or had to abandon, because
// its deadline came first. Such work is not failed: it goes back on the
// queue (deferWork), so that nothing reads as done that was not.
var errNoTime = errors.New("not done before the batch's deadline")

// forEach runs fn over items with up to workers in parallel and joins the
// errors; one failure does not stop the others. Once ctx is done no item
// is started: callers that must know which items ran record it in fn
// (an item fn never saw keeps whatever its caller set before).
func forEach[T any](ctx context.Context, workers int, items []T, fn func(T) error) error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
		next = make(chan T)
	)
	for range min(workers, len(items)) {
		wg.Go(func() {
			for it := range next {
				if err := fn(it); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		})
	}
	for _, it := range items {
		if ctx.Err() != nil {
			break
		}
		next <- it
	}
	close(next)
	wg.Wait()
	if ctx.Err() != nil {
		errs = append(errs, ctx.Err())
	}
	return errors.Join(errs...)
}

// maxSettleTime and maxTokenWait split the time a reconciler invocation
// has (see phases).
const (
	// maxSettleTime is kept free at the end of an invocation for the
	// ledger marks, the deferrals and the response.
	maxSettleTime = 10 * time.Second
	// maxTokenWait is the longest a batch waits for EC2 tokens. What its
	// share does not cover by then is deferred, so that the reconciler is
	// soon free to write the next batch's Pods: Pod writes never queue
	// behind terminate tokens for long.
	maxTokenWait = 10 * time.Second
)

// phases are the ends of a batch's steps, from its invocation's deadline:
// the batch's facts, Pod writes and tag lookups until work; terminations
// until terminate (at most maxTokenWait after they start); ledger marks
// and deferrals until settle. A short invocation gets each a share of its
// time, so even a 20 s function makes progress. Zero times: no deadline.
type phases struct {
	work, terminate, settle time.Time
}

func phasesOf(ctx context.Context) phases {
	d, ok := ctx.Deadline()
	if !ok {
		return phases{}
	}
	left := time.Until(d)
	settle, wait := min(maxSettleTime, left/4), min(maxTokenWait, left/4)
	return phases{work: d.Add(-settle - wait), terminate: d.Add(-settle), settle: d.Add(-settle / 8)}
}

// halfway is the time halfway from now to t (zero for zero).
func halfway(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	now := time.Now()
	return now.Add(t.Sub(now) / 2)
}

// withDeadline is ctx ending at t (never, for the zero time).
func withDeadline(ctx context.Context, t time.Time) (context.Context, context.CancelFunc) {
	if t.IsZero() {
		return context.WithCancel(ctx)
	}
	return context.WithDeadline(ctx, t)
}

// terminateContext is the context of a batch's terminations: they may wait
// for tokens until maxTokenWait from now, and never past p.terminate.
func (p phases) terminateContext(ctx context.Context) (context.Context, context.CancelFunc) {
	end := time.Now().Add(maxTokenWait)
	if !p.terminate.IsZero() && p.terminate.Before(end) {
		end = p.terminate
	}
	return context.WithDeadline(ctx, end)
}

// settleContext is the context of a batch's marks and deferrals: it
// outlives the work's deadline, never the invocation's.
func (p phases) settleContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return withDeadline(context.WithoutCancel(ctx), p.settle)
}

// outOfTime marks err as errNoTime when ctx, the step's context, is done:
// whatever the call in flight answered (the context's error, or a client's
// own, such as a rate limiter that would wait past the deadline), it was
// cut short, and the work is for later, not failed.
func outOfTime(ctx context.Context, err error) error {
	if err != nil && ctx.Err() != nil {
		return errors.Join(errNoTime, err)
	}
	return err
}
