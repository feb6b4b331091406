package ec2server_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/reaper-k8s/reaper/internal/callrecord"
	"github.com/reaper-k8s/reaper/internal/ec2server"
)

// newClient returns the real SDK client pointed at a fresh server. The
// retryer is the SDK's standard one with a short backoff cap, so retries are
// exercised without the 1 s throttle base delay slowing the suite down.
func newClient(t *testing.T, optFns ...func(*retry.StandardOptions)) (*ec2.Client, *ec2server.Server) {
	t.Helper()
	srv := ec2server.New()
	t.Cleanup(srv.Close)
	fns := append([]func(*retry.StandardOptions){func(o *retry.StandardOptions) { o.MaxBackoff = 10 * time.Millisecond }}, optFns...)
	client := ec2.New(ec2.Options{
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider("AKIDTEST", "secret", ""),
		BaseEndpoint: aws.String(srv.URL()),
		Retryer:      retry.NewStandard(fns...),
	})
	return client, srv
}

func TestDescribeWithTagFilter(t *testing.T) {
	ctx := context.Background()
	client, srv := newClient(t)
	launched := time.Date(2026, 3, 1, 12, 30, 0, 123e6, time.UTC)
	a := srv.AddInstance(ec2server.Instance{
		ID:         "i-0123456789abcdef0",
		LaunchTime: launched,
		Tags:       map[string]string{"reaper.io/managed": "true", "reaper.io/pod-name": "train-0"},
	})
	b := srv.AddInstance(ec2server.Instance{State: ec2server.Stopped, Tags: map[string]string{"reaper.io/managed": "true"}})
	srv.AddInstance(ec2server.Instance{State: ec2server.Terminated, Tags: map[string]string{"reaper.io/managed": "true"}})
	srv.AddInstance(ec2server.Instance{Tags: map[string]string{"team": "web"}})

	out, err := client.DescribeInstances(ctx, &ec2.DescribeInstancesInput{Filters: []types.Filter{
		{Name: aws.String("tag:reaper.io/managed"), Values: []string{"true"}},
		{Name: aws.String("instance-state-name"), Values: []string{"running", "stopped"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	var got []types.Instance
	for _, r := range out.Reservations {
		got = append(got, r.Instances...)
	}
	if len(got) != 2 || *got[0].InstanceId != a.ID || *got[1].InstanceId != b.ID {
		t.Fatalf("got %v, want [%s %s]", ids(got), a.ID, b.ID)
	}
	first := got[0]
	if first.State.Name != types.InstanceStateNameRunning || *first.State.Code != 16 {
		t.Errorf("state = %s/%d, want running/16", first.State.Name, *first.State.Code)
	}
	if !first.LaunchTime.Equal(launched) {
		t.Errorf("launchTime = %v, want %v", first.LaunchTime, launched)
	}
	tags := map[string]string{}
	for _, tag := range first.Tags {
		tags[*tag.Key] = *tag.Value
	}
	if tags["reaper.io/pod-name"] != "train-0" || len(tags) != 2 {
		t.Errorf("tags = %v", tags)
	}
	if got[1].State.Name != types.InstanceStateNameStopped || *got[1].State.Code != 80 {
		t.Errorf("second state = %s", got[1].State.Name)
	}

	// tag-key with a wildcard, and instance-id.
	out, err = client.DescribeInstances(ctx, &ec2.DescribeInstancesInput{Filters: []types.Filter{
		{Name: aws.String("tag-key"), Values: []string{"reaper.io/*"}},
		{Name: aws.String("instance-id"), Values: []string{b.ID}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Reservations) != 1 || *out.Reservations[0].Instances[0].InstanceId != b.ID {
		t.Fatalf("tag-key filter: got %d reservations", len(out.Reservations))
	}

	// instance-id values that exist nowhere just match nothing (unlike
	// InstanceIds); repeated and wildcard values behave as EC2's.
	for _, tc := range []struct {
		values []string
		want   []string
	}{
		{[]string{b.ID, "i-0000000000000dead", a.ID, b.ID}, []string{a.ID, b.ID}},
		{[]string{"i-0000000000000dead"}, nil},
		{[]string{a.ID[:len(a.ID)-1] + "?"}, []string{a.ID}},
	} {
		out, err := client.DescribeInstances(ctx, &ec2.DescribeInstancesInput{Filters: []types.Filter{
			{Name: aws.String("instance-id"), Values: tc.values},
			{Name: aws.String("tag:reaper.io/managed"), Values: []string{"true"}},
		}})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, r := range out.Reservations {
			got = append(got, ids(r.Instances)...)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("instance-id %v: got %v, want %v", tc.values, got, tc.want)
		}
	}

	_, err = client.DescribeInstances(ctx, &ec2.DescribeInstancesInput{Filters: []types.Filter{
		{Name: aws.String("no-such-filter"), Values: []string{"x"}},
	}})
	if code := callrecord.APIErrorCode(t, err); code != "InvalidParameterValue" {
		t.Errorf("unknown filter: code %s", code)
	}
}

func TestDescribePagination(t *testing.T) {
	client, srv := newClient(t)
	var want []string
	for i := range 12 {
		want = append(want, srv.AddInstance(ec2server.Instance{ID: fmt.Sprintf("i-%08x", i+1)}).ID)
	}
	var got []string
	pages := 0
	p := ec2.NewDescribeInstancesPaginator(client, &ec2.DescribeInstancesInput{MaxResults: aws.Int32(5)})
	for p.HasMorePages() {
		out, err := p.NextPage(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		pages++
		for _, r := range out.Reservations {
			got = append(got, ids(r.Instances)...)
		}
	}
	if pages != 3 || !slices.Equal(got, want) {
		t.Fatalf("pages=%d got %v, want 3 pages of %v", pages, got, want)
	}
	if n := srv.CallCount("DescribeInstances"); n != 3 {
		t.Errorf("CallCount = %d, want 3", n)
	}

	_, err := client.DescribeInstances(context.Background(), &ec2.DescribeInstancesInput{NextToken: aws.String("garbage")})
	if code := callrecord.APIErrorCode(t, err); code != "InvalidPaginationToken" {
		t.Errorf("bad token: code %s", code)
	}
}

func TestUnknownAndMalformedIDs(t *testing.T) {
	ctx := context.Background()
	client, srv := newClient(t)
	known := srv.AddInstance(ec2server.Instance{}).ID
	unknown := ec2server.NewInstanceID()

	_, err := client.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{known, unknown}})
	if code := callrecord.APIErrorCode(t, err); code != "InvalidInstanceID.NotFound" {
		t.Errorf("describe unknown: code %s", code)
	}
	var re *smithyhttp.ResponseError
	if !errors.As(err, &re) || re.HTTPStatusCode() != 400 {
		t.Errorf("describe unknown: want HTTP 400, got %v", err)
	}

	// All or nothing: the known instance must survive a request naming an
	// unknown one.
	_, err = client.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{known, unknown}})
	if code := callrecord.APIErrorCode(t, err); code != "InvalidInstanceID.NotFound" {
		t.Errorf("terminate unknown: code %s", code)
	}
	if inst, _ := srv.Instance(known); inst.State != ec2server.Running {
		t.Errorf("known instance is %s after a failed terminate", inst.State)
	}

	_, err = client.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{"i-nothex"}})
	if code := callrecord.APIErrorCode(t, err); code != "InvalidInstanceID.Malformed" {
		t.Errorf("malformed: code %s", code)
	}

	many := make([]string, 1001)
	for i := range many {
		many[i] = known
	}
	_, err = client.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: many})
	if code := callrecord.APIErrorCode(t, err); code != "InvalidRequest" {
		t.Errorf("1001 ids: code %s", code)
	}

	// Unknown ids are not retried: exactly one request each.
	if n := srv.CallCount("TerminateInstances"); n != 3 {
		t.Errorf("TerminateInstances calls = %d, want 3", n)
	}
}

func TestTerminateIsIdempotent(t *testing.T) {
	ctx := context.Background()
	client, srv := newClient(t)
	id := srv.AddInstance(ec2server.Instance{}).ID

	out, err := client.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{id}})
	if err != nil {
		t.Fatal(err)
	}
	ch := out.TerminatingInstances[0]
	if *ch.InstanceId != id || ch.CurrentState.Name != types.InstanceStateNameShuttingDown || ch.PreviousState.Name != types.InstanceStateNameRunning {
		t.Fatalf("first terminate: %s %s -> %s", *ch.InstanceId, ch.PreviousState.Name, ch.CurrentState.Name)
	}
	if inst, _ := srv.Instance(id); inst.State != ec2server.Terminated || inst.StateReason.Code != "Client.UserInitiatedShutdown" {
		t.Fatalf("after terminate: %+v", inst)
	}

	out, err = client.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{id}})
	if err != nil {
		t.Fatalf("second terminate: %v", err)
	}
	ch = out.TerminatingInstances[0]
	if ch.CurrentState.Name != types.InstanceStateNameTerminated || ch.PreviousState.Name != types.InstanceStateNameTerminated ||
		*ch.CurrentState.Code != 48 {
		t.Fatalf("second terminate: %s -> %s", ch.PreviousState.Name, ch.CurrentState.Name)
	}

	// An id named twice in one request changes state once.
	other := srv.AddInstance(ec2server.Instance{}).ID
	out, err = client.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{other, id, other}})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(out.TerminatingInstances); n != 2 || out.TerminatingInstances[0].PreviousState.Name != types.InstanceStateNameRunning {
		t.Fatalf("duplicate ids: %d entries, first previous state %s", n, out.TerminatingInstances[0].PreviousState.Name)
	}

	// Terminated instances stay visible until removed.
	desc, err := client.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{id}})
	if err != nil || desc.Reservations[0].Instances[0].State.Name != types.InstanceStateNameTerminated {
		t.Fatalf("describe terminated: %v", err)
	}
	srv.RemoveInstance(id)
	_, err = client.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{id}})
	if code := callrecord.APIErrorCode(t, err); code != "InvalidInstanceID.NotFound" {
		t.Errorf("describe removed: code %s", code)
	}
}

