package ec2server

import (
	"fmt"
	"net/url"
	"slices"
	"time"

	"github.com/reaper-k8s/reaper/pkg/model"
)

// Bucket is one EC2 throttling token bucket, as Reaper paces itself
// against it. Here a Bucket with zero Capacity does not limit anything, so
// a test can throttle one action and leave the rest alone.
type Bucket = model.Bucket

// Limits are the token buckets EC2 throttles the server's actions with. Each
// request, whatever its outcome, takes one token from its action's request
// bucket; TerminateInstances also takes one token per instance it names from
// its resource bucket.
type Limits struct {
	Terminate         Bucket // TerminateInstances requests
	TerminateResource Bucket // instances named in TerminateInstances
	// Describe is for DescribeInstances with a filter or pagination;
	// DescribeUnfiltered for those with neither.
	Describe           Bucket
	DescribeUnfiltered Bucket
	// CreateTags is for CreateTags requests.
	CreateTags Bucket
}

// PublishedLimits returns EC2's default limits, per account and Region, from
// "Request throttling for the Amazon EC2 API",
// https://docs.aws.amazon.com/ec2/latest/devguide/ec2-api-throttling.html:
//
//   - TerminateInstances is an uncategorized action with its own request
//     bucket (100, refill 5/s) and a resource bucket of 1,000 instances,
//     refill 20/s.
//   - DescribeInstances is non-mutating (100, refill 20/s), but is also listed
//     among the actions that, requested with neither pagination nor a filter,
//     draw on a smaller bucket (50, refill 10/s).
//   - CreateTags is not listed on its own: the bucket of mutating actions
//     (50, refill 5/s).
func PublishedLimits() Limits {
	b := model.PublishedBudget()
	return Limits{
		Terminate:          b.Terminate,
		TerminateResource:  b.TerminateInstances,
		Describe:           b.Describe,
		DescribeUnfiltered: Bucket{Capacity: 50, Refill: 10},
		CreateTags:         b.CreateTags,
	}
}

// EnableBuckets makes the server throttle requests as EC2 does: a request its
// buckets cannot cover is answered RequestLimitExceeded (HTTP 503), changes
// nothing and takes no token from any bucket, and is recorded with Refused
// set. A request that needs more resource tokens than remain is refused whole.
// Faults from FailNext and Throttle answer first and take no tokens.
//
// Every bucket starts full. Refill rates are multiplied by scale, which must
// be positive: with scale 60 a second refills what a minute does on EC2,
// while capacities stay as given. Calling EnableBuckets again starts over
// with full buckets.
func (s *Server) EnableBuckets(l Limits, scale float64) {
	if scale <= 0 {
		panic(fmt.Sprintf("ec2server: time scale %v is not positive", scale))
	}
	now := time.Now()
	b := func(c Bucket) bucket {
		return bucket{capacity: float64(c.Capacity), rate: c.Refill * scale, tokens: float64(c.Capacity), last: now}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buckets = &buckets{
		terminate:          b(l.Terminate),
		terminateResource:  b(l.TerminateResource),
		describe:           b(l.Describe),
		describeUnfiltered: b(l.DescribeUnfiltered),
		createTags:         b(l.CreateTags),
	}
}

// DisableBuckets stops throttling by token buckets, as before EnableBuckets.
func (s *Server) DisableBuckets() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buckets = nil
}

// HoldEmpty keeps the buckets action draws on empty for d from now, as the
// account's other tools do when they spend every token as it comes: every
// request for action is refused (RequestLimitExceeded, HTTP 503, recorded
// with Refused set) until then, and afterwards its buckets refill from
// empty. action is TerminateInstances (its request and resource buckets) or
// DescribeInstances (both of its request buckets). A bucket that does not
// limit (zero Capacity) stays so. It needs EnableBuckets, whose next call
// ends the hold.
func (s *Server) HoldEmpty(action string, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.buckets == nil {
		panic("ec2server: HoldEmpty before EnableBuckets")
	}
	var held []*bucket
	switch action {
	case "TerminateInstances":
		held = []*bucket{&s.buckets.terminate, &s.buckets.terminateResource}
	case "DescribeInstances":
		held = []*bucket{&s.buckets.describe, &s.buckets.describeUnfiltered}
	default:
		panic(fmt.Sprintf("ec2server: %s has no bucket to hold", action))
	}
	until := time.Now().Add(d)
	for _, b := range held {
		b.heldUntil = until
	}
}

// Refusals returns how many requests for action the token buckets refused
// since New or ResetCalls.
func (s *Server) Refusals(action string) int {
	return s.calls.CountFunc(func(c Call) bool { return c.Action == action && c.Refused })
}

type buckets struct {
	terminate, terminateResource bucket
	describe, describeUnfiltered bucket
	createTags                   bucket
}

// bucket refills lazily: tokens is the level at last, and each use first adds
// what accrued since, so no timer is needed.
type bucket struct {
	capacity float64
	rate     float64 // tokens per second, time scale applied
	tokens   float64
	last     time.Time
	// heldUntil is when others stop holding b empty (HoldEmpty).
	heldUntil time.Time
}

// covers refills b up to now and reports whether it holds n tokens.
func (b *bucket) covers(n float64, now time.Time) bool {
	if b.capacity == 0 {
		return true
	}
	if b.last.Before(b.heldUntil) {
		// Others took every token until heldUntil: b refills from empty
		// from then on.
		b.tokens, b.last = 0, b.heldUntil
		if now.Before(b.last) {
			b.last = now
		}
	}
	if now.After(b.last) {
		b.tokens = min(b.capacity, b.tokens+now.Sub(b.last).Seconds()*b.rate)
		b.last = now
	}
	return b.tokens >= n
}

func (b *bucket) take(n float64) {
	if b.capacity != 0 {
		b.tokens -= n
	}
}

// admit charges a request to its buckets and reports whether they covered
// it; a request either bucket cannot cover is charged nothing. Called with
// s.mu held.
func (s *Server) admit(action string, form url.Values, ids []string, now time.Time) bool {
	if s.buckets == nil {
		return true
	}
	var req, res *bucket
	switch action {
	case "TerminateInstances":
		req, res = &s.buckets.terminate, &s.buckets.terminateResource
	case "CreateTags":
		req = &s.buckets.createTags
	case "DescribeInstances":
		// The page names only pagination and filters as what moves a request
		// to the larger bucket, so InstanceId.N alone does not.
		paginated := form.Get("MaxResults") != "" || form.Get("NextToken") != ""
		if paginated || len(indexes(form, "Filter", ".Name")) > 0 {
			req = &s.buckets.describe
		} else {
			req = &s.buckets.describeUnfiltered
		}
	default:
		return true // no bucket: the action fails in dispatch
	}
	var n float64
	// Over maxIDs the request is invalid: refusing it as throttled would make
	// clients retry a request that can never succeed. An id named twice
	// affects one instance.
	if res != nil && len(ids) <= maxIDs {
		n = float64(len(slices.Compact(slices.Sorted(slices.Values(ids)))))
	}
	if !req.covers(1, now) || (n > 0 && !res.covers(n, now)) {
		return false
	}
	req.take(1)
	if n > 0 {
		res.take(n)
	}
	return true
}
