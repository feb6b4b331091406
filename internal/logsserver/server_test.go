package logsserver_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatchlogs"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatchlogs/types"
	"github.com/aws/smithy-go"

	"github.com/reaper-k8s/reaper/internal/logsserver"
)

func client(srv *logsserver.Server) *cloudwatchlogs.Client {
	return cloudwatchlogs.New(cloudwatchlogs.Options{
		Region:       logsserver.Region,
		Credentials:  credentials.NewStaticCredentialsProvider("AKIDTEST", "secret", ""),
		BaseEndpoint: aws.String(srv.URL()),
	})
}

const group = "/reaper/prod/exits"

// FilterLogEvents returns a group's events in time order, within the time
// range, of the streams asked for, matching a JSON pattern, a page at a
// time.
func TestFilterLogEvents(t *testing.T) {
	srv := logsserver.New()
	defer srv.Close()
	srv.CreateLogGroup(group)
	t0 := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
	exit := func(n int) string { return fmt.Sprintf(`{"reaper":"container-exit","v":1,"exitCode":%d}`, n) }
	srv.PutLogEvent(group, logsserver.Event{Stream: "i-0b", Time: t0.Add(2 * time.Minute), Message: exit(2)})
	srv.PutLogEvent(group, logsserver.Event{Stream: "i-0a", Time: t0, Message: exit(0)})
	srv.PutLogEvent(group, logsserver.Event{Stream: "i-0a", Time: t0.Add(time.Minute), Message: "not json"})
	srv.PutLogEvent(group, logsserver.Event{Stream: "i-0c", Time: t0.Add(3 * time.Minute), Message: `{"reaper":"other"}`})
	srv.PutLogEvent(group, logsserver.Event{Stream: "i-0a", Time: t0.Add(4 * time.Minute), Message: exit(4)})

	filter := func(in *cloudwatchlogs.FilterLogEventsInput) []string {
		t.Helper()
		var got []string
		p := cloudwatchlogs.NewFilterLogEventsPaginator(client(srv), in)
		for p.HasMorePages() {
			page, err := p.NextPage(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			for _, ev := range page.Events {
				got = append(got, fmt.Sprintf("%s@%d", aws.ToString(ev.LogStreamName), time.UnixMilli(aws.ToInt64(ev.Timestamp)).Sub(t0)/time.Minute))
			}
		}
		return got
	}
	pattern := aws.String(`{ $.reaper = "container-exit" }`)
	for _, tc := range []struct {
		in   cloudwatchlogs.FilterLogEventsInput
		want string
	}{
		{cloudwatchlogs.FilterLogEventsInput{LogGroupName: aws.String(group)}, "[i-0a@0 i-0a@1 i-0b@2 i-0c@3 i-0a@4]"},
		{cloudwatchlogs.FilterLogEventsInput{LogGroupName: aws.String(group), FilterPattern: pattern, Limit: aws.Int32(1)}, "[i-0a@0 i-0b@2 i-0a@4]"},
		{cloudwatchlogs.FilterLogEventsInput{LogGroupIdentifier: aws.String("arn:aws:logs:us-east-1:123456789012:log-group:" + group), FilterPattern: aws.String(`{$.reaper!=container-exit}`)}, "[i-0c@3]"},
		{cloudwatchlogs.FilterLogEventsInput{LogGroupName: aws.String(group), FilterPattern: aws.String(`{ $.exitCode = 4 }`)}, "[i-0a@4]"},
		{cloudwatchlogs.FilterLogEventsInput{LogGroupName: aws.String(group), FilterPattern: pattern,
			StartTime: aws.Int64(t0.Add(time.Minute).UnixMilli()), EndTime: aws.Int64(t0.Add(2 * time.Minute).UnixMilli())}, "[i-0b@2]"},
		{cloudwatchlogs.FilterLogEventsInput{LogGroupName: aws.String(group), LogStreamNames: []string{"i-0a"}}, "[i-0a@0 i-0a@1 i-0a@4]"},
	} {
		if got := fmt.Sprint(filter(&tc.in)); got != tc.want {
			t.Errorf("FilterLogEvents(pattern %q, limit %d, start %v): %s, want %s", aws.ToString(tc.in.FilterPattern), aws.ToInt32(tc.in.Limit), tc.in.StartTime, got, tc.want)
		}
	}
}

// DescribeSubscriptionFilters lists a group's filters; a missing group is
// the SDK's ResourceNotFoundException for both actions, and a pattern this
// server does not evaluate is refused, not answered wrongly.
func TestSubscriptionFiltersAndErrors(t *testing.T) {
	srv := logsserver.New()
	defer srv.Close()
	srv.CreateLogGroup(group)
	srv.PutSubscriptionFilter(group, logsserver.SubscriptionFilter{Name: "reaper-exits", Pattern: `{ $.reaper = "container-exit" }`, DestinationARN: "arn:aws:lambda:us-east-1:123456789012:function:rec"})
	srv.PutSubscriptionFilter(group, logsserver.SubscriptionFilter{Name: "audit", Pattern: "", DestinationARN: "arn:aws:kinesis:us-east-1:123456789012:stream/audit"})
	out, err := client(srv).DescribeSubscriptionFilters(t.Context(), &cloudwatchlogs.DescribeSubscriptionFiltersInput{LogGroupName: aws.String(group)})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.SubscriptionFilters) != 2 || aws.ToString(out.SubscriptionFilters[0].FilterName) != "reaper-exits" ||
		aws.ToString(out.SubscriptionFilters[0].DestinationArn) != "arn:aws:lambda:us-east-1:123456789012:function:rec" ||
		aws.ToString(out.SubscriptionFilters[0].FilterPattern) != `{ $.reaper = "container-exit" }` {
		t.Errorf("DescribeSubscriptionFilters: %+v", out.SubscriptionFilters)
	}
	srv.DeleteSubscriptionFilter(group, "reaper-exits")
	out, err = client(srv).DescribeSubscriptionFilters(t.Context(), &cloudwatchlogs.DescribeSubscriptionFiltersInput{LogGroupName: aws.String(group), FilterNamePrefix: aws.String("reaper")})
	if err != nil || len(out.SubscriptionFilters) != 0 {
		t.Errorf("after DeleteSubscriptionFilter: %v, %+v", err, out)
	}

	srv.DeleteLogGroup(group)
	var nf *types.ResourceNotFoundException
	if _, err := client(srv).DescribeSubscriptionFilters(t.Context(), &cloudwatchlogs.DescribeSubscriptionFiltersInput{LogGroupName: aws.String(group)}); !errors.As(err, &nf) {
		t.Errorf("DescribeSubscriptionFilters of a missing group: %v", err)
	}
	if _, err := client(srv).FilterLogEvents(t.Context(), &cloudwatchlogs.FilterLogEventsInput{LogGroupName: aws.String(group)}); !errors.As(err, &nf) {
		t.Errorf("FilterLogEvents of a missing group: %v", err)
	}
	srv.CreateLogGroup(group)
	var invalid *types.InvalidParameterException
	if _, err := client(srv).FilterLogEvents(t.Context(), &cloudwatchlogs.FilterLogEventsInput{LogGroupName: aws.String(group), FilterPattern: aws.String("ERROR")}); !errors.As(err, &invalid) {
		t.Errorf("FilterLogEvents with a term pattern: %v, want InvalidParameterException", err)
	}
	var ae smithy.APIError
	if _, err := client(srv).DescribeLogGroups(t.Context(), &cloudwatchlogs.DescribeLogGroupsInput{}); !errors.As(err, &ae) || ae.ErrorCode() != "UnknownOperationException" {
		t.Errorf("DescribeLogGroups: %v, want UnknownOperationException", err)
	}
}
