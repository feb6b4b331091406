package workqueue_test

import (
	"context"
	"fmt"
	"slices"
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
	exit := workqueue.Exit("i-0123456789abcdef0", pod, model.Exit{Container: "main", ExitCode: 3, FinishedAt: at})
	exit.TokenHash = model.ExitTokenHash(strings.Repeat("t", 64))
	recheck := workqueue.State("i-0123456789abcdef4", model.StateStopped, at)
	recheck.Checks = workqueue.MaxChecks
	msgs := []workqueue.Message{
		exit, recheck,
		workqueue.State("i-0123456789abcdef1", "terminated", at),
		workqueue.Orphan("i-0123456789abcdef2", 40),
	}
	for i := range 20 {
		msgs = append(msgs, workqueue.Sweep(fmt.Sprintf("i-%017x", i)))
	}
	again := workqueue.Sweep("i-0123456789abcdef3")
	again.Attempt, again.Reason = workqueue.MaxAttempts, "pod write outlasted the batch"
	msgs = append(msgs, again)
	if unsent, err := q.Send(t.Context(), 0, msgs...); err != nil || unsent != nil {
		t.Fatalf("%d unsent: %v", len(unsent), err)
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
	// Each body is its kind's type, parsed once.
	if c, ok := byID["i-0123456789abcdef0"].Body.(workqueue.ExitClaim); !ok || c.Pod != pod || c.Exit.ExitCode != 3 || !c.Exit.FinishedAt.Equal(at) || c.TokenHash != exit.TokenHash {
		t.Fatalf("exit %+v", byID["i-0123456789abcdef0"].Body)
	}
	if r := byID[recheck.InstanceID]; r.Checks != workqueue.MaxChecks {
		t.Fatalf("checks %d, want %d", r.Checks, workqueue.MaxChecks)
	}
	if s, ok := byID["i-0123456789abcdef1"].Body.(workqueue.StateChange); !ok || s.State != "terminated" || !s.At.Equal(at) {
		t.Fatalf("state %+v", byID["i-0123456789abcdef1"].Body)
	}
	if o, ok := byID["i-0123456789abcdef2"].Body.(workqueue.OrphanCheck); !ok || o.Running != 40 {
		t.Fatalf("orphan %+v", byID["i-0123456789abcdef2"].Body)
	}
	if _, ok := byID[again.InstanceID].Body.(workqueue.SweepRequest); !ok {
		t.Fatalf("sweep %+v", byID[again.InstanceID].Body)
	}
	if a := byID[again.InstanceID]; a.Attempt != again.Attempt || a.Reason != again.Reason {
		t.Fatalf("attempt %d, reason %q: want %d, %q", a.Attempt, a.Reason, again.Attempt, again.Reason)
	}
}

// A delayed message is not received before its delay.
func TestSendDelayed(t *testing.T) {
	q, client, url, _ := newQueue(t)
	if unsent, err := q.Send(t.Context(), 2*time.Second, workqueue.Sweep("i-0123456789abcdef0")); err != nil || unsent != nil {
		t.Fatalf("%d unsent: %v", len(unsent), err)
	}
	if got := receiveAll(t, client, url); len(got) != 0 {
		t.Fatalf("%d received at once", len(got))
	}
	time.Sleep(2100 * time.Millisecond)
	if got := receiveAll(t, client, url); len(got) != 1 {
		t.Fatalf("%d received after the delay", len(got))
	}
}

// A failed send is an error for the caller, whose own event then comes
// back, and the message is returned unsent.
func TestSendFails(t *testing.T) {
	q, _, _, srv := newQueue(t)
	srv.FailNext("SendMessageBatch", 10, "KMS.DisabledException")
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	msg := workqueue.Sweep("i-0123456789abcdef0")
	if unsent, err := q.Send(ctx, 0, msg); err == nil || len(unsent) != 1 || unsent[0] != msg {
		t.Fatalf("%v unsent, %v: want the message unsent, with an error", unsent, err)
	}
}

// sweeps are n sweep messages, one an instance.
func sweeps(n int) []workqueue.Message {
	out := make([]workqueue.Message, n)
	for i := range out {
		out[i] = workqueue.Sweep(fmt.Sprintf("i-%017x", i))
	}
	return out
}

// instanceIDs are the instances of msgs, sorted.
func instanceIDs(msgs []workqueue.Message) []string {
	var out []string
	for _, m := range msgs {
		out = append(out, m.InstanceID)
	}
	slices.Sort(out)
	return out
}

// receivedIDs are the instances of the messages received, sorted.
func receivedIDs(t *testing.T, recs []events.SQSMessage) []string {
	t.Helper()
	var out []string
	for _, rec := range recs {
		it, err := workqueue.Parse(rec)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, it.InstanceID)
	}
	slices.Sort(out)
	return out
}

