package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/reaper-k8s/reaper/internal/ec2server"
	"github.com/reaper-k8s/reaper/internal/labstack"
	"github.com/reaper-k8s/reaper/internal/replay"
	"github.com/reaper-k8s/reaper/pkg/app"
	"github.com/reaper-k8s/reaper/pkg/app/reaperapp"
	"github.com/reaper-k8s/reaper/pkg/exitline"
	"github.com/reaper-k8s/reaper/pkg/intake"
	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/model"
)

// coldStarts is how many measured cold starts each bootstrap gets in
// BenchmarkInit (one more, unmeasured, warms the page cache).
const coldStarts = 15

// initGuard is the regression guard on init: a function's cold start may
// take at most this many times that of a hello-world bootstrap linking the
// AWS SDK clients the function uses.
const initGuard = 1.5

// BenchmarkInit measures the exitrecorder's and the reconciler's init under
// the runtime interface emulator next to hello-world aws-lambda-go
// bootstraps built the same way and run with the same environment: plain,
// and linking the SDK clients each function uses (the exitrecorder:
// config, DynamoDB, SQS; the reconciler: those, EC2, and EKS, STS and
// Secrets Manager for its Kubernetes access modes). Each is started cold
// (a new emulator and bootstrap process), invoked once, and the emulator's
// INIT REPORT duration (exec until the first request for an event) read.
// They alternate, so drift hits all alike. A function over initGuard times
// its SDK hello-world fails the benchmark.
func BenchmarkInit(b *testing.B) {
	b.StopTimer()
	env, bins, payloads := coldStartSetup(b)
	fns := []function{
		{name: "hello", bin: bins["hello"], payload: helloPayload},
		{name: "hello+recorder-sdk", bin: bins["recordersdk"], payload: helloPayload},
		{name: "exitrecorder", bin: bins["exitrecorder"], payload: payloads["exitrecorder"]},
		{name: "hello+reconciler-sdk", bin: bins["reconcilersdk"], payload: helloPayload},
		{name: "reconciler", bin: bins["reconciler"], payload: payloads["reconciler"]},
	}
	medians := coldStartTable(b, fns, coldStarts, env)
	for _, g := range []struct{ fn, sdk string }{{"exitrecorder", "hello+recorder-sdk"}, {"reconciler", "hello+reconciler-sdk"}} {
		ratio := medians[g.fn] / medians[g.sdk]
		b.ReportMetric(ratio, g.fn+"-init-ratio")
		b.ReportMetric(medians[g.fn]/medians["hello"], g.fn+"-init-ratio-plain")
		b.Logf("init ratio %s/%s (medians): %.2f; against plain hello-world %.2f", g.fn, g.sdk, ratio, medians[g.fn]/medians["hello"])
		if ratio > initGuard {
			b.Errorf("%s init %.1f ms is %.2f× %s's %.1f ms, over the %.1f× guard", g.fn, medians[g.fn], ratio, g.sdk, medians[g.sdk], initGuard)
		}
	}

	// Where the package initialisation goes (GODEBUG=inittrace=1).
	for _, fn := range fns {
		if fn.name != "hello" && fn.name != "exitrecorder" && fn.name != "reconciler" {
			continue
		}
		trace, err := initTrace(context.Background(), fn, env)
		if err != nil {
			b.Fatal(err)
		}
		b.Logf("%s package init (GODEBUG=inittrace=1): %s", fn.name, trace)
	}
}

// initPartStarts is how many measured cold starts each bootstrap gets in
// BenchmarkInitParts.
const initPartStarts = 9

