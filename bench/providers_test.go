package bench

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/reaper-k8s/reaper/internal/ec2server"
	"github.com/reaper-k8s/reaper/internal/labstack"
	"github.com/reaper-k8s/reaper/internal/replay"
)

// providersGrace is the REAPER_POWER_OFF_GRACE of BenchmarkBurstProviders:
// the README's example, longer than a batch of a 10,000-exit burst on two
// cores (20 – 31 s, REPORT.md's "Hosts that power themselves off"). The
// Pod-written tag needs a grace: without one Reaper terminates an instance
// as soon as it has written its Pod, before its host can read the tag.
const (
	providersGrace = 30 * time.Second
	// providersTag is the REAPER_TAG_POD_WRITTEN of the hosts that wait
	// for it.
	providersTag = "reaper.io:pod-written"
	// deployedReconcilerMemoryMB is the reconciler's memory as
	// infra/reapercdk deploys it (DefaultReconcilerMemoryMB): the lab's
	// reconcilers get the CPU Lambda gives it.
	deployedReconcilerMemoryMB = 3538
)

// reconcilerMemoryMB is deployedReconcilerMemoryMB, or
// REAPER_BENCH_RECONCILER_MEMORY_MB.
func reconcilerMemoryMB(b *testing.B) int {
	v := os.Getenv("REAPER_BENCH_RECONCILER_MEMORY_MB")
	if v == "" {
		return deployedReconcilerMemoryMB
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 128 || n > 10240 {
		b.Fatalf("REAPER_BENCH_RECONCILER_MEMORY_MB=%q: want Lambda's 128 to 10240", v)
	}
	return n
}

// providerRuns are BenchmarkBurstProviders' runs: each provider style with
// the hosts it needs.
var providerRuns = []struct {
	provider replay.ProviderStyle
	// waitForTag makes the hosts power off after Reaper's Pod-written tag
	// rather than after their line's delivery.
	waitForTag bool
}{
	{replay.LedgerFirst, false},
	{replay.StatusFromInstance, true},
}

// BenchmarkBurstProviders lets hostsExits Pods end at once
// (REAPER_BENCH_PROVIDERS_EXITS overrides it) beside a virtual-kubelet
// provider from examples/vkprovider, once per provider style, with
// BenchmarkBurstHosts' production settings: hosts that power themselves off
// 3 – 7 s after their trigger, 10% never (seed hostsSeed); lines delivered
// 0.3 – 1.5 s after they were written; EventBridge's two events of every
// instance; the reconcilers as deployed, at EC2's published buckets
// refilled × hostsScale (REAPER_BENCH_SCALE sets another, 1 for EC2's own
// rates); REAPER_POWER_OFF_GRACE providersGrace.
//
//   - ledger-first (vkprovider.Run), hosts powering off after their line's
//     delivery, as the default user-data's do;
//   - status-from-instance (vkprovider.RunStatusFromInstance), hosts
//     powering off after they see Reaper's Pod-written tag on their
//     instance (REAPER_TAG_POD_WRITTEN).
//
// The provider polls every second (replay's default: see
// BurstOptions.ProviderPoll) against the same EC2 test server, its requests
// counted apart from Reaper's. Each run prints its table, reports the Pods
// that did not end with their exit's truth, and writes its timeline
// (burst-providers-<style>[-x<scale>][-<exits>].csv) for bench/chart:
//
//	go run ./bench/chart -in bench/burst-providers-ledger-first.csv -out bench/burst-providers-ledger-first.png
func BenchmarkBurstProviders(b *testing.B) {
	exits := hostsExits
	if v := os.Getenv("REAPER_BENCH_PROVIDERS_EXITS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("REAPER_BENCH_PROVIDERS_EXITS=%q: want a positive number", v)
		}
		exits = n
	}
	for _, run := range providerRuns {
		b.Run("provider="+run.provider.String(), func(b *testing.B) {
			b.StopTimer()
			w := getWorld(b)
			ctx := context.Background()
			scale := refillScale(b)
			memory := reconcilerMemoryMB(b)
			hosts := &replay.Hosts{
				PowerOffMin: 3 * time.Second, PowerOffMax: 7 * time.Second, NeverPowerOff: 0.1,
				LineAgeMin: 300 * time.Millisecond, LineAgeMax: 1500 * time.Millisecond, Seed: hostsSeed,
			}
			if run.waitForTag {
				hosts.AfterPodWritten = providersTag
			}
			burst, err := replay.NewBurst(ctx, w.stack, "reaper-bench-provider-"+run.provider.String(), buildBootstraps(b), replay.BurstOptions{
				Exits: exits, Scale: scale, StateChanges: true, Progress: os.Stderr, Hosts: hosts, Provider: run.provider,
				Lab: replay.LabOptions{Env: []string{"REAPER_POWER_OFF_GRACE=" + providersGrace.String()}, ReconcilerMemoryMB: memory},
			})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(burst.Stop)
			for range b.N {
				w.stack.EC2.EnableBuckets(ec2server.PublishedLimits(), scale)
				cpu0, machine0 := bootstrapsCPU(burst.Lab.Reconcilers), sampleCPU()
				b.StartTimer()
				start := time.Now()
				res, err := burst.Run(ctx)
				wall := time.Since(start)
				b.StopTimer()
				reconcilerCPU := bootstrapsCPU(burst.Lab.Reconcilers) - cpu0
				machine := labCPU(sampleCPU().sub(machine0), reconcilerCPU)
				machine["wall"] = wall
				w.stack.EC2.DisableBuckets()
				if res != nil {
					reportProviders(b, res, run.waitForTag, memory, machine)
					if err := writeTimeline(fmt.Sprintf("burst-providers-%s%s%s%s.csv", run.provider, scaleSuffix(scale), exitsSuffix(exits), memorySuffix(memory)), res); err != nil {
						b.Fatal(err)
					}
				}
				if err != nil {
					b.Fatal(err)
				}
				checkProviders(b, res)
				if err := w.cleanupBurst(ctx, res, &baselineResult{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// exitsSuffix names a run's timeline after its burst when it is not the
// default hostsExits, so that a smaller run keeps the full one's file.
func exitsSuffix(exits int) string {
	if exits == hostsExits {
		return ""
	}
	return fmt.Sprintf("-%d", exits)
}

// labCPU splits the machine's CPU use between two samples (cpuSample.sub)
// into the parts a burst's table shows: the apiserver, etcd, dynalite, the
// benchmark process, the reconcilers' bootstraps (reconcilers, which the
// samples do not see apart) and "rest", everything else the machine did
// (the other functions, the emulators, other work).
func labCPU(used map[string]time.Duration, reconcilers time.Duration) map[string]time.Duration {
	out := map[string]time.Duration{"reconcilers": reconcilers}
	var rest time.Duration
	for k, v := range used {
		switch k {
		case "apiserver", "etcd", "dynalite", "bench":
			out[k] = v
		default:
			rest += v
		}
	}
	out["rest"] = max(0, rest-reconcilers)
	return out
}

// bootstrapsCPU is the CPU time the functions' bootstraps (the emulators'
// children) have used so far: what runs inside a Lambda sandbox, on the
// CPU share its memory buys.
func bootstrapsCPU(fs []*labstack.Function) time.Duration {
	var total time.Duration
	for _, f := range fs {
		for _, pid := range labstack.ChildPIDs(f.PID()) {
			if _, cpu, ok := procCPU(pid); ok {
				total += cpu
			}
		}
	}
	return total
}

// memorySuffix names the timelines of runs whose reconcilers have another
// memory than the deployed one.
func memorySuffix(mb int) string {
	if mb == deployedReconcilerMemoryMB {
		return ""
	}
	return fmt.Sprintf("-%dmb", mb)
}

// checkProviders fails the benchmark unless every Pod ended with its
// exit's truth and every instance is gone.
func checkProviders(b *testing.B, res *replay.BurstResult) {
	if len(res.WrongPods) > 0 {
		b.Fatalf("%d Pods did not end with their exit's truth: %v", len(res.WrongPods), res.WrongPods)
	}
	if running := res.StillRunning(); len(running) > 0 {
		b.Fatalf("%d instances still running: %v", len(running), running)
	}
}

// reportProviders reports a burst beside a provider and writes its table to
// stderr.
//
// cpu is the CPU each part of the lab used during the run (labCPU) and
// "wall", the run's time.
func reportProviders(b *testing.B, res *replay.BurstResult, waitForTag bool, memoryMB int, cpu map[string]time.Duration) {
	reconcilerCPU := cpu["reconcilers"]
	n := float64(res.Exits)
	lastDelivery, lastTerminal := res.Lasts()
	lat := res.PodLatencies()
	all, allGone := res.AllGone()
	never, early, tagged := 0, 0, 0
	for _, p := range res.Pods {
		if !p.PowersOff {
			never++
		}
		if !p.PoweredOff.IsZero() && (p.Terminal.IsZero() || p.PoweredOff.Before(p.Terminal)) {
			early++
		}
		if !p.TagSeen.IsZero() {
			tagged++
		}
	}
	refusals, providerRefusals := sum(res.Refused), sum(res.ProviderRefused)
	// Each batch describes the instances it must check in calls of up to
	// 200 ids: the DescribeInstances a burst costs is the sum over its
	// batches, so it grows with the number of batches that check anything.
	var deferred, looking, lookups, pages int
	for _, c := range res.Batches {
		deferred += c.Deferred
		if c.Lookups > 0 {
			looking++
			lookups += c.Lookups
			pages += (c.Lookups + 199) / 200
		}
	}

	b.ReportMetric(float64(len(res.WrongPods)), "wrong-pods")
	b.ReportMetric(100*float64(res.TerminateNamed)/n, "terminate-named-%")
	b.ReportMetric(float64(res.EC2["DescribeInstances"]), "describe-requests")
	b.ReportMetric(float64(res.ProviderEC2["DescribeInstances"]), "provider-describe-requests")
	b.ReportMetric(float64(refusals), "refusals")
	b.ReportMetric(float64(providerRefusals), "provider-refusals")
	b.ReportMetric(all.Seconds(), "all-gone-s")
	b.ReportMetric(percentile(lat, 50).Seconds(), "pod-terminal-p50-s")
	b.ReportMetric(percentile(lat, 99).Seconds(), "pod-terminal-p99-s")
	b.ReportMetric(lastTerminal.Sub(lastDelivery).Seconds(), "last-terminal-after-last-delivery-s")
	b.ReportMetric(ms(reconcilerCPU)/n, "reconciler-cpu-ms/exit")

	var t strings.Builder
	row := func(what, v string) { fmt.Fprintf(&t, "| %s | %s |\n", what, v) }
	trigger := "their line's delivery"
	if waitForTag {
		trigger = "Reaper's Pod-written tag"
	}
	fmt.Fprintf(&t, "\n| %d exits, provider %s, hosts powering off after %s, refill × %g, REAPER_POWER_OFF_GRACE %s, reconcilers at %d MB (%.2f vCPU) | |\n|---|---|\n",
		res.Exits, res.Provider, trigger, res.Scale, providersGrace, memoryMB, labstack.LambdaVCPU(memoryMB))
	row("Pods not ending with their exit's truth (WrongPods)", fmt.Sprintf("%d (%.1f%% of N)", len(res.WrongPods), 100*float64(len(res.WrongPods))/n))
	row("Pod terminal after its delivery, p50 / p99", fmt.Sprintf("%s / %s", secs(percentile(lat, 50)), secs(percentile(lat, 99))))
	row("last delivery after the first / last Pod terminal after the last delivery", fmt.Sprintf("%s / %s", secs(lastDelivery.Sub(res.FirstDelivery)), secs(lastTerminal.Sub(lastDelivery))))
	row("hosts drawn never to power off / that powered off / of them before their Pod was terminal", fmt.Sprintf("%d / %d / %d", never, res.PoweredOff, early))
	if waitForTag {
		row("hosts that saw the Pod-written tag", fmt.Sprint(tagged))
	}
	row("instances named in TerminateInstances", fmt.Sprintf("%d (%.1f%% of N)", res.TerminateNamed, 100*float64(res.TerminateNamed)/n))
	row("Reaper's requests: DescribeInstances / TerminateInstances / CreateTags", fmt.Sprintf("%d / %d / %d", res.EC2["DescribeInstances"], res.EC2["TerminateInstances"], res.EC2["CreateTags"]))
	row("reconciler batches that described instances / instances described / Σ⌈described/200⌉", fmt.Sprintf("%d / %d / %d", looking, lookups, pages))
	row("the provider's DescribeInstances requests", fmt.Sprint(res.ProviderEC2["DescribeInstances"]))
	row("the provider's DynamoDB requests (ledger reads)", fmt.Sprint(res.ProviderDynamo))
	row("requests refused (RequestLimitExceeded): Reaper's / the provider's", fmt.Sprintf("%d %v / %d %v", refusals, res.Refused, providerRefusals, res.ProviderRefused))
	gone := "not every instance gone"
	if allGone {
		gone = secs(all)
	}
	row("first delivery → every instance gone", gone)
	row("still running at the end", fmt.Sprint(len(res.StillRunning())))
	row("state-change events delivered", fmt.Sprint(res.StateEvents))
	row("reconciler invocations (failed), deferred", fmt.Sprintf("%d (%d), %d", res.Invocations, res.FailedInvocations, deferred))
	row("dead-lettered", fmt.Sprint(res.DeadLettered))
	row("the reconcilers' CPU per exit (their bootstraps')", fmt.Sprintf("%.2f ms", ms(reconcilerCPU)/n))
	row(fmt.Sprintf("CPU during the run, the Pods' creation and the provider's adoption included (%s × %d cores): apiserver / etcd / dynalite / the bench process (provider, EC2 and SQS servers) / reconcilers / the rest", secs(cpu["wall"]), runtime.NumCPU()),
		fmt.Sprintf("%s / %s / %s / %s / %s / %s", secs(cpu["apiserver"]), secs(cpu["etcd"]), secs(cpu["dynalite"]), secs(cpu["bench"]), secs(reconcilerCPU), secs(cpu["rest"])))
	row("Kubernetes / DynamoDB / SQS requests per exit (Reaper's)", fmt.Sprintf("%.2f / %.2f / %.2f", float64(sum(res.Kube))/n, float64(sum(res.Dynamo))/n, float64(sum(res.SQS))/n))
	// API Priority and Fairness charges a LIST page of 500 ten seats, any
	// other request of Reaper's one.
	row("Kubernetes: LIST pages / GETs of Pods; API Priority and Fairness seats per exit", fmt.Sprintf("%d / %d; %.2f",
		res.Kube["LIST pods"], res.Kube["GET pods"], float64(sum(res.Kube)+9*res.Kube["LIST pods"])/n))
	fmt.Fprintf(os.Stderr, "%s", t.String())
	if len(res.WrongPods) > 0 {
		fmt.Fprintf(os.Stderr, "wrong Pods: %s\n", strings.Join(res.WrongPods[:min(len(res.WrongPods), 50)], ", "))
	}
}
