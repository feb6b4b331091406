package instances_test

import (
	"context"
	"errors"
	"net/http"
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
	srv := ec2server.New()
	t.Cleanup(srv.Close)
	srv.EnableBuckets(ec2server.PublishedLimits(), scale)
	client := ec2.New(ec2.Options{
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider("AKIDTEST", "secret", ""),
		BaseEndpoint: aws.String(srv.URL()),
		HTTPClient:   &http.Client{Transport: sqsserver.BufferedBodies{}},
		Retryer:      retry.NewStandard(func(o *retry.StandardOptions) { o.MaxAttempts = 1 }),
	})
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
		known, err := fleet.Describe(ctx, ids)
		if err != nil || len(known) != n {
			t.Fatalf("describe: %d found, %v", len(known), err)
		}
	}
	known, err := fleet.Describe(ctx, ids)
	if err != nil {
		t.Fatal(err)
	}
	out, err := fleet.Terminate(ctx, ids, known)
	if err != nil {
		t.Fatalf("terminate: %v", err)
	}
	for _, id := range ids {
		if out[id] != instances.Terminating {
			t.Fatalf("%s: %q", id, out[id])
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
// pacing prevents.
func TestUnpacedCallsAreRefused(t *testing.T) {
	fleet, srv, ids := newFleet(t, 1e-6, 1500)
	if _, err := fleet.Terminate(t.Context(), ids, nil); err == nil {
		t.Fatal("1,500 instances terminated against a 1,000-token bucket")
	}
	if srv.Refusals("TerminateInstances") == 0 {
		t.Fatal("no refusal")
	}
}

// deferred returns the Deferred that err must be.
func deferred(t *testing.T, err error) *instances.Deferred {
	t.Helper()
	var d *instances.Deferred
	if !errors.As(err, &d) || !errors.Is(err, instances.ErrNoTokens) {
		t.Fatalf("error %v, want a Deferred that is ErrNoTokens", err)
	}
	return d
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
	known, err := fleet.Describe(t.Context(), ids)
	if err != nil {
		t.Fatal(err)
	}

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
		out, err := fleet.Terminate(ctx, left, known)
		cancel()
		done := len(out)
		for _, id := range left[:done] {
			if out[id] != instances.Terminating {
				t.Fatalf("round %d: %s: %q", round, id, out[id])
			}
		}
		wantRunning(t, srv, false, left[:done])
		if done < len(left) {
			d := deferred(t, err)
			if !slices.Equal(d.IDs, left[done:]) {
				t.Fatalf("round %d: %d ids deferred, want the %d after the %d terminated", round, len(d.IDs), len(left)-done, done)
			}
			wantRunning(t, srv, true, d.IDs)
		} else if err != nil {
			t.Fatalf("round %d: all terminated, with %v", round, err)
		}
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
		found, err := fleet.Describe(ctx, left)
		cancel()
		done := len(found)
		for _, id := range left[:done] {
			if !found[id].Owned {
				t.Fatalf("round %d: %s not found", round, id)
			}
		}
		if done < len(left) {
			d := deferred(t, err)
			if !slices.Equal(d.IDs, left[done:]) {
				t.Fatalf("round %d: %d ids deferred, want the %d after the %d described", round, len(d.IDs), len(left)-done, done)
			}
		} else if err != nil {
			t.Fatalf("round %d: all described, with %v", round, err)
		}
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
	out, err := fleet.Terminate(ctx, ids, nil)
	d := deferred(t, err)
	if len(out) != 400 || !slices.Equal(d.IDs, ids[400:]) {
		t.Fatalf("%d decided, %d deferred: want the 400 of two lookups decided, the rest deferred", len(out), len(d.IDs))
	}
	for _, id := range ids[:400] {
		if out[id] != instances.Terminating {
			t.Fatalf("%s: %q", id, out[id])
		}
	}
	wantRunning(t, srv, true, d.IDs)
}

// A TerminateInstances that EC2 refuses, because the account's other
// tools hold the bucket empty, defers its instances; the Fleet then backs
// off instead of sending the next call into the empty bucket.
func TestRefusedTerminateIsDeferred(t *testing.T) {
	fleet, srv, ids := newFleet(t, 1, 100)
	fleet.Pace(model.PublishedBudget().Share(0.5), nil) // 2.5 requests a second
	known, err := fleet.Describe(t.Context(), ids)
	if err != nil {
		t.Fatal(err)
	}
	srv.HoldEmpty("TerminateInstances", time.Minute)

	out, err := fleet.Terminate(t.Context(), ids, known)
	d := deferred(t, err)
	var ae smithy.APIError
	if len(out) != 0 || !slices.Equal(d.IDs, ids) || !errors.As(err, &ae) || ae.ErrorCode() != "RequestLimitExceeded" {
		t.Fatalf("%d decided, %d deferred, %v: want all deferred for RequestLimitExceeded", len(out), len(d.IDs), err)
	}
	wantRunning(t, srv, true, ids)

	// The share's request tokens at hand went with the refusal: a call
	// that would start in the next 200 ms waits for half a token and is
	// not made.
	ctx, cancel := context.WithTimeout(t.Context(), 1200*time.Millisecond)
	defer cancel()
	_, err = fleet.Terminate(ctx, ids, known)
	if d := deferred(t, err); !slices.Equal(d.IDs, ids) {
		t.Fatalf("%d deferred, want all %d", len(d.IDs), len(ids))
	}
	if c := srv.CallCount("TerminateInstances"); c != 1 {
		t.Fatalf("%d TerminateInstances requests into a bucket held empty, want 1", c)
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