// BenchmarkInitParts attributes the functions' init: hello-world
// bootstraps that link part of their dependencies (the SDK clients of each
// function, the core/v1 REST client) or all of them without calling the
// wiring (bench/testdata/hello built with a tag), the exitrecorder with the
// default GC, and the two functions.
func BenchmarkInitParts(b *testing.B) {
	b.StopTimer()
	env, bins, payloads := coldStartSetup(b)
	fns := []function{
		{name: "hello", bin: bins["hello"], payload: helloPayload},
		{name: "hello+recorder-sdk", bin: bins["recordersdk"], payload: helloPayload},
		{name: "hello+reconciler-sdk", bin: bins["reconcilersdk"], payload: helloPayload},
		{name: "hello+corev1-rest", bin: bins["corev1rest"], payload: helloPayload},
		{name: "hello+deps", bin: bins["deps"], payload: helloPayload},
		{name: "exitrecorder-default-GC", bin: bins["exitrecorder"], payload: payloads["exitrecorder"], env: []string{"GOGC=100"}},
		{name: "exitrecorder", bin: bins["exitrecorder"], payload: payloads["exitrecorder"]},
		{name: "reconciler", bin: bins["reconciler"], payload: payloads["reconciler"]},
	}
	coldStartTable(b, fns, initPartStarts, env)
}

// productionGOGC is what infra/reapercdk sets in every function's
// environment: package initialisation allocates about 4 MB, and with the
// default the GC runs several times before the first event.
const productionGOGC = "GOGC=400"

// coldStartSetup returns what the cold-start benchmarks share: the
// environment every bootstrap gets, hello-world included (the functions'
// environment under the emulator, with the GC setting the construct
// deploys), the built bootstraps, and each function's payload, one that
// makes no outside call: a control message for the exitrecorder, an empty
// batch for the reconciler.
func coldStartSetup(b *testing.B) (env []string, bins map[string]string, payloads map[string][]byte) {
	b.Helper()
	w := getWorld(b)
	bins = buildBootstraps(b)
	control, err := controlPayload()
	if err != nil {
		b.Fatal(err)
	}
	payloads = map[string][]byte{"exitrecorder": control, "reconciler": []byte(`{"Records":[]}`)}
	return append(w.lambdaEnv(), productionGOGC), bins, payloads
}

var helloPayload = []byte(`{"name":"bench"}`)

// controlPayload is the CONTROL_MESSAGE CloudWatch Logs sends to test a
// subscription: the exitrecorder answers it without any call.
func controlPayload() ([]byte, error) {
	ev, err := exitline.Encode(events.CloudwatchLogsData{
		Owner: "CloudwatchLogs", LogGroup: "", LogStream: "", MessageType: "CONTROL_MESSAGE",
		LogEvents: []events.CloudwatchLogsLogEvent{{ID: "", Timestamp: time.Now().UnixMilli(), Message: "CWL CONTROL MESSAGE: Checking health of destination Firehose."}},
	})
	if err != nil {
		return nil, err
	}
	return json.Marshal(ev)
}

// coldStartTable starts each function cold n times (plus one unmeasured
// start each, which warms the page cache), in alternating order, reports
// their init medians and p90s and logs a table. It returns the medians.
func coldStartTable(b *testing.B, fns []function, n int, env []string) map[string]float64 {
	ctx := context.Background()
	got := map[string][]coldStart{}
	for range b.N {
		for round := range n + 1 {
			_ = waitQuiet(b)
			order := slices.Clone(fns)
			if round%2 == 1 {
				slices.Reverse(order)
			}
			for _, fn := range order {
				cs, err := startCold(ctx, fn, env)
				if err != nil {
					b.Fatal(err)
				}
				if round > 0 {
					got[fn.name] = append(got[fn.name], cs)
				}
			}
		}
	}
	medians := map[string]float64{}
	var sb strings.Builder
	tw := tabwriter.NewWriter(&sb, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "bootstrap\tsize MB\tinit median ms\tinit p90 ms\tinit min ms\tfirst invoke wall ms\tVmHWM MB\t\n")
	for _, fn := range fns {
		cs := got[fn.name]
		inits := durations(cs, func(c coldStart) time.Duration { return c.init })
		walls := durations(cs, func(c coldStart) time.Duration { return c.wall })
		hwm := slices.Sorted(slices.Values(mapSlice(cs, func(c coldStart) int64 { return c.hwm })))
		st, err := os.Stat(fn.bin)
		if err != nil {
			b.Fatal(err)
		}
		medians[fn.name] = ms(percentile(inits, 50))
		b.ReportMetric(ms(percentile(inits, 50)), fn.name+"-init-median-ms")
		b.ReportMetric(ms(percentile(inits, 90)), fn.name+"-init-p90-ms")
		b.ReportMetric(mb(hwm[len(hwm)/2]), fn.name+"-VmHWM-MB")
		fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t\n", fn.name, mb(st.Size()), ms(percentile(inits, 50)),
			ms(percentile(inits, 90)), ms(inits[0]), ms(percentile(walls, 50)), mb(hwm[len(hwm)/2]))
	}
	tw.Flush()
	b.Logf("%d cold starts each, alternating order; init = emulator INIT REPORT (exec to first event request)\n%s", n*b.N, sb.String())
	return medians
}

