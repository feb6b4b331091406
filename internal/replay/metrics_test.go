package replay

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/model"
)

// emfLine is one Embedded Metric Format line of a function's log: the
// directive and the root members it names.
type emfLine struct {
	AWS struct {
		Timestamp         int64
		CloudWatchMetrics []struct {
			Namespace  string
			Dimensions [][]string
			Metrics    []struct{ Name, Unit string }
		}
	} `json:"_aws"`
	root map[string]any
}

// emfLines decodes every EMF line of a function's log.
func emfLines(t *testing.T, logs string) []emfLine {
	t.Helper()
	var out []emfLine
	for _, l := range strings.Split(logs, "\n") {
		if !strings.Contains(l, `"_aws"`) {
			continue
		}
		var e emfLine
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatalf("EMF line %q: %v", l, err)
		}
		if err := json.Unmarshal([]byte(l), &e.root); err != nil {
			t.Fatal(err)
		}
		out = append(out, e)
	}
	return out
}

// metric finds the metric name carrying dims (besides Function) and returns
// its unit and its values.
func metric(lines []emfLine, function, name string, dims map[string]string) (unit string, values []float64, found bool) {
	for _, l := range lines {
		if l.root[metrics.FunctionDim] != function {
			continue
		}
		for _, d := range l.AWS.CloudWatchMetrics {
			if d.Namespace != metrics.DefaultNamespace || len(d.Dimensions) != 1 || len(d.Dimensions[0]) != 1+len(dims) {
				continue
			}
			match := true
			for k, v := range dims {
				match = match && l.root[k] == v
			}
			for _, m := range d.Metrics {
				if !match || m.Name != name {
					continue
				}
				switch v := l.root[name].(type) {
				case float64:
					values = append(values, v)
				case []any:
					for _, x := range v {
						values = append(values, x.(float64))
					}
				}
				unit, found = m.Unit, true
			}
		}
	}
	return unit, values, found
}

// An exit's invocations report, as metrics in their own logs, the line the
// exitrecorder queued and the one it rejected, and the Pod the reconciler
// finalized, the instance it terminated and how long after the container
// finished each happened.
func TestExitMetrics(t *testing.T) {
	t.Parallel()
	// A deployment of its own, so that the reconciler's log holds this
	// exit's metrics alone.
	bins := map[string]string{"exitrecorder": lab.Bootstraps["exitrecorder"], "reconciler": lab.Bootstraps["reconciler"]}
	own, err := NewLabWith(t.Context(), lab.Stack, "reaper-metrics", bins, LabOptions{MaxConcurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(own.Stop)
	sc := prepare(t, "metrics", corev1.RestartPolicyNever, nil)
	before := time.Now()
	if err := own.Invoke(t.Context(), "exitrecorder", sc.Payloads("exitrecorder")[0], nil); err != nil {
		t.Fatalf("exitrecorder: %v", err)
	}
	pod := getPod(t, "jobs", "job-metrics")
	wantEnded(t, pod, corev1.PodSucceeded, 0, "Completed")
	finished := pod.Status.ContainerStatuses[0].State.Terminated.FinishedAt.Time
	recorder, reconciler := emfLines(t, own.Functions["exitrecorder"].Logs()), emfLines(t, own.Reconcilers[0].Logs())
	if len(recorder) == 0 || len(reconciler) == 0 {
		t.Fatalf("no metric lines in the logs:\n%s\n%s", own.Functions["exitrecorder"].Logs(), own.Reconcilers[0].Logs())
	}
	for _, tc := range []struct {
		function string
		name     string
		dims     map[string]string
		count    float64
	}{
		{metrics.FunctionExitRecorder, metrics.ExitsRecorded, nil, 1},
		{metrics.FunctionExitRecorder, metrics.LinesRejected, map[string]string{metrics.ReasonDim: model.ReasonInvalid}, 1},
		{metrics.FunctionExitRecorder, metrics.WorkItemsQueued, nil, 1},
		{metrics.FunctionReconciler, metrics.PodStatusesWritten, map[string]string{metrics.OutcomeDim: metrics.OutcomeSucceeded}, 1},
		{metrics.FunctionReconciler, metrics.InstancesTerminated, nil, 1},
	} {
		lines := recorder
		if tc.function == metrics.FunctionReconciler {
			lines = reconciler
		}
		unit, values, ok := metric(lines, tc.function, tc.name, tc.dims)
		if !ok || unit != "Count" || len(values) != 1 || values[0] != tc.count {
			t.Errorf("%s %s %v: found=%v unit %q values %v, want Count %v", tc.function, tc.name, tc.dims, ok, unit, values, tc.count)
		}
	}
	// The recording's container finished days ago: each latency is the
	// time from then to the step, in milliseconds. The Pod shows the finish
	// in whole seconds, the line has it to the nanosecond. The exit is
	// recorded once the reconciler has checked it.
	low, high := float64(before.Sub(finished.Add(time.Second)).Milliseconds()), float64(time.Since(finished).Milliseconds())
	for _, tc := range []struct {
		lines    []emfLine
		function string
		name     string
	}{
		{reconciler, metrics.FunctionReconciler, metrics.FinishToRecorded},
		{reconciler, metrics.FunctionReconciler, metrics.FinishToPodTerminal},
		{reconciler, metrics.FunctionReconciler, metrics.FinishToTerminated},
	} {
		unit, values, ok := metric(tc.lines, tc.function, tc.name, nil)
		if !ok || unit != "Milliseconds" || len(values) != 1 || values[0] < low || values[0] > high {
			t.Errorf("%s %s: found=%v unit %q values %v, want one value in [%v, %v] ms", tc.function, tc.name, ok, unit, values, low, high)
		}
	}
	// And how long the work waited in the queue.
	if unit, values, ok := metric(reconciler, metrics.FunctionReconciler, metrics.QueueAge, nil); !ok || unit != "Milliseconds" || len(values) != 1 || values[0] < 0 || values[0] > float64(time.Since(before).Milliseconds()) {
		t.Errorf("%s: found=%v unit %q values %v", metrics.QueueAge, ok, unit, values)
	}
}