func TestTransitionDelayAndSetState(t *testing.T) {
	ctx := context.Background()
	client, srv := newClient(t)
	srv.SetTransitionDelay(time.Hour)
	a := srv.AddInstance(ec2server.Instance{}).ID
	b := srv.AddInstance(ec2server.Instance{}).ID

	if _, err := client.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{a}}); err != nil {
		t.Fatal(err)
	}
	out, err := client.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{a}})
	if err != nil {
		t.Fatal(err)
	}
	if s := out.TerminatingInstances[0].CurrentState.Name; s != types.InstanceStateNameShuttingDown {
		t.Errorf("still shutting down expected, got %s", s)
	}

	srv.SetState(b, ec2server.Stopped)
	if inst, _ := srv.Instance(b); inst.State != ec2server.Stopped {
		t.Errorf("SetState: %s", inst.State)
	}

	_, err = client.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{b}, DryRun: aws.Bool(true)})
	if code := callrecord.APIErrorCode(t, err); code != "DryRunOperation" {
		t.Errorf("dry run: code %s", code)
	}
	if inst, _ := srv.Instance(b); inst.State != ec2server.Stopped {
		t.Errorf("dry run changed the state to %s", inst.State)
	}
	out, err = client.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{b}})
	if err != nil {
		t.Fatal(err)
	}
	if ch := out.TerminatingInstances[0]; ch.PreviousState.Name != types.InstanceStateNameStopped || ch.CurrentState.Name != types.InstanceStateNameShuttingDown {
		t.Errorf("terminate stopped: %s -> %s", ch.PreviousState.Name, ch.CurrentState.Name)
	}
}

