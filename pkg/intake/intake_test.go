package intake_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/reaper-k8s/reaper/internal/fakes"
	"github.com/reaper-k8s/reaper/internal/sqsserver"
	"github.com/reaper-k8s/reaper/pkg/exitline"
	"github.com/reaper-k8s/reaper/pkg/intake"
	"github.com/reaper-k8s/reaper/pkg/model"
	"github.com/reaper-k8s/reaper/pkg/statechange"
	"github.com/reaper-k8s/reaper/pkg/workqueue"
)

// The intake's functions write the queue only; they reach neither the
// ledger nor EC2 nor Kubernetes, so this fake is all they have (package
// fakes), and a call to anything else could not even be wired.

func testNow() time.Time { return time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC) }

var errBadLine = errors.New("not JSON")

func line(n int, restarts int32, willRestart bool) exitline.Line {
	pod := fakes.Pod(n)
	return exitline.Line{Reaper: exitline.Kind, V: exitline.Version, InstanceID: fakes.InstanceID(1), PodNamespace: pod.Namespace, PodName: pod.Name,
		PodUID: pod.UID, Container: "main", RestartCount: restarts, WillRestart: willRestart,
		StartedAt: time.Date(2026, 12, 1, 11, 0, 0, 0, time.UTC), FinishedAt: time.Date(2026, 12, 1, 11, 59, 0, 0, time.UTC)}
}

// The exitrecorder queues the latest claim of each Pod the lines name, and
// nothing else: what a host wrote reaches the ledger only once the
// reconciler has checked it against the instance's tags.
func TestHandleExitsQueues(t *testing.T) {
	q := &fakes.Queue{}
	in := &intake.Intake{Queue: q, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Now: testNow}
	sum, err := in.HandleExits(t.Context(), exitline.Batch{InstanceID: fakes.InstanceID(1), Lines: []exitline.Line{
		line(1, 0, true), line(2, 5, false), line(1, 1, false),
	}, Rejected: []exitline.Rejection{{EventID: "e", Reason: model.ReasonUndecodable, Err: errBadLine}}})
	if err != nil {
		t.Fatal(err)
	}
	if sum.Lines != 4 || sum.Recorded != 3 || sum.Queued != 2 || sum.Rejected != 1 {
		t.Fatalf("summary %+v", sum)
	}
	if len(q.Sent) != 1 || len(q.Sent[0].Msgs) != 2 {
		t.Fatalf("sent %+v", q.Sent)
	}
	claims := map[string]int32{}
	for _, m := range q.Sent[0].Msgs {
		if m.Kind != workqueue.KindExit || m.InstanceID != fakes.InstanceID(1) {
			t.Fatalf("message %+v", m)
		}
		claims[m.Pod.Name] = m.Exit.RestartCount
	}
	if claims["job-1"] != 1 || claims["job-2"] != 5 {
		t.Fatalf("claims %v, want each Pod's latest", claims)
	}
}

// The lines of two containers of one Pod, at the same restart count, in
// one payload, are two claims: a main container's end and its sidecar's
// ship together, and neither may hide the other. Each container's latest
// line is its claim.
func TestHandleExitsContainers(t *testing.T) {
	q := &fakes.Queue{}
	in := &intake.Intake{Queue: q, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Now: testNow}
	main, sidecar, sidecarAgain := line(1, 0, false), line(1, 0, true), line(1, 1, false)
	main.OthersRunning = true
	sidecar.Container, sidecarAgain.Container = "sidecar-proxy", "sidecar-proxy"
	sum, err := in.HandleExits(t.Context(), exitline.Batch{InstanceID: fakes.InstanceID(1), Lines: []exitline.Line{main, sidecar, sidecarAgain}})
	if err != nil || sum.Recorded != 3 || sum.Queued != 2 {
		t.Fatalf("summary %+v, %v: want 2 claims queued", sum, err)
	}
	claims := map[string]int32{}
	for _, m := range q.Sent[0].Msgs {
		claims[m.Exit.Container] = m.Exit.RestartCount
	}
	if len(claims) != 2 || claims["main"] != 0 || claims["sidecar-proxy"] != 1 {
		t.Fatalf("claims %v, want main's and the sidecar's latest", claims)
	}
}

// A state change goes to the queue as it came.
func TestHandleStateChangeQueues(t *testing.T) {
	q := &fakes.Queue{}
	in := &intake.Intake{Queue: q, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Now: testNow}
	at := time.Date(2026, 12, 1, 11, 0, 0, 0, time.UTC)
	sum, err := in.HandleStateChange(t.Context(), statechange.Message{InstanceID: fakes.InstanceID(1), State: "terminated", Time: at})
	if err != nil || !sum.Queued {
		t.Fatalf("summary %+v, %v", sum, err)
	}
	if len(q.Sent) != 1 || q.Sent[0].Msgs[0] != workqueue.State(fakes.InstanceID(1), "terminated", at) {
		t.Fatalf("sent %+v", q.Sent)
	}
}