type function struct {
	name, bin string
	payload   []byte
	env       []string // added to the stack's environment
}

type coldStart struct {
	init, wall time.Duration
	hwm, rss   int64
}

// startCold starts a fresh emulator and bootstrap, invokes it once and
// returns the emulator's init duration and the bootstrap's memory.
func startCold(ctx context.Context, fn function, env []string) (coldStart, error) {
	f, err := labstack.StartFunction(ctx, fn.bin, append(slices.Clone(env), fn.env...))
	if err != nil {
		return coldStart{}, err
	}
	defer f.Stop()
	start := time.Now()
	resp, fe, err := f.Invoke(ctx, fn.payload)
	wall := time.Since(start)
	if err == nil && fe != nil {
		err = fe
	}
	if err != nil {
		return coldStart{}, fmt.Errorf("%s: %w\n%s", fn.name, err, f.Logs())
	}
	inits := f.InitDurations()
	if len(inits) != 1 {
		return coldStart{}, fmt.Errorf("%s: %d init reports (response %s)\n%s", fn.name, len(inits), resp, f.Logs())
	}
	cs := coldStart{init: inits[0], wall: wall}
	if pid, ok := pidOf(fn.bin); ok {
		cs.hwm, cs.rss, _ = procMemory(pid)
	}
	return cs, nil
}

var initLineRE = regexp.MustCompile(`(?m)^init (\S+) @([0-9.]+) ms, ([0-9.]+) ms clock, (\d+) bytes, (\d+) allocs`)

// initTraceRuns is how many times initTrace runs a bootstrap; the run
// with the median total is shown.
const initTraceRuns = 5

