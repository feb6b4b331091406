package reaper

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/reaper-k8s/reaper/pkg/instances"
	"github.com/reaper-k8s/reaper/pkg/workqueue"
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
// queue with its attempt counted (settle), so that nothing reads as done
// that was not.
var errNoTime = errors.New("not done before the batch's deadline")

// maxSettleTime and maxTokenWait split the time a reconciler invocation
// has (see phases).
const (
	// maxSettleTime is kept free at the end of an invocation for the
	// ledger marks, the deferrals, the wake-ups and the response.
	maxSettleTime = 10 * time.Second
	// maxTokenWait is the longest a batch waits for EC2 tokens. What its
	// share does not cover by then is deferred, so that the reconciler is
	// soon free to write the next batch's Pods: Pod writes never queue
	// behind terminate tokens for long.
	maxTokenWait = 10 * time.Second
)

// phases are the ends of a batch's steps, from its invocation's deadline:
// reads, claims and Pod writes until work; terminations and tags until
// terminate (at most maxTokenWait after they start); ledger marks until
// marks; the queue's sends (deferrals, dead letters, wake-ups) until
// settle. Each later phase has time reserved that an earlier one cannot
// spend: marks that use up their share leave the sends theirs. A short
// invocation gets each a share of its time, so even a 20 s function makes
// progress. Zero times: no deadline.
type phases struct {
	work, terminate, marks, settle time.Time
}

func phasesOf(ctx context.Context) phases {
	d, ok := ctx.Deadline()
	if !ok {
		return phases{}
	}
	left := time.Until(d)
	settle, wait := min(maxSettleTime, left/4), min(maxTokenWait, left/4)
	return phases{work: d.Add(-settle - wait), terminate: d.Add(-settle), marks: d.Add(-settle / 2), settle: d.Add(-settle / 8)}
}

// halfway is the time halfway from now to t (zero for zero).
func halfway(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	now := time.Now()
	return now.Add(t.Sub(now) / 2)
}

// until is ctx ending at t (never, for the zero time).
func until(ctx context.Context, t time.Time) (context.Context, context.CancelFunc) {
	if t.IsZero() {
		return context.WithCancel(ctx)
	}
	return context.WithDeadline(ctx, t)
}

// terminateContext is the context of a batch's terminations and tags: they
// may wait for tokens until maxTokenWait from now, and never past
// p.terminate.
func (p phases) terminateContext(ctx context.Context) (context.Context, context.CancelFunc) {
	end := time.Now().Add(maxTokenWait)
	if !p.terminate.IsZero() && p.terminate.Before(end) {
		end = p.terminate
	}
	return context.WithDeadline(ctx, end)
}

// afterWork is a context that outlives the work's deadline, ending at t
// (marks or settle), never past the invocation's.
func afterWork(ctx context.Context, t time.Time) (context.Context, context.CancelFunc) {
	return until(context.WithoutCancel(ctx), t)
}

// outOfTime marks err as errNoTime when it is the deadline's doing: the
// step's context is done and the call answered with the context's error,
// or a client refused to wait past the step's deadline (client-go's rate
// limiter says so before the deadline comes, when its wait would end
// after it). Any other error, even one that came as the deadline passed,
// stays a failure.
func outOfTime(ctx context.Context, err error) error {
	if err == nil {
		return err
	}
	if _, bounded := ctx.Deadline(); bounded && strings.Contains(err.Error(), "would exceed context deadline") {
		return errors.Join(errNoTime, err)
	}
	if ctx.Err() != nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) {
		return errors.Join(errNoTime, err)
	}
	return err
}

// deferrable says whether err ended work for want of time or of EC2 tokens:
// the work is deferred, not failed.
func deferrable(err error) bool {
	return errors.Is(err, errNoTime) || errors.Is(err, instances.ErrNoTokens) || errors.Is(err, context.DeadlineExceeded)
}

// DeferDelay is the least time work EC2 refused waits on the queue before
// it is tried again, and the time between the checks of a claim EC2 did
// not confirm yet.
const DeferDelay = 30 * time.Second

// maxRetryDelay caps the delay of deferred work.
const maxRetryDelay = 5 * time.Minute

// retryDelay is how long work deferred for a failure waits before it comes
// back, on its attempt (1: the first deferral). Work that ran out of time
// comes back at once the first time (a new batch has all its time), then
// after 2 s, 4 s, 8 s, …; work EC2 refused (refused) after DeferDelay,
// 60 s, 120 s, …; each capped at maxRetryDelay and stretched by up to a
// quarter at random, so that work deferred together does not come back
// together. No work comes back at once twice. Work the batch's share of a
// bucket did not cover is not a failure: it comes back when the share has
// refilled for it (pacedDelay).
func retryDelay(attempt int, refused bool) time.Duration {
	base := time.Second
	if refused {
		base = DeferDelay
	} else if attempt <= 1 {
		return 0
	}
	d := min(base<<min(attempt-1, 16), maxRetryDelay)
	return min(d+rand.N(d/4+1), workqueue.MaxDelay)
}
