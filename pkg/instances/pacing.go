package instances

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/reaper-k8s/reaper/pkg/model"
)

// ErrNoTokens is the error, wrapped, of the work a Fleet did not do
// because its share of a bucket would not cover the calls before the
// context's deadline, or because EC2 refused them (RequestLimitExceeded)
// until then. The work is not failed: it is for later.
var ErrNoTokens = errors.New("EC2 token budget spent until the deadline")

// ShareSpent is the error of work a paced Fleet left because its share of
// a bucket would not cover it before the deadline: pacing, not EC2's
// refusal. Ready is when its share will have refilled for it, counting
// the work left before it, in this call and in earlier ones (the tokens
// promised to them). errors.Is(err, ErrNoTokens) holds. Work left so comes
// back at Ready, not after a backoff: the bucket is not contended, only
// spent.
type ShareSpent struct {
	Ready time.Time
}

func (e *ShareSpent) Error() string {
	return fmt.Sprintf("%v: the share refills for it by %s", ErrNoTokens, e.Ready.UTC().Format(time.RFC3339))
}

func (e *ShareSpent) Unwrap() error { return ErrNoTokens }

// callTime is what a call is left of its context: it starts only when
// its tokens come at least callTime before the deadline, so that it is not
// cut off while EC2 answers (in well under a second for a
// DescribeInstances or a TerminateInstances of 1,000 ids).
const callTime = time.Second

// pacer spends a model.Budget's tokens at most as fast as the buckets refill, so
// that Reaper's calls are never refused and leave the rest to the account's
// other tools.
type pacer struct {
	describe, terminate, terminateInstances, createTags *rate.Limiter
	// waited is called with each wait.
	waited func(time.Duration)

	// sharedBy is how many pacers alike the work left is spread over
	// (Fleet.SharedBy).
	sharedBy int

	mu sync.Mutex
	// promised is, per limiter, the time until which its refill is
	// promised to work left earlier (ShareSpent.Ready of the last).
	promised map[*rate.Limiter]time.Time
}

func newPacer(b model.Budget, waited func(time.Duration)) *pacer {
	l := func(k model.Bucket) *rate.Limiter { return rate.NewLimiter(rate.Limit(k.Refill), max(k.Capacity, 1)) }
	return &pacer{describe: l(b.Describe), terminate: l(b.Terminate), terminateInstances: l(b.TerminateInstances), createTags: l(b.CreateTags), waited: waited,
		sharedBy: 1, promised: map[*rate.Limiter]time.Time{}}
}

// promise returns when each of n pieces of work left now, in order, will
// have its token of l, piece i its (i+1)th: after the tokens l holds or
// has reserved, and after the refill already promised to work left
// before; the refill up to the last is then promised to them. The work
// comes back to any of sharedBy pacers alike: the tokens and the refill
// counted are theirs together.
func (p *pacer) promise(l *rate.Limiter, now time.Time, n int) []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	shares := float64(p.sharedBy)
	rate := float64(l.Limit()) * shares
	if n <= 0 || rate <= 0 {
		return nil
	}
	after := func(tokens float64) time.Duration { return time.Duration(max(tokens, 0) / rate * float64(time.Second)) }
	held := l.TokensAt(now) * shares
	from, promised := now, p.promised[l].After(now)
	if promised {
		from = p.promised[l]
	}
	ready := make([]time.Time, n)
	for i := range ready {
		own := now.Add(after(float64(i+1) - held))
		if promised {
			own = laterOf(own, from.Add(after(float64(i+1))))
		}
		ready[i] = own
	}
	p.promised[l] = ready[n-1]
	return ready
}

// leftTerminates is the error of each of ids, a terminate left for want of
// its share, in order: ShareSpent with when the share covers it (one
// token of the instances bucket each, one of the request bucket per
// terminateChunk of them).
func (p *pacer) leftTerminates(ids []string, now time.Time) map[string]error {
	instances := p.promise(p.terminateInstances, now, len(ids))
	requests := p.promise(p.terminate, now, (len(ids)+terminateChunk-1)/terminateChunk)
	out := make(map[string]error, len(ids))
	for i, id := range ids {
		out[id] = &ShareSpent{Ready: laterOf(instances[i], requests[i/terminateChunk])}
	}
	return out
}