// initTrace runs the bootstrap by itself (no emulator: package init does
// not depend on it, and the emulator would trace its own) with
// GODEBUG=inittrace=1 and sums the package init clock time by module.
func initTrace(ctx context.Context, fn function, env []string) (string, error) {
	type sum struct {
		clock  float64
		bytes  int64
		allocs int64
		pkgs   int
	}
	type pkg struct {
		name  string
		clock float64
	}
	type run struct {
		by    map[string]*sum
		total sum
		last  float64
		pkgs  []pkg
	}
	var runs []run
	for range initTraceRuns {
		home, err := os.MkdirTemp("", "reaper-inittrace-")
		if err != nil {
			return "", err
		}
		cmd := exec.CommandContext(ctx, fn.bin)
		cmd.Env = append(append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + home}, env...), append(fn.env, "GODEBUG=inittrace=1")...)
		// Without AWS_LAMBDA_RUNTIME_API lambda.Start exits at once; the
		// trace is printed before main runs.
		out, _ := cmd.CombinedOutput()
		os.RemoveAll(home)
		r := run{by: map[string]*sum{}}
		for _, m := range initLineRE.FindAllStringSubmatch(string(out), -1) {
			at, _ := strconv.ParseFloat(m[2], 64)
			clock, _ := strconv.ParseFloat(m[3], 64)
			bytes, _ := strconv.ParseInt(m[4], 10, 64)
			allocs, _ := strconv.ParseInt(m[5], 10, 64)
			g := module(m[1])
			if r.by[g] == nil {
				r.by[g] = &sum{}
			}
			for _, s := range []*sum{r.by[g], &r.total} {
				s.clock += clock
				s.bytes += bytes
				s.allocs += allocs
				s.pkgs++
			}
			r.last = max(r.last, at+clock)
			r.pkgs = append(r.pkgs, pkg{m[1], clock})
		}
		if r.total.pkgs == 0 {
			return "", fmt.Errorf("%s: no inittrace output:\n%s", fn.name, out)
		}
		runs = append(runs, r)
	}
	slices.SortFunc(runs, func(a, b run) int { return cmpFloat(a.total.clock, b.total.clock) })
	r := runs[len(runs)/2]
	var sb strings.Builder
	fmt.Fprintf(&sb, "%d packages, %.2f ms clock, %.1f MB, %d allocs; last init done @%.2f ms after process start (median of %d runs)\n",
		r.total.pkgs, r.total.clock, mb(r.total.bytes), r.total.allocs, r.last, len(runs))
	groups := make([]string, 0, len(r.by))
	for g := range r.by {
		groups = append(groups, g)
	}
	slices.SortFunc(groups, func(a, b string) int { return cmpFloat(r.by[b].clock, r.by[a].clock) })
	tw := tabwriter.NewWriter(&sb, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "module\tpackages\tclock ms\tMB\tallocs\t\n")
	for _, g := range groups {
		s := r.by[g]
		fmt.Fprintf(tw, "%s\t%d\t%.2f\t%.2f\t%d\t\n", g, s.pkgs, s.clock, mb(s.bytes), s.allocs)
	}
	tw.Flush()
	slices.SortFunc(r.pkgs, func(a, b pkg) int { return cmpFloat(b.clock, a.clock) })
	fmt.Fprintf(&sb, "slowest packages:")
	for _, p := range r.pkgs[:min(10, len(r.pkgs))] {
		fmt.Fprintf(&sb, " %s %.2f ms;", p.name, p.clock)
	}
	return sb.String(), nil
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// module groups a package path for the init breakdown.
func module(pkg string) string {
	parts := strings.Split(pkg, "/")
	switch {
	case !strings.Contains(parts[0], "."):
		return "std"
	case parts[0] == "k8s.io" && len(parts) > 1:
		return "k8s.io/" + parts[1]
	case parts[0] == "github.com" && len(parts) > 2:
		return parts[0] + "/" + parts[1] + "/" + parts[2]
	case len(parts) > 1:
		return parts[0] + "/" + parts[1]
	}
	return pkg
}

// emulatorExits is how many exits BenchmarkEmulator sends through the
// bootstrap under the emulator.
const emulatorExits = 100

// emulatorGap separates the invocations, as exits of single Pods arrive:
// sent back to back, each would also meet the previous one's work still
// running in dynalite. REAPER_BENCH_EMULATOR_GAP overrides it (a Go
// duration).
var emulatorGap = 100 * time.Millisecond

func init() {
	if v := os.Getenv("REAPER_BENCH_EMULATOR_GAP"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			panic("REAPER_BENCH_EMULATOR_GAP: " + err.Error())
		}
		emulatorGap = d
	}
}

