package instances

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"golang.org/x/time/rate"
)

// Bucket is one EC2 throttling token bucket: it holds at most Capacity
// tokens and gains Refill tokens a second.
type Bucket struct {
	Capacity int
	Refill   float64
}

// Budget is the EC2 token buckets Reaper's calls draw on, per account and
// Region, shared with every other tool in the account.
type Budget struct {
	// Describe: DescribeInstances requests with a filter (Reaper's are).
	Describe Bucket
	// Terminate: TerminateInstances requests.
	Terminate Bucket
	// TerminateInstances: instances named in TerminateInstances.
	TerminateInstances Bucket
}

// PublishedBudget is EC2's default, from "Request throttling for the Amazon
// EC2 API" (https://docs.aws.amazon.com/ec2/latest/devguide/ec2-api-throttling.html):
// non-mutating actions 100 then 20/s; TerminateInstances, an uncategorized
// action, 100 then 5/s, and its resource bucket 1,000 instances then 20/s.
func PublishedBudget() Budget {
	return Budget{
		Describe:           Bucket{Capacity: 100, Refill: 20},
		Terminate:          Bucket{Capacity: 100, Refill: 5},
		TerminateInstances: Bucket{Capacity: 1000, Refill: 20},
	}
}

// Share is the part f of every bucket.
func (b Budget) Share(f float64) Budget {
	s := func(k Bucket) Bucket { return Bucket{Capacity: int(float64(k.Capacity) * f), Refill: k.Refill * f} }
	return Budget{Describe: s(b.Describe), Terminate: s(b.Terminate), TerminateInstances: s(b.TerminateInstances)}
}

// budgetNames are ParseBudget's bucket names.
var budgetNames = map[string]func(*Budget) *Bucket{
	"describe":            func(b *Budget) *Bucket { return &b.Describe },
	"terminate":           func(b *Budget) *Bucket { return &b.Terminate },
	"terminate-instances": func(b *Budget) *Bucket { return &b.TerminateInstances },
}

// ParseBudget reads buckets that differ from the published ones, for an
// account whose limits AWS has raised: "name=capacity/refill,…" with names
// describe, terminate and terminate-instances; unnamed buckets keep the
// published values.
func ParseBudget(s string) (Budget, error) {
	b := PublishedBudget()
	for part := range strings.SplitSeq(s, ",") {
		name, value, ok := strings.Cut(strings.TrimSpace(part), "=")
		field, known := budgetNames[name]
		capacity, refill, ok2 := strings.Cut(value, "/")
		if !ok || !known || !ok2 {
			return b, fmt.Errorf("%q: want name=capacity/refill with name describe, terminate or terminate-instances", part)
		}
		c, err1 := strconv.Atoi(capacity)
		r, err2 := strconv.ParseFloat(refill, 64)
		if err1 != nil || err2 != nil || c < 1 || r <= 0 {
			return b, fmt.Errorf("%q: capacity must be a whole number ≥ 1 and refill a positive number", part)
		}
		*field(&b) = Bucket{Capacity: c, Refill: r}
	}
	return b, nil
}

// ErrNoTokens is returned, wrapped, for the calls a Fleet did not make
// because its share of a bucket would not cover them before the context's
// deadline. The work is not failed: it is for later.
var ErrNoTokens = errors.New("EC2 token budget spent until the deadline")

// pacer spends a Budget's tokens at most as fast as the buckets refill, so
// that Reaper's calls are never refused and leave the rest to the account's
// other tools.
type pacer struct {
	describe, terminate, terminateInstances *rate.Limiter
	// waited is called with each wait.
	waited func(time.Duration)
}

func newPacer(b Budget, waited func(time.Duration)) *pacer {
	l := func(k Bucket) *rate.Limiter { return rate.NewLimiter(rate.Limit(k.Refill), max(k.Capacity, 1)) }
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
