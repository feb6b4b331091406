package bench

import (
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"golang.org/x/net/http2"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reaper-k8s/reaper/internal/ec2server"
	"github.com/reaper-k8s/reaper/internal/labstack"
	"github.com/reaper-k8s/reaper/internal/replay"
	"github.com/reaper-k8s/reaper/pkg/app"
	"github.com/reaper-k8s/reaper/pkg/instances"
	"github.com/reaper-k8s/reaper/pkg/model"
)

// burstExits is how many Pods end at once in BenchmarkBurst; burstScale is
// how much faster than on EC2 the buckets refill, on the EC2 test server
// and in the reconcilers' pacing alike. Together they keep the benchmark,
// whose baseline alone waits (N − 100)/(5·scale) s for the TerminateInstances
// bucket, near ten minutes on two cores.
const (
	burstExits = 6000
	burstScale = 4
)

// BenchmarkBurst lets burstExits Pods end at once with EC2's published
// buckets on (refill × burstScale), through the production bootstraps
// under the emulator: four exitrecorders deliver the exit payloads, the
// reconcilers (two, behind the event source mapping, with the construct's
// 1 s window) check, write and terminate, and four statechange functions
// deliver each terminated instance's two EventBridge events. Then, against
// the same bucketed server, the baseline: one DescribeInstances and one
// TerminateInstances per exit through instances.Fleet, unpaced, as the
// exitrecorder made them before the work queue. It reports both side by
// side, prints the table REPORT.md's "Burst" section shows and writes the
// timeline bench/chart draws.
func BenchmarkBurst(b *testing.B) {
	w, burst := newBurst(b, "reaper-bench-burst", burstExits, burstScale)
	ctx := context.Background()
	for range b.N {
		w.stack.EC2.EnableBuckets(ec2server.PublishedLimits(), burstScale)
		b.StartTimer()
		res, err := burst.Run(ctx)
		b.StopTimer()
		w.stack.EC2.DisableBuckets()
		if err != nil {
			if res != nil {
				reportBurst(b, res, &baselineResult{})
			}
			b.Fatal(err)
		}
		checkBurst(b, res)

		w.stack.EC2.EnableBuckets(ec2server.PublishedLimits(), burstScale)
		base, err := w.baseline(ctx, burstExits, burstScale)
		w.stack.EC2.DisableBuckets()
		if err != nil {
			b.Fatal(err)
		}
		reportBurst(b, res, base)
		if err := writeTimeline(timelineFile, res); err != nil {
			b.Fatal(err)
		}
		if err := w.cleanupBurst(ctx, res, base); err != nil {
			b.Fatal(err)
		}
	}
}

// publishedExits is how many Pods end at once in BenchmarkBurstPublished:
// at EC2's published refill, uncompressed, the reconcilers' share of the
// Terminate bucket covers them in (N − 500)/10 s, 2.5 minutes.
const publishedExits = 2000

// BenchmarkBurstPublished lets publishedExits Pods end at once as
// BenchmarkBurst does, but at EC2's published buckets uncompressed (refill
// × 1), and with the reconciler as deployed: its 5 min timeout (the
// emulator's default), batches of up to 10,000 gathered for 1 s, two at
// once (the burst's defaults).
func BenchmarkBurstPublished(b *testing.B) {
	w, burst := newBurst(b, "reaper-bench-published", publishedExits, 1)
	runBursts(b, w, burst, 1)
}

// runBursts runs burst b.N times at EC2's published buckets refilled ×
// scale, and reports, checks and cleans up each run, with no baseline.
func runBursts(b *testing.B, w *world, burst *replay.Burst, scale float64) {
	ctx := context.Background()
	for range b.N {
		w.stack.EC2.EnableBuckets(ec2server.PublishedLimits(), scale)
		b.StartTimer()
		res, err := burst.Run(ctx)
		b.StopTimer()
		w.stack.EC2.DisableBuckets()
		if res != nil {
			reportBurst(b, res, &baselineResult{})
		}
		if err != nil {
			b.Fatal(err)
		}
		checkBurst(b, res)
		if err := w.cleanupBurst(ctx, res, &baselineResult{}); err != nil {
			b.Fatal(err)
		}
	}
}

