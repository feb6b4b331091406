package bench

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/reaper-k8s/reaper/internal/ec2server"
	"github.com/reaper-k8s/reaper/internal/replay"
)

// hostsExits is how many Pods end at once in BenchmarkBurstHosts
// (REAPER_BENCH_HOSTS_EXITS overrides it), at EC2's published buckets
// refilled × hostsScale; hostsGraces are the REAPER_POWER_OFF_GRACE of its
// runs: internal/replay's TestBurstHostsPowerOff's, the README's example,
// and none.
const (
	hostsExits = 10000
	hostsScale = 4
	hostsSeed  = 21
)

// refillScale is hostsScale, or REAPER_BENCH_SCALE: 1 runs at EC2's
// published refill rates, uncompressed.
func refillScale(b *testing.B) float64 {
	v := os.Getenv("REAPER_BENCH_SCALE")
	if v == "" {
		return hostsScale
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f < 1 || f > hostsScale {
		b.Fatalf("REAPER_BENCH_SCALE=%q: want a refill compression from 1 to %d", v, hostsScale)
	}
	return f
}

// scaleSuffix names the timelines of runs at another refill than hostsScale.
func scaleSuffix(scale float64) string {
	if scale == hostsScale {
		return ""
	}
	return fmt.Sprintf("-x%g", scale)
}

var hostsGraces = []time.Duration{10 * time.Second, 30 * time.Second, 0}

// BenchmarkBurstHosts lets hostsExits Pods end at once on hosts that power
// themselves off, as production's do with the default user-data: each
// host 3 – 7 s after its exit line is delivered, 10% never; each line
// delivered 0.3 – 1.5 s after it was written; EventBridge's shutting-down
// and terminated events of every instance, whoever ended it. The
// reconcilers run as deployed (batches of up to 10,000 gathered for 1 s,
// two at once, the 5 min timeout, visibility 30 min) at EC2's published
// buckets refilled × hostsScale (REAPER_BENCH_SCALE sets another, 1 for
// EC2's own rates). One run per REAPER_POWER_OFF_GRACE of
// hostsGraces (0: Reaper terminates at once). Each prints the table of
// REPORT.md's "Hosts that power themselves off" section and writes its
// timeline (burst-hosts-grace-<grace>.csv) for bench/chart.
func BenchmarkBurstHosts(b *testing.B) {
	exits := hostsExits
	if v := os.Getenv("REAPER_BENCH_HOSTS_EXITS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("REAPER_BENCH_HOSTS_EXITS=%q: want a positive number", v)
		}
		exits = n
	}
	for _, grace := range hostsGraces {
		b.Run("grace="+grace.String(), func(b *testing.B) {
			b.StopTimer()
			w := getWorld(b)
			ctx := context.Background()
			scale := refillScale(b)
			var env []string
			if grace > 0 {
				env = append(env, "REAPER_POWER_OFF_GRACE="+grace.String())
			}
			burst, err := replay.NewBurst(ctx, w.stack, fmt.Sprintf("reaper-bench-hosts-%d", int(grace.Seconds())), buildBootstraps(b), replay.BurstOptions{
				Exits: exits, Scale: scale, StateChanges: true, Progress: os.Stderr,
				Hosts: &replay.Hosts{
					PowerOffMin: 3 * time.Second, PowerOffMax: 7 * time.Second, NeverPowerOff: 0.1,
					LineAgeMin: 300 * time.Millisecond, LineAgeMax: 1500 * time.Millisecond, Seed: hostsSeed,
				},
				Lab: replay.LabOptions{Env: env},
			})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(burst.Stop)
			for range b.N {
				w.stack.EC2.EnableBuckets(ec2server.PublishedLimits(), scale)
				b.StartTimer()
				res, err := burst.Run(ctx)
				b.StopTimer()
				w.stack.EC2.DisableBuckets()
				if res != nil {
					reportHosts(b, res, grace)
				}
				if err != nil {
					b.Fatal(err)
				}
				checkHosts(b, res)
				if err := writeTimeline(fmt.Sprintf("burst-hosts-grace-%s%s.csv", grace, scaleSuffix(scale)), res); err != nil {
					b.Fatal(err)
				}
				if err := w.cleanupBurst(ctx, res, &baselineResult{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// checkHosts fails the benchmark unless every Pod ended as its exit code
// says, every instance is gone, and none was terminated twice or, its host
// still on, not at all.
func checkHosts(b *testing.B, res *replay.BurstResult) {
	for _, p := range res.Pods {
		want := corev1.PodSucceeded
		if p.ExitCode != 0 {
			want = corev1.PodFailed
		}
		if p.Phase != want || p.Terminates > 1 || (p.PoweredOff.IsZero() && p.Terminates != 1) {
			b.Fatalf("pod %s: phase %q (want %s), instance %s terminated %d times, powered off by its host at %v",
				p.Name, p.Phase, want, p.InstanceID, p.Terminates, p.PoweredOff)
		}
	}
	if running := res.StillRunning(); len(running) > 0 {
		b.Fatalf("%d instances still running: %v", len(running), running)
	}
}

// reportHosts reports a burst on hosts that power off and writes its
// table to stderr.
func reportHosts(b *testing.B, res *replay.BurstResult, grace time.Duration) {
	n := float64(res.Exits)
	lat := res.PodLatencies()
	all, _ := res.AllGone()
	lastDelivery, lastTerminal := res.Lasts()
	var gone []time.Duration
	// both: instances named in TerminateInstances that their host powered
	// off too; wasted: of those, the ones already shutting down when the
	// first call naming them arrived.
	never, both, wasted := 0, 0, 0
	for _, p := range res.Pods {
		if g := p.Gone(); !g.IsZero() {
			gone = append(gone, g.Sub(p.Delivered))
		}
		if !p.PowersOff {
			never++
		}
		if !p.PoweredOff.IsZero() && p.Terminates > 0 {
			both++
			if p.PoweredOff.Before(p.ShuttingDown) {
				wasted++
			}
		}
	}
	slices.Sort(gone)
	describeLimit := 2*ceilDiv(res.Exits, 200) + 20
	refusals := sum(res.Refused)
	// Batches that write Pods, and the others (state changes, wake-ups).
	var deferred, lookups, patched, writing int
	var busy, writingTime time.Duration
	var batches []string
	for _, c := range res.Batches {
		deferred += c.Deferred
		lookups += c.Lookups
		patched += c.Patched
		busy += c.Duration
		if c.Patched > 0 {
			writing++
			writingTime += c.Duration
		}
		batches = append(batches, fmt.Sprintf("%d msgs/%d inst/%d looked up/%d patched/%d terminated in %s", c.Messages, c.Instances, c.Lookups, c.Patched, c.Terminated, secs(c.Duration)))
	}
	sizes := slices.Sorted(slices.Values(res.BatchSizes))

	b.ReportMetric(percentile(lat, 50).Seconds(), "pod-terminal-p50-s")
	b.ReportMetric(percentile(lat, 99).Seconds(), "pod-terminal-p99-s")
	b.ReportMetric(lastTerminal.Sub(lastDelivery).Seconds(), "last-terminal-after-last-delivery-s")
	b.ReportMetric(float64(res.TerminateNamed), "terminate-named")
	b.ReportMetric(100*float64(res.TerminateNamed)/n, "terminate-named-%")
	b.ReportMetric(float64(res.PoweredOff), "hosts-powered-off")
	b.ReportMetric(float64(res.EC2["DescribeInstances"]), "describe-requests")
	b.ReportMetric(float64(res.EC2["TerminateInstances"]), "terminate-requests")
	b.ReportMetric(float64(refusals), "refusals")
	b.ReportMetric(all.Seconds(), "all-gone-s")
	b.ReportMetric(percentile(gone, 50).Seconds(), "gone-after-delivery-p50-s")
	b.ReportMetric(percentile(gone, 99).Seconds(), "gone-after-delivery-p99-s")

	var t strings.Builder
	row := func(what, v string) { fmt.Fprintf(&t, "| %s | %s |\n", what, v) }
	graceSaid := "unset (terminate at once)"
	if grace > 0 {
		graceSaid = grace.String()
	}
	fmt.Fprintf(&t, "\n| %d exits, hosts powering off, refill × %g, REAPER_POWER_OFF_GRACE %s | |\n|---|---|\n", res.Exits, res.Scale, graceSaid)
	row("delivering the payloads (4 exitrecorders)", secs(res.Delivering))
	row("Pod terminal after its delivery, p50 / p99", fmt.Sprintf("%s / %s", secs(percentile(lat, 50)), secs(percentile(lat, 99))))
	row("last Pod terminal after the last delivery", secs(lastTerminal.Sub(lastDelivery)))
	row("hosts drawn never to power off / that powered off", fmt.Sprintf("%d / %d", never, res.PoweredOff))
	row("instances named in TerminateInstances", fmt.Sprintf("%d (%.1f%% of N); %d powered off by their host as well, %d of them before the call", res.TerminateNamed, 100*float64(res.TerminateNamed)/n, both, wasted))
	row("TerminateInstances requests", fmt.Sprint(res.EC2["TerminateInstances"]))
	row("DescribeInstances requests", fmt.Sprintf("%d (2·⌈N/200⌉+20 = %d)", res.EC2["DescribeInstances"], describeLimit))
	row("requests refused (RequestLimitExceeded)", fmt.Sprintf("%d %v", refusals, res.Refused))
	row("first delivery → every instance gone", secs(all))
	row("instance gone after its delivery, p50 / p99 / max", fmt.Sprintf("%s / %s / %s", secs(percentile(gone, 50)), secs(percentile(gone, 99)), secs(gone[len(gone)-1])))
	row("still running at the end", fmt.Sprint(len(res.StillRunning())))
	row("state-change events delivered", fmt.Sprint(res.StateEvents))
	row("reconciler invocations (failed), batch sizes min / median / max", fmt.Sprintf("%d (%d), %d / %d / %d", res.Invocations, res.FailedInvocations, sizes[0], sizes[len(sizes)/2], sizes[len(sizes)-1]))
	row("instances looked up / deferred", fmt.Sprintf("%d / %d", lookups, deferred))
	row("first delivery → last Pod terminal", secs(lastTerminal.Sub(res.FirstDelivery)))
	row("reconciler batches writing Pods: count, summed time, Pods patched per second of it", fmt.Sprintf("%d, %s, %.0f", writing, secs(writingTime), float64(patched)/writingTime.Seconds()))
	row("other batches (state changes, wake-ups): count, summed time", fmt.Sprintf("%d, %s", len(res.Batches)-writing, secs(busy-writingTime)))
	row("dead-lettered", fmt.Sprint(res.DeadLettered))
	row("Kubernetes / DynamoDB / SQS requests per exit", fmt.Sprintf("%.2f / %.2f / %.2f", float64(sum(res.Kube))/n, float64(sum(res.Dynamo))/n, float64(sum(res.SQS))/n))
	row("SQS requests by action", fmt.Sprint(res.SQS))
	fmt.Fprintf(os.Stderr, "%s\nreconciler batches: %s\n", t.String(), strings.Join(batches, "; "))
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }
