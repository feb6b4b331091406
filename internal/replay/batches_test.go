package replay

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/reaper-k8s/reaper/internal/ec2server"
	"github.com/reaper-k8s/reaper/internal/kubeproxy"
	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/model"
	"github.com/reaper-k8s/reaper/pkg/reaper"
)

// timeoutEnv is the environment that gives the functions a Lambda timeout
// of d (whole seconds).
func timeoutEnv(d time.Duration) string {
	return fmt.Sprintf("AWS_LAMBDA_FUNCTION_TIMEOUT=%d", int(d/time.Second))
}

// runBurst runs a burst on the shared EC2 test server with its published
// buckets on at the burst's scale, and removes its instances afterwards;
// before, when not nil, shapes the burst first.
func runBurst(t *testing.T, table string, opts BurstOptions, before func(*Burst)) *BurstResult {
	t.Helper()
	b, err := NewBurst(t.Context(), lab.Stack, table, lab.Bootstraps, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Stop)
	if before != nil {
		before(b)
	}
	lab.Stack.EC2.EnableBuckets(ec2server.PublishedLimits(), max(opts.Scale, 1))
	t.Cleanup(lab.Stack.EC2.DisableBuckets)
	// Work that never converges keeps the queue busy: bound the wait.
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	res, err := b.Run(ctx)
	if res != nil {
		t.Cleanup(func() {
			for _, p := range res.Pods {
				lab.Stack.EC2.RemoveInstance(p.InstanceID)
			}
		})
	}
	t.Cleanup(func() {
		if t.Failed() {
			logs := ""
			for _, f := range b.Lab.Reconcilers {
				logs += f.Logs()
			}
			t.Logf("reconciler output (tail):\n%s", Tail(logs, 60))
		}
	})
	if err != nil {
		t.Fatalf("burst: %v", err)
	}
	return res
}

// wantAllEnded checks that every Pod of the burst ended with its exit's
// phase and every instance was terminated exactly once, with no work
// failed or dead-lettered. With hosts (BurstOptions.Hosts), an instance
// its host powered off was terminated at most once: Reaper's lookup may
// have found it running a moment before the host powered it off.
func wantAllEnded(t *testing.T, res *BurstResult) {
	t.Helper()
	for _, p := range res.Pods {
		want := corev1.PodSucceeded
		if p.ExitCode != 0 {
			want = corev1.PodFailed
		}
		if p.Phase != want {
			t.Errorf("pod %s is %q, want %s", p.Name, p.Phase, want)
		}
		switch {
		case !p.PoweredOff.IsZero():
			if p.Terminates > 1 {
				t.Errorf("instance %s, powered off by its host, terminated %d times", p.InstanceID, p.Terminates)
			}
		case p.Terminates != 1:
			t.Errorf("instance %s terminated %d times", p.InstanceID, p.Terminates)
		}
	}
	failed := 0
	for _, b := range res.Batches {
		failed += b.Failed
	}
	if failed != 0 || res.DeadLettered != 0 || res.FailedInvocations != 0 {
		t.Errorf("%d work items failed, %d dead-lettered, %d invocations failed", failed, res.DeadLettered, res.FailedInvocations)
	}
}

// deferred sums what the burst's batches deferred.
func deferred(res *BurstResult) int {
	n := 0
	for _, b := range res.Batches {
		n += b.Deferred
	}
	return n
}

// A batch several times larger than its share of the Terminate bucket
// covers before a 20 s deadline, at the published buckets (refill × 4):
// each batch terminates what its share allows, defers only the rest, and
// the deferred work shrinks until it is done. Every Pod is written once
// and every instance terminated once, in a few rounds.
func TestBigBatchShortDeadline(t *testing.T) {
	const exits, scale = 600, 4
	res := runBurst(t, "reaper-bigbatch-ledger", BurstOptions{
		Exits: exits, Scale: scale,
		// A window long enough to gather the whole burst into one batch,
		// as Lambda's 10,000-message batches would.
		Lab: LabOptions{Env: []string{timeoutEnv(20 * time.Second)}, BatchingWindow: 5 * time.Second},
	}, nil)
	wantAllEnded(t, res)
	// One reconciler's share of the resource bucket: a quarter of its
	// 1,000 (share 0.5, two reconcilers), plus what refills (20/s × 4, a
	// quarter of it) in the 5 s a 20 s invocation waits for tokens.
	const share = 1000/4 + 5*20*scale/4
	if largest := slices.Max(res.BatchSizes); largest <= share {
		t.Fatalf("largest batch %d, not larger than the %d instances its share covers: the test proves nothing", largest, share)
	}
	if deferred(res) == 0 {
		t.Fatal("nothing was deferred: the batch fit its share")
	}
	// A patch the batch's deadline cut short is tried again; one that
	// was answered never is.
	if n := res.Kube["PATCH pods/status"] - res.KubeErrors["PATCH pods/status"]; n > exits {
		t.Errorf("%d status patches landed for %d Pods (%v, errors %v): work already done was redone", n, exits, res.Kube, res.KubeErrors)
	}
	if len(res.Batches) > 8 {
		t.Errorf("%d batches for %d exits: deferred work does not shrink", len(res.Batches), exits)
	}
	if res.Refused["TerminateInstances"] != 0 {
		t.Errorf("%d TerminateInstances refused", res.Refused["TerminateInstances"])
	}
}