// BenchmarkEmulator sends exits, one payload per invocation, through the
// exitrecorder bootstrap under the emulator (the production binary and
// wiring) and reports the emulator's per-invocation Duration, and
// the bootstrap's real memory (VmHWM, VmRSS from /proc; the emulator's "Max
// Memory Used" is not measured) and Go heap (GODEBUG=gctrace=1).
func BenchmarkEmulator(b *testing.B) {
	b.StopTimer()
	w := getWorld(b)
	ctx := context.Background()
	bin := buildBootstraps(b)["exitrecorder"]
	for range b.N {
		p, err := w.prepare(ctx, emulatorExits)
		if err != nil {
			b.Fatal(err)
		}
		_ = waitQuiet(b)
		f, err := labstack.StartFunction(ctx, bin, append(w.lambdaEnv(), "GODEBUG=gctrace=1"))
		if err != nil {
			b.Fatal(err)
		}
		var walls []time.Duration
		b.StartTimer()
		for _, payload := range p.payloads {
			start := time.Now()
			resp, fe, err := f.Invoke(ctx, payload)
			walls = append(walls, time.Since(start))
			if err == nil && fe != nil {
				err = fe
			}
			var sum intake.ExitSummary
			if err == nil {
				err = json.Unmarshal(resp, &sum)
			}
			if err == nil && (sum.Recorded != 1 || sum.Queued != 1) {
				err = fmt.Errorf("summary %s", resp)
			}
			if err != nil {
				b.Fatalf("%v\n%s", err, f.Logs())
			}
			b.StopTimer()
			time.Sleep(emulatorGap)
			b.StartTimer()
		}
		b.StopTimer()
		var hwm, rss int64
		if pid, ok := pidOf(bin); ok {
			hwm, rss, _ = procMemory(pid)
		}
		logs := f.Logs()
		f.Stop()
		if _, err := w.receive(ctx, emulatorExits, emulatorExits); err != nil {
			b.Fatal(err)
		}
		if err := w.cleanup(ctx, p); err != nil {
			b.Fatal(err)
		}

		durs := reportDurations(logs)
		if len(durs) != len(p.payloads) {
			b.Fatalf("%d REPORT lines for %d invocations\n%s", len(durs), len(p.payloads), logs)
		}
		warm := slices.Sorted(slices.Values(durs[1:]))
		var total time.Duration
		for _, d := range warm {
			total += d
		}
		heap, goal := maxHeap(logs)
		b.ReportMetric(ms(durs[0]), "first-ms")
		b.ReportMetric(ms(total)/float64(len(warm)), "warm-mean-ms")
		b.ReportMetric(ms(percentile(warm, 50)), "warm-p50-ms")
		b.ReportMetric(ms(percentile(warm, 90)), "warm-p90-ms")
		b.ReportMetric(mb(hwm), "VmHWM-MB")
		b.ReportMetric(mb(rss), "VmRSS-MB")
		b.ReportMetric(heap, "max-heap-MB")
		b.Logf("%d exits, one per invocation, %v apart; emulator Duration: first (cold, with init excluded) %.1f ms, "+
			"warm mean %.2f ms p50 %.2f p90 %.2f; client wall p50 %.2f ms; bootstrap VmHWM %.1f MB VmRSS %.1f MB; "+
			"Go heap at most %.0f MB at a GC (goal %.0f MB)",
			len(durs), emulatorGap, ms(durs[0]), ms(total)/float64(len(warm)), ms(percentile(warm, 50)), ms(percentile(warm, 90)),
			ms(percentile(slices.Sorted(slices.Values(walls)), 50)), mb(hwm), mb(rss), heap, goal)
	}
}

var reportRE = regexp.MustCompile(`REPORT RequestId: \S+\s+(?:Init Duration: [0-9.]+ ms\s+)?Duration: ([0-9.]+) ms`)

func reportDurations(logs string) []time.Duration {
	var out []time.Duration
	for _, m := range reportRE.FindAllStringSubmatch(logs, -1) {
		v, _ := strconv.ParseFloat(m[1], 64)
		out = append(out, time.Duration(v*float64(time.Millisecond)))
	}
	return out
}

var gcRE = regexp.MustCompile(`gc \d+ @[0-9.]+s [0-9]+%: .* (\d+)->(\d+)->(\d+) MB, (\d+) MB goal`)

// maxHeap is the largest heap a gctrace line saw at the start of a GC, and
// the largest goal.
func maxHeap(logs string) (heap, goal float64) {
	for _, m := range gcRE.FindAllStringSubmatch(logs, -1) {
		h, _ := strconv.ParseFloat(m[1], 64)
		g, _ := strconv.ParseFloat(m[4], 64)
		heap, goal = max(heap, h), max(goal, g)
	}
	return heap, goal
}

