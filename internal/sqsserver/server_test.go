package sqsserver_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"

	"github.com/reaper-k8s/reaper/internal/callrecord"
	"github.com/reaper-k8s/reaper/internal/sqsserver"
)

// newClient returns the real SDK client pointed at a fresh server, with
// message checksum validation on (the SDK default), request bodies
// buffered (see BufferedBodies) and a short retry backoff so retried
// faults do not slow the suite down.
func newClient(t *testing.T) (*sqs.Client, *sqsserver.Server) {
	t.Helper()
	srv := sqsserver.New()
	t.Cleanup(srv.Close)
	client := srv.Client(nil, func(o *sqs.Options) {
		o.Retryer = retry.NewStandard(func(o *retry.StandardOptions) { o.MaxBackoff = 10 * time.Millisecond })
	})
	return client, srv
}

func createQueue(t *testing.T, client *sqs.Client, name string, attrs map[string]string) string {
	t.Helper()
	out, err := client.CreateQueue(context.Background(), &sqs.CreateQueueInput{QueueName: aws.String(name), Attributes: attrs})
	if err != nil {
		t.Fatalf("CreateQueue %s: %v", name, err)
	}
	return aws.ToString(out.QueueUrl)
}

func depth(t *testing.T, srv *sqsserver.Server, name string) sqsserver.Depth {
	t.Helper()
	d, ok := srv.Depth(name)
	if !ok {
		t.Fatalf("no queue %s", name)
	}
	return d
}

func receive(t *testing.T, client *sqs.Client, in *sqs.ReceiveMessageInput) []types.Message {
	t.Helper()
	if in.MessageSystemAttributeNames == nil {
		in.MessageSystemAttributeNames = []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll}
	}
	out, err := client.ReceiveMessage(context.Background(), in)
	if err != nil {
		t.Fatalf("ReceiveMessage: %v", err)
	}
	return out.Messages
}

func receiveCount(t *testing.T, m types.Message) int {
	t.Helper()
	n, err := strconv.Atoi(m.Attributes[string(types.MessageSystemAttributeNameApproximateReceiveCount)])
	if err != nil {
		t.Fatalf("ApproximateReceiveCount of %s: %v", aws.ToString(m.MessageId), err)
	}
	return n
}

// deleteBatch deletes msgs in one DeleteMessageBatch, the way consumers
// delete, and fails on an entry the server refuses.
func deleteBatch(ctx context.Context, client *sqs.Client, url string, msgs ...types.Message) error {
	var entries []types.DeleteMessageBatchRequestEntry
	for i, m := range msgs {
		entries = append(entries, types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: m.ReceiptHandle})
	}
	out, err := client.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: &url, Entries: entries})
	if err == nil && len(out.Failed) > 0 {
		err = fmt.Errorf("DeleteMessageBatch refused %+v", out.Failed)
	}
	return err
}

