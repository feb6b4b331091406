package reaper

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/reaper-k8s/reaper/internal/fakes"
	"github.com/reaper-k8s/reaper/pkg/model"
	"github.com/reaper-k8s/reaper/pkg/workqueue"
)

// ec2Takes is the instance id EC2 takes in a by-id call: any other fails
// the whole call with InvalidInstanceID.Malformed.
var ec2Takes = regexp.MustCompile(`^i-([0-9a-f]{8}|[0-9a-f]{17})$`)

// A work item naming "i-" and 10 hex digits (a host whose log stream is
// so named, or anyone allowed to send to the queue) is rejected as
// invalid with its reason, logged and counted, and never reaches EC2,
// where it would fail the batch's lookup for every instance beside it.
// The other messages of the batch are reconciled: the described
// instance's Pod is written and the instance terminated, and the claim
// for an instance EC2 does not list yet goes back to be checked again,
// not failed.
func TestMalformedInstanceIDRejected(t *testing.T) {
	const malformed = "i-0123456789"
	listed, unlisted := instanceOf(1), instanceOf(2)
	w := fakes.NewWorld(owned(listed, podOf(1)))
	w.Pods[podOf(1)], w.Pods[podOf(2)], w.Pods[podOf(3)] = true, true, true
	// As EC2 does: one id it would not take fails the whole call.
	errMalformed := errors.New("api error InvalidInstanceID.Malformed")
	w.DescribeFails = func(chunk []string) error {
		if slices.ContainsFunc(chunk, func(id string) bool { return !ec2Takes.MatchString(id) }) {
			return errMalformed
		}
		return nil
	}
	core, _, q := newBatchCore(w)
	var logs bytes.Buffer
	core.Log = slog.New(slog.NewJSONHandler(&logs, nil))
	bad := workqueue.Exit(malformed, podOf(3), model.Exit{Container: "main", ExitCode: 3, FinishedAt: testNow().Add(-time.Minute)})
	ev := batch(t, exitMsg(1, 0), bad, exitMsg(2, 0))
	resp, err := core.HandleQueueEvent(t.Context(), ev)
	if err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("failures %v, %v: want none", failures(resp), err)
	}
	if want := []string{"pod jobs/job-1 exit/0", "terminate [" + listed + "]"}; !slices.Equal(w.Log, want) {
		t.Fatalf("steps %q, want %q", w.Log, want)
	}
	for _, d := range w.Describes {
		if slices.Contains(d, malformed) {
			t.Fatalf("lookups %v: the malformed id reached EC2", w.Describes)
		}
	}
	var resent []string
	for _, s := range q.Sent {
		for _, m := range s.Msgs {
			resent = append(resent, m.InstanceID)
		}
	}
	if !slices.Equal(resent, []string{unlisted}) {
		t.Fatalf("sent again for %v, want the unlisted instance's claim alone", resent)
	}
	var rejected, summary bool
	for line := range strings.Lines(logs.String()) {
		var l struct {
			Msg, MessageID, Error string
			Invalid, Failed       int
		}
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatal(err)
		}
		switch l.Msg {
		case "work item rejected":
			rejected = l.MessageID == ev.Records[1].MessageId && strings.Contains(l.Error, `instanceId "`+malformed+`" is not an EC2 instance id`)
		case "batch":
			summary = l.Invalid == 1 && l.Failed == 0
		}
	}
	if !rejected || !summary {
		t.Fatalf("want the message rejected with its reason and counted invalid in the batch's line:\n%s", logs.String())
	}
}
