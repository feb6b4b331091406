package metrics

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 30, 7, 0, 0, 250_000_000, time.UTC)

// newTest returns a Recorder for the sweeper writing JSON lines to a buffer,
// its clock stopped at t0.
func newTest(level slog.Leveler) (*Recorder, *bytes.Buffer) {
	var buf bytes.Buffer
	r := New(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: level})), "", "sweeper")
	r.s.now = func() time.Time { return t0 }
	return r, &buf
}

// emfLine is one decoded metrics line.
type emfLine struct {
	AWS struct {
		Timestamp         int64
		CloudWatchMetrics []directive
	}
	Root map[string]any
}

var units = map[Unit]bool{Count: true, Milliseconds: true, Seconds: true}

// decode returns the metrics lines of buf (message "metrics") after checking
// each against the EMF specification, and the other lines as they are.
func decode(t *testing.T, buf *bytes.Buffer) (lines []emfLine, other []map[string]any) {
	t.Helper()
	sc := bufio.NewScanner(buf)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var root map[string]any
		if err := json.Unmarshal(sc.Bytes(), &root); err != nil {
			t.Fatalf("line is not one JSON object: %v\n%s", err, sc.Bytes())
		}
		if root["msg"] != "metrics" {
			other = append(other, root)
			continue
		}
		lines = append(lines, checkEMF(t, sc.Bytes(), root))
	}
	return lines, other
}

func checkEMF(t *testing.T, raw []byte, root map[string]any) emfLine {
	t.Helper()
	var outer struct {
		AWS json.RawMessage `json:"_aws"`
	}
	if err := json.Unmarshal(raw, &outer); err != nil || outer.AWS == nil {
		t.Fatalf("no _aws at the root: %v\n%s", err, raw)
	}
	l := emfLine{Root: root}
	// Objects of the specification MUST NOT have members it does not define.
	dec := json.NewDecoder(bytes.NewReader(outer.AWS))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&l.AWS); err != nil {
		t.Fatalf("_aws: %v\n%s", err, raw)
	}
	if l.AWS.Timestamp == 0 || len(l.AWS.CloudWatchMetrics) == 0 {
		t.Fatalf("_aws lacks Timestamp or CloudWatchMetrics:\n%s", raw)
	}
	for _, d := range l.AWS.CloudWatchMetrics {
		if d.Namespace == "" || len(d.Dimensions) == 0 || len(d.Metrics) == 0 || len(d.Metrics) > 100 {
			t.Fatalf("bad directive %+v:\n%s", d, raw)
		}
		for _, set := range d.Dimensions {
			if len(set) > 30 {
				t.Fatalf("dimension set of %d keys:\n%s", len(set), raw)
			}
			for _, k := range set {
				if v, ok := root[k].(string); !ok || v == "" {
					t.Fatalf("dimension %q is not a string at the root:\n%s", k, raw)
				}
			}
		}
		for _, m := range d.Metrics {
			if !units[m.Unit] {
				t.Fatalf("metric %s has unit %q:\n%s", m.Name, m.Unit, raw)
			}
			switch v := root[m.Name].(type) {
			case float64:
			case []any:
				if len(v) < 2 || len(v) > 100 {
					t.Fatalf("metric %s has %d values:\n%s", m.Name, len(v), raw)
				}
				for _, x := range v {
					if _, ok := x.(float64); !ok {
						t.Fatalf("metric %s holds %v:\n%s", m.Name, x, raw)
					}
				}
			default:
				t.Fatalf("metric %s is %v at the root:\n%s", m.Name, v, raw)
			}
		}
	}
	return l
}

// values are the values of the metric name on l.
func (l emfLine) values(name string) []float64 {
	switch v := l.Root[name].(type) {
	case float64:
		return []float64{v}
	case []any:
		out := make([]float64, len(v))
		for i, x := range v {
			out[i] = x.(float64)
		}
		return out
	}
	return nil
}

