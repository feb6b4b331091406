package app_test

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"

	"github.com/reaper-k8s/reaper/internal/ec2server"
	"github.com/reaper-k8s/reaper/internal/sqsserver"
	"github.com/reaper-k8s/reaper/pkg/app"
)

// The account's other tools hold the TerminateInstances buckets empty
// while one client sends 110 calls: more throttled retries than the SDK's
// retry quota (500 tokens, 5 a throttled retry) allows. With Reaper's
// retryer every call rides the hold out and succeeds; none fails with
// "retry quota exceeded".
func TestRetryerRidesOutThrottling(t *testing.T) {
	srv := ec2server.New()
	t.Cleanup(srv.Close)
	client := ec2.New(ec2.Options{
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider("AKIDTEST", "secret", ""),
		BaseEndpoint: aws.String(srv.URL()),
		HTTPClient:   &http.Client{Transport: sqsserver.BufferedBodies{}},
		Retryer:      app.Retryer(),
	})
	const calls = 110
	ids := make([]string, calls)
	for i := range ids {
		ids[i] = srv.AddInstance(ec2server.Instance{}).ID
	}
	// At 100 times the published refill the buckets cover the 110 calls
	// within a second of the hold's end.
	srv.EnableBuckets(ec2server.PublishedLimits(), 100)
	srv.HoldEmpty("TerminateInstances", 2*time.Second)

	errs := make([]error, calls)
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Go(func() {
			_, errs[i] = client.TerminateInstances(t.Context(), &ec2.TerminateInstancesInput{InstanceIds: []string{id}})
		})
	}
	wg.Wait()
	failed := 0
	for i, err := range errs {
		if err == nil {
			continue
		}
		failed++
		if strings.Contains(err.Error(), "retry quota exceeded") {
			t.Errorf("%s: %v", ids[i], err)
		}
	}
	if failed > 0 {
		t.Fatalf("%d of %d calls failed", failed, calls)
	}
	if r := srv.Refusals("TerminateInstances"); r < calls {
		t.Fatalf("%d refusals: the hold did not throttle every call", r)
	}
	for _, id := range ids {
		if i, _ := srv.Instance(id); i.State == ec2server.Running {
			t.Fatalf("%s still running", id)
		}
	}
}