func TestSendReceiveDelete(t *testing.T) {
	ctx := context.Background()
	client, srv := newClient(t)
	url := createQueue(t, client, "work", nil)
	if want := srv.QueueURL("work"); url != want {
		t.Fatalf("QueueUrl = %s, want %s", url, want)
	}

	before := time.Now().Add(-time.Second)
	sent, err := client.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: &url, MessageBody: aws.String(`{"instanceId":"i-0123456789abcdef0"}`)})
	if err != nil {
		t.Fatal(err) // includes the SDK's MD5OfMessageBody check
	}
	if d := depth(t, srv, "work"); d != (sqsserver.Depth{Visible: 1}) {
		t.Fatalf("depth after send = %+v", d)
	}

	msgs := receive(t, client, &sqs.ReceiveMessageInput{QueueUrl: &url, MaxNumberOfMessages: 10})
	if len(msgs) != 1 {
		t.Fatalf("received %d messages, want 1", len(msgs))
	}
	m := msgs[0]
	if aws.ToString(m.MessageId) != aws.ToString(sent.MessageId) || aws.ToString(m.Body) != `{"instanceId":"i-0123456789abcdef0"}` {
		t.Fatalf("received %s %q", aws.ToString(m.MessageId), aws.ToString(m.Body))
	}
	if receiveCount(t, m) != 1 || m.Attributes["SenderId"] != sqsserver.SenderID {
		t.Errorf("attributes = %v", m.Attributes)
	}
	for _, name := range []string{"SentTimestamp", "ApproximateFirstReceiveTimestamp"} {
		ms, err := strconv.ParseInt(m.Attributes[name], 10, 64)
		if err != nil || time.UnixMilli(ms).Before(before) || time.UnixMilli(ms).After(time.Now()) {
			t.Errorf("%s = %q, want a recent epoch in milliseconds", name, m.Attributes[name])
		}
	}
	if d := depth(t, srv, "work"); d != (sqsserver.Depth{InFlight: 1}) {
		t.Fatalf("depth after receive = %+v", d)
	}
	if again := receive(t, client, &sqs.ReceiveMessageInput{QueueUrl: &url}); len(again) != 0 {
		t.Fatalf("an in-flight message was received again")
	}

	if err := deleteBatch(ctx, client, url, m); err != nil {
		t.Fatal(err)
	}
	attrs, err := client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: &url, AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameAll}})
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{
		"ApproximateNumberOfMessages":           "0",
		"ApproximateNumberOfMessagesNotVisible": "0",
		"ApproximateNumberOfMessagesDelayed":    "0",
		"QueueArn":                              sqsserver.QueueARN("work"),
		"VisibilityTimeout":                     "30",
		"MaximumMessageSize":                    "1048576",
		"MessageRetentionPeriod":                "345600",
	} {
		if attrs.Attributes[name] != want {
			t.Errorf("%s = %q, want %q", name, attrs.Attributes[name], want)
		}
	}
	if _, ok := attrs.Attributes["RedrivePolicy"]; ok {
		t.Errorf("RedrivePolicy reported for a queue without one")
	}

	for action, want := range map[string]int{"CreateQueue": 1, "SendMessage": 1, "ReceiveMessage": 2, "DeleteMessageBatch": 1, "GetQueueAttributes": 1} {
		if got := srv.CallCount(action); got != want {
			t.Errorf("%s calls = %d, want %d", action, got, want)
		}
	}
	calls := srv.Calls()
	if c := calls[2]; c.Action != "ReceiveMessage" || c.Queue != "work" || c.Count != 1 || c.ErrorCode != "" {
		t.Errorf("third call = %+v, want a ReceiveMessage of work returning 1", c)
	}
	srv.ResetCalls()
	if len(srv.Calls()) != 0 {
		t.Errorf("ResetCalls kept calls")
	}
}

