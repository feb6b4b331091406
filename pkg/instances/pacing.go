package instances

import (
	"context"
	"errors"
	"time"

	"golang.org/x/time/rate"

	"github.com/reaper-k8s/reaper/pkg/model"
)

// ErrNoTokens is returned, wrapped, for the calls a Fleet did not make
// because its share of a bucket would not cover them before the context's
// deadline. The work is not failed: it is for later.
var ErrNoTokens = errors.New("EC2 token budget spent until the deadline")

// pacer spends a model.Budget's tokens at most as fast as the buckets refill, so
// that Reaper's calls are never refused and leave the rest to the account's
// other tools.
type pacer struct {
	describe, terminate, terminateInstances *rate.Limiter
	// waited is called with each wait.
	waited func(time.Duration)
}

func newPacer(b model.Budget, waited func(time.Duration)) *pacer {
	l := func(k model.Bucket) *rate.Limiter { return rate.NewLimiter(rate.Limit(k.Refill), max(k.Capacity, 1)) }
	return &pacer{describe: l(b.Describe), terminate: l(b.Terminate), terminateInstances: l(b.TerminateInstances), waited: waited}
}

// take waits for n tokens of l, reserved a burst at a time (a limiter
// grants at most its burst at once), or returns ErrNoTokens at once, taking
// nothing, when they would come after ctx's deadline.
func (p *pacer) take(ctx context.Context, l *rate.Limiter, n int) error {
	now := time.Now()
	var rs []*rate.Reservation
	cancel := func() {
		for i := len(rs) - 1; i >= 0; i-- {
			rs[i].CancelAt(now)
		}
	}
	for ; n > 0; n -= l.Burst() {
		rs = append(rs, l.ReserveN(now, min(n, l.Burst())))
	}
	wait := rs[len(rs)-1].DelayFrom(now)
	if deadline, ok := ctx.Deadline(); ok && now.Add(wait).After(deadline) {
		cancel()
		return ErrNoTokens
	}
	if p.waited != nil {
		p.waited(wait)
	}
	if wait <= 0 {
		return nil
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		cancel()
		return ctx.Err()
	}
}

// describeCall waits for the token of one DescribeInstances request. A nil
// pacer does not wait.
func (p *pacer) describeCall(ctx context.Context) error {
	if p == nil {
		return nil
	}
	return p.take(ctx, p.describe, 1)
}

// terminateCall waits for the tokens of one TerminateInstances request
// naming n instances: a request token and n resource tokens.
func (p *pacer) terminateCall(ctx context.Context, n int) error {
	if p == nil {
		return nil
	}
	if err := p.take(ctx, p.terminateInstances, n); err != nil {
		return err
	}
	return p.take(ctx, p.terminate, 1)
}
