package intake_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/aws/aws-lambda-go/events"

	"github.com/reaper-k8s/reaper/internal/fakes"
	"github.com/reaper-k8s/reaper/pkg/exitline"
	"github.com/reaper-k8s/reaper/pkg/intake"
	"github.com/reaper-k8s/reaper/pkg/model"
)

// A host whose log stream is "i-" and 10 hex digits names no instance EC2
// takes (8 or 17 digits): its payload is refused, logged and counted
// with its reason, and nothing reaches the queue, where one such id in a
// by-id DescribeInstances would fail the call for every instance it
// names. The invocation does not fail: a retry cannot do better.
func TestMalformedStreamRefused(t *testing.T) {
	const malformed = "i-0123456789"
	q := &fakes.Queue{}
	var logs bytes.Buffer
	in := &intake.Intake{Queue: q, Log: slog.New(slog.NewJSONHandler(&logs, nil)), Now: testNow}
	l := line(1, 0, false)
	l.InstanceID = malformed
	msg, err := json.Marshal(l)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := exitline.Encode(events.CloudwatchLogsData{MessageType: "DATA_MESSAGE", LogStream: malformed,
		LogEvents: []events.CloudwatchLogsLogEvent{{ID: "1", Message: string(msg)}}})
	if err != nil {
		t.Fatal(err)
	}
	sum, err := in.HandleLogsEvent(t.Context(), ev)
	if err != nil {
		t.Fatalf("the invocation failed: %v", err)
	}
	if sum.Queued != 0 || sum.Rejected != 1 || sum.RejectedFor[model.ReasonUndecodable] != 1 {
		t.Fatalf("summary %+v: want the payload rejected for %s", sum, model.ReasonUndecodable)
	}
	if len(q.Sent) != 0 {
		t.Fatalf("sent %+v, want nothing", q.Sent)
	}
	var logged struct{ Msg, Reason, Error string }
	if err := json.Unmarshal(logs.Bytes(), &logged); err != nil {
		t.Fatalf("log %q: %v", logs.String(), err)
	}
	if logged.Msg != "payload rejected" || logged.Reason != model.ReasonUndecodable || !strings.Contains(logged.Error, malformed) {
		t.Fatalf("logged %+v, want the refusal with its reason and the stream", logged)
	}
}

// A state change naming an instance id EC2 would not take is refused,
// and nothing is queued.
func TestMalformedStateChangeRefused(t *testing.T) {
	q := &fakes.Queue{}
	var logs bytes.Buffer
	in := &intake.Intake{Queue: q, Log: slog.New(slog.NewJSONHandler(&logs, nil)), Now: testNow}
	ev := events.CloudWatchEvent{Source: model.StateChangeSource, DetailType: model.StateChangeDetailType, Time: testNow(),
		Detail: json.RawMessage(`{"instance-id":"i-0123456789","state":"stopped"}`)}
	sum, err := in.HandleEC2Event(t.Context(), ev)
	if err != nil || sum.Queued || sum.Skipped != "rejected" || len(q.Sent) != 0 {
		t.Fatalf("summary %+v, %v, sent %+v: want it rejected", sum, err, q.Sent)
	}
	if !strings.Contains(logs.String(), `i-0123456789\"`) {
		t.Fatalf("the refusal is not logged with the id: %s", logs.String())
	}
}