// The apiserver answers every request 600 ms late and the reconciler has
// a 10 s timeout: a batch of 200 Pods needs about 7.5 s of writes (32 at a
// time, a patch and an Event each) and has 5 s for its work, so it writes
// the Pods it has time for and hands the rest back at once. Nothing is lost and nothing counts as done that was
// not: every Pod ends with its exit and every instance is terminated.
func TestSlowAPIServerShortDeadline(t *testing.T) {
	res := runBurst(t, "reaper-slowkube-ledger", BurstOptions{
		Exits: 200, Scale: 4,
		// A failed batch would come back after 6 × the timeout, as deployed.
		Lab: LabOptions{Env: []string{timeoutEnv(10 * time.Second)}, BatchingWindow: 2 * time.Second, QueueVisibility: time.Minute},
	}, func(b *Burst) { b.Kube.SetDelay(600 * time.Millisecond) })
	wantAllEnded(t, res)
	if deferred(res) == 0 {
		t.Fatal("nothing was deferred: the deadline never bit")
	}
}

// The share of the Describe bucket runs out in the middle of a batch: the
// claims of the instances it could not describe go back on the queue, and
// none is rejected as an unknown instance's.
func TestDescribeTokensRunOut(t *testing.T) {
	const scale = 4
	p := model.PublishedBudget()
	// Each of the two reconcilers has one DescribeInstances at once, and
	// one more every 10 s: a 20 s invocation's work ends before its second.
	limits := fmt.Sprintf("describe=4/0.4,terminate=%d/%g,terminate-instances=%d/%g",
		p.Terminate.Capacity, p.Terminate.Refill*scale, p.TerminateInstances.Capacity, p.TerminateInstances.Refill*scale)
	res := runBurst(t, "reaper-describe-ledger", BurstOptions{
		Exits: 400, Scale: scale, Limits: limits,
		Lab: LabOptions{Env: []string{timeoutEnv(20 * time.Second)}, BatchingWindow: 5 * time.Second},
	}, nil)
	wantAllEnded(t, res)
	rejected := 0
	for _, b := range res.Batches {
		rejected += b.Rejected
	}
	if rejected != 0 {
		t.Errorf("%d claims rejected", rejected)
	}
	if deferred(res) == 0 {
		t.Fatal("nothing was deferred: the Describe share covered the batch")
	}
}

// sweepFleet is the fleet of TestSweepCost: running owned instances whose
// Pods are alive.
const sweepFleet = 2000

// A sweep over 2,000 running owned instances, every one past the orphan
// grace period, reads their Pods in LIST pages: its apiserver requests
// are at most 2,000/500 + 10, not one per instance.
func TestSweepCost(t *testing.T) {
	ctx := t.Context()
	const cluster = "sweep-cost"
	proxy, err := kubeproxy.Start(lab.Stack.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := proxy.WriteKubeconfig(kubeconfig, lab.Stack.RESTConfig()); err != nil {
		t.Fatal(err)
	}
	exits, err := lab.CreateExits(ctx, "sweep-cost", sweepFleet, func(i int) (string, string, int) {
		return fmt.Sprintf("gpu-%04d", i), fmt.Sprintf("i-5c%015x", i), 0
	}, nil)
	t.Cleanup(func() {
		for _, e := range exits {
			lab.Stack.EC2.RemoveInstance(e.InstanceID)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	// The fleet is another deployment's as far as the other tests' sweeps
	// go: this one serves cluster alone.
	for _, e := range exits {
		lab.AddTaggedInstance(e.InstanceID, lab.InstanceTags(e.Pod, true, cluster))
	}
	sweeps, err := NewLabWith(ctx, lab.Stack, "reaper-sweepcost-ledger", map[string]string{metrics.FunctionSweeper: lab.Bootstraps[metrics.FunctionSweeper]},
		LabOptions{Env: []string{"KUBECONFIG=" + kubeconfig, "REAPER_CLUSTER=" + cluster}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sweeps.Stop)
	proxy.Calls.Reset()
	var sum reaper.SweepSummary
	if err := sweeps.InvokeOnly(ctx, metrics.FunctionSweeper, []byte(`{"source":"aws.events","detail-type":"Scheduled Event"}`), &sum); err != nil {
		t.Fatal(err)
	}
	if sum.ManagedInstances != sweepFleet || sum.Orphans != 0 || sum.Errors != 0 {
		t.Fatalf("sweep %+v, want %d managed instances, no orphan, no error", sum, sweepFleet)
	}
	calls := proxy.Calls.Calls()
	byAction := map[string]int{}
	for _, c := range calls {
		byAction[c.Action]++
	}
	if limit := sweepFleet/500 + 10; len(calls) > limit {
		t.Fatalf("one sweep made %d apiserver requests (%v), want at most %d", len(calls), byAction, limit)
	}
	if byAction["LIST pods"] == 0 {
		t.Fatalf("requests %v: the Pods were not listed", byAction)
	}
}
