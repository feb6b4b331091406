package instances_test

import (
	"context"
	"errors"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/smithy-go"

	"github.com/reaper-k8s/reaper/internal/ec2server"
	"github.com/reaper-k8s/reaper/internal/sqsserver"
	"github.com/reaper-k8s/reaper/pkg/instances"
	"github.com/reaper-k8s/reaper/pkg/model"
)

const cluster = "prod"

// newFleet is a Fleet on the real SDK client against an EC2 test server
// whose token buckets are the published ones, refilled scale times faster.
// The client does not retry: a refusal reaches the test.
func newFleet(t *testing.T, scale float64, n int) (*instances.Fleet, *ec2server.Server, []string) {
	t.Helper()
	return newFleetBehind(t, scale, n, nil)
}

// newFleetBehind is newFleet with the client talking to a front server
// (see startFront) that intercepts requests, or straight to the test
// server when intercept is nil; optFns adjust the client's options.
func newFleetBehind(t *testing.T, scale float64, n int, intercept func(url.Values) verdict, optFns ...func(*ec2.Options)) (*instances.Fleet, *ec2server.Server, []string) {
	t.Helper()
	srv := ec2server.New()
	t.Cleanup(srv.Close)
	srv.EnableBuckets(ec2server.PublishedLimits(), scale)
	endpoint := srv.URL()
	if intercept != nil {
		endpoint = startFront(t, srv, intercept)
	}
	client := ec2.New(ec2.Options{
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider("AKIDTEST", "secret", ""),
		BaseEndpoint: aws.String(endpoint),
		HTTPClient:   &http.Client{Transport: sqsserver.BufferedBodies{}},
		Retryer:      retry.NewStandard(func(o *retry.StandardOptions) { o.MaxAttempts = 1 }),
	}, optFns...)
	keys := model.DefaultTagKeys()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = srv.AddInstance(ec2server.Instance{Tags: map[string]string{keys.Managed: "true", keys.Cluster: cluster}}).ID
	}
	return instances.NewFleet(client, keys, cluster), srv, ids
}

// scaled is the published budget with refills scale times faster, as the
// test server's buckets are.
func scaled(scale float64) model.Budget {
	b := model.PublishedBudget()
	for _, k := range []*model.Bucket{&b.Describe, &b.Terminate, &b.TerminateInstances} {
		k.Refill *= scale
	}
	return b
}

// Paced at a share of the buckets, lookups and terminations of more
// instances than the buckets hold are all accepted: the Fleet waits for
// its tokens instead of being refused.
func TestPacedCallsAreNeverRefused(t *testing.T) {
	const scale, n = 100.0, 3000
	fleet, srv, ids := newFleet(t, scale, n)
	var waited time.Duration
	fleet.Pace(scaled(scale).Share(0.5), func(d time.Duration) { waited += d })
	ctx := t.Context()
	for range 3 { // 45 lookups of 200: more than the share's 50 at once
		d := fleet.Describe(ctx, ids)
		if len(d.Found) != n || len(d.Left) != 0 {
			t.Fatalf("describe: %d found, %d left: %v", len(d.Found), len(d.Left), firstLeft(d.Left))
		}
	}
	known := describeAll(t, fleet, ids)
	res := fleet.Terminate(ctx, ids, known)
	if len(res.Left) != 0 {
		t.Fatalf("terminate: %d left: %v", len(res.Left), firstLeft(res.Left))
	}
	for _, id := range ids {
		if res.Outcome[id] != instances.Terminating {
			t.Fatalf("%s: %q", id, res.Outcome[id])
		}
	}
	if r := srv.Refusals("TerminateInstances") + srv.Refusals("DescribeInstances"); r != 0 {
		t.Fatalf("%d refusals", r)
	}
	// A call names no more instances than the share holds at once (500):
	// EC2's bucket holds 1,000, and the rest of it is the other tools'.
	if n := srv.CallCount("TerminateInstances"); n != 6 {
		t.Fatalf("%d TerminateInstances requests for %d instances, want 6", n, len(ids))
	}
	// 3,000 ids against 500 resource tokens at 10/s (scaled ×100): the
	// terminations had to wait.
	if waited < time.Second {
		t.Fatalf("waited %s for tokens", waited)
	}
}

// The same calls unpaced are refused once the buckets are empty: what the
// pacing prevents. The refused instances are left for later.
func TestUnpacedCallsAreRefused(t *testing.T) {
	fleet, srv, ids := newFleet(t, 1e-6, 1500)
	res := fleet.Terminate(t.Context(), ids, nil)
	if len(res.Left) == 0 {
		t.Fatal("1,500 instances terminated against a 1,000-token bucket")
	}
	if srv.Refusals("TerminateInstances") == 0 {
		t.Fatal("no refusal")
	}
	for id, err := range res.Left {
		if !errors.Is(err, instances.ErrNoTokens) {
			t.Fatalf("%s left with %v, want ErrNoTokens", id, err)
		}
	}
}

