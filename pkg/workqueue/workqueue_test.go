package workqueue_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/reaper-k8s/reaper/internal/sqsserver"
	"github.com/reaper-k8s/reaper/pkg/model"
	"github.com/reaper-k8s/reaper/pkg/workqueue"
)

func newQueue(t *testing.T) (*workqueue.Queue, *sqs.Client, string, *sqsserver.Server) {
	t.Helper()
	srv := sqsserver.New()
	t.Cleanup(srv.Close)
	client := srv.Client(nil)
	out, err := client.CreateQueue(t.Context(), &sqs.CreateQueueInput{QueueName: aws.String("work")})
	if err != nil {
		t.Fatal(err)
	}
	url := aws.ToString(out.QueueUrl)
	return workqueue.New(client, url), client, url, srv
}

// receiveAll receives every visible message as the event source mapping
// hands them to the reconciler.
func receiveAll(t *testing.T, client *sqs.Client, url string) []events.SQSMessage {
	t.Helper()
	var out []events.SQSMessage
	for {
		res, err := client.ReceiveMessage(t.Context(), &sqs.ReceiveMessageInput{QueueUrl: aws.String(url), MaxNumberOfMessages: 10,
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll}})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Messages) == 0 {
			return out
		}
		for _, m := range res.Messages {
			out = append(out, events.SQSMessage{MessageId: aws.ToString(m.MessageId), Body: aws.ToString(m.Body), Attributes: m.Attributes})
		}
	}
}

// Messages sent through the real SDK come back, parsed, as they were sent,
// ten to a SendMessageBatch request.
func TestSendAndParse(t *testing.T) {
	q, client, url, srv := newQueue(t)
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	pod := model.PodRef{Namespace: "jobs", Name: "train", UID: "0b6f8e2c-2f4e-4c55-9d3e-6a1f7a9b2c01"}
	msgs := []workqueue.Message{
		workqueue.Exit("i-0123456789abcdef0", pod, model.Exit{Container: "main", ExitCode: 3, FinishedAt: at}),
		workqueue.State("i-0123456789abcdef1", "terminated", at),
		workqueue.Orphan("i-0123456789abcdef2"),
	}
	for i := range 20 {
		msgs = append(msgs, workqueue.Sweep(fmt.Sprintf("i-%017x", i)))
	}
	if err := q.Send(t.Context(), 0, msgs...); err != nil {
		t.Fatal(err)
	}
	if n := srv.CallCount("SendMessageBatch"); n != 3 {
		t.Fatalf("%d SendMessageBatch requests for %d messages, want 3", n, len(msgs))
	}
	got := receiveAll(t, client, url)
	if len(got) != len(msgs) {
		t.Fatalf("%d received, %d sent", len(got), len(msgs))
	}
	byID := map[string]workqueue.Item{}
	for _, rec := range got {
		it, err := workqueue.Parse(rec)
		if err != nil {
			t.Fatal(err)
		}
		if it.SentAt.IsZero() || it.ReceiveCount != 1 || it.MessageID != rec.MessageId {
			t.Fatalf("item %+v", it)
		}
		byID[it.InstanceID] = it
	}
	if e := byID["i-0123456789abcdef0"]; e.Kind != workqueue.KindExit || *e.Pod != pod || e.Exit.ExitCode != 3 || !e.Exit.FinishedAt.Equal(at) {
		t.Fatalf("exit %+v", e)
	}
	if s := byID["i-0123456789abcdef1"]; s.Kind != workqueue.KindState || s.State != "terminated" || !s.At.Equal(at) {
		t.Fatalf("state %+v", s)
	}
	if o := byID["i-0123456789abcdef2"]; o.Kind != workqueue.KindOrphan {
		t.Fatalf("orphan %+v", o)
	}
}

// A delayed message is not received before its delay.
func TestSendDelayed(t *testing.T) {
	q, client, url, _ := newQueue(t)
	if err := q.Send(t.Context(), 2*time.Second, workqueue.Sweep("i-0123456789abcdef0")); err != nil {
		t.Fatal(err)
	}
	if got := receiveAll(t, client, url); len(got) != 0 {
		t.Fatalf("%d received at once", len(got))
	}
	time.Sleep(2100 * time.Millisecond)
	if got := receiveAll(t, client, url); len(got) != 1 {
		t.Fatalf("%d received after the delay", len(got))
	}
}

// A failed send is an error for the caller, whose own event then comes back.
func TestSendFails(t *testing.T) {
	q, _, _, srv := newQueue(t)
	srv.FailNext("SendMessageBatch", 10, "KMS.DisabledException")
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := q.Send(ctx, 0, workqueue.Sweep("i-0123456789abcdef0")); err == nil {
		t.Fatal("send succeeded")
	}
}

// Bodies that are not work items are errors, each naming what is wrong.
func TestParseRejects(t *testing.T) {
	for body, want := range map[string]string{
		`{`: "unexpected end",
		`{"v":2,"kind":"sweep","instanceId":"i-0123456789abcdef0"}`:  "version 2",
		`{"v":1,"kind":"sweep"}`:                                     `instanceId "" is not an EC2 instance id`,
		`{"v":1,"kind":"sweep","instanceId":"i-../../x"}`:            `instanceId "i-../../x" is not an EC2 instance id`,
		`{"v":1,"kind":"exit","instanceId":"i-0123456789abcdef0"}`:   "without pod or exit",
		`{"v":1,"kind":"state","instanceId":"i-0123456789abcdef0"}`:  "without state or time",
		`{"v":1,"kind":"reboot","instanceId":"i-0123456789abcdef0"}`: "unknown kind",
	} {
		if _, err := workqueue.Parse(events.SQSMessage{MessageId: "m", Body: body}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", body, err, want)
		}
	}
}
