package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/reaper-k8s/reaper/pkg/intake"
	"github.com/reaper-k8s/reaper/pkg/reaper"
)

// numExits is how many exits one exitrecorder pass handles: 1000
// instances, one payload each.
const numExits = 1000

// concurrencies are the worker counts the exitrecorder benchmark runs at. A
// worker is one Lambda execution environment handling one payload at a
// time, so 8 is 8 concurrent executions and 1 is a single environment,
// whose per-exit time is the invocation's duration.
var concurrencies = []int{8, 1}

// invocationTimeout bounds one exitrecorder invocation, like the function's
// timeout (one minute in the construct).
const invocationTimeout = time.Minute

// BenchmarkExitRecorder runs 1000 exits through the exitrecorder's handler
// in-process: the payload decoded as the Lambda runtime does, then
// functions/exitrecorder/main.go's handler, wired as its main wires it.
// Per exit it sends one work item, a claim; it writes no ledger.
func BenchmarkExitRecorder(b *testing.B) {
	for _, c := range concurrencies {
		b.Run(fmt.Sprintf("c=%d", c), func(b *testing.B) {
			b.StopTimer()
			w := getWorld(b)
			ctx := context.Background()
			recorders, err := w.newRecorders(ctx, c)
			if err != nil {
				b.Fatal(err)
			}
			var res result
			for range b.N {
				p, err := w.prepare(ctx, numExits)
				if err != nil {
					b.Fatal(err)
				}
				w.timed(b, ctx, numExits, &res, func() ([]time.Duration, error) { return record(ctx, recorders, p) })
				// Every exit handed its work item to the queue.
				if _, err := w.receive(ctx, numExits, numExits); err != nil {
					b.Fatal(err)
				}
				if err := w.cleanup(ctx, p); err != nil {
					b.Fatal(err)
				}
			}
			res.report(b)
		})
	}
}

// reconcilerExits is how many exits one reconciler pass handles.
// reconcilerBatches are the batch sizes: an exit alone in its batching
// window, and a hundred that arrived together.
const reconcilerExits = 200

var reconcilerBatches = []int{1, 100}

// reconcilerTimeout is the reconciler's timeout in the construct.
const reconcilerTimeout = 5 * time.Minute

// BenchmarkReconciler runs the work items of 200 exits through the
// reconciler's handler in-process, one batch after the other as one
// execution environment takes them, wired as the mains wire them (the
// production apiserver client limits included; EC2 pacing lifted, see
// unpaced). The exits are recorded first, untimed,
// by the exitrecorder, and their work items taken off the queue. Per exit
// it checks the claim against the tags (one DescribeInstances per batch of
// up to 200), writes the Pod's status and an Event, terminates (one call
// per batch) and marks the ledger record done.
func BenchmarkReconciler(b *testing.B) {
	for _, size := range reconcilerBatches {
		b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) {
			b.StopTimer()
			w := getWorld(b)
			ctx := context.Background()
			recorders, err := w.newRecorders(ctx, 8)
			if err != nil {
				b.Fatal(err)
			}
			rec, err := w.newReconciler(ctx)
			if err != nil {
				b.Fatal(err)
			}
			var res result
			for range b.N {
				p, err := w.prepare(ctx, reconcilerExits)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := record(ctx, recorders, p); err != nil {
					b.Fatal(err)
				}
				batches, err := w.receive(ctx, reconcilerExits, size)
				if err != nil {
					b.Fatal(err)
				}
				w.timed(b, ctx, reconcilerExits, &res, func() ([]time.Duration, error) {
					var lat []time.Duration
					for _, ev := range batches {
						start := time.Now()
						if err := reconcile(ctx, rec, ev); err != nil {
							return lat, err
						}
						for range ev.Records {
							lat = append(lat, time.Since(start))
						}
					}
					return lat, nil
				})
				if n := terminated(w, p); n != reconcilerExits {
					b.Fatalf("%d of %d instances terminated", n, reconcilerExits)
				}
				if err := w.cleanup(ctx, p); err != nil {
					b.Fatal(err)
				}
			}
			res.report(b)
		})
	}
}

// terminated counts the pass's instances a call terminated
// (ec2server.Call.Terminated).
func terminated(w *world, p *pass) int {
	first := w.stack.EC2.TallySince(0).FirstTerminated
	n := 0
	for _, id := range p.ids {
		if _, ok := first[id]; ok {
			n++
		}
	}
	return n
}

// timed runs one pass under the benchmark timer, after the machine has
// quietened, and adds it to res with what the counters saw, this process's
// allocations and each process's CPU.
func (w *world) timed(b *testing.B, ctx context.Context, exits int, res *result, run func() ([]time.Duration, error)) {
	w.dynamo.Reset()
	before, err := w.count(ctx)
	if err != nil {
		b.Fatal(err)
	}
	idle := waitQuiet(b)
	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	cpu0 := sampleCPU()

	stopProfile := startProfile(b)
	b.StartTimer()
	start := time.Now()
	lat, err := run()
	wall := time.Since(start)
	b.StopTimer()
	stopProfile()

	cpu := sampleCPU().sub(cpu0)
	runtime.ReadMemStats(&m1)
	if err != nil {
		b.Fatal(err)
	}
	if share := float64(cpu["other"]) / float64(wall*time.Duration(runtime.NumCPU())); share > noisyShare {
		b.Logf("other work used %.0f%% of the CPUs during the pass", share*100)
	}
	after, err := w.count(ctx)
	if err != nil {
		b.Fatal(err)
	}
	res.add(exits, wall, lat, after.since(before), m1.Mallocs-m0.Mallocs, m1.TotalAlloc-m0.TotalAlloc, cpu, idle)
}