func TestThrottlingIsRetried(t *testing.T) {
	ctx := context.Background()
	client, srv := newClient(t)
	id := srv.AddInstance(ec2server.Instance{}).ID

	srv.Throttle("TerminateInstances", 2)
	if _, err := client.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{id}}); err != nil {
		t.Fatalf("terminate after 2 throttles: %v", err)
	}
	calls := srv.Calls()
	if len(calls) != 3 {
		t.Fatalf("want 3 attempts, got %d", len(calls))
	}
	for i, c := range calls {
		throttled := i < 2
		if c.Injected != throttled || (c.ErrorCode == "RequestLimitExceeded") != throttled || !slices.Equal(c.InstanceIDs, []string{id}) {
			t.Errorf("call %d: %+v", i, c)
		}
	}

	// When the throttle outlasts the attempts, the caller sees a throttle
	// error the SDK classifies as one.
	srv.ResetCalls()
	srv.ThrottleUntil("", time.Now().Add(time.Minute))
	_, err := client.DescribeInstances(ctx, &ec2.DescribeInstancesInput{})
	if code := callrecord.APIErrorCode(t, err); code != "RequestLimitExceeded" {
		t.Fatalf("code %s", code)
	}
	if retry.IsErrorThrottles(retry.DefaultThrottles).IsErrorThrottle(err) != aws.TrueTernary {
		t.Errorf("SDK does not classify %v as a throttle", err)
	}
	var re *smithyhttp.ResponseError
	if !errors.As(err, &re) || re.HTTPStatusCode() != 503 {
		t.Errorf("want HTTP 503, got %v", err)
	}
	if n := srv.CallCount("DescribeInstances"); n != retry.DefaultMaxAttempts {
		t.Errorf("attempts = %d, want %d", n, retry.DefaultMaxAttempts)
	}
	srv.ClearFaults()
	if _, err := client.DescribeInstances(ctx, &ec2.DescribeInstancesInput{}); err != nil {
		t.Fatalf("after ClearFaults: %v", err)
	}
}