// The SDK checks body digests itself; these check the message attribute
// digest against values computed by SQS (from its documentation and
// other implementations' test vectors), on send and on receive.
func TestMessageAttributeDigests(t *testing.T) {
	ctx := context.Background()
	client, _ := newClient(t)
	// VisibilityTimeout 0: each receive leaves the message receivable.
	url := createQueue(t, client, "attrs", map[string]string{"VisibilityTimeout": "0"})
	str := func(dataType, v string) types.MessageAttributeValue {
		return types.MessageAttributeValue{DataType: aws.String(dataType), StringValue: aws.String(v)}
	}
	for _, tc := range []struct {
		attrs map[string]types.MessageAttributeValue
		want  string
	}{
		{map[string]types.MessageAttributeValue{"SellerName": str("String", "Example Store")}, "cd28f3b68aeee4b2eac9c66f2f694b58"},
		{map[string]types.MessageAttributeValue{"timestamp": str("Number", "1493147359900")}, "235c5c510d26fb653d073faed50ae77c"},
		{map[string]types.MessageAttributeValue{"ordinal": str("Number", "1"), "category": str("String", "test")}, "d21ae90c49061e927f57df5f5d72be1f"},
		{map[string]types.MessageAttributeValue{
			"test_attribute_name_2": str("String", "test_attribute_value_2"),
			"test_attribute_name_1": str("String", "test_attribute_value_1"),
		}, "d53f3b558fe951154770f25cb63dbba9"},
		{map[string]types.MessageAttributeValue{
			"test_attribute_name": {DataType: aws.String("Binary"), BinaryValue: []byte("test_attribute_value")},
		}, "23f6bd27ea87aab7dfeadcc9aebee495"},
	} {
		out, err := client.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: &url, MessageBody: aws.String("x"), MessageAttributes: tc.attrs})
		if err != nil {
			t.Fatal(err)
		}
		if got := aws.ToString(out.MD5OfMessageAttributes); got != tc.want {
			t.Errorf("send %v: MD5OfMessageAttributes = %s, want %s", keys(tc.attrs), got, tc.want)
		}
		msgs := receive(t, client, &sqs.ReceiveMessageInput{QueueUrl: &url, MessageAttributeNames: []string{"All"}})
		if len(msgs) != 1 {
			t.Fatalf("received %d", len(msgs))
		}
		if got := aws.ToString(msgs[0].MD5OfMessageAttributes); got != tc.want {
			t.Errorf("receive %v: MD5OfMessageAttributes = %s, want %s", keys(tc.attrs), got, tc.want)
		}
		if len(msgs[0].MessageAttributes) != len(tc.attrs) {
			t.Errorf("received attributes %v, want %v", msgs[0].MessageAttributes, keys(tc.attrs))
		}
		if err := deleteBatch(ctx, client, url, msgs[0]); err != nil {
			t.Fatal(err)
		}
	}

	// Receiving a subset returns only those attributes, with their digest.
	_, err := client.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: &url, MessageBody: aws.String("x"), MessageAttributes: map[string]types.MessageAttributeValue{
		"SellerName":  str("String", "Example Store"),
		"reaper.kind": str("String", "exit"),
		"reaper.v":    str("Number", "1"),
	}})
	if err != nil {
		t.Fatal(err)
	}
	msgs := receive(t, client, &sqs.ReceiveMessageInput{QueueUrl: &url, MessageAttributeNames: []string{"SellerName"}})
	if len(msgs) != 1 || len(msgs[0].MessageAttributes) != 1 || aws.ToString(msgs[0].MD5OfMessageAttributes) != "cd28f3b68aeee4b2eac9c66f2f694b58" {
		t.Fatalf("subset receive: %+v", msgs)
	}
	msgs = receive(t, client, &sqs.ReceiveMessageInput{QueueUrl: &url, MessageAttributeNames: []string{"reaper.*"}})
	if len(msgs) != 1 || len(msgs[0].MessageAttributes) != 2 {
		t.Fatalf("prefix receive: %+v", msgs)
	}
	if msgs[0].MessageAttributes["reaper.v"].StringValue == nil || *msgs[0].MessageAttributes["reaper.v"].StringValue != "1" {
		t.Errorf("reaper.v = %+v", msgs[0].MessageAttributes["reaper.v"])
	}
}