// record hands the pass's payloads to one worker per exitrecorder and
// returns each exit's duration.
func record(ctx context.Context, recorders []*intake.Intake, p *pass) ([]time.Duration, error) {
	lat := make([]time.Duration, len(p.payloads))
	errs := make([]error, len(p.payloads))
	next := make(chan int)
	var wg sync.WaitGroup
	for _, r := range recorders {
		wg.Go(func() {
			for i := range next {
				start := time.Now()
				errs[i] = handleExit(ctx, r, p.payloads[i])
				lat[i] = time.Since(start)
			}
		})
	}
	for i := range p.payloads {
		next <- i
	}
	close(next)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return lat, fmt.Errorf("exits failed: %w", err)
	}
	return lat, nil
}

// handleExit is one invocation of the exitrecorder: the runtime's JSON
// decode of the payload, then the handler functions/exitrecorder/main.go
// starts.
func handleExit(ctx context.Context, r *intake.Intake, payload []byte) error {
	ctx, cancel := context.WithTimeout(ctx, invocationTimeout)
	defer cancel()
	var ev events.CloudwatchLogsEvent
	if err := json.Unmarshal(payload, &ev); err != nil {
		return err
	}
	sum, err := r.HandleLogsEvent(ctx, ev)
	if err != nil {
		return err
	}
	if sum.Recorded != 1 || sum.Queued != 1 {
		return fmt.Errorf("summary %+v", sum)
	}
	return nil
}

// reconcile is one invocation of the reconciler: the runtime's JSON decode
// of the batch, then the handler functions/reconciler/main.go starts. No
// work item may fail.
func reconcile(ctx context.Context, r *reaper.Reaper, ev events.SQSEvent) error {
	ctx, cancel := context.WithTimeout(ctx, reconcilerTimeout)
	defer cancel()
	payload, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	var decoded events.SQSEvent
	if err := json.Unmarshal(payload, &decoded); err != nil {
		return err
	}
	resp, err := r.HandleQueueEvent(ctx, decoded)
	if err != nil {
		return err
	}
	if len(resp.BatchItemFailures) > 0 {
		return fmt.Errorf("%d of %d work items failed", len(resp.BatchItemFailures), len(ev.Records))
	}
	return nil
}

// A pass during which other work used more than noisyShare of the CPUs is
// reported in the log.
const noisyShare = 0.10

// result sums the passes of one benchmark.
type result struct {
	passes     int
	exits      int
	wall       time.Duration
	lat        []time.Duration
	calls      counts
	mallocs    uint64
	allocBytes uint64
	// cpu is what each process used during the passes; idle is what it
	// would have used in the same time doing nothing (its background rate
	// measured just before each pass).
	cpu  map[string]time.Duration
	idle map[string]time.Duration
}

func (r *result) add(exits int, wall time.Duration, lat []time.Duration, calls counts, mallocs, bytes uint64, cpu map[string]time.Duration, idle map[string]float64) {
	if r.calls == nil {
		r.calls, r.cpu, r.idle = counts{}, map[string]time.Duration{}, map[string]time.Duration{}
	}
	r.passes++
	r.exits += exits
	r.wall += wall
	r.lat = append(r.lat, lat...)
	for k, v := range calls {
		r.calls[k] += v
	}
	r.mallocs += mallocs
	r.allocBytes += bytes
	for k, v := range cpu {
		r.cpu[k] += v
	}
	for k, v := range idle {
		r.idle[k] += time.Duration(v * float64(wall))
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(float64(len(sorted))*p/100))]
}

// cpuOrder is how the CPU columns are shown.
var cpuOrder = []string{"bench", "apiserver", "etcd", "dynalite", "other"}

func (r *result) report(b *testing.B) {
	n := float64(r.exits)
	b.ReportMetric(ms(r.wall)/n, "ms/exit")
	slices.Sort(r.lat)
	b.ReportMetric(ms(percentile(r.lat, 50)), "p50-ms")
	b.ReportMetric(ms(percentile(r.lat, 99)), "p99-ms")
	var total int
	var sb strings.Builder
	tw := tabwriter.NewWriter(&sb, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "request\tper exit\t\n")
	for _, k := range kinds(r.calls) {
		b.ReportMetric(float64(r.calls[k])/n, metricName(k))
		fmt.Fprintf(tw, "%s\t%.3f\t\n", k, float64(r.calls[k])/n)
		total += r.calls[k]
	}
	tw.Flush()
	b.ReportMetric(float64(total)/n, "requests/exit")
	b.ReportMetric(float64(r.mallocs)/n, "allocs/exit")
	b.ReportMetric(float64(r.allocBytes)/n, "B/exit")
	var cpu []string
	for _, k := range cpuOrder {
		b.ReportMetric(ms(max(0, r.cpu[k]-r.idle[k]))/n, k+"-cpu-ms/exit")
		cpu = append(cpu, fmt.Sprintf("%s=%.2f(idle %.2f)", k, ms(r.cpu[k])/n, ms(r.idle[k])/n))
	}
	b.Logf("%d exits in %d pass(es), %.1f s timed; CPU ms/exit used(of which background) %s; wall ms/exit %.3f\n%s",
		r.exits, r.passes, r.wall.Seconds(), strings.Join(cpu, " "), ms(r.wall)/n, sb.String())
}
