package ec2server_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/reaper-k8s/reaper/internal/callrecord"
	"github.com/reaper-k8s/reaper/internal/ec2server"
)

// frozen is a time scale that makes refill negligible over a test (the
// fastest published rate, 20/s, gives a token every 14 hours), so the
// number of accepted requests is exact.
const frozen = 1e-6

// noRetries makes each SDK call one request, so every refusal reaches the
// test.
func noRetries(o *retry.StandardOptions) { o.MaxAttempts = 1 }

func terminate(ctx context.Context, client *ec2.Client, ids ...string) error {
	_, err := client.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: ids})
	return err
}

func addInstances(srv *ec2server.Server, n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = srv.AddInstance(ec2server.Instance{}).ID
	}
	return ids
}

// wantRefused fails unless err is EC2's throttling answer.
func wantRefused(t *testing.T, err error, what string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: accepted, want RequestLimitExceeded", what)
	}
	if code := callrecord.APIErrorCode(t, err); code != "RequestLimitExceeded" {
		t.Fatalf("%s: code %s, want RequestLimitExceeded", what, code)
	}
	var re *smithyhttp.ResponseError
	if !errors.As(err, &re) || re.HTTPStatusCode() != 503 {
		t.Errorf("%s: want HTTP 503, got %v", what, err)
	}
}

func wantState(t *testing.T, srv *ec2server.Server, state ec2server.State, ids ...string) {
	t.Helper()
	for _, id := range ids {
		if inst, _ := srv.Instance(id); inst.State != state {
			t.Fatalf("%s is %s, want %s", id, inst.State, state)
		}
	}
}

func TestBucketsRefuseTerminateBurst(t *testing.T) {
	ctx := context.Background()
	client, srv := newClient(t, noRetries)
	id := srv.AddInstance(ec2server.Instance{}).ID
	const scale = 10
	limits := ec2server.PublishedLimits()
	rate := limits.Terminate.Refill * scale // 50/s

	start := time.Now()
	srv.EnableBuckets(limits, scale)
	accepted := 0
	var err error
	for accepted < 1000 {
		if err = terminate(ctx, client, id); err != nil {
			break
		}
		accepted++
	}
	elapsed := time.Since(start).Seconds()
	wantRefused(t, err, "terminate after the burst")
	// The full bucket covers the first 100; after that only what refilled
	// while the burst ran can have been accepted.
	if most := float64(limits.Terminate.Capacity) + rate*elapsed; accepted < limits.Terminate.Capacity || float64(accepted) > most {
		t.Fatalf("accepted %d before the first refusal, want 100..%.1f", accepted, most)
	}
	calls := srv.Calls()
	last := calls[len(calls)-1]
	if !last.Refused || last.Injected || last.ErrorCode != "RequestLimitExceeded" || len(last.InstanceIDs) != 1 {
		t.Errorf("refused call recorded as %+v", last)
	}
	if n := srv.Refusals("TerminateInstances"); n != 1 {
		t.Errorf("Refusals = %d, want 1", n)
	}

	// 100 ms at 50/s refills 5 tokens; without the time scale it would be
	// half a token.
	time.Sleep(100 * time.Millisecond)
	for i := range 3 {
		if err := terminate(ctx, client, id); err != nil {
			t.Fatalf("terminate %d after refill: %v", i, err)
		}
	}
	if n, want := srv.CallCount("TerminateInstances"), accepted+4; n != want {
		t.Errorf("CallCount = %d, want %d", n, want)
	}
}