func keys(m map[string]types.MessageAttributeValue) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestBatchOperations(t *testing.T) {
	ctx := context.Background()
	client, srv := newClient(t)
	url := createQueue(t, client, "batch", map[string]string{"VisibilityTimeout": "60"})

	var entries []types.SendMessageBatchRequestEntry
	for i := range 10 {
		entries = append(entries, types.SendMessageBatchRequestEntry{Id: aws.String(fmt.Sprintf("e%d", i)), MessageBody: aws.String(fmt.Sprintf("body-%d", i))})
	}
	entries[3].DelaySeconds = 901 // fails alone
	sent, err := client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: &url, Entries: entries})
	if err != nil {
		t.Fatal(err) // includes the SDK's per-entry body digest checks
	}
	if len(sent.Successful) != 9 || len(sent.Failed) != 1 {
		t.Fatalf("successful %d, failed %d, want 9 and 1", len(sent.Successful), len(sent.Failed))
	}
	if f := sent.Failed[0]; aws.ToString(f.Id) != "e3" || aws.ToString(f.Code) != "InvalidParameterValue" || !f.SenderFault {
		t.Errorf("failed entry = %+v", f)
	}
	if c := srv.Calls()[1]; c.Action != "SendMessageBatch" || c.Count != 10 {
		t.Errorf("call = %+v, want SendMessageBatch with 10 entries", c)
	}

	msgs := receive(t, client, &sqs.ReceiveMessageInput{QueueUrl: &url, MaxNumberOfMessages: 10})
	if len(msgs) != 9 {
		t.Fatalf("received %d, want 9", len(msgs))
	}
	for i, m := range msgs { // in send order, e3 missing
		want := i
		if i >= 3 {
			want++
		}
		if aws.ToString(m.Body) != fmt.Sprintf("body-%d", want) {
			t.Errorf("message %d body %q", i, aws.ToString(m.Body))
		}
	}

	// Three deleted, one bad handle.
	del, err := client.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: &url, Entries: []types.DeleteMessageBatchRequestEntry{
		{Id: aws.String("x"), ReceiptHandle: msgs[2].ReceiptHandle},
		{Id: aws.String("y"), ReceiptHandle: msgs[3].ReceiptHandle},
		{Id: aws.String("z"), ReceiptHandle: msgs[4].ReceiptHandle},
		{Id: aws.String("bad"), ReceiptHandle: aws.String("AAAA")},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if len(del.Successful) != 3 || len(del.Failed) != 1 || aws.ToString(del.Failed[0].Id) != "bad" ||
		aws.ToString(del.Failed[0].Code) != "ReceiptHandleIsInvalid" || !del.Failed[0].SenderFault {
		t.Fatalf("DeleteMessageBatch = %+v / %+v", del.Successful, del.Failed)
	}
	if d := depth(t, srv, "batch"); d != (sqsserver.Depth{InFlight: 6}) {
		t.Fatalf("depth = %+v, want 6 in flight", d)
	}

	// Request-wide rules.
	tooMany := append(entries[:0:0], entries...)
	tooMany = append(tooMany, types.SendMessageBatchRequestEntry{Id: aws.String("e10"), MessageBody: aws.String("x")})
	_, err = client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: &url, Entries: tooMany})
	var tooManyErr *types.TooManyEntriesInBatchRequest
	if !errors.As(err, &tooManyErr) {
		t.Errorf("11 entries: %v, want TooManyEntriesInBatchRequest", err)
	}
	_, err = client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: &url, Entries: []types.SendMessageBatchRequestEntry{}})
	var emptyErr *types.EmptyBatchRequest
	if !errors.As(err, &emptyErr) {
		t.Errorf("no entries: %v, want EmptyBatchRequest", err)
	}
	_, err = client.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: &url, Entries: []types.DeleteMessageBatchRequestEntry{
		{Id: aws.String("same"), ReceiptHandle: msgs[5].ReceiptHandle},
		{Id: aws.String("same"), ReceiptHandle: msgs[6].ReceiptHandle},
	}})
	var dupErr *types.BatchEntryIdsNotDistinct
	if !errors.As(err, &dupErr) {
		t.Errorf("repeated ids: %v, want BatchEntryIdsNotDistinct", err)
	}
	_, err = client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: &url, Entries: []types.SendMessageBatchRequestEntry{{Id: aws.String("no spaces"), MessageBody: aws.String("x")}}})
	var idErr *types.InvalidBatchEntryId
	if !errors.As(err, &idErr) {
		t.Errorf("bad id: %v, want InvalidBatchEntryId", err)
	}
	half := strings.Repeat("x", 600_000)
	_, err = client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: &url, Entries: []types.SendMessageBatchRequestEntry{
		{Id: aws.String("a"), MessageBody: &half}, {Id: aws.String("b"), MessageBody: &half},
	}})
	var longErr *types.BatchRequestTooLong
	if !errors.As(err, &longErr) {
		t.Errorf("1.2 MB batch: %v, want BatchRequestTooLong", err)
	}
	if d := depth(t, srv, "batch"); d != (sqsserver.Depth{InFlight: 6}) {
		t.Fatalf("refused batches changed the queue: %+v", d)
	}
}