// Entries SQS refuses one by one are sent again, alone: the second request
// carries exactly those. Refused again, they come back unsent, and every
// other message of the request landed.
func TestSendResendsOnlyRefusedEntries(t *testing.T) {
	q, client, url, srv := newQueue(t)
	msgs := sweeps(10)
	// A body SQS refuses per entry: U+FFFE is outside the characters a
	// message may hold (InvalidMessageContents).
	bad := []int{3, 7}
	for _, i := range bad {
		msgs[i] = workqueue.Exit(msgs[i].InstanceID, model.PodRef{Namespace: "jobs", Name: "x\uFFFE", UID: "u"}, model.Exit{Container: "main"})
	}
	unsent, err := q.Send(t.Context(), 0, msgs...)
	if err == nil || !slices.Equal(instanceIDs(unsent), []string{msgs[3].InstanceID, msgs[7].InstanceID}) {
		t.Fatalf("unsent %v, %v: want the two refused entries, with an error", instanceIDs(unsent), err)
	}
	var counts []int
	for _, c := range srv.Calls() {
		if c.Action == "SendMessageBatch" {
			counts = append(counts, c.Count)
		}
	}
	if !slices.Equal(counts, []int{10, len(bad)}) {
		t.Fatalf("SendMessageBatch entries %v, want 10, then the %d refused", counts, len(bad))
	}
	var landed []workqueue.Message
	for i, m := range msgs {
		if !slices.Contains(bad, i) {
			landed = append(landed, m)
		}
	}
	if got := receivedIDs(t, receiveAll(t, client, url)); !slices.Equal(got, instanceIDs(landed)) {
		t.Fatalf("received %v, want the %d entries SQS took", got, len(landed))
	}
}

// A request that fails whole costs its own ten entries only: the other
// requests' land, and only its ten come back unsent.
func TestSendFailedRequestCostsItsOwnEntries(t *testing.T) {
	q, client, url, srv := newQueue(t)
	srv.FailNext("SendMessageBatch", 1, "KMS.DisabledException")
	msgs := sweeps(30)
	unsent, err := q.Send(t.Context(), 0, msgs...)
	if err == nil || len(unsent) != 10 {
		t.Fatalf("%d unsent, %v: want one request's 10, with an error", len(unsent), err)
	}
	failed := -1
	for r := range 3 {
		if slices.Equal(instanceIDs(unsent), instanceIDs(msgs[10*r:10*r+10])) {
			failed = r
		}
	}
	if failed < 0 {
		t.Fatalf("unsent %v: want the ten of one request", instanceIDs(unsent))
	}
	landed := slices.Concat(msgs[:10*failed], msgs[10*failed+10:])
	if got := receivedIDs(t, receiveAll(t, client, url)); !slices.Equal(got, instanceIDs(landed)) {
		t.Fatalf("received %v, want the %d messages of the other requests", got, len(landed))
	}
}