func (l emfLine) names() []string {
	var out []string
	for _, m := range l.AWS.CloudWatchMetrics[0].Metrics {
		out = append(out, m.Name)
	}
	return out
}

func TestFlush(t *testing.T) {
	r, buf := newTest(slog.LevelInfo)
	r.Count("Terminations", 2)
	r.Count("Terminations", 1)
	r.Observe("SweepLatency", 1500*time.Microsecond)
	r.Observe("SweepLatency", 20*time.Millisecond)
	r.By(Outcome("applied")).Count("PodPatches", 1)
	r.By(Reason("orphan")).Value("InstanceAge", Seconds, 930)
	if err := r.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	lines, other := decode(t, buf)
	if len(lines) != 3 || len(other) != 0 {
		t.Fatalf("%d metrics lines and %d others, want 3 and 0", len(lines), len(other))
	}
	want := []struct {
		directive directive
		dims      map[string]string
		values    map[string][]float64
	}{{
		directive{"Reaper", [][]string{{"Function"}}, []definition{{"SweepLatency", Milliseconds}, {"Terminations", Count}}},
		map[string]string{"Function": "sweeper"},
		map[string][]float64{"SweepLatency": {1.5, 20}, "Terminations": {3}},
	}, {
		directive{"Reaper", [][]string{{"Function", "Outcome"}}, []definition{{"PodPatches", Count}}},
		map[string]string{"Function": "sweeper", "Outcome": "applied"},
		map[string][]float64{"PodPatches": {1}},
	}, {
		directive{"Reaper", [][]string{{"Function", "Reason"}}, []definition{{"InstanceAge", Seconds}}},
		map[string]string{"Function": "sweeper", "Reason": "orphan"},
		map[string][]float64{"InstanceAge": {930}},
	}}
	for i, w := range want {
		l := lines[i]
		if l.AWS.Timestamp != t0.UnixMilli() {
			t.Errorf("line %d: Timestamp %d, want %d", i, l.AWS.Timestamp, t0.UnixMilli())
		}
		if l.Root["time"] != t0.Format(time.RFC3339Nano) || l.Root["level"] != "INFO" {
			t.Errorf("line %d: time %v level %v", i, l.Root["time"], l.Root["level"])
		}
		if !reflect.DeepEqual(l.AWS.CloudWatchMetrics, []directive{w.directive}) {
			t.Errorf("line %d: directives %+v, want %+v", i, l.AWS.CloudWatchMetrics, w.directive)
		}
		for k, v := range w.dims {
			if l.Root[k] != v {
				t.Errorf("line %d: %s is %v, want %q", i, k, l.Root[k], v)
			}
		}
		for name, v := range w.values {
			if got := l.values(name); !slices.Equal(got, v) {
				t.Errorf("line %d: %s is %v, want %v", i, name, got, v)
			}
		}
		// time, level, msg and _aws besides the dimensions and metrics.
		if n := 4 + len(w.dims) + len(w.values); len(l.Root) != n {
			t.Errorf("line %d: %d root members, want %d: %v", i, len(l.Root), n, l.Root)
		}
	}
}

func TestNamespace(t *testing.T) {
	var buf bytes.Buffer
	r := New(slog.New(slog.NewJSONHandler(&buf, nil)), "Reaper/Test", "exitrecorder")
	r.Count("ExitsRecorded", 1)
	if err := r.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	lines, _ := decode(t, &buf)
	if len(lines) != 1 || lines[0].AWS.CloudWatchMetrics[0].Namespace != "Reaper/Test" || lines[0].Root["Function"] != "exitrecorder" {
		t.Fatalf("lines %+v", lines)
	}
}

