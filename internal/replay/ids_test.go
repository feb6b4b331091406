package replay

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/reaper-k8s/reaper/internal/ec2server"
	"github.com/reaper-k8s/reaper/pkg/intake"
	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/model"
	"github.com/reaper-k8s/reaper/pkg/reaper"
)

// A host names its log stream "i-" and 10 hex digits, an id EC2 would not
// take (8 or 17 digits): named in a by-id DescribeInstances it fails the
// call for every instance beside it (InvalidInstanceID.Malformed). Its
// payload comes within one batching window of a real exit of an instance
// EC2 does not list yet, which Reaper asks for by id. The malformed one is
// refused at the exitrecorder, logged and counted with its reason, and
// never reaches EC2; the real claim is not failed back to the queue (with
// the deployed 30-minute visibility timeout a batch item failure costs half
// an hour) but checked again, and its Pod ends with its exit's code once
// EC2 lists the instance.
func TestMalformedStreamBesideUnlistedInstance(t *testing.T) {
	t.Parallel()
	const cluster, ns, malformed = "reaper-malformed-id", "malformed-id", "i-0123456789"
	ctx := t.Context()
	d := deployment(t, cluster, LabOptions{MaxConcurrency: 1, BatchingWindow: 2 * time.Second, QueueVisibility: 30 * time.Minute},
		"exitrecorder", "reconciler")
	id := hostileInstance(0xf0c, 1)
	pod, err := lab.RunningPod(ctx, ns, "real", corev1.RestartPolicyNever)
	if err != nil {
		t.Fatal(err)
	}
	other, err := lab.RunningPod(ctx, ns, "malformed", corev1.RestartPolicyNever)
	if err != nil {
		t.Fatal(err)
	}
	bad, err := ExitPayload(malformed, other, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	good, err := ExitPayload(id, pod, 3, 2)
	if err != nil {
		t.Fatal(err)
	}
	var badSum, goodSum intake.ExitSummary
	if err := d.InvokeOnly(ctx, "exitrecorder", bad, &badSum); err != nil {
		t.Fatalf("exitrecorder, the malformed stream: %v", err)
	}
	if err := d.InvokeOnly(ctx, "exitrecorder", good, &goodSum); err != nil || goodSum.Queued != 1 {
		t.Fatalf("exitrecorder, the real exit: %+v, %v", goodSum, err)
	}

	// failed counts the instances the reconciler failed, the batch item
	// failures the mapping kept on the queue and the failed invocations.
	failed := func() (n int) {
		for _, f := range d.Reconcilers {
			batches, _ := ReconcilerLines(f.Logs())
			for _, b := range batches {
				n += b.Failed
			}
		}
		return n + d.Mapping.Stats().ReportedFailures + d.Mapping.Stats().FailedInvocations
	}
	waitFor(t, 30*time.Second, "the real claim's first check", func() bool { return lookups(id) > 0 && d.Mapping.Stats().Invocations > 0 })
	waitFor(t, 5*time.Second, "the first batch settles", func() bool {
		batches, _ := ReconcilerLines(d.Functions["reconciler"].Logs())
		return len(batches) > 0
	})
	if n := failed(); n != 0 {
		t.Fatalf("%d failures: the real claim was failed back to the queue\n%s", n, Tail(d.Functions["reconciler"].Logs(), 20))
	}
	wantUntouched(t, pod)

	d.AddTaggedInstance(id, lab.InstanceTags(pod, true, cluster))
	waitFor(t, reaper.DeferDelay+30*time.Second, "the real Pod ends", func() bool {
		return getPod(t, ns, "real").Status.Phase != corev1.PodRunning
	})
	wantEnded(t, getPod(t, ns, "real"), corev1.PodFailed, 3, "Error")
	waitFor(t, 10*time.Second, "the real instance is terminated", func() bool { return instanceState(t, id) == ec2server.Terminated })
	if n := failed(); n != 0 {
		t.Fatalf("%d failures after EC2 listed the instance", n)
	}

	// The malformed stream: refused at the door, with its reason, and
	// nothing else.
	if badSum.Queued != 0 || badSum.RejectedFor[model.ReasonUndecodable] != 1 {
		t.Errorf("exitrecorder, the malformed stream: %+v, want its payload rejected as %s", badSum, model.ReasonUndecodable)
	}
	logs := d.Functions["exitrecorder"].Logs()
	if !strings.Contains(logs, `"msg":"payload rejected","reason":"`+model.ReasonUndecodable+`"`) || !strings.Contains(logs, malformed) {
		t.Errorf("the refusal is not logged with its reason and the stream:\n%s", Tail(logs, 20))
	}
	if _, values, _ := metric(emfLines(t, logs), metrics.FunctionExitRecorder, metrics.LinesRejected, map[string]string{metrics.ReasonDim: model.ReasonUndecodable}); len(values) != 1 || values[0] != 1 {
		t.Errorf("%s for %s: %v, want one", metrics.LinesRejected, model.ReasonUndecodable, values)
	}
	for _, c := range lab.Stack.EC2.Calls() {
		if names(c, malformed) {
			t.Fatalf("the malformed id reached EC2: %s %v", c.Action, c.Params)
		}
	}
	wantUntouched(t, other)
}
