package replay

import (
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/reaper-k8s/reaper/internal/ec2server"
	"github.com/reaper-k8s/reaper/pkg/reaper"
)

// throttleExits Pods end while the account's other tools hold EC2's
// TerminateInstances buckets empty for throttleHold.
const (
	throttleExits = 200
	throttleHold  = 60 * time.Second
)

// The account's other tools hold the Terminate buckets empty for a minute
// while 200 Pods end: every TerminateInstances is refused until then.
// Reaper, with the deployed function and queue visibility timeouts, writes
// every Pod, defers the terminations EC2 refused instead of failing them,
// and terminates every instance after the hold, once each; nothing fails
// with the SDK's "retry quota exceeded", and no work is dead-lettered.
// Refused work waits reaper.DeferDelay before it is tried again, so each
// instance meets the hold in at most hold/DeferDelay + 1 operations,
// however many attempts the SDK makes in each.
func TestTerminateBucketHeldEmpty(t *testing.T) {
	// Not parallel: it holds the shared EC2 test server's buckets empty.
	ctx := t.Context()
	b, err := NewBurst(ctx, lab.Stack, "reaper-throttle-ledger", lab.Bootstraps, BurstOptions{
		Exits: throttleExits, Scale: burstScale,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Stop)
	lab.Stack.EC2.EnableBuckets(ec2server.PublishedLimits(), burstScale)
	t.Cleanup(lab.Stack.EC2.DisableBuckets)
	lab.Stack.EC2.HoldEmpty("TerminateInstances", throttleHold)
	heldUntil := time.Now().Add(throttleHold)

	res, err := b.Run(ctx)
	if res != nil {
		t.Cleanup(func() {
			for _, p := range res.Pods {
				lab.Stack.EC2.RemoveInstance(p.InstanceID)
			}
		})
	}
	logs := ""
	for _, f := range b.Lab.Reconcilers {
		logs += f.Logs()
	}
	if err != nil {
		t.Fatalf("burst: %v\nreconciler output (tail):\n%s", err, Tail(logs, 40))
	}
	if strings.Contains(logs, "retry quota exceeded") {
		t.Errorf("the reconciler ran out of the SDK's retry quota:\n%s", Tail(logs, 40))
	}
	if res.Refused["TerminateInstances"] == 0 {
		t.Fatal("no TerminateInstances refused: the hold did not bite")
	}
	for _, p := range res.Pods {
		if p.Phase != corev1.PodSucceeded && p.Phase != corev1.PodFailed {
			t.Errorf("pod %s is %s", p.Name, p.Phase)
		}
		if s := instanceState(t, p.InstanceID); s != ec2server.Terminated {
			t.Errorf("instance %s is %s", p.InstanceID, s)
		}
		if p.Terminates != 1 {
			t.Errorf("instance %s terminated %d times: %s", p.InstanceID, p.Terminates, terminatesNaming(p.InstanceID))
		}
		if p.ShuttingDown.Before(heldUntil) {
			t.Errorf("instance %s terminated at %s, during the hold", p.InstanceID, p.ShuttingDown.Format(time.StampMilli))
		}
	}
	refused := b.ec2.terminates(http.StatusServiceUnavailable)
	maxRefused := int(throttleHold/reaper.DeferDelay) + 1
	for id, n := range refused {
		if n > maxRefused {
			t.Errorf("instance %s named in %d refused TerminateInstances operations, want at most %d", id, n, maxRefused)
		}
	}
	var deferred, failed int
	for _, c := range res.Batches {
		deferred += c.Deferred
		failed += c.Failed
	}
	if failed != 0 || deferred == 0 {
		t.Errorf("batches failed %d instances and deferred %d: want the refused terminations deferred, none failed", failed, deferred)
	}
	if res.DeadLettered != 0 {
		t.Errorf("%d work items dead-lettered", res.DeadLettered)
	}
	all, _ := res.AllShuttingDown()
	t.Logf("%d exits, Terminate held empty %v: all shutting down %v after the first delivery; EC2 %v, refused %v, SDK retries %v; "+
		"%d invocations, batch sizes %v; deferred %d; refused operations per instance %v", throttleExits, throttleHold, all, res.EC2, res.Refused, res.Retried,
		res.Invocations, res.BatchSizes, deferred, histogram(refused))
}

// histogram is how many instances have each count.
func histogram(counts map[string]int) map[int]int {
	out := map[int]int{}
	for _, n := range counts {
		out[n]++
	}
	return out
}