func TestEmptyFlush(t *testing.T) {
	r, buf := newTest(slog.LevelInfo)
	if err := r.Flush(context.Background()); err != nil || buf.Len() != 0 {
		t.Fatalf("empty flush wrote %q (err %v)", buf, err)
	}
	r.Count("Sweeps", 1)
	if err := r.Flush(context.Background()); err != nil || buf.Len() == 0 {
		t.Fatalf("flush wrote nothing (err %v)", err)
	}
	buf.Reset()
	if err := r.Flush(context.Background()); err != nil || buf.Len() != 0 {
		t.Fatalf("second flush wrote %q (err %v)", buf, err)
	}
}

func TestZeroCount(t *testing.T) {
	r, buf := newTest(slog.LevelInfo)
	r.Count("Terminations", 0)
	if err := r.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	lines, _ := decode(t, buf)
	if len(lines) != 1 || !slices.Equal(lines[0].values("Terminations"), []float64{0}) {
		t.Fatalf("lines %+v", lines)
	}
}

func TestSplitValues(t *testing.T) {
	r, buf := newTest(slog.LevelInfo)
	var want []float64
	for i := range 250 {
		r.Observe("Latency", time.Duration(i)*time.Millisecond)
		want = append(want, float64(i))
	}
	for range 100 {
		r.Observe("Exact", time.Millisecond)
	}
	r.Count("Runs", 1)
	if err := r.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	lines, _ := decode(t, buf)
	wantNames := [][]string{{"Exact", "Latency", "Runs"}, {"Latency"}, {"Latency"}}
	if len(lines) != len(wantNames) {
		t.Fatalf("%d lines, want %d", len(lines), len(wantNames))
	}
	var got []float64
	for i, l := range lines {
		if !slices.Equal(l.names(), wantNames[i]) {
			t.Errorf("line %d has metrics %v, want %v", i, l.names(), wantNames[i])
		}
		got = append(got, l.values("Latency")...)
	}
	if !slices.Equal(got, want) {
		t.Errorf("Latency across lines is %v, want 0..249 in order", got)
	}
	if n := len(lines[0].values("Exact")); n != 100 {
		t.Errorf("Exact has %d values, want 100", n)
	}
}

func TestSplitMetrics(t *testing.T) {
	r, buf := newTest(slog.LevelInfo)
	for i := range 205 {
		r.Count(fmt.Sprintf("M%03d", i), i)
	}
	if err := r.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	lines, _ := decode(t, buf)
	if len(lines) != 3 || len(lines[0].names()) != 100 || len(lines[1].names()) != 100 || len(lines[2].names()) != 5 {
		t.Fatalf("%d lines of metrics %v", len(lines), lines)
	}
	seen := map[string]bool{}
	for _, l := range lines {
		for _, name := range l.names() {
			var i int
			fmt.Sscanf(name, "M%03d", &i)
			if seen[name] || !slices.Equal(l.values(name), []float64{float64(i)}) {
				t.Errorf("%s: seen before %v, values %v", name, seen[name], l.values(name))
			}
			seen[name] = true
		}
	}
	if len(seen) != 205 {
		t.Errorf("%d metrics written, want 205", len(seen))
	}
}

func TestByReplaces(t *testing.T) {
	r, buf := newTest(slog.LevelInfo)
	r.By(Outcome("applied")).By(Reason("orphan")).Count("Terminations", 1)
	if err := r.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	lines, _ := decode(t, buf)
	if len(lines) != 1 {
		t.Fatalf("%d lines", len(lines))
	}
	if d := lines[0].AWS.CloudWatchMetrics[0].Dimensions; !reflect.DeepEqual(d, [][]string{{"Function", "Reason"}}) {
		t.Errorf("dimensions %v", d)
	}
	if _, ok := lines[0].Root["Outcome"]; ok {
		t.Errorf("replaced Outcome still on the line: %v", lines[0].Root)
	}
}