// twoContainerPods is how many Pods of two containers end at once in
// BenchmarkBurstTwoContainers.
const twoContainerPods = 2000

// BenchmarkBurstTwoContainers lets twoContainerPods Pods of two regular
// containers end at once, at the published buckets refilled ×
// burstScale: each Pod's first container ends, its line delivered on its
// own, then its last. It measures what a Pod's second container costs:
// the requests per container exit.
func BenchmarkBurstTwoContainers(b *testing.B) {
	w, burst := newBurstWith(b, "reaper-bench-two-containers", replay.BurstOptions{Exits: twoContainerPods, Containers: 2, Scale: burstScale})
	runBursts(b, w, burst, burstScale)
}

// newBurst stops the timer and sets up a burst of exits Pods with its own
// ledger table, EC2's published buckets refilled × scale, and both state
// changes of each terminated instance; it is stopped with the benchmark.
func newBurst(b *testing.B, table string, exits int, scale float64) (*world, *replay.Burst) {
	return newBurstWith(b, table, replay.BurstOptions{Exits: exits, Scale: scale})
}

// newBurstWith is newBurst with opts, both state changes of each
// terminated instance delivered.
func newBurstWith(b *testing.B, table string, opts replay.BurstOptions) (*world, *replay.Burst) {
	b.StopTimer()
	w := getWorld(b)
	opts.StateChanges, opts.Progress = true, os.Stderr
	burst, err := replay.NewBurst(context.Background(), w.stack, table, buildBootstraps(b), opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(burst.Stop)
	return w, burst
}

// timelineFile is where BenchmarkBurst writes the burst's timeline, in the
// package directory, for bench/chart to draw:
//
//	go run ./bench/chart -in bench/burst-timeline.csv -out bench/burst.png
const timelineFile = "burst-timeline.csv"

// writeTimeline writes one row per Pod: when its exit was delivered, when
// it was seen terminal and when its instance was shutting down (Reaper's
// terminate, or its host's power-off: BurstPod.Gone), in seconds after the
// first delivery (empty when it never happened).
func writeTimeline(path string, res *replay.BurstResult) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	cw := csv.NewWriter(f)
	since := func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return fmt.Sprintf("%.2f", t.Sub(res.FirstDelivery).Seconds())
	}
	// A csv.Writer keeps its first error for Error, after Flush.
	_ = cw.Write([]string{"pod", "delivered_s", "terminal_s", "shutting_down_s"})
	for _, p := range res.Pods {
		_ = cw.Write([]string{p.Name, since(p.Delivered), since(p.Terminal), since(p.Gone())})
	}
	cw.Flush()
	return errors.Join(cw.Error(), f.Close())
}

// checkBurst fails the benchmark unless every Pod ended as its exit code
// says and every instance was terminated by exactly one operation.
func checkBurst(b *testing.B, res *replay.BurstResult) {
	for _, p := range res.Pods {
		want := corev1.PodSucceeded
		if p.ExitCode != 0 {
			want = corev1.PodFailed
		}
		if p.Phase != want || p.Terminates != 1 {
			b.Fatalf("pod %s: phase %q (want %s), instance %s terminated %d times", p.Name, p.Phase, want, p.InstanceID, p.Terminates)
		}
	}
}