// Bodies that are not work items are errors, each naming what is wrong:
// an exit message is checked as the exitrecorder checks a line, and the
// counts the reconciler keeps stay within its limits.
func TestParseRejects(t *testing.T) {
	const id, uid = `"instanceId":"i-0123456789abcdef0"`, `"6b9a1c2e-0000-4000-8000-000000000001"`
	exitBody := func(pod, exit string) string {
		return `{"v":1,"kind":"exit",` + id + `,"pod":` + pod + `,"exit":` + exit + `}`
	}
	const goodPod, goodExit = `{"namespace":"ml","name":"train-0","uid":` + uid + `}`,
		`{"container":"main","exitCode":0,"startedAt":"2026-11-30T06:00:00Z","finishedAt":"2026-11-30T07:00:00Z","restartCount":0}`
	if _, err := workqueue.Parse(events.SQSMessage{MessageId: "m", Body: exitBody(goodPod, goodExit)}); err != nil {
		t.Fatalf("a good exit message: %v", err)
	}
	for body, want := range map[string]string{
		`{"v":1,"kind":"sweep",` + id + `,"checks":6}`:  "checks 6, want 0 to 5",
		`{"v":1,"kind":"sweep",` + id + `,"checks":-1}`: "checks -1, want 0 to 5",
		`{"v":1,"kind":"exit",` + id + `,"pod":` + goodPod + `,"exit":` + goodExit + `,"tokenHash":"` + strings.Repeat("A", 64) + `"}`:       "tokenHash",
		`{"v":1,"kind":"exit",` + id + `,"pod":` + goodPod + `,"exit":` + goodExit + `,"tokenHash":"` + strings.Repeat("a", 63) + `"}`:       "tokenHash",
		`{"v":1,"kind":"state",` + id + `,"state":"exploded","at":"2026-11-30T07:00:00Z"}`:                                                   `state "exploded" is not an EC2 instance state`,
		exitBody(`{"namespace":"ML/../x","name":"train-0","uid":`+uid+`}`, goodExit):                                                         `podNamespace "ML/../x"`,
		exitBody(`{"namespace":"ml","name":"`+strings.Repeat("a", 254)+`","uid":`+uid+`}`, goodExit):                                         "podName",
		exitBody(`{"namespace":"ml","name":"train-0","uid":"u"}`, goodExit):                                                                  `podUID "u": not a UUID`,
		exitBody(goodPod, strings.Replace(goodExit, `"main"`, `"Main_1"`, 1)):                                                                `container "Main_1"`,
		exitBody(goodPod, strings.Replace(goodExit, `"exitCode":0`, `"exitCode":300`, 1)):                                                    "exitCode 300 is out of range",
		exitBody(goodPod, strings.Replace(goodExit, `"exitCode":0`, `"exitCode":-1`, 1)):                                                     "needs an error",
		exitBody(goodPod, strings.Replace(goodExit, `"restartCount":0`, `"restartCount":-1`, 1)):                                             "restartCount -1 is out of range",
		exitBody(goodPod, strings.Replace(goodExit, `"restartCount":0`, `"restartCount":0,"backoffSeconds":301`, 1)):                         "backoffSeconds 301",
		exitBody(goodPod, strings.Replace(goodExit, `"restartCount":0`, `"restartCount":0,"signal":"kill -9"`, 1)):                           "signal",
		exitBody(goodPod, strings.Replace(goodExit, `"restartCount":0`, `"restartCount":0,"containerId":"`+strings.Repeat("f", 129)+`"`, 1)): "containerId is 129 bytes",
		exitBody(goodPod, strings.Replace(goodExit, `07:00:00Z`, `05:00:00Z`, 1)):                                                            "finishedAt is before startedAt",
		exitBody(goodPod, strings.Replace(goodExit, `"finishedAt":"2026-11-30T07:00:00Z",`, ``, 1)):                                          "finishedAt is missing",

		`{`: "unexpected end",
		`{"v":2,"kind":"sweep","instanceId":"i-0123456789abcdef0"}`:              "version 2",
		`{"v":1,"kind":"sweep"}`:                                                 `instanceId "" is not an EC2 instance id`,
		`{"v":1,"kind":"sweep","instanceId":"i-../../x"}`:                        `instanceId "i-../../x" is not an EC2 instance id`,
		`{"v":1,"kind":"sweep","instanceId":"i-0123456789"}`:                     `instanceId "i-0123456789" is not an EC2 instance id`,
		`{"v":1,"kind":"sweep","instanceId":"i-0123456789abcdef"}`:               `instanceId "i-0123456789abcdef" is not an EC2 instance id`,
		`{"v":1,"kind":"exit","instanceId":"i-0123456789abcdef0"}`:               "without pod or exit",
		`{"v":1,"kind":"state","instanceId":"i-0123456789abcdef0"}`:              "without state or time",
		`{"v":1,"kind":"reboot","instanceId":"i-0123456789abcdef0"}`:             "unknown kind",
		`{"v":1,"kind":"sweep","instanceId":"i-0123456789abcdef0","attempt":-1}`: "attempt -1, want 0 to 8",
		`{"v":1,"kind":"sweep","instanceId":"i-0123456789abcdef0","attempt":9}`:  "attempt 9, want 0 to 8",
	} {
		if _, err := workqueue.Parse(events.SQSMessage{MessageId: "m", Body: body}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", body, err, want)
		}
	}
}