// BenchmarkWiring is the wiring part of a function's init (app.Load:
// configuration, AWS configuration; then app.NewIntake, or for the
// reconciler reaperapp.New with the kubeconfig and the Kubernetes client)
// in a warm process.
func BenchmarkWiring(b *testing.B) {
	getWorld(b)
	ctx := context.Background()
	for _, fn := range []string{metrics.FunctionExitRecorder, metrics.FunctionReconciler} {
		b.Run(fn, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				s, err := app.Load(ctx, fn)
				if err != nil {
					b.Fatal(err)
				}
				if fn == metrics.FunctionExitRecorder {
					app.NewIntake(s, app.Clients{})
				} else if _, err := reaperapp.New(ctx, s, reaperapp.Clients{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkEC2TestServer is the in-process EC2 test server's own cost (it
// runs in the benchmark process, so the reconciler's allocations and bench
// CPU include it): one DescribeInstances by instance-id filter and one
// TerminateInstances of one instance, with 1000 instances stored.
func BenchmarkEC2TestServer(b *testing.B) {
	s := ec2server.New()
	defer s.Close()
	keys := model.DefaultTagKeys()
	var ids []string
	for i := range numExits {
		inst := s.AddInstance(ec2server.Instance{Tags: map[string]string{
			keys.Managed: "true", keys.PodNamespace: "bench", keys.PodName: fmt.Sprintf("exit-%04d", i), keys.PodUID: "uid",
		}})
		ids = append(ids, inst.ID)
	}
	for _, tc := range []struct {
		action string
		form   func(id string) url.Values
	}{
		{"DescribeInstances", func(id string) url.Values {
			return url.Values{"Action": {"DescribeInstances"}, "Version": {"2016-11-15"}, "Filter.1.Name": {"instance-id"}, "Filter.1.Value.1": {id}}
		}},
		{"TerminateInstances", func(id string) url.Values {
			return url.Values{"Action": {"TerminateInstances"}, "Version": {"2016-11-15"}, "InstanceId.1": {id}}
		}},
	} {
		b.Run(tc.action, func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				body := tc.form(ids[i%len(ids)]).Encode()
				req := httptest.NewRequest("POST", "/", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
				rec := httptest.NewRecorder()
				s.ServeHTTP(rec, req)
				if rec.Code != 200 {
					b.Fatalf("%d %s", rec.Code, rec.Body)
				}
				if i++; i%1000 == 0 {
					s.ResetCalls()
				}
			}
		})
	}
}

var built struct {
	dir  string
	bins map[string]string
}

// buildBootstraps builds the exitrecorder, statechange and reconciler
// (replay.Build, as `make build` does) and, the same way,
// bench/testdata/hello: plain, and with each tag that links more packages,
// under the tag's name. It builds them once per run.
func buildBootstraps(b *testing.B) map[string]string {
	b.Helper()
	if built.bins != nil {
		return built.bins
	}
	ctx := context.Background()
	root, err := replay.ModuleRoot()
	if err != nil {
		b.Fatal(err)
	}
	dir := filepath.Join(theWorld.dir, "build")
	bins, err := replay.Build(ctx, root, dir, metrics.FunctionExitRecorder, metrics.FunctionStateChange, metrics.FunctionReconciler)
	if err != nil {
		b.Fatal(err)
	}
	for name, tags := range map[string][]string{
		"hello":         nil,
		"recordersdk":   {"recordersdk"},
		"reconcilersdk": {"reconcilersdk"},
		"corev1rest":    {"corev1rest"},
		"deps":          {"deps"},
	} {
		bin := filepath.Join(dir, name, "bootstrap")
		if err := replay.BuildBootstrap(ctx, root, bin, "./bench/testdata/hello", tags...); err != nil {
			b.Fatal(err)
		}
		bins[name] = bin
	}
	for k, v := range bins {
		if bins[k], err = filepath.EvalSymlinks(v); err != nil {
			b.Fatal(err)
		}
	}
	built.dir, built.bins = dir, bins
	return bins
}

func durations(cs []coldStart, f func(coldStart) time.Duration) []time.Duration {
	return slices.Sorted(slices.Values(mapSlice(cs, f)))
}

func mapSlice[T, U any](in []T, f func(T) U) []U {
	out := make([]U, len(in))
	for i, v := range in {
		out[i] = f(v)
	}
	return out
}

func mb(n int64) float64 { return float64(n) / (1 << 20) }