// A claim the queue does not take fails the invocation, so that its event
// comes back, even when the other claims landed; the summary counts those
// that did. A state change the queue does not take fails too.
func TestUnsentClaimsFailTheInvocation(t *testing.T) {
	errRefused := errors.New("KMS.DisabledException")
	q := &fakes.Queue{Refuse: func(m workqueue.Message) error {
		if m.Kind == workqueue.KindState || m.Pod.Name == "job-2" {
			return errRefused
		}
		return nil
	}}
	in := &intake.Intake{Queue: q, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Now: testNow}
	sum, err := in.HandleExits(t.Context(), exitline.Batch{InstanceID: fakes.InstanceID(1), Lines: []exitline.Line{
		line(1, 0, false), line(2, 0, false), line(3, 0, false),
	}})
	if !errors.Is(err, errRefused) {
		t.Fatalf("exits: %v, want the queue's refusal", err)
	}
	if sum.Queued != 2 || sum.Recorded != 0 {
		t.Fatalf("summary %+v: want the 2 claims that landed queued, no line recorded", sum)
	}
	if len(q.Sent) != 1 || len(q.Sent[0].Msgs) != 2 {
		t.Fatalf("sent %+v", q.Sent)
	}
	state, err := in.HandleStateChange(t.Context(), statechange.Message{InstanceID: fakes.InstanceID(1), State: "terminated", Time: testNow()})
	if !errors.Is(err, errRefused) || state.Queued {
		t.Fatalf("state change: %+v, %v: want the queue's refusal", state, err)
	}
}

// A payload as CloudWatch Logs delivers it, through the real line parser
// and the real work queue (the SQS client against the test server): each
// claim carries the hash of the token its line carried, a line without
// the token or with another one is queued beside the real one instead of
// hiding it, a line with a malformed token is rejected for invalid-token,
// and the token itself is in no message body and no log line.
func TestHandleLogsEventTokens(t *testing.T) {
	srv := sqsserver.New()
	t.Cleanup(srv.Close)
	client := srv.Client(nil)
	created, err := client.CreateQueue(t.Context(), &sqs.CreateQueueInput{QueueName: aws.String("work")})
	if err != nil {
		t.Fatal(err)
	}
	url := aws.ToString(created.QueueUrl)
	var logs bytes.Buffer
	in := &intake.Intake{Queue: workqueue.New(client, url), Log: slog.New(slog.NewJSONHandler(&logs, nil)), Now: testNow}

	token := strings.Repeat("5eC7", 16)
	encode := func(l exitline.Line, tok string) string {
		l.Token = tok
		b, err := json.Marshal(l)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	genuine, forged := line(1, 0, false), line(1, 3, false)
	ev, err := exitline.Encode(events.CloudwatchLogsData{MessageType: "DATA_MESSAGE", LogStream: fakes.InstanceID(1),
		LogEvents: []events.CloudwatchLogsLogEvent{
			{ID: "1", Message: encode(forged, "")},
			{ID: "2", Message: encode(genuine, token)},
			{ID: "3", Message: encode(genuine, token[:31])},
		}})
	if err != nil {
		t.Fatal(err)
	}
	sum, err := in.HandleLogsEvent(t.Context(), ev)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Queued != 2 || sum.Rejected != 1 || sum.RejectedFor[model.ReasonInvalidToken] != 1 {
		t.Fatalf("summary %+v: want 2 claims queued and 1 line rejected for %s", sum, model.ReasonInvalidToken)
	}
	res, err := client.ReceiveMessage(t.Context(), &sqs.ReceiveMessageInput{QueueUrl: aws.String(url), MaxNumberOfMessages: 10})
	if err != nil {
		t.Fatal(err)
	}
	hashes := map[int32]string{}
	for _, m := range res.Messages {
		body := aws.ToString(m.Body)
		if strings.Contains(body, token[:16]) {
			t.Errorf("message body carries the token: %s", body)
		}
		it, err := workqueue.Parse(events.SQSMessage{MessageId: aws.ToString(m.MessageId), Body: body})
		if err != nil {
			t.Fatal(err)
		}
		hashes[it.Exit.RestartCount] = it.TokenHash
	}
	if want := map[int32]string{0: model.ExitTokenHash(token), 3: ""}; !maps.Equal(hashes, want) {
		t.Errorf("token hashes by restart count %v, want %v", hashes, want)
	}
	if strings.Contains(logs.String(), token[:16]) {
		t.Errorf("the logs carry the token:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), model.ReasonInvalidToken) {
		t.Errorf("the rejected line is not logged with its reason:\n%s", logs.String())
	}
}
