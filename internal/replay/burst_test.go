package replay

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reaper-k8s/reaper/internal/ec2server"
)

// burstExits is how many Pods end at once in TestBurst, and burstScale how
// much faster than on EC2 the buckets refill, to keep the test short.
const (
	burstExits = 500
	burstScale = 10
)

// 500 Pods end at once, with EC2's published buckets on: every Pod must
// end with the status its exit code says, every instance must be
// terminated by exactly one TerminateInstances operation (the SDK may send
// one twice when loopback loses its answer), no request may be refused,
// and the tag lookups
// and terminate calls must come in batches (one DescribeInstances per 200
// instances, one TerminateInstances per 1,000, per reconciler batch, with
// slack for batches the queue splits).
func TestBurst(t *testing.T) {
	// Not parallel: it turns the shared EC2 test server's buckets on, and
	// counts every request the server and the apiserver see.
	ctx := t.Context()
	b, err := NewBurst(ctx, lab.Stack, "reaper-burst-ledger", lab.Bootstraps, BurstOptions{
		Exits: burstExits, Scale: burstScale, StateChanges: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Stop)
	lab.Stack.EC2.EnableBuckets(ec2server.PublishedLimits(), burstScale)
	t.Cleanup(lab.Stack.EC2.DisableBuckets)

	res, err := b.Run(ctx)
	if res != nil {
		// The shared lab's sweeper would otherwise find the burst's
		// instances, terminated without a record in its ledger.
		t.Cleanup(func() {
			for _, p := range res.Pods {
				lab.Stack.EC2.RemoveInstance(p.InstanceID)
			}
		})
	}
	if err != nil {
		t.Fatalf("burst: %v\nreconciler output (tail):\n%s", err, Tail(b.Lab.Reconcilers[0].Logs(), 40))
	}
	for action, n := range res.Refused {
		if n > 0 {
			t.Errorf("%d %s requests refused", n, action)
		}
	}
	if res.DeadLettered != 0 {
		t.Errorf("%d work items dead-lettered", res.DeadLettered)
	}

	list, err := lab.Stack.Kube.CoreV1().Pods(res.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pods := map[string]*corev1.Pod{}
	for i := range list.Items {
		pods[list.Items[i].Name] = &list.Items[i]
	}
	for _, p := range res.Pods {
		pod, ok := pods[p.Name]
		if !ok {
			t.Fatalf("pod %s missing", p.Name)
		}
		if p.ExitCode == 0 {
			wantEnded(t, pod, corev1.PodSucceeded, 0, "Completed")
		} else {
			wantEnded(t, pod, corev1.PodFailed, int32(p.ExitCode), "Error")
		}
		if s := instanceState(t, p.InstanceID); s != ec2server.Terminated {
			t.Errorf("instance %s is %s", p.InstanceID, s)
		}
		if p.Terminates != 1 {
			t.Errorf("instance %s terminated %d times: %s", p.InstanceID, p.Terminates, terminatesNaming(p.InstanceID))
		}
	}

	if n, limit := res.EC2["DescribeInstances"], 2*ceilDiv(burstExits, 200)+20; n > limit {
		t.Errorf("%d tag lookups for %d exits, want at most %d", n, burstExits, limit)
	}
	if n, limit := res.EC2["TerminateInstances"], 2*ceilDiv(burstExits, 1000)+10; n > limit {
		t.Errorf("%d TerminateInstances requests for %d exits, want at most %d", n, burstExits, limit)
	}
	if res.StateEvents != 2*burstExits {
		t.Errorf("%d state-change events delivered, want %d", res.StateEvents, 2*burstExits)
	}
	all, _ := res.AllShuttingDown()
	lat := res.PodLatencies()
	t.Logf("%d exits: EC2 %v, refused %v, SDK retries %v; all shutting down %v after the first delivery (delivering took %v); "+
		"Pods terminal p50 %v p99 %v; %d invocations, batch sizes %v; DynamoDB %v; SQS %v",
		burstExits, res.EC2, res.Refused, res.Retried, all, res.Delivering, lat[len(lat)/2], lat[len(lat)*99/100],
		res.Invocations, res.BatchSizes, res.Dynamo, res.SQS)
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// terminatesNaming describes the successful TerminateInstances requests
// naming id: when each arrived and how many instances it named, which
// tells an SDK retry of one request (same instances, moments apart) from
// two batches terminating the instance.
func terminatesNaming(id string) string {
	var out []string
	for _, c := range lab.Stack.EC2.Calls() {
		if slices.Contains(c.Terminated(), id) {
			out = append(out, fmt.Sprintf("%s (%d instances, first %s)", c.Time.Format(time.StampMicro), len(c.InstanceIDs), c.InstanceIDs[0]))
		}
	}
	return strings.Join(out, ", ")
}