func TestVisibilityTimeoutAndRedelivery(t *testing.T) {
	ctx := context.Background()
	client, srv := newClient(t)
	url := createQueue(t, client, "vis", map[string]string{"VisibilityTimeout": "1"})
	if _, err := client.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: &url, MessageBody: aws.String("m")}); err != nil {
		t.Fatal(err)
	}

	first := receive(t, client, &sqs.ReceiveMessageInput{QueueUrl: &url})
	if len(first) != 1 || receiveCount(t, first[0]) != 1 {
		t.Fatalf("first receive: %+v", first)
	}
	if none := receive(t, client, &sqs.ReceiveMessageInput{QueueUrl: &url}); len(none) != 0 {
		t.Fatal("received during the visibility timeout")
	}
	// The long poll returns when the 1 s timeout ends.
	second := receive(t, client, &sqs.ReceiveMessageInput{QueueUrl: &url, WaitTimeSeconds: 5})
	if len(second) != 1 || receiveCount(t, second[0]) != 2 {
		t.Fatalf("second receive: %+v", second)
	}
	if aws.ToString(second[0].ReceiptHandle) == aws.ToString(first[0].ReceiptHandle) {
		t.Error("the receipt handle did not change between receives")
	}
	if second[0].Attributes["ApproximateFirstReceiveTimestamp"] != first[0].Attributes["ApproximateFirstReceiveTimestamp"] {
		t.Error("ApproximateFirstReceiveTimestamp changed on redelivery")
	}

	// The stale handle is accepted and deletes nothing (DeleteMessage
	// reference).
	if err := deleteBatch(ctx, client, url, first[0]); err != nil {
		t.Fatalf("delete with a stale handle: %v", err)
	}
	if d := depth(t, srv, "vis"); d != (sqsserver.Depth{InFlight: 1}) {
		t.Fatalf("a stale handle deleted the message: %+v", d)
	}

	// A receive may override the queue's timeout.
	third := receive(t, client, &sqs.ReceiveMessageInput{QueueUrl: &url, VisibilityTimeout: 600, WaitTimeSeconds: 5})
	if len(third) != 1 || receiveCount(t, third[0]) != 3 {
		t.Fatalf("third receive: %+v", third)
	}
	if none := receive(t, client, &sqs.ReceiveMessageInput{QueueUrl: &url, WaitTimeSeconds: 2}); len(none) != 0 {
		t.Fatal("the 600 s receive override did not hold past the queue's 1 s")
	}
	if err := deleteBatch(ctx, client, url, third[0]); err != nil {
		t.Fatal(err)
	}
	if d := depth(t, srv, "vis"); d != (sqsserver.Depth{}) {
		t.Fatalf("depth after delete = %+v", d)
	}
	// Deleting again succeeds, as SQS answers.
	if err := deleteBatch(ctx, client, url, third[0]); err != nil {
		t.Errorf("second delete: %v", err)
	}
}