// cleanupBurst removes the burst's Pods, Events and instances and the
// baseline's instances, so that the benchmarks after this one meet a stack
// of the usual size.
func (w *world) cleanupBurst(ctx context.Context, res *replay.BurstResult, base *baselineResult) error {
	for _, p := range res.Pods {
		w.stack.EC2.RemoveInstance(p.InstanceID)
	}
	for _, id := range base.ids {
		w.stack.EC2.RemoveInstance(id)
	}
	w.stack.EC2.ResetCalls()
	now := int64(0)
	pods, evs := w.stack.Kube.CoreV1().Pods(res.Namespace), w.stack.Kube.CoreV1().Events(res.Namespace)
	if err := untilDone(func() error {
		return pods.DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &now}, metav1.ListOptions{})
	}); err != nil {
		return err
	}
	return untilDone(func() error { return evs.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}) })
}

// untilDone calls del again while the apiserver answers that it ran out of
// time (it goes on deleting meanwhile): deleting 10,000 Pods, or the
// 20,000 Events of a burst, takes longer than its 60 s request timeout.
// Over HTTP/2 the timeout may come as the stream's reset instead.
func untilDone(del func() error) error {
	for range 10 {
		err := del()
		var reset http2.StreamError
		if !apierrors.IsTimeout(err) && !apierrors.IsServerTimeout(err) && !(errors.As(err, &reset) && reset.Code == http2.ErrCodeInternal) {
			return err
		}
	}
	return del()
}

// baselineWorkers are the baseline's concurrent invocations. Before the
// work queue the exitrecorder ran one invocation per exit, as many at once
// as exits arrived; 32 already keep every bucket empty.
const baselineWorkers = 32

// asyncRetry is how long Lambda waits before it retries a failed
// asynchronous invocation the first time (one minute); the baseline
// compresses it by the scale, like the buckets.
const asyncRetry = time.Minute

// baselineResult is what the baseline took and came to.
type baselineResult struct {
	ids []string
	// ec2 and refused count the EC2 test server's requests by action.
	ec2, refused map[string]int
	// allShuttingDown is from the start until the last instance's first
	// successful TerminateInstances.
	allShuttingDown time.Duration
	// failures are the invocations whose calls failed after the SDK's
	// retries (10 attempts, backoff up to 20 s, as app.AWSConfig sets) or
	// its retry quota ran out, and were retried asyncRetry/scale later.
	failures int
}

// baseline terminates n managed instances one exit at a time: per exit,
// one tag lookup and one TerminateInstances through instances.Fleet, with
// no pacing, from baselineWorkers invocations at once, each with its own
// EC2 client as Lambda execution environments have.
func (w *world) baseline(ctx context.Context, n int, scale float64) (*baselineResult, error) {
	w.mu.Lock()
	w.passes++
	seq := w.passes
	w.mu.Unlock()
	keys := model.DefaultTagKeys()
	res := &baselineResult{ids: make([]string, n)}
	for i := range n {
		id := fmt.Sprintf("i-0ba5e%06x%06x", seq, i)
		res.ids[i] = id
		w.lab.AddTaggedInstance(id, map[string]string{
			keys.Managed: "true", keys.Cluster: labstack.Cluster,
			keys.PodNamespace: "baseline", keys.PodName: fmt.Sprintf("exit-%05d", i), keys.PodUID: fmt.Sprintf("uid-%05d", i),
		})
	}
	before := len(w.stack.EC2.Calls())
	bar := replay.NewProgress(os.Stderr, "baseline", n)
	var done, failures atomic.Int64
	stopBar := bar.Follow(func() (int, string) {
		return int(done.Load()), fmt.Sprintf("exits done, %d invocations failed and retried", failures.Load())
	})
	next := make(chan string)
	errs := make([]error, baselineWorkers)
	var wg sync.WaitGroup
	start := time.Now()
	for k := range baselineWorkers {
		awsCfg, err := app.AWSConfig(ctx)
		if err != nil {
			return nil, err
		}
		fleet := instances.NewFleet(ec2.NewFromConfig(awsCfg), keys, labstack.Cluster)
		wg.Go(func() {
			for id := range next {
				for {
					described := fleet.Describe(ctx, []string{id})
					err := described.Left[id]
					if err == nil {
						res := fleet.Terminate(ctx, []string{id}, described.Found)
						if err = res.Left[id]; err == nil {
							if o := res.Outcome[id]; o != instances.Terminating && o != instances.AlreadyGone {
								errs[k] = fmt.Errorf("terminate %s: %s", id, o)
							}
							break
						}
					}
					failures.Add(1)
					time.Sleep(time.Duration(float64(asyncRetry) / scale))
				}
				done.Add(1)
			}
		})
	}
	for _, id := range res.ids {
		next <- id
	}
	close(next)
	wg.Wait()
	stopBar()
	res.failures = int(failures.Load())
	tally := w.stack.EC2.TallySince(before)
	res.ec2, res.refused = tally.Requests, tally.Refused
	for _, id := range res.ids {
		t, ok := tally.FirstTerminated[id]
		if !ok {
			return nil, fmt.Errorf("baseline: instance %s never terminated", id)
		}
		res.allShuttingDown = max(res.allShuttingDown, t.Sub(start))
	}
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return res, nil
}

