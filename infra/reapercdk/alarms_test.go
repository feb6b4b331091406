package reapercdk_test

import (
	"math"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/reaper-k8s/reaper/infra/cdktest"
	"github.com/reaper-k8s/reaper/infra/reapercdk"
	"github.com/reaper-k8s/reaper/pkg/workqueue"
)

// The reconcilers' pacing as EC2 meters it by default: their share (0.5)
// of the TerminateInstances bucket of 1,000 instances, refilled at 20 a
// second, and the few seconds from a container's exit to its first batch.
const (
	paceBurst    = 500
	paceRefill   = 10.0 // instances a second
	firstBatch   = 5 * time.Second
	alarmPeriods = 5 * time.Minute
)

// periodMetrics are what the reconciler records in one alarm period.
type periodMetrics struct {
	latencies []time.Duration // FinishToTerminated
	deferred  int             // WorkItemsDeferred
}

func (m periodMetrics) p99() (time.Duration, bool) {
	if len(m.latencies) == 0 {
		return 0, false
	}
	l := append([]time.Duration(nil), m.latencies...)
	sort.Slice(l, func(i, j int) bool { return l[i] < l[j] })
	return l[int(math.Ceil(0.99*float64(len(l))))-1], true
}

// stall is a fault: from start for length, the reconciler ends nothing.
type stall struct{ start, length time.Duration }

// reconcile models the reconciler over exits (their times, in order):
// each is terminated as soon as its share of the bucket has a token for
// it; one whose token comes later than its first batch is deferred, by at
// most SQS's longest delay at a time, and counted each time. During a
// stall nothing ends and nothing is deferred: the work waits (a failing
// or throttled reconciler, a slow apiserver). It returns the metrics by
// period.
func reconcile(exits []time.Duration, stalls []stall, horizon time.Duration) []periodMetrics {
	periods := make([]periodMetrics, int(horizon/alarmPeriods)+1)
	at := func(t time.Duration) *periodMetrics { return &periods[min(int(t/alarmPeriods), len(periods)-1)] }
	tokens, last := float64(paceBurst), time.Duration(0)
	for _, exit := range exits {
		batch := exit + firstBatch
		for _, s := range stalls {
			if batch >= s.start && batch < s.start+s.length {
				batch = s.start + s.length
			}
		}
		// The token bucket, refilled up to the batch, then spent.
		if batch > last {
			tokens = min(paceBurst, tokens+paceRefill*(batch-last).Seconds())
			last = batch
		}
		ready := last
		if tokens >= 1 {
			tokens--
		} else {
			wait := time.Duration((1 - tokens) / paceRefill * float64(time.Second))
			ready = last + wait
			tokens, last = 0, ready
		}
		for t := batch; ready > t+time.Second; {
			at(t).deferred++
			t += min(ready-t, workqueue.MaxDelay)
		}
		at(ready).latencies = append(at(ready).latencies, ready-exit)
	}
	return periods
}

// alarmConfig is how the synthesized template evaluates the alarm that
// notifies about FinishToTerminated.
type alarmConfig struct {
	// threshold of the p99 in milliseconds; pacedPeriods the periods the
	// pacing alarm looks back, 0 without one.
	threshold    float64
	pacedPeriods int
}

// terminateLatencyConfig reads the template's TerminateLatency alarm: a
// composite of the p99 alarm and the pacing alarm, or (as before it was
// one) the p99 alarm alone. It fails on any expression the model above
// does not compute.
func terminateLatencyConfig(t *testing.T, m map[string]any) alarmConfig {
	t.Helper()
	alarms := cdktest.Resources(m, "AWS::CloudWatch::Alarm")
	p99 := func(a map[string]any) float64 {
		props := cdktest.Props(a)
		if e := compact(props["Metrics"]); !strings.Contains(e, `"Expression":"MAX(METRICS())"`) || !strings.Contains(e, `"MetricName":"FinishToTerminated"`) || !strings.Contains(e, `"Stat":"p99"`) ||
			props["EvaluationPeriods"] != 1.0 {
			t.Fatalf("the latency alarm is not the p99 of one period the model computes: %s", compact(props))
		}
		return props["Threshold"].(float64)
	}
	named := regexp.MustCompile(`^ReaperTerminateLatency[0-9A-F]{8}$`)
	for id, a := range alarms {
		if named.MatchString(id) {
			return alarmConfig{threshold: p99(a)}
		}
	}
	_, composite := cdktest.Only(t, m, "AWS::CloudWatch::CompositeAlarm")
	rule := compact(cdktest.Props(composite)["AlarmRule"])
	refs := regexp.MustCompile(`"Fn::GetAtt":\["(\w+)","Arn"\]`).FindAllStringSubmatch(rule, -1)
	want := regexp.MustCompile(`^\{"Fn::Join":\["",\["\(ALARM\(\\"",\{[^}]*\},"\\"\) AND \(NOT \(ALARM\(\\"",\{[^}]*\},"\\"\)\)\)\)"\]\]\}$`)
	if len(refs) != 2 || !want.MatchString(rule) {
		t.Fatalf("composite rule %s, want ALARM(latency) AND NOT ALARM(paced)", rule)
	}
	paced := cdktest.Props(alarms[refs[1][1]])
	if e := compact(paced["Metrics"]); !strings.Contains(e, `"Expression":"FILL(deferred, 0) + FILL(waited, 0)"`) ||
		!strings.Contains(e, `"Id":"deferred","Label":"reconciler","MetricStat":{"Metric":{"Dimensions":[{"Name":"Function","Value":"reconciler"}],"MetricName":"WorkItemsDeferred"`) ||
		!strings.Contains(e, `"Id":"waited","Label":"reconciler","MetricStat":{"Metric":{"Dimensions":[{"Name":"Function","Value":"reconciler"}],"MetricName":"EC2PacingWait"`) ||
		paced["Threshold"] != 0.0 || paced["DatapointsToAlarm"] != 1.0 || paced["TreatMissingData"] != "notBreaching" {
		t.Fatalf("the pacing alarm is not one the model computes: %s", compact(paced))
	}
	return alarmConfig{threshold: p99(alarms[refs[0][1]]), pacedPeriods: int(paced["EvaluationPeriods"].(float64))}
}