func TestBucketsTerminateResource(t *testing.T) {
	ctx := context.Background()
	client, srv := newClient(t, noRetries)
	sets := [2][]string{addInstances(srv, 1000), addInstances(srv, 1000)}
	const scale = 100
	limits := ec2server.PublishedLimits()
	rate := limits.TerminateResource.Refill * scale // 2,000/s

	// Sent together, so the second arrives right after the first however
	// slowly the SDK handles 1,000 ids: the first empties the resource
	// bucket (the request bucket keeps 99 tokens), and the 1,000 the
	// second needs take 0.5 s to refill.
	srv.EnableBuckets(limits, scale)
	var errs [2]error
	var wg sync.WaitGroup
	for i, ids := range sets {
		wg.Go(func() { errs[i] = terminate(ctx, client, ids...) })
	}
	wg.Wait()
	if (errs[0] == nil) == (errs[1] == nil) {
		t.Fatalf("want one of two 1,000-id calls refused, got %v and %v", errs[0], errs[1])
	}
	refused := 0
	if errs[0] == nil {
		refused = 1
	}
	wantRefused(t, errs[refused], "the second 1,000")
	wantState(t, srv, ec2server.Terminated, sets[1-refused]...)
	wantState(t, srv, ec2server.Running, sets[refused]...)

	// Wait on the bucket's own clock: it emptied at the accepted call's
	// time. 1.3 times the refill time leaves margin; without the time scale
	// the bucket would hold 13 tokens by then.
	var emptied time.Time
	for _, c := range srv.Calls() {
		if !c.Refused {
			emptied = c.Time
		}
	}
	full := time.Duration(float64(limits.TerminateResource.Capacity) / rate * float64(time.Second))
	time.Sleep(time.Until(emptied.Add(full * 13 / 10)))
	if err := terminate(ctx, client, sets[refused]...); err != nil {
		t.Fatalf("the refused 1,000 after %v: %v", full*13/10, err)
	}
	wantState(t, srv, ec2server.Terminated, sets[refused]...)
	if n := srv.Refusals("TerminateInstances"); n != 1 {
		t.Errorf("Refusals = %d, want 1", n)
	}
}

func TestBucketsRefusalHasNoSideEffect(t *testing.T) {
	ctx := context.Background()
	client, srv := newClient(t, noRetries)
	ids := addInstances(srv, 3)
	x, y, z := ids[0], ids[1], ids[2]

	// One request token, two resource tokens: three ids ask for more than
	// remains and are refused whole, taking no token from either bucket.
	srv.EnableBuckets(ec2server.Limits{
		Terminate:         ec2server.Bucket{Capacity: 1, Refill: 5},
		TerminateResource: ec2server.Bucket{Capacity: 2, Refill: 20},
	}, frozen)
	wantRefused(t, terminate(ctx, client, x, y, z), "three ids")
	wantState(t, srv, ec2server.Running, x, y, z)
	if err := terminate(ctx, client, x, y); err != nil {
		t.Fatalf("two ids after the refusal: %v", err)
	}
	wantState(t, srv, ec2server.Terminated, x, y)
	wantRefused(t, terminate(ctx, client, z), "with the request bucket empty")
	wantState(t, srv, ec2server.Running, z)
	var refused []bool
	for _, c := range srv.Calls() {
		refused = append(refused, c.Refused)
	}
	if len(refused) != 3 || !refused[0] || refused[1] || !refused[2] {
		t.Errorf("Refused per call = %v, want [true false true]", refused)
	}

	// An id named twice costs one resource token. The request bucket is
	// left unlimited here.
	srv.EnableBuckets(ec2server.Limits{TerminateResource: ec2server.Bucket{Capacity: 2, Refill: 20}}, frozen)
	p, q := srv.AddInstance(ec2server.Instance{}).ID, srv.AddInstance(ec2server.Instance{}).ID
	if err := terminate(ctx, client, p, p, q); err != nil {
		t.Fatalf("an id named twice: %v", err)
	}
	wantRefused(t, terminate(ctx, client, z), "with the resource bucket empty")
}

// More ids than a call may name can never be covered by the 1,000-token
// resource bucket; answering that as throttled would have clients retry it.
func TestBucketsLeaveOversizedCallInvalid(t *testing.T) {
	client, srv := newClient(t)
	ids := addInstances(srv, 1001)
	srv.EnableBuckets(ec2server.PublishedLimits(), frozen)
	err := terminate(context.Background(), client, ids...)
	if code := callrecord.APIErrorCode(t, err); code != "InvalidRequest" {
		t.Errorf("1,001 ids: code %s, want InvalidRequest", code)
	}
	if n := srv.CallCount("TerminateInstances"); n != 1 {
		t.Errorf("attempts = %d, want 1", n)
	}
}