func TestRedriveToDeadLetterQueue(t *testing.T) {
	ctx := context.Background()
	client, srv := newClient(t)
	dlqURL := createQueue(t, client, "work-dlq", nil)
	policy := fmt.Sprintf(`{"deadLetterTargetArn":%q,"maxReceiveCount":"2"}`, sqsserver.QueueARN("work-dlq"))
	// VisibilityTimeout 0 makes each receive count without waiting. (The
	// SDK leaves a zero VisibilityTimeout out of ReceiveMessage, so the
	// queue's setting is the way to get it.)
	url := createQueue(t, client, "work", map[string]string{"RedrivePolicy": policy, "VisibilityTimeout": "0"})
	sent, err := client.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: &url, MessageBody: aws.String("poison")})
	if err != nil {
		t.Fatal(err)
	}

	for want := 1; want <= 2; want++ {
		msgs := receive(t, client, &sqs.ReceiveMessageInput{QueueUrl: &url})
		if len(msgs) != 1 || receiveCount(t, msgs[0]) != want {
			t.Fatalf("receive %d: %+v", want, msgs)
		}
	}
	if msgs := receive(t, client, &sqs.ReceiveMessageInput{QueueUrl: &url}); len(msgs) != 0 {
		t.Fatalf("received past maxReceiveCount: %+v", msgs)
	}
	if d := depth(t, srv, "work"); d != (sqsserver.Depth{}) {
		t.Errorf("source depth = %+v, want empty", d)
	}
	if d := depth(t, srv, "work-dlq"); d != (sqsserver.Depth{Visible: 1}) {
		t.Errorf("dead-letter depth = %+v, want 1 visible", d)
	}

	dead := receive(t, client, &sqs.ReceiveMessageInput{QueueUrl: &dlqURL})
	if len(dead) != 1 {
		t.Fatalf("dead-letter queue gave %d messages", len(dead))
	}
	m := dead[0]
	if aws.ToString(m.MessageId) != aws.ToString(sent.MessageId) || aws.ToString(m.Body) != "poison" {
		t.Errorf("dead letter %s %q", aws.ToString(m.MessageId), aws.ToString(m.Body))
	}
	if m.Attributes["DeadLetterQueueSourceArn"] != sqsserver.QueueARN("work") {
		t.Errorf("DeadLetterQueueSourceArn = %q", m.Attributes["DeadLetterQueueSourceArn"])
	}

	attrs, err := client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: &url, AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameRedrivePolicy}})
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(`{"deadLetterTargetArn":%q,"maxReceiveCount":2}`, sqsserver.QueueARN("work-dlq"))
	if attrs.Attributes["RedrivePolicy"] != want || len(attrs.Attributes) != 1 {
		t.Errorf("attributes = %v, want only RedrivePolicy %s", attrs.Attributes, want)
	}

	_, err = client.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String("orphan"), Attributes: map[string]string{
		"RedrivePolicy": fmt.Sprintf(`{"deadLetterTargetArn":%q,"maxReceiveCount":3}`, sqsserver.QueueARN("missing")),
	}})
	if code := callrecord.APIErrorCode(t, err); code != "InvalidParameterValue" {
		t.Errorf("redrive to a missing queue: %v", err)
	}
}

func TestLongPolling(t *testing.T) {
	ctx := context.Background()
	client, srv := newClient(t)
	url := createQueue(t, client, "poll", nil)

	got := make(chan []types.Message, 1)
	start := time.Now()
	go func() {
		out, err := client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: &url, WaitTimeSeconds: 20, MaxNumberOfMessages: 10})
		if err != nil {
			t.Error(err)
		}
		got <- out.Messages
	}()
	time.Sleep(200 * time.Millisecond)
	if _, err := client.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: &url, MessageBody: aws.String("wake")}); err != nil {
		t.Fatal(err)
	}
	msgs := <-got
	if elapsed := time.Since(start); len(msgs) != 1 || elapsed > 10*time.Second {
		t.Fatalf("long poll returned %d messages after %v, want 1 well before 20 s", len(msgs), elapsed)
	}

	// A delayed message arrives when its delay ends.
	if _, err := client.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: &url, MessageBody: aws.String("later"), DelaySeconds: 1}); err != nil {
		t.Fatal(err)
	}
	if d := depth(t, srv, "poll"); d.Delayed != 1 {
		t.Fatalf("depth = %+v, want 1 delayed", d)
	}
	if msgs := receive(t, client, &sqs.ReceiveMessageInput{QueueUrl: &url}); len(msgs) != 0 {
		t.Fatal("a delayed message was received early")
	}
	if msgs := receive(t, client, &sqs.ReceiveMessageInput{QueueUrl: &url, WaitTimeSeconds: 10}); len(msgs) != 1 || aws.ToString(msgs[0].Body) != "later" {
		t.Fatalf("after the delay: %+v", msgs)
	}

	// Nothing to receive: the poll waits its time and answers empty.
	start = time.Now()
	if msgs := receive(t, client, &sqs.ReceiveMessageInput{QueueUrl: &url, WaitTimeSeconds: 1}); len(msgs) != 0 {
		t.Fatalf("empty queue gave %d", len(msgs))
	}
	if elapsed := time.Since(start); elapsed < 900*time.Millisecond {
		t.Errorf("an empty 1 s long poll answered after %v", elapsed)
	}

	// Close ends a pending poll instead of waiting it out.
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: &url, WaitTimeSeconds: 20})
	}()
	time.Sleep(100 * time.Millisecond)
	start = time.Now()
	srv.Close()
	<-done
	if elapsed := time.Since(start); elapsed > 5*time.Second {
		t.Errorf("Close waited %v for a long poll", elapsed)
	}
}

