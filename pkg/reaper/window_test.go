package reaper

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/reaper-k8s/reaper/internal/fakes"
	"github.com/reaper-k8s/reaper/pkg/instances"
	"github.com/reaper-k8s/reaper/pkg/model"
	"github.com/reaper-k8s/reaper/pkg/workqueue"
)

// An exit claim deferred for EC2 tokens keeps its instance's exit-wait
// window open while it waits on the queue: the host powers off, the sweep
// records the instance gone and the window's minute passes, but the Pod
// ends with the exit's code when the claim comes back, not as lost.
func TestDeferredExitKeepsTheWindowOpen(t *testing.T) {
	w := fakes.NewWorld(owned(instanceOf(1), podOf(1)))
	w.Pods[podOf(1)] = true
	w.DescribeErr = fmt.Errorf("describe: %w", instances.ErrNoTokens)
	core, l, q := newBatchCore(w) // ExitWait: a minute
	start := testNow()
	now := start
	core.Now = func() time.Time { return now }
	if resp, err := core.HandleQueueEvent(t.Context(), batch(t, exitMsg(1, 3))); err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("failures %v, %v", failures(resp), err)
	}
	if len(q.Sent) != 1 || q.Sent[0].Delay < DeferDelay {
		t.Fatalf("sent %+v, want the claim deferred", q.Sent)
	}
	claim := redeliver(t, q)
	w.DescribeErr = nil // the claim waits on the queue; EC2 answers again

	inst := w.Instances[instanceOf(1)]
	inst.State = model.StateTerminated
	w.Instances[instanceOf(1)] = inst
	for _, at := range []time.Duration{10 * time.Second, 90 * time.Second} {
		now = start.Add(at)
		if _, err := core.Sweep(t.Context(), time.Hour); err != nil {
			t.Fatal(err)
		}
		if len(q.Sent) > 0 {
			if _, err := core.HandleQueueEvent(t.Context(), redeliver(t, q)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if r := l.Recs[instanceOf(1)]; r.Gone == nil || r.PodSynced != "" {
		t.Fatalf("record %+v: want the instance recorded gone and its Pod not written yet", r)
	}

	now = start.Add(100 * time.Second)
	if resp, err := core.HandleQueueEvent(t.Context(), claim); err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("failures %v, %v", failures(resp), err)
	}
	pods := slices.DeleteFunc(slices.Clone(w.Log), func(s string) bool { return !strings.HasPrefix(s, "pod ") })
	if want := "pod jobs/job-1 exit/0"; len(pods) != 1 || pods[0] != want {
		t.Fatalf("Pod writes %q, want one, of the exit (not lost)", pods)
	}
	if r := l.Recs[instanceOf(1)]; r.Latest() == nil || r.Latest().ExitCode != 3 || r.PodSynced != "exit/0" {
		t.Fatalf("record %+v, want the Pod written with exit code 3", r)
	}
}

// A claim sent for a later check is as durable as the claim: when SQS
// refuses the check's send, the claim's own message fails back to the
// queue (a batch item failure) instead of being deleted with the exit
// lost; the other work of the batch is done.
func TestRecheckNotSentKeepsTheClaim(t *testing.T) {
	w := fakes.NewWorld(owned(instanceOf(2), podOf(2))) // instance 1: EC2 does not list it yet
	w.Pods[podOf(1)], w.Pods[podOf(2)] = true, true
	core, _, q := newBatchCore(w)
	q.Refuse = func(m workqueue.Message) error {
		if m.Checks > 0 {
			return errors.New("InternalError")
		}
		return nil
	}
	ev := batch(t, exitMsg(1, 0), exitMsg(2, 0))
	resp, err := core.HandleQueueEvent(t.Context(), ev)
	if err != nil {
		t.Fatal(err)
	}
	if got := failures(resp); len(got) != 1 || got[0] != ev.Records[0].MessageId {
		t.Fatalf("failures %v, want the unlisted instance's claim (%s) back on the queue", got, ev.Records[0].MessageId)
	}
	if want := []string{"pod jobs/job-2 exit/0", "terminate [" + instanceOf(2) + "]"}; !slices.Equal(w.Log, want) {
		t.Fatalf("steps %q, want %q", w.Log, want)
	}
}
