package replay

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/reaper-k8s/reaper/internal/localstack"
	"github.com/reaper-k8s/reaper/pkg/metrics"
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

// An exit's invocation reports, as metrics in its own log, the line it
// recorded and the one it rejected, the Pod it finalized, the instance it
// terminated and how long after the container finished each happened.
func TestExitMetrics(t *testing.T) {
	t.Parallel()
	f := localstack.MustStartFunction(t, lab.Bootstraps["exitrecorder"], lab.Env)
	sc := prepare(t, "metrics", corev1.RestartPolicyNever, nil)
	before := time.Now()
	resp, fnErr, err := f.Invoke(t.Context(), sc.Payloads("exitrecorder")[0])
	if err != nil || fnErr != nil {
		t.Fatalf("exitrecorder: %v %v %s", err, fnErr, resp)
	}
	pod := getPod(t, "jobs", "job-metrics")
	wantEnded(t, pod, corev1.PodSucceeded, 0, "Completed")
	finished := pod.Status.ContainerStatuses[0].State.Terminated.FinishedAt.Time
	lines := emfLines(t, f.Logs())
	if len(lines) == 0 {
		t.Fatalf("no metric lines in the log:\n%s", f.Logs())
	}
	for _, tc := range []struct {
		name  string
		dims  map[string]string
		count float64
	}{
		{metrics.ExitsRecorded, nil, 1},
		{metrics.LinesRejected, map[string]string{metrics.ReasonDim: metrics.ReasonInvalid}, 1},
		{metrics.PodsFinalized, map[string]string{metrics.OutcomeDim: metrics.OutcomeSucceeded}, 1},
		{metrics.InstancesTerminated, nil, 1},
	} {
		unit, values, ok := metric(lines, metrics.FunctionExitRecorder, tc.name, tc.dims)
		if !ok || unit != "Count" || len(values) != 1 || values[0] != tc.count {
			t.Errorf("%s %v: found=%v unit %q values %v, want Count %v", tc.name, tc.dims, ok, unit, values, tc.count)
		}
	}
	// The recording's container finished days ago: each latency is the
	// time from then to the step, in milliseconds. The Pod shows the finish
	// in whole seconds, the line has it to the nanosecond.
	low, high := float64(before.Sub(finished.Add(time.Second)).Milliseconds()), float64(time.Since(finished).Milliseconds())
	for _, name := range []string{metrics.FinishToRecorded, metrics.FinishToPodTerminal, metrics.FinishToTerminated} {
		unit, values, ok := metric(lines, metrics.FunctionExitRecorder, name, nil)
		if !ok || unit != "Milliseconds" || len(values) != 1 || values[0] < low || values[0] > high {
			t.Errorf("%s: found=%v unit %q values %v, want one value in [%v, %v] ms", name, ok, unit, values, low, high)
		}
	}
}