// leftDescribes is the error of each of calls, the ids of describe calls
// left for want of their share, in order: ShareSpent with when the share
// covers the call (one token of the describe bucket each).
func (p *pacer) leftDescribes(calls [][]string, now time.Time) map[string]error {
	ready := p.promise(p.describe, now, len(calls))
	out := map[string]error{}
	for i, ids := range calls {
		for _, id := range ids {
			out[id] = &ShareSpent{Ready: ready[i]}
		}
	}
	return out
}

func laterOf(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// take waits for the tokens of one call: one of request's and, with a
// resource limiter, one per item named, for up to want items and at most
// resource's burst (a limiter grants no more at once). It returns how many
// items the call may name: want, or fewer when no more come callTime
// before ctx's deadline. When not even one would, it takes nothing and
// returns ErrNoTokens at once.
func (p *pacer) take(ctx context.Context, request, resource *rate.Limiter, want int) (int, error) {
	now := time.Now()
	n := want
	if resource != nil {
		n = min(n, resource.Burst())
	}
	deadline, bounded := ctx.Deadline()
	latest := deadline.Add(-callTime)
	if bounded {
		if now.After(latest) {
			return 0, ErrNoTokens
		}
		if resource != nil {
			n = min(n, int(resource.TokensAt(latest)))
		}
		if n < 1 || request.TokensAt(latest) < 1 {
			return 0, ErrNoTokens
		}
	}
	rs := []*rate.Reservation{request.ReserveN(now, 1)}
	if resource != nil {
		rs = append(rs, resource.ReserveN(now, n))
	}
	cancel := func() {
		for _, r := range rs {
			r.CancelAt(now)
		}
	}
	var wait time.Duration
	for _, r := range rs {
		wait = max(wait, r.DelayFrom(now))
	}
	// Another call may have reserved the same tokens since TokensAt; a
	// millisecond forgives the rounding between TokensAt and the delay.
	if bounded && now.Add(wait).Sub(latest) > time.Millisecond {
		cancel()
		return 0, ErrNoTokens
	}
	if p.waited != nil {
		p.waited(wait)
	}
	if wait <= 0 {
		return n, nil
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		return n, nil
	case <-ctx.Done():
		cancel()
		return 0, ctx.Err()
	}
}

// describeCall waits for the token of one DescribeInstances request. A nil
// pacer does not wait.
func (p *pacer) describeCall(ctx context.Context) error {
	if p == nil {
		return nil
	}
	_, err := p.take(ctx, p.describe, nil, 1)
	return err
}

// tagCall waits for the token of one CreateTags request. A nil pacer does
// not wait.
func (p *pacer) tagCall(ctx context.Context) error {
	if p == nil {
		return nil
	}
	_, err := p.take(ctx, p.createTags, nil, 1)
	return err
}

// terminateCall waits for the tokens of one TerminateInstances request
// naming up to want instances, and returns how many it may name: at most
// terminateChunk, and for a pacer as many as its share of the request and
// resource buckets covers before the deadline. A nil pacer does not wait.
func (p *pacer) terminateCall(ctx context.Context, want int) (int, error) {
	want = min(want, terminateChunk)
	if p == nil {
		return want, nil
	}
	return p.take(ctx, p.terminate, p.terminateInstances, want)
}

// describeRefused and terminateRefused back off after EC2 refused a call
// (RequestLimitExceeded): some other tool holds the bucket empty, so the
// tokens at hand of the call's limiters are dropped, and the next call
// waits for a refill of Reaper's share instead of being refused again at
// once.
func (p *pacer) describeRefused() {
	if p != nil {
		drain(p.describe)
	}
}

func (p *pacer) tagRefused() {
	if p != nil {
		drain(p.createTags)
	}
}

func (p *pacer) terminateRefused() {
	if p != nil {
		drain(p.terminate, p.terminateInstances)
	}
}

func drain(limiters ...*rate.Limiter) {
	now := time.Now()
	for _, l := range limiters {
		if n := int(l.TokensAt(now)); n > 0 {
			l.ReserveN(now, n)
		}
	}
}