func TestFailNext(t *testing.T) {
	ctx := context.Background()
	client, srv := newClient(t)
	id := srv.AddInstance(ec2server.Instance{}).ID

	// A 500 is retried by status code.
	srv.FailNext("DescribeInstances", 1, "InternalError", 500)
	if _, err := client.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{id}}); err != nil {
		t.Fatalf("describe after one InternalError: %v", err)
	}
	if n := srv.CallCount("DescribeInstances"); n != 2 {
		t.Errorf("attempts = %d, want 2", n)
	}

	// A client error is not retried, and the instance is untouched.
	srv.FailNext("TerminateInstances", 1, "UnauthorizedOperation", 403)
	_, err := client.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{id}})
	if code := callrecord.APIErrorCode(t, err); code != "UnauthorizedOperation" {
		t.Fatalf("code %s", code)
	}
	if n := srv.CallCount("TerminateInstances"); n != 1 {
		t.Errorf("attempts = %d, want 1", n)
	}
	if inst, _ := srv.Instance(id); inst.State != ec2server.Running {
		t.Errorf("state %s after a faulted terminate", inst.State)
	}
}

// TallySince counts every call by action, faulted ones included, and takes
// an instance as terminated from the first successful TerminateInstances
// naming it.
func TestTallySince(t *testing.T) {
	ctx := context.Background()
	client, srv := newClient(t)
	a, b := srv.AddInstance(ec2server.Instance{}).ID, srv.AddInstance(ec2server.Instance{}).ID
	if _, err := client.DescribeInstances(ctx, &ec2.DescribeInstancesInput{}); err != nil {
		t.Fatal(err)
	}
	from := len(srv.Calls())
	srv.FailNext("TerminateInstances", 1, "UnauthorizedOperation", 403)
	if _, err := client.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{a}}); err == nil {
		t.Fatal("the injected fault did not answer")
	}
	for _, ids := range [][]string{{a}, {a, b}} {
		if _, err := client.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: ids}); err != nil {
			t.Fatal(err)
		}
	}

	calls := srv.Calls()
	if got := calls[from].Terminated(); got != nil {
		t.Errorf("the faulted TerminateInstances terminated %v", got)
	}
	tally := srv.TallySince(from)
	if want := map[string]int{"TerminateInstances": 3}; !maps.Equal(tally.Requests, want) {
		t.Errorf("requests %v, want %v", tally.Requests, want)
	}
	if len(tally.Refused) != 0 {
		t.Errorf("refused %v without buckets", tally.Refused)
	}
	if want := map[string]time.Time{a: calls[from+1].Time, b: calls[from+2].Time}; !maps.Equal(tally.FirstTerminated, want) {
		t.Errorf("first terminated %v, want %v", tally.FirstTerminated, want)
	}
	if n := len(srv.TallySince(len(calls) + 1).Requests); n != 0 {
		t.Errorf("a tally past the last call counted %d actions", n)
	}
}

