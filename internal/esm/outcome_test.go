package esm

import (
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"testing"

	"github.com/aws/aws-lambda-go/events"
)

// The cases of "Implementing partial batch responses" in the Lambda
// developer guide, plus the function-error document the runtime interface
// emulator answers with.
func TestOutcome(t *testing.T) {
	ids := []string{"m-1", "m-2", "m-3"}
	for _, tc := range []struct {
		name     string
		resp     string
		err      error
		report   bool
		wantFail bool
		wantKeep []string
	}{
		{name: "empty response", resp: "", report: true},
		{name: "null response", resp: "null", report: true},
		{name: "empty object", resp: "{}", report: true},
		{name: "null list", resp: `{"batchItemFailures":null}`, report: true},
		{name: "empty list", resp: ` {"batchItemFailures":[]} `, report: true},
		{name: "two failures", resp: `{"batchItemFailures":[{"itemIdentifier":"m-1"},{"itemIdentifier":"m-3"}]}`, report: true, wantKeep: []string{"m-1", "m-3"}},
		{name: "invalid JSON", resp: `{"batchItemFailures":[`, report: true, wantFail: true},
		{name: "not an object", resp: `"done"`, report: true, wantFail: true},
		{name: "empty identifier", resp: `{"batchItemFailures":[{"itemIdentifier":""}]}`, report: true, wantFail: true},
		{name: "null identifier", resp: `{"batchItemFailures":[{"itemIdentifier":null}]}`, report: true, wantFail: true},
		{name: "bad key name", resp: `{"batchItemFailures":[{"itemId":"m-1"}]}`, report: true, wantFail: true},
		{name: "unknown message id", resp: `{"batchItemFailures":[{"itemIdentifier":"m-9"}]}`, report: true, wantFail: true},
		{name: "invoke error", err: errors.New("connection refused"), report: true, wantFail: true},
		{name: "function error document", resp: `{"errorMessage":"boom","errorType":"errorString"}`, report: true, wantFail: true},
		{name: "function error without reporting", resp: `{"errorMessage":"boom","errorType":"errorString"}`, wantFail: true},
		{name: "failures ignored without reporting", resp: `{"batchItemFailures":[{"itemIdentifier":"m-1"}]}`},
		{name: "junk ignored without reporting", resp: `{"batchItemFailures":[`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			keep, failed := outcome([]byte(tc.resp), tc.err, ids, tc.report)
			if failed != tc.wantFail {
				t.Fatalf("failed = %v, want %v", failed, tc.wantFail)
			}
			if got := slices.Sorted(maps.Keys(keep)); !slices.Equal(got, tc.wantKeep) {
				t.Errorf("keep = %v, want %v", got, tc.wantKeep)
			}
		})
	}
}

// The assembled payload is exactly what encoding an events.SQSEvent gives,
// and its tracked size is its real size.
func TestBatchPayload(t *testing.T) {
	recs := []events.SQSMessage{
		{MessageId: "a", Body: `{"x":"<&>"}`, Attributes: map[string]string{"ApproximateReceiveCount": "1"}, EventSource: "aws:sqs"},
		{MessageId: "b", Body: "two", MessageAttributes: map[string]events.SQSMessageAttribute{
			"k": {DataType: "Binary", BinaryValue: []byte{0, 1, 2}, StringListValues: []string{}, BinaryListValues: [][]byte{}},
		}},
	}
	b := &batch{}
	for _, r := range recs {
		if !b.add(r) {
			t.Fatal("a small record did not fit")
		}
	}
	want, err := json.Marshal(events.SQSEvent{Records: recs})
	if err != nil {
		t.Fatal(err)
	}
	if got := b.payload(); string(got) != string(want) || b.size != len(want) {
		t.Fatalf("payload %s (size %d), want %s (size %d)", got, b.size, want, len(want))
	}
}