func TestErrorMapping(t *testing.T) {
	ctx := context.Background()
	client, _ := newClient(t)
	url := createQueue(t, client, "errs", map[string]string{"VisibilityTimeout": "45"})
	missing := strings.Replace(url, "/errs", "/nope", 1)

	_, err := client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: &missing})
	var noQueue *types.QueueDoesNotExist
	if !errors.As(err, &noQueue) {
		t.Fatalf("GetQueueAttributes of a missing queue: %T %v", err, err)
	}
	// The SDK reports the awsQuery code SQS sends in x-amzn-query-error.
	if noQueue.ErrorCode() != "AWS.SimpleQueueService.NonExistentQueue" || noQueue.ErrorMessage() != "The specified queue does not exist." {
		t.Errorf("code %q message %q", noQueue.ErrorCode(), noQueue.ErrorMessage())
	}
	if noQueue.ErrorFault() != smithy.FaultClient {
		t.Errorf("fault = %v", noQueue.ErrorFault())
	}

	check := func(name string, err error, target any, code string) {
		t.Helper()
		if target != nil && !errors.As(err, target) {
			t.Errorf("%s: %T %v, want %T", name, err, err, target)
			return
		}
		if got := callrecord.APIErrorCode(t, err); got != code {
			t.Errorf("%s: code %q, want %q", name, got, code)
		}
	}
	_, err = client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: &missing})
	check("receive from a missing queue", err, new(*types.QueueDoesNotExist), "AWS.SimpleQueueService.NonExistentQueue")
	_, err = client.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String("not a url"), MessageBody: aws.String("x")})
	check("malformed queue URL", err, new(*types.InvalidAddress), "InvalidAddress")
	_, err = client.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String("errs"), Attributes: map[string]string{"VisibilityTimeout": "30"}})
	check("CreateQueue with other attributes", err, new(*types.QueueNameExists), "QueueAlreadyExists")
	_, err = client.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String("bad"), Attributes: map[string]string{"Colour": "blue"}})
	check("unknown attribute", err, new(*types.InvalidAttributeName), "InvalidAttributeName")
	_, err = client.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String("bad"), Attributes: map[string]string{"VisibilityTimeout": "43201"}})
	check("visibility out of range", err, new(*types.InvalidAttributeValue), "InvalidAttributeValue")
	_, err = client.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String("jobs.fifo")})
	check("FIFO queue", err, new(*types.UnsupportedOperation), "AWS.SimpleQueueService.UnsupportedOperation")
	_, err = client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: &url, AttributeNames: []types.QueueAttributeName{"Colour"}})
	check("unknown attribute name", err, new(*types.InvalidAttributeName), "InvalidAttributeName")
	_, err = client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: &url, MaxNumberOfMessages: 11})
	check("MaxNumberOfMessages 11", err, nil, "InvalidParameterValue")
	_, err = client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: &url, WaitTimeSeconds: 21})
	check("WaitTimeSeconds 21", err, nil, "InvalidParameterValue")
	_, err = client.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: &url, MessageBody: aws.String("bell \x07")})
	check("control character", err, new(*types.InvalidMessageContents), "InvalidMessageContents")
	_, err = client.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: &url, MessageBody: aws.String(strings.Repeat("x", 1<<20+1))})
	check("message over 1 MiB", err, nil, "InvalidParameterValue")
	_, err = client.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: &url, MessageBody: aws.String("x"), MessageAttributes: map[string]types.MessageAttributeValue{
		"n": {DataType: aws.String("Number"), StringValue: aws.String("one")},
	}})
	check("non-numeric Number attribute", err, nil, "InvalidParameterValue")

	// The same attributes again, or none, return the existing queue.
	for _, attrs := range []map[string]string{{"VisibilityTimeout": "45"}, nil} {
		again, err := client.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String("errs"), Attributes: attrs})
		if err != nil || aws.ToString(again.QueueUrl) != url {
			t.Errorf("idempotent CreateQueue %v: %v %v", attrs, again, err)
		}
	}
}