// fires evaluates the alarm at the end of every period, as CloudWatch
// does (missing data is not breaching), and returns the periods it is in
// ALARM.
func (c alarmConfig) fires(periods []periodMetrics) []int {
	var out []int
	for k := range periods {
		p99, ok := periods[k].p99()
		latency := ok && float64(p99.Milliseconds()) > c.threshold
		paced := false
		for j := max(0, k-c.pacedPeriods+1); c.pacedPeriods > 0 && j <= k; j++ {
			paced = paced || periods[j].deferred > 0
		}
		if latency && !paced {
			out = append(out, k)
		}
	}
	return out
}

// TestTerminateLatencyFiresOnFaultsNotLoad runs the default stack's
// TerminateLatency alarm over a model of the reconciler: bursts of any size
// at EC2's real refill, which pacing spreads over up to an hour, leave it
// OK; the reconciler stalling, alone or after a burst, fires it.
func TestTerminateLatencyFiresOnFaultsNotLoad(t *testing.T) {
	_, m := defaults(t)
	c := terminateLatencyConfig(t, m)
	burst := func(n int, at time.Duration) []time.Duration {
		out := make([]time.Duration, n)
		for i := range out {
			out[i] = at
		}
		return out
	}
	trickle := func(every, until time.Duration) []time.Duration {
		var out []time.Duration
		for at := time.Duration(0); at < until; at += every {
			out = append(out, at)
		}
		return out
	}
	merge := func(lists ...[]time.Duration) []time.Duration {
		var out []time.Duration
		for _, l := range lists {
			out = append(out, l...)
		}
		sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
		return out
	}
	const horizon = 4 * time.Hour
	for _, tc := range []struct {
		name   string
		exits  []time.Duration
		stalls []stall
		fires  bool
	}{
		{"a burst of 1,000", burst(1000, time.Minute), nil, false},
		{"a burst of 2,000", burst(2000, time.Minute), nil, false},
		{"a burst of 6,000", burst(6000, time.Minute), nil, false},
		{"a burst of 10,000", burst(10000, time.Minute), nil, false},
		{"a burst of 30,000 (49 minutes of pacing, deferred four times)", burst(30000, time.Minute), nil, false},
		{"two bursts of 5,000 an hour apart amid a trickle", merge(burst(5000, time.Minute), burst(5000, time.Hour), trickle(30*time.Second, horizon)), nil, false},
		{"a trickle", trickle(30*time.Second, horizon), nil, false},
		{"a trickle, the reconciler stalled 10 minutes", trickle(30*time.Second, horizon), []stall{{time.Hour, 10 * time.Minute}}, true},
		{"a burst of 6,000, then the reconciler stalled 10 minutes an hour later", merge(burst(6000, time.Minute), trickle(30*time.Second, horizon)),
			[]stall{{75 * time.Minute, 10 * time.Minute}}, true},
	} {
		fired := c.fires(reconcile(tc.exits, tc.stalls, horizon))
		if got := len(fired) > 0; got != tc.fires {
			t.Errorf("%s: TerminateLatency in ALARM in periods %v, want it to fire: %v", tc.name, fired, tc.fires)
		}
	}

	// The lookback covers the longest a paced instance waits after the
	// deferral that names it.
	p := reapercdk.Props{ReconcilerBatchingWindow: 5 * time.Minute}
	if min := workqueue.MaxDelay + p.ReconcilerBatchingWindow + reapercdk.ReconcilerTimeout + alarmPeriods; p.PacedLookback() < min {
		t.Errorf("PacedLookback %s with a batching window of %s, want at least %s", p.PacedLookback(), p.ReconcilerBatchingWindow, min)
	}
	if got, want := c.pacedPeriods, int((reapercdk.Props{ReconcilerBatchingWindow: reapercdk.DefaultReconcilerBatchingWindow}).PacedLookback()/alarmPeriods); got != want {
		t.Errorf("the pacing alarm looks back %d periods, want %d", got, want)
	}
}