func TestConcurrentUse(t *testing.T) {
	ctx := context.Background()
	client, srv := newClient(t)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			id := srv.AddInstance(ec2server.Instance{Tags: map[string]string{"reaper.io/managed": "true"}}).ID
			if _, err := client.DescribeInstances(ctx, &ec2.DescribeInstancesInput{}); err != nil {
				t.Error(err)
			}
			if _, err := client.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{id}}); err != nil {
				t.Error(err)
			}
			_ = srv.Calls()
		})
	}
	wg.Wait()
	if n := srv.CallCount("TerminateInstances"); n != 8 {
		t.Errorf("TerminateInstances calls = %d", n)
	}
}

func ids(insts []types.Instance) []string {
	out := make([]string, len(insts))
	for i, inst := range insts {
		out[i] = aws.ToString(inst.InstanceId)
	}
	return out
}

// A provider launches with the SDK's RunInstances: the instance runs at once,
// carries the instance tags of its TagSpecifications (not those for other
// resource types) and DescribeInstances finds it by them.
func TestRunInstances(t *testing.T) {
	ctx := context.Background()
	client, srv := newClient(t)
	out, err := client.RunInstances(ctx, &ec2.RunInstancesInput{
		MinCount: aws.Int32(1), MaxCount: aws.Int32(1), ImageId: aws.String("ami-0123456789abcdef0"),
		InstanceType: types.InstanceTypeG5Xlarge,
		TagSpecifications: []types.TagSpecification{
			{ResourceType: types.ResourceTypeVolume, Tags: []types.Tag{{Key: aws.String("volume-only"), Value: aws.String("x")}}},
			{ResourceType: types.ResourceTypeInstance, Tags: []types.Tag{
				{Key: aws.String("reaper.io/managed"), Value: aws.String("true")},
				{Key: aws.String("reaper.io/pod-name"), Value: aws.String("train-0")},
			}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Instances) != 1 || out.ReservationId == nil {
		t.Fatalf("RunInstances answered %+v", out)
	}
	id := aws.ToString(out.Instances[0].InstanceId)
	if out.Instances[0].State.Name != types.InstanceStateNameRunning {
		t.Errorf("state %s, want running", out.Instances[0].State.Name)
	}
	inst, ok := srv.Instance(id)
	want := map[string]string{"reaper.io/managed": "true", "reaper.io/pod-name": "train-0"}
	if !ok || inst.State != ec2server.Running || inst.InstanceType != "g5.xlarge" || fmt.Sprint(inst.Tags) != fmt.Sprint(want) {
		t.Fatalf("server holds %+v (known %v), want running g5.xlarge with tags %v", inst, ok, want)
	}
	desc, err := client.DescribeInstances(ctx, &ec2.DescribeInstancesInput{
		Filters: []types.Filter{{Name: aws.String("tag:reaper.io/pod-name"), Values: []string{"train-0"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(desc.Reservations) != 1 || aws.ToString(desc.Reservations[0].Instances[0].InstanceId) != id {
		t.Fatalf("DescribeInstances by tag found %+v, want %s", desc.Reservations, id)
	}

	if _, err := client.RunInstances(ctx, &ec2.RunInstancesInput{MinCount: aws.Int32(0), MaxCount: aws.Int32(1)}); callrecord.APIErrorCode(t, err) != "InvalidParameterValue" {
		t.Errorf("MinCount 0: %v, want InvalidParameterValue", err)
	}
}

// CreateTags through the real SDK: all or nothing, and on an instance whose
// metadata shows its tags only keys the metadata can show, as at launch.
func TestCreateTags(t *testing.T) {
	ctx := t.Context()
	client, srv := newClient(t, func(o *retry.StandardOptions) { o.MaxAttempts = 1 })
	plain := srv.AddInstance(ec2server.Instance{Tags: map[string]string{"reaper.io/managed": "true"}}).ID
	tag := func(key string, ids ...string) error {
		_, err := client.CreateTags(ctx, &ec2.CreateTagsInput{Resources: ids, Tags: []types.Tag{{Key: aws.String(key), Value: aws.String("2026-12-02T10:00:00Z")}}})
		return err
	}
	if err := tag("reaper.io:pod-written", plain); err != nil {
		t.Fatal(err)
	}
	if i, _ := srv.Instance(plain); i.Tags["reaper.io:pod-written"] != "2026-12-02T10:00:00Z" || i.Tags["reaper.io/managed"] != "true" {
		t.Fatalf("tags %v", i.Tags)
	}
	if err := tag("x", plain, ec2server.NewInstanceID()); err == nil || !strings.Contains(err.Error(), "InvalidInstanceID.NotFound") {
		t.Fatalf("unknown id: %v", err)
	}
	if i, _ := srv.Instance(plain); i.Tags["x"] != "" {
		t.Fatalf("a failed call tagged %s: %v", plain, i.Tags)
	}

	launch := func(keys ...string) (string, error) {
		var tags []types.Tag
		for _, k := range keys {
			tags = append(tags, types.Tag{Key: aws.String(k), Value: aws.String("v")})
		}
		out, err := client.RunInstances(ctx, &ec2.RunInstancesInput{
			MinCount: aws.Int32(1), MaxCount: aws.Int32(1), ImageId: aws.String("ami-0123456789abcdef0"),
			MetadataOptions:   &types.InstanceMetadataOptionsRequest{InstanceMetadataTags: types.InstanceMetadataTagsStateEnabled},
			TagSpecifications: []types.TagSpecification{{ResourceType: types.ResourceTypeInstance, Tags: tags}},
		})
		if err != nil {
			return "", err
		}
		return aws.ToString(out.Instances[0].InstanceId), nil
	}
	if _, err := launch("reaper.io/managed"); err == nil || !strings.Contains(err.Error(), "InvalidParameterValue") {
		t.Fatalf("launch with a slash in a key and metadata tags: %v", err)
	}
	shown, err := launch("reaper.io:managed")
	if err != nil {
		t.Fatal(err)
	}
	if err := tag("reaper.io/pod-written", shown, plain); err == nil || !strings.Contains(err.Error(), "InvalidParameterValue") {
		t.Fatalf("a slash in a key on an instance with metadata tags: %v", err)
	}
	if err := tag("reaper.io:pod-written", shown); err != nil {
		t.Fatal(err)
	}
	if n := srv.CallCount("CreateTags"); n != 4 {
		t.Fatalf("%d CreateTags calls recorded, want 4", n)
	}
}