// reportBurst reports the burst and the baseline, and writes the table
// REPORT.md shows to stderr (a benchmark's log is cut after ten lines).
func reportBurst(b *testing.B, res *replay.BurstResult, base *baselineResult) {
	n := float64(res.Exits)
	all, _ := res.AllShuttingDown()
	full, shared := res.TerminateFloor(1), res.TerminateFloor(res.Share)
	lat := res.PodLatencies()
	refusals := sum(res.Refused)
	kube := kubePerExit(res.Kube)
	ddb, sqsReqs := sum(res.Dynamo), sum(res.SQS)
	sizes := slices.Sorted(slices.Values(res.BatchSizes))
	var durations time.Duration
	var batchMessages, lookups, deferred int
	for _, c := range res.Batches {
		durations += c.Duration
		batchMessages += c.Messages
		lookups += c.Lookups
		deferred += c.Deferred
	}

	b.ReportMetric(float64(res.EC2["DescribeInstances"]), "describe-requests")
	b.ReportMetric(float64(res.EC2["TerminateInstances"]), "terminate-requests")
	b.ReportMetric(float64(refusals), "refusals")
	b.ReportMetric(all.Seconds(), "all-shutting-down-s")
	b.ReportMetric(full.Seconds(), "floor-full-s")
	b.ReportMetric(shared.Seconds(), "floor-share-s")
	b.ReportMetric(ratio(all, full), "x-floor-full")
	b.ReportMetric(ratio(all, shared), "x-floor-share")
	b.ReportMetric(percentile(lat, 50).Seconds(), "pod-terminal-p50-s")
	b.ReportMetric(percentile(lat, 99).Seconds(), "pod-terminal-p99-s")
	b.ReportMetric(float64(kube)/n, "kube-requests/exit")
	containerExits := n * float64(max(1, res.Containers))
	b.ReportMetric(float64(kube)/containerExits, "kube-requests/container-exit")
	b.ReportMetric(float64(ddb)/containerExits, "ddb-requests/container-exit")
	b.ReportMetric(float64(ddb)/n, "ddb-requests/exit")
	b.ReportMetric(float64(sqsReqs)/n, "sqs-requests/exit")
	b.ReportMetric(float64(res.Invocations), "invocations")
	b.ReportMetric(n/float64(max(1, res.Invocations)), "exits/invocation")
	b.ReportMetric(float64(base.ec2["DescribeInstances"]), "baseline-describe-requests")
	b.ReportMetric(float64(base.ec2["TerminateInstances"]), "baseline-terminate-requests")
	b.ReportMetric(float64(sum(base.refused)), "baseline-refusals")
	b.ReportMetric(base.allShuttingDown.Seconds(), "baseline-all-shutting-down-s")

	var t strings.Builder
	row := func(what, burst, baseline string) { fmt.Fprintf(&t, "| %s | %s | %s |\n", what, burst, baseline) }
	fmt.Fprintf(&t, "\n| %d exits (%d containers a Pod), buckets at the published limits, refill × %g | work queue | one call per exit |\n|---|---|---|\n", res.Exits, max(1, res.Containers), res.Scale)
	row("DescribeInstances requests", fmt.Sprint(res.EC2["DescribeInstances"]), fmt.Sprint(base.ec2["DescribeInstances"]))
	row("TerminateInstances requests", fmt.Sprint(res.EC2["TerminateInstances"]), fmt.Sprint(base.ec2["TerminateInstances"]))
	row("requests refused (RequestLimitExceeded)", fmt.Sprintf("%d %v", refusals, res.Refused), fmt.Sprintf("%d %v", sum(base.refused), base.refused))
	row("SDK retries of an operation whose answer was lost on loopback", fmt.Sprint(res.Retried), "—")
	row("first delivery → every instance shutting down", secs(all), secs(base.allShuttingDown))
	row("full-bucket floor (N − 1000)/(20·scale)", fmt.Sprintf("%s (%.2f×)", secs(full), ratio(all, full)), fmt.Sprintf("%s (%.2f×)", secs(full), ratio(base.allShuttingDown, full)))
	row(fmt.Sprintf("floor at share %g, (N − s·1000)/(s·20·scale)", res.Share), fmt.Sprintf("%s (%.2f×)", secs(shared), ratio(all, shared)), "—")
	row("delivering the payloads (4 exitrecorders)", secs(res.Delivering), "—")
	row("Pod terminal after its delivery, p50 / p99", fmt.Sprintf("%s / %s", secs(percentile(lat, 50)), secs(percentile(lat, 99))), "—")
	row("Kubernetes requests per exit", fmt.Sprintf("%.2f %v", float64(kube)/n, res.Kube), "—")
	row("DynamoDB requests per exit", fmt.Sprintf("%.2f %v", float64(ddb)/n, res.Dynamo), "—")
	if res.Containers > 1 {
		row("Kubernetes / DynamoDB requests per container exit", fmt.Sprintf("%.2f / %.2f", float64(kube)/containerExits, float64(ddb)/containerExits), "—")
	}
	row("SQS requests per exit (work queue)", fmt.Sprintf("%.2f %v", float64(sqsReqs)/n, res.SQS), "—")
	row("state-change events delivered", fmt.Sprint(res.StateEvents), "—")
	row("reconciler invocations (failed)", fmt.Sprintf("%d (%d)", res.Invocations, res.FailedInvocations), "—")
	if len(sizes) > 0 {
		row("batch sizes: min / median / max", fmt.Sprintf("%d / %d / %d", sizes[0], sizes[len(sizes)/2], sizes[len(sizes)-1]), "—")
	}
	row("reconciler time per message (sum of batch durations / messages)", fmt.Sprintf("%.1f ms", ms(durations)/float64(max(1, batchMessages))), "—")
	row("instances looked up / deferred", fmt.Sprintf("%d / %d", lookups, deferred), "—")
	row("invocations failed and retried", "—", fmt.Sprint(base.failures))
	var batches []string
	for _, c := range res.Batches {
		batches = append(batches, fmt.Sprintf("%d msgs/%d inst/%d looked up/%d terminated in %s", c.Messages, c.Instances, c.Lookups, c.Terminated, secs(c.Duration)))
	}
	fmt.Fprintf(os.Stderr, "%s\nreconciler batches: %s\n", t.String(), strings.Join(batches, "; "))
}

// kubePerExit counts the functions' apiserver requests (BurstResult.Kube
// holds theirs alone).
func kubePerExit(kube map[string]int) int { return sum(kube) }

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

func ratio(a, b time.Duration) float64 {
	if b <= 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func secs(d time.Duration) string { return fmt.Sprintf("%.1f s", d.Seconds()) }