func TestFailNextIsRetriedAndRecorded(t *testing.T) {
	ctx := context.Background()
	client, srv := newClient(t)
	url := createQueue(t, client, "faults", nil)

	srv.FailNext("SendMessage", 2, "RequestThrottled")
	if _, err := client.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: &url, MessageBody: aws.String("x")}); err != nil {
		t.Fatalf("two throttles should be retried away: %v", err)
	}
	if got := srv.CallCount("SendMessage"); got != 3 {
		t.Errorf("SendMessage calls = %d, want 3 (2 throttled + 1)", got)
	}
	var injected []string
	for _, c := range srv.Calls() {
		if c.Injected {
			injected = append(injected, c.ErrorCode)
		}
	}
	if len(injected) != 2 || injected[0] != "RequestThrottled" {
		t.Errorf("injected = %v", injected)
	}

	srv.FailNext("", 1, "AWS.SimpleQueueService.NonExistentQueue")
	_, err := client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: &url})
	if !errors.As(err, new(*types.QueueDoesNotExist)) {
		t.Errorf("injected NonExistentQueue: %v", err)
	}
	if _, err := client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: &url}); err != nil {
		t.Errorf("the fault outlived its count: %v", err)
	}
}

// Producers and consumers at once: every message is delivered exactly
// once, and the server's bookkeeping holds under the race detector.
func TestConcurrentUse(t *testing.T) {
	ctx := context.Background()
	client, srv := newClient(t)
	url := createQueue(t, client, "busy", nil)
	const producers, perProducer, consumers = 4, 50, 4

	var wg sync.WaitGroup
	for p := range producers {
		wg.Go(func() {
			for i := 0; i < perProducer; i += 10 {
				var entries []types.SendMessageBatchRequestEntry
				for j := range 10 {
					entries = append(entries, types.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(j)), MessageBody: aws.String(fmt.Sprintf("%d-%d", p, i+j))})
				}
				if _, err := client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: &url, Entries: entries}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	var mu sync.Mutex
	seen := map[string]int{}
	var cwg sync.WaitGroup
	for range consumers {
		cwg.Go(func() {
			for {
				mu.Lock()
				n := len(seen)
				mu.Unlock()
				if n == producers*perProducer {
					return
				}
				out, err := client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: &url, MaxNumberOfMessages: 10, WaitTimeSeconds: 1})
				if err != nil {
					t.Error(err)
					return
				}
				if len(out.Messages) == 0 {
					continue
				}
				mu.Lock()
				for _, m := range out.Messages {
					seen[aws.ToString(m.Body)]++
				}
				mu.Unlock()
				if err := deleteBatch(ctx, client, url, out.Messages...); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	cwg.Wait()
	if len(seen) != producers*perProducer {
		t.Fatalf("received %d distinct messages, want %d", len(seen), producers*perProducer)
	}
	for body, n := range seen {
		if n != 1 {
			t.Errorf("%s delivered %d times", body, n)
		}
	}
	if d := depth(t, srv, "busy"); d != (sqsserver.Depth{}) {
		t.Errorf("depth = %+v, want empty", d)
	}
}