func TestDropped(t *testing.T) {
	r, buf := newTest(slog.LevelInfo)
	r.Count("", 1)
	r.Count("time", 1)
	r.Count("Function", 1)
	r.Count("_aws", 1)
	r.Value("Ratio", Count, math.NaN())
	r.Value("Ratio", Count, math.Inf(1))
	r.By(Outcome(" ")).Count("Blank", 1)
	r.By(Outcome("applied")).Count("Outcome", 1)
	r.By(Dim{Name: "level", Value: "x"}).Count("Level", 1)
	r.Count("Mixed", 1)
	r.Observe("Mixed", time.Millisecond)
	r.Value("Mixed", Seconds, 1)
	r.Count("Good", 1)
	if err := r.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	lines, other := decode(t, buf)
	if len(other) != 11 {
		t.Errorf("%d warnings, want 11: %v", len(other), other)
	}
	for _, w := range other {
		if w["level"] != "WARN" || w["msg"] != "metric dropped" || w["reason"] == "" {
			t.Errorf("warning %v", w)
		}
	}
	if len(lines) != 1 || !slices.Equal(lines[0].names(), []string{"Good", "Mixed"}) || !slices.Equal(lines[0].values("Mixed"), []float64{1}) {
		t.Fatalf("lines %+v", lines)
	}
}

func TestLevel(t *testing.T) {
	var level slog.LevelVar
	level.Set(slog.LevelWarn)
	r, buf := newTest(&level)
	r.Count("Sweeps", 1)
	if err := r.Flush(context.Background()); err != nil || buf.Len() != 0 {
		t.Fatalf("flush at warn wrote %q (err %v)", buf, err)
	}
	level.Set(slog.LevelInfo)
	if err := r.Flush(context.Background()); err != nil || buf.Len() != 0 {
		t.Fatalf("metrics outlived the flush that dropped them: %q (err %v)", buf, err)
	}
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("stdout closed") }

func TestFlushError(t *testing.T) {
	r := New(slog.New(slog.NewJSONHandler(failWriter{}, nil)), "", "sweeper")
	r.Count("Sweeps", 1)
	if err := r.Flush(context.Background()); err == nil {
		t.Fatal("Flush hid the write error")
	}
}

func TestNil(t *testing.T) {
	var r *Recorder
	r.Count("Sweeps", 1)
	r.Observe("Latency", time.Second)
	r.Value("Age", Seconds, 1)
	r.By(Outcome("applied")).Count("PodPatches", 1)
	if r.By(Outcome("applied")) != nil {
		t.Error("By on nil made a Recorder")
	}
	if err := r.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestConcurrent(t *testing.T) {
	r, buf := newTest(slog.LevelInfo)
	const workers, each = 8, 500
	var wg sync.WaitGroup
	done := make(chan struct{})
	flushed := make(chan error)
	go func() {
		// Flushes race the recording; nothing may be lost or written twice.
		for {
			select {
			case <-done:
				flushed <- r.Flush(context.Background())
				return
			default:
				if err := r.Flush(context.Background()); err != nil {
					flushed <- err
					return
				}
			}
		}
	}()
	for w := range workers {
		wg.Go(func() {
			by := r.By(Outcome([]string{"applied", "failed"}[w%2]))
			for i := range each {
				r.Count("Events", 1)
				by.Observe("Latency", time.Duration(i)*time.Millisecond)
			}
		})
	}
	wg.Wait()
	close(done)
	if err := <-flushed; err != nil {
		t.Fatal(err)
	}
	lines, _ := decode(t, buf)
	var events float64
	latencies := map[string]int{}
	for _, l := range lines {
		for _, v := range l.values("Events") {
			events += v
		}
		if o, ok := l.Root["Outcome"].(string); ok {
			latencies[o] += len(l.values("Latency"))
		}
	}
	if events != workers*each {
		t.Errorf("Events sum to %v, want %d", events, workers*each)
	}
	if want := workers * each / 2; latencies["applied"] != want || latencies["failed"] != want {
		t.Errorf("Latency values per outcome %v, want %d each", latencies, want)
	}
}