func TestBucketsDescribeFilteredAndUnfiltered(t *testing.T) {
	ctx := context.Background()
	client, srv := newClient(t, noRetries)
	id := srv.AddInstance(ec2server.Instance{Tags: map[string]string{"reaper.io/managed": "true"}}).ID
	srv.EnableBuckets(ec2server.PublishedLimits(), frozen)
	describe := func(in *ec2.DescribeInstancesInput) error {
		_, err := client.DescribeInstances(ctx, in)
		return err
	}
	unfiltered := &ec2.DescribeInstancesInput{}
	filtered := &ec2.DescribeInstancesInput{Filters: []types.Filter{{Name: aws.String("tag:reaper.io/managed"), Values: []string{"true"}}}}
	paginated := &ec2.DescribeInstancesInput{MaxResults: aws.Int32(5)}

	for i := range 50 {
		if err := describe(unfiltered); err != nil {
			t.Fatalf("unfiltered %d: %v", i, err)
		}
	}
	wantRefused(t, describe(unfiltered), "unfiltered 51")
	// Naming instances is neither a filter nor pagination.
	wantRefused(t, describe(&ec2.DescribeInstancesInput{InstanceIds: []string{id}}), "by InstanceIds")

	// Filtered and paginated requests share the larger bucket, still full.
	for i := range 100 {
		in := filtered
		if i%2 == 1 {
			in = paginated
		}
		if err := describe(in); err != nil {
			t.Fatalf("filtered or paginated %d: %v", i, err)
		}
	}
	wantRefused(t, describe(filtered), "filtered 101")
	wantRefused(t, describe(paginated), "paginated 101")

	// Each action has its own buckets.
	if err := terminate(ctx, client, id); err != nil {
		t.Errorf("terminate with the describe buckets empty: %v", err)
	}
	if n := srv.Refusals("DescribeInstances"); n != 4 {
		t.Errorf("Refusals = %d, want 4", n)
	}
}

func TestBucketsOffByDefault(t *testing.T) {
	ctx := context.Background()
	client, srv := newClient(t, noRetries)
	id := srv.AddInstance(ec2server.Instance{}).ID
	// Past the published capacities, 100 and 50.
	for i := range 110 {
		if err := terminate(ctx, client, id); err != nil {
			t.Fatalf("terminate %d: %v", i, err)
		}
	}
	for i := range 55 {
		if _, err := client.DescribeInstances(ctx, &ec2.DescribeInstancesInput{}); err != nil {
			t.Fatalf("describe %d: %v", i, err)
		}
	}

	srv.EnableBuckets(ec2server.Limits{Terminate: ec2server.Bucket{Capacity: 1, Refill: 5}}, frozen)
	srv.DisableBuckets()
	for i := range 3 {
		if err := terminate(ctx, client, id); err != nil {
			t.Fatalf("terminate %d after DisableBuckets: %v", i, err)
		}
	}
	if n := srv.Refusals("TerminateInstances") + srv.Refusals("DescribeInstances"); n != 0 {
		t.Errorf("Refusals = %d, want 0", n)
	}
}

