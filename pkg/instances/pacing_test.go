package instances_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"

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
	if n := srv.CallCount("TerminateInstances"); n != 3 {
		t.Fatalf("%d TerminateInstances requests for %d instances, want 3", n, len(ids))
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

// Tokens that would come after the deadline are not waited for: the call
// is not made and ErrNoTokens says why, so the work can be deferred.
func TestNoTokensBeforeDeadline(t *testing.T) {
	fleet, srv, ids := newFleet(t, 1, 1200)
	fleet.Pace(model.PublishedBudget().Share(0.5), nil)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	out, err := fleet.Terminate(ctx, ids, nil)
	if !errors.Is(err, instances.ErrNoTokens) {
		t.Fatalf("terminate: %v, want ErrNoTokens", err)
	}
	if len(out) != 0 || srv.CallCount("TerminateInstances") != 0 {
		t.Fatalf("%d outcomes, %d calls: a call was made without its tokens", len(out), srv.CallCount("TerminateInstances"))
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