// describeAll describes ids and fails unless every one was answered.
func describeAll(t *testing.T, fleet *instances.Fleet, ids []string) map[string]instances.Instance {
	t.Helper()
	d := fleet.Describe(t.Context(), ids)
	if len(d.Left) != 0 {
		t.Fatalf("describe: %d left: %v", len(d.Left), firstLeft(d.Left))
	}
	return d.Found
}

// firstLeft is the error of the first id left, in id order, for messages.
func firstLeft(left map[string]error) error {
	if len(left) == 0 {
		return nil
	}
	return left[slices.Min(slices.Collect(maps.Keys(left)))]
}

// wantLeft fails unless left holds exactly ids, each with an error for
// which errors.Is(err, target) holds.
func wantLeft(t *testing.T, left map[string]error, ids []string, target error) {
	t.Helper()
	if len(left) != len(ids) {
		t.Fatalf("%d ids left, want %d", len(left), len(ids))
	}
	for _, id := range ids {
		err, ok := left[id]
		if !ok {
			t.Fatalf("%s not left", id)
		}
		if !errors.Is(err, target) {
			t.Fatalf("%s left with %v, want %v", id, err, target)
		}
	}
}

// wantRunning fails unless each of ids is running on the server, or,
// when not running, each has been terminated.
func wantRunning(t *testing.T, srv *ec2server.Server, running bool, ids []string) {
	t.Helper()
	for _, id := range ids {
		if i, _ := srv.Instance(id); (i.State == ec2server.Running) != running {
			t.Fatalf("%s is %s", id, i.State)
		}
	}
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// A Terminate of six times the instances the share's burst covers, under a
// deadline too short for the refill to cover them, terminates what the
// tokens allow, in the order given, a burst a call, and defers exactly the
// untouched rest; calls with fresh deadlines finish them all, and nothing
// is refused.
func TestTerminateDoesWhatTheTokensAllow(t *testing.T) {
	const scale, share, n = 50.0, 0.5, 3000
	const deadline = 1500 * time.Millisecond
	fleet, srv, ids := newFleet(t, scale, n)
	budget := scaled(scale).Share(share)
	fleet.Pace(budget, nil)
	resource := budget.TerminateInstances // 500 at once, 500 a second
	known := describeAll(t, fleet, ids)

	// Each round's last call starts a second before its deadline, with
	// what refilled until then: at least half a second's refill (less a
	// token cut off by rounding), so the rounds are bounded.
	maxRounds := 1 + ceilDiv(n-resource.Capacity, int(resource.Refill/2)-1)
	left := ids
	for round := 1; len(left) > 0; round++ {
		if round > maxRounds {
			t.Fatalf("%d instances left after %d rounds", len(left), maxRounds)
		}
		callsBefore := srv.CallCount("TerminateInstances")
		ctx, cancel := context.WithTimeout(t.Context(), deadline)
		res := fleet.Terminate(ctx, left, known)
		cancel()
		done := len(res.Outcome)
		for _, id := range left[:done] {
			if res.Outcome[id] != instances.Terminating {
				t.Fatalf("round %d: %s: %q", round, id, res.Outcome[id])
			}
		}
		wantRunning(t, srv, false, left[:done])
		// The ids left are exactly the untouched rest (every one for
		// want of tokens), whatever the order of the maps.
		wantLeft(t, res.Left, left[done:], instances.ErrNoTokens)
		wantRunning(t, srv, true, left[done:])
		if round == 1 && (done < resource.Capacity || float64(done) > float64(resource.Capacity)+resource.Refill*deadline.Seconds()) {
			t.Errorf("first round terminated %d: want at least the %d at hand, at most what refills before the deadline", done, resource.Capacity)
		}
		if calls := srv.CallCount("TerminateInstances") - callsBefore; calls != ceilDiv(done, resource.Capacity) {
			t.Errorf("round %d: %d TerminateInstances requests for %d instances, want %d", round, calls, done, ceilDiv(done, resource.Capacity))
		}
		t.Logf("round %d: %d terminated, %d deferred", round, done, len(left)-done)
		left = left[done:]
	}
	if r := srv.Refusals("TerminateInstances"); r != 0 {
		t.Fatalf("%d refusals", r)
	}
}

// Describe makes the DescribeInstances calls the tokens allow before the
// deadline, 200 ids each, and defers the ids of the others; calls with
// fresh deadlines describe them all, each once, and nothing is refused.
func TestDescribeDoesWhatTheTokensAllow(t *testing.T) {
	const n, deadline = 4000, 2500 * time.Millisecond
	fleet, srv, ids := newFleet(t, 1, n)
	budget := model.PublishedBudget().Share(0.1) // 10 calls at once, 2 a second
	fleet.Pace(budget, nil)
	const chunk = 200

	// As in TestTerminateDoesWhatTheTokensAllow, each round gets at least
	// the refill of the 1.5 s before its last call may start, less a token.
	maxRounds := 1 + ceilDiv(n/chunk-budget.Describe.Capacity, int(budget.Describe.Refill*1.5)-1)
	left := ids
	for round := 1; len(left) > 0; round++ {
		if round > maxRounds {
			t.Fatalf("%d instances left after %d rounds", len(left), maxRounds)
		}
		ctx, cancel := context.WithTimeout(t.Context(), deadline)
		d := fleet.Describe(ctx, left)
		cancel()
		done := len(d.Found)
		for _, id := range left[:done] {
			if !d.Found[id].Owned || !answered(d, id) {
				t.Fatalf("round %d: %s not found", round, id)
			}
		}
		wantLeft(t, d.Left, left[done:], instances.ErrNoTokens)
		if round == 1 && (done < chunk*budget.Describe.Capacity || float64(done) > chunk*(float64(budget.Describe.Capacity)+budget.Describe.Refill*deadline.Seconds())) {
			t.Errorf("first round described %d: want at least the %d calls at hand, at most what refills before the deadline", done, budget.Describe.Capacity)
		}
		t.Logf("round %d: %d described, %d deferred", round, done, len(left)-done)
		left = left[done:]
	}
	if c, r := srv.CallCount("DescribeInstances"), srv.Refusals("DescribeInstances"); c != n/chunk || r != 0 {
		t.Fatalf("%d DescribeInstances requests, %d refused; want %d, none refused", c, r, n/chunk)
	}
}

// A Terminate whose own lookup runs out of tokens terminates what it
// described and defers the rest, which it must not take for gone.
func TestTerminateDefersWhatItCouldNotDescribe(t *testing.T) {
	fleet, srv, ids := newFleet(t, 1, 600)
	budget := model.PublishedBudget()
	budget.Describe = model.Bucket{Capacity: 2, Refill: 0.01}
	fleet.Pace(budget, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	res := fleet.Terminate(ctx, ids, nil)
	if len(res.Outcome) != 400 {
		t.Fatalf("%d decided, %d left: want the 400 of two lookups decided, the rest left", len(res.Outcome), len(res.Left))
	}
	wantLeft(t, res.Left, ids[400:], instances.ErrNoTokens)
	for _, id := range ids[:400] {
		if res.Outcome[id] != instances.Terminating {
			t.Fatalf("%s: %q", id, res.Outcome[id])
		}
	}
	wantRunning(t, srv, true, ids[400:])
}

// A TerminateInstances that EC2 refuses, because the account's other
// tools hold the bucket empty, defers its instances; the Fleet then backs
// off instead of sending the next call into the empty bucket.
func TestRefusedTerminateIsDeferred(t *testing.T) {
	fleet, srv, ids := newFleet(t, 1, 100)
	fleet.Pace(model.PublishedBudget().Share(0.5), nil) // 2.5 requests a second
	known := describeAll(t, fleet, ids)
	srv.HoldEmpty("TerminateInstances", time.Minute)

	res := fleet.Terminate(t.Context(), ids, known)
	if len(res.Outcome) != 0 {
		t.Fatalf("%d decided: want all left for RequestLimitExceeded", len(res.Outcome))
	}
	wantLeft(t, res.Left, ids, instances.ErrNoTokens)
	var ae smithy.APIError
	if err := res.Left[ids[0]]; !errors.As(err, &ae) || ae.ErrorCode() != "RequestLimitExceeded" {
		t.Fatalf("left with %v, want RequestLimitExceeded", err)
	}
	wantRunning(t, srv, true, ids)

	// The share's request tokens at hand went with the refusal: a call
	// that would start in the next 200 ms waits for half a token and is
	// not made.
	ctx, cancel := context.WithTimeout(t.Context(), 1200*time.Millisecond)
	defer cancel()
	res = fleet.Terminate(ctx, ids, known)
	wantLeft(t, res.Left, ids, instances.ErrNoTokens)
	if c := srv.CallCount("TerminateInstances"); c != 1 {
		t.Fatalf("%d TerminateInstances requests into a bucket held empty, want 1", c)
	}
}

// Work the share does not cover is left with when the share will have
// refilled for it (ShareSpent), one token after the other, and work left
// by a later call comes after the refill already promised: pacing hands
// the work back with a time, not a failure, and a refusal is not paced.
func TestShareSpentSaysWhenTheShareCoversIt(t *testing.T) {
	fleet, srv, ids := newFleet(t, 1, 400)
	budget := model.PublishedBudget()
	budget.TerminateInstances = model.Bucket{Capacity: 100, Refill: 10}
	fleet.Pace(budget, nil)
	known := describeAll(t, fleet, ids)

	readies := func(res instances.Terminated, left []string) []time.Time {
		t.Helper()
		var out []time.Time
		for _, id := range left {
			var spent *instances.ShareSpent
			if err := res.Left[id]; !errors.As(err, &spent) || !errors.Is(err, instances.ErrNoTokens) {
				t.Fatalf("%s left with %v, want ShareSpent", id, err)
			}
			out = append(out, spent.Ready)
		}
		return out
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), 1500*time.Millisecond)
	defer cancel()
	res := fleet.Terminate(ctx, ids[:200], known)
	done := len(res.Outcome)
	if done < 100 || done > 110 {
		t.Fatalf("%d terminated, want the 100 the bucket holds and the refill until the last call may start", done)
	}
	first := readies(res, ids[done:200])
	// Those left need one more token each, at 10 a second: each a tenth
	// of a second after the one before, the first once the tokens the
	// terminate reserved are refilled.
	if d := first[0].Sub(start); d < 0 || d > 1500*time.Millisecond {
		t.Fatalf("first left ready %v after the start", d)
	}
	for i := 1; i < len(first); i++ {
		if d := first[i].Sub(first[i-1]); d < 90*time.Millisecond || d > 110*time.Millisecond {
			t.Fatalf("left %d ready %v after the one before, want 100 ms", i, d)
		}
	}
	ctx2, cancel2 := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel2()
	res = fleet.Terminate(ctx2, ids[200:300], known)
	second := readies(res, ids[200:300])
	if !second[0].After(first[len(first)-1]) {
		t.Fatalf("a later call's work ready at %v, before the %v promised to the work left before it", second[0].Sub(start), first[len(first)-1].Sub(start))
	}
	if d := second[len(second)-1].Sub(first[len(first)-1]); d < 9900*time.Millisecond || d > 10100*time.Millisecond {
		t.Fatalf("100 more left ready %v after those left before, want 10 s at 10 a second", d)
	}
	if c := srv.Refusals("TerminateInstances"); c != 0 {
		t.Fatalf("%d refusals", c)
	}
}

func TestParseBudget(t *testing.T) {
	b, err := model.ParseBudget("terminate-instances=5000/100, describe=200/40")
	if err != nil {
		t.Fatal(err)
	}
	want := model.PublishedBudget()
	want.TerminateInstances, want.Describe = model.Bucket{Capacity: 5000, Refill: 100}, model.Bucket{Capacity: 200, Refill: 40}
	if b != want {
		t.Fatalf("%+v, want %+v", b, want)
	}
	for _, bad := range []string{"terminate=0/5", "stop=1/1", "describe=10", "describe=10/-1"} {
		if _, err := model.ParseBudget(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// Work left by one of two Fleets paced alike comes back to either:
// SharedBy(2) spreads it over both shares' refill, twice as fast as over
// its own.
func TestShareSpentSharedBy(t *testing.T) {
	fleet, _, ids := newFleet(t, 1, 300)
	budget := model.PublishedBudget()
	budget.TerminateInstances = model.Bucket{Capacity: 100, Refill: 10}
	fleet.Pace(budget, nil).SharedBy(2)
	known := describeAll(t, fleet, ids)
	ctx, cancel := context.WithTimeout(t.Context(), 1500*time.Millisecond)
	defer cancel()
	res := fleet.Terminate(ctx, ids[:200], known)
	done := len(res.Outcome)
	var prev time.Time
	for i, id := range ids[done:200] {
		var spent *instances.ShareSpent
		if !errors.As(res.Left[id], &spent) {
			t.Fatalf("%s left with %v, want ShareSpent", id, res.Left[id])
		}
		if i > 0 {
			if d := spent.Ready.Sub(prev); d < 45*time.Millisecond || d > 55*time.Millisecond {
				t.Fatalf("left %d ready %v after the one before, want 50 ms: two shares of 10 a second", i, d)
			}
		}
		prev = spent.Ready
	}
}