func TestBucketsRefusalRetriedBySDK(t *testing.T) {
	ctx := context.Background()
	// A fixed backoff of two tokens' worth at 5/s, so the retry finds a
	// token without depending on jitter.
	var throttled []aws.Ternary
	client, srv := newClient(t, func(o *retry.StandardOptions) {
		o.Backoff = retry.BackoffDelayerFunc(func(_ int, err error) (time.Duration, error) {
			throttled = append(throttled, retry.IsErrorThrottles(o.Throttles).IsErrorThrottle(err))
			return 400 * time.Millisecond, nil
		})
	})
	a, b := srv.AddInstance(ec2server.Instance{}).ID, srv.AddInstance(ec2server.Instance{}).ID
	srv.EnableBuckets(ec2server.Limits{Terminate: ec2server.Bucket{Capacity: 1, Refill: 5}}, 1)

	if err := terminate(ctx, client, a); err != nil {
		t.Fatal(err)
	}
	// The next token is 200 ms away: the first attempt is refused, the retry
	// accepted.
	if err := terminate(ctx, client, b); err != nil {
		t.Fatalf("terminate with one refusal: %v", err)
	}
	wantState(t, srv, ec2server.Terminated, b)
	var refused []bool
	for _, c := range srv.Calls() {
		refused = append(refused, c.Refused)
	}
	if len(refused) != 3 || refused[0] || !refused[1] || refused[2] {
		t.Fatalf("Refused per attempt = %v, want [false true false]", refused)
	}
	if len(throttled) != 1 || throttled[0] != aws.TrueTernary {
		t.Errorf("retryer saw the refusal as a throttle: %v, want [true]", throttled)
	}
}

func TestBucketsConcurrentUse(t *testing.T) {
	ctx := context.Background()
	client, srv := newClient(t, noRetries)
	id := srv.AddInstance(ec2server.Instance{}).ID
	limits := ec2server.Limits{Terminate: ec2server.Bucket{Capacity: 40, Refill: 5}}
	srv.EnableBuckets(limits, frozen)

	const workers, each = 8, 10
	var (
		wg                sync.WaitGroup
		mu                sync.Mutex
		accepted, refused int
		unexpected        []error
	)
	// Readers run alongside the requests, for the race detector.
	stop := make(chan struct{})
	var readers sync.WaitGroup
	readers.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
				_ = srv.Refusals("TerminateInstances")
				_ = srv.Calls()
			}
		}
	})
	for range workers {
		wg.Go(func() {
			for range each {
				err := terminate(ctx, client, id)
				var apiErr smithy.APIError
				mu.Lock()
				switch {
				case err == nil:
					accepted++
				case errors.As(err, &apiErr) && apiErr.ErrorCode() == "RequestLimitExceeded":
					refused++
				default:
					unexpected = append(unexpected, err)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(stop)
	readers.Wait()
	if len(unexpected) > 0 {
		t.Fatalf("unexpected errors: %v", unexpected)
	}
	// With refill frozen the interleaving cannot matter: exactly the
	// capacity is accepted.
	if accepted != limits.Terminate.Capacity || refused != workers*each-accepted {
		t.Errorf("accepted %d, refused %d, want %d and %d", accepted, refused, limits.Terminate.Capacity, workers*each-limits.Terminate.Capacity)
	}
	if n := srv.Refusals("TerminateInstances"); n != refused {
		t.Errorf("Refusals = %d, want %d", n, refused)
	}
}

// The account's other tools hold the Terminate buckets empty: every
// TerminateInstances is refused, as the buckets refuse, until the hold
// ends; DescribeInstances is not held. (That they refill from empty is
// TestBucketHeldEmpty's.)
func TestBucketsHeldEmpty(t *testing.T) {
	ctx := context.Background()
	client, srv := newClient(t, noRetries)
	id := srv.AddInstance(ec2server.Instance{}).ID
	const hold = time.Second
	srv.EnableBuckets(ec2server.PublishedLimits(), 10) // 50 requests, 200 instances a second
	srv.HoldEmpty("TerminateInstances", hold)
	start := time.Now()

	wantRefused(t, terminate(ctx, client, id), "terminate while held")
	if _, err := client.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{id}}); err != nil {
		t.Fatalf("describe while terminate is held: %v", err)
	}
	calls := srv.Calls()
	if c := calls[0]; !c.Refused || c.Injected {
		t.Errorf("held call recorded as %+v, want refused by the buckets", c)
	}
	wantState(t, srv, ec2server.Running, id)

	time.Sleep(time.Until(start.Add(hold + 100*time.Millisecond)))
	if err := terminate(ctx, client, id); err != nil {
		t.Fatalf("terminate after the hold: %v", err)
	}
}
