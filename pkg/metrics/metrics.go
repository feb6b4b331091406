// Package metrics records Reaper's CloudWatch metrics as Embedded Metric
// Format (EMF) lines in the function's JSON log, so a handler needs no
// CloudWatch client, no cloudwatch:PutMetricData permission and no API call
// on its path.
//
// The EMF facts this package relies on:
//
//   - Specification
//     (https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/CloudWatch_Embedded_Metric_Format_Specification.html):
//     a log event is one JSON object whose root holds "_aws" with Timestamp
//     (milliseconds after the epoch) and CloudWatchMetrics, a list of
//     directives {Namespace, Dimensions [[key, ...]], Metrics [{Name, Unit}]}.
//     Each dimension key and metric name is a member of the root: a dimension
//     a string, a metric a number or an array of numbers. A directive holds
//     at most 100 metrics, an array at most 100 values, a dimension set at
//     most 30 keys. The root MAY hold any other member, so slog's time, level
//     and msg fields do no harm.
//   - Lambda
//     (https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/CloudWatch_Embedded_Metric_Format_Lambda.html):
//     Lambda sends stdout to CloudWatch Logs, which extracts metrics from
//     every event that follows the specification; no agent, no header.
//     Lambda does not flush on a timeout: metrics not written by then are lost.
//   - JSON log format
//     (https://docs.aws.amazon.com/lambda/latest/dg/monitoring-cloudwatchlogs-logformat.html):
//     on provided.al2023 Lambda structures only its own system logs; the
//     application's lines are its own, and a line that is already JSON is
//     not encoded again, so the EMF object stays the root of the event.
//   - Log-level filtering
//     (https://docs.aws.amazon.com/lambda/latest/dg/monitoring-cloudwatchlogs-log-level.html):
//     with the JSON log format Lambda filters application lines by their
//     "level" member. Metric lines are INFO, so an application log level of
//     WARN or ERROR drops them, as does a logger level above info.
package metrics

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"strings"
	"sync"
	"time"
)

// DefaultNamespace is the CloudWatch namespace used when New gets none.
const DefaultNamespace = "Reaper"

// FunctionDim is the dimension every metric carries: the handler that
// recorded it.
const FunctionDim = "Function"

// Unit is a CloudWatch metric unit, the MetricDefinition's Unit.
type Unit string

// Units from CloudWatch's list (MetricDatum) that Reaper's metrics use.
const (
	Count        Unit = "Count"
	Milliseconds Unit = "Milliseconds"
	Seconds      Unit = "Seconds"
)

// Dim is the one dimension a metric may carry besides Function. Every
// distinct value becomes a metric of its own in CloudWatch, billed as such,
// so values come from a small fixed set (an outcome, a reason), never an id.
type Dim struct {
	Name, Value string
}

// Outcome is the Outcome dimension: how a step ended.
func Outcome(value string) Dim { return Dim{Name: "Outcome", Value: value} }

// Reason is the Reason dimension: why a decision went the way it did.
func Reason(value string) Dim { return Dim{Name: "Reason", Value: value} }

// Recorder collects metrics until Flush writes them. It is safe for
// concurrent use. A nil *Recorder records nothing, so code that holds one
// works unchanged where metrics are not wired.
type Recorder struct {
	s   *sink
	dim Dim
}

// sink is the buffer shared by a Recorder and those derived from it by By.
type sink struct {
	log       *slog.Logger
	namespace string
	function  string
	now       func() time.Time

	mu   sync.Mutex
	sets map[Dim]map[string]*series
}

// series is one metric of one dimension set until the next Flush.
type series struct {
	unit Unit
	// summed series (counts) hold one running total, the others every value.
	summed bool
	values []float64
}

// New returns a Recorder writing to log under namespace (DefaultNamespace
// when empty); every metric carries the Function dimension set to function,
// the handler's name. log must put attributes at the root of a JSON object,
// as slog.NewJSONHandler does: a logger from WithGroup nests them where
// CloudWatch does not look, and attributes added with With must not reuse a
// metric or dimension name.
func New(log *slog.Logger, namespace, function string) *Recorder {
	if namespace == "" {
		namespace = DefaultNamespace
	}
	return &Recorder{s: &sink{
		log:       log,
		namespace: namespace,
		function:  function,
		now:       time.Now,
		sets:      map[Dim]map[string]*series{},
	}}
}

// By returns a Recorder whose metrics also carry d. It shares r's buffer, so
// a Flush of either writes both. A metric carries at most one dimension
// besides Function: By on a Recorder from By replaces its dimension.
func (r *Recorder) By(d Dim) *Recorder {
	if r == nil {
		return nil
	}
	return &Recorder{s: r.s, dim: d}
}

// Count adds n to the metric name (unit Count). Counts are summed until
// Flush, which writes one total per metric and dimension set; a count of 0
// is still written, so an alarm on the metric sees data rather than none.
func (r *Recorder) Count(name string, n int) {
	r.add(name, Count, float64(n), true)
}

// Observe records one duration of the metric name, in milliseconds. Every
// observation is kept until Flush and written as an array, so CloudWatch
// sees each value rather than an average.
func (r *Recorder) Observe(name string, d time.Duration) {
	r.add(name, Milliseconds, float64(d)/float64(time.Millisecond), false)
}

// Value records one value of the metric name in unit, kept like Observe's.
func (r *Recorder) Value(name string, unit Unit, v float64) {
	r.add(name, unit, v, false)
}

func (r *Recorder) add(name string, unit Unit, v float64, summed bool) {
	if r == nil {
		return
	}
	reason := r.invalid(name, v)
	if reason == "" {
		reason = r.s.store(r.dim, name, unit, v, summed)
	}
	if reason != "" {
		// Written as is, a bad name or value could make CloudWatch reject
		// the whole line; dropping it alone, loudly, keeps the others.
		r.s.log.Warn("metric dropped", "metric", name, "dimension", r.dim.Name, "reason", reason)
	}
}

// invalid says why name and v cannot be written under r's dimension, or "".
func (r *Recorder) invalid(name string, v float64) string {
	switch {
	case name == "":
		return "empty metric name"
	case reserved(name) || name == r.dim.Name:
		return "metric name is another member of the line"
	case r.dim != (Dim{}) && (r.dim.Name == "" || reserved(r.dim.Name) || strings.TrimSpace(r.dim.Value) == ""):
		return "dimension needs a free name and a non-blank value"
	case math.IsNaN(v) || math.IsInf(v, 0):
		return "value is not a finite number"
	}
	return ""
}

// reserved reports whether name is a root member every line already has.
func reserved(name string) bool {
	switch name {
	case "_aws", FunctionDim, slog.TimeKey, slog.LevelKey, slog.MessageKey:
		return true
	}
	return false
}

// store adds v to its series and says why it could not, or "".
func (s *sink) store(d Dim, name string, unit Unit, v float64, summed bool) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	set := s.sets[d]
	if set == nil {
		set = map[string]*series{}
		s.sets[d] = set
	}
	m := set[name]
	switch {
	case m == nil:
		set[name] = &series{unit: unit, summed: summed, values: []float64{v}}
	case m.unit != unit || m.summed != summed:
		// One line gives a metric one unit; the first recorded wins.
		return "metric already recorded with another unit or as another kind"
	case summed:
		m.values[0] += v
	default:
		m.values = append(m.values, v)
	}
	return ""
}

// Flush writes the metrics recorded since the last Flush, through r and
// every Recorder sharing its buffer, and forgets them. It writes one INFO
// line with message "metrics" per dimension set, more when a set has over
// 100 metrics or a metric over 100 values, and nothing when nothing was
// recorded. Call it before the handler returns.
func (r *Recorder) Flush(ctx context.Context) error {
	if r == nil {
		return nil
	}
	s := r.s
	s.mu.Lock()
	if len(s.sets) == 0 {
		s.mu.Unlock()
		return nil
	}
	sets := s.sets
	s.sets = map[Dim]map[string]*series{}
	s.mu.Unlock()
	// The record is built here rather than by Logger.LogAttrs so that the
	// line's time and _aws.Timestamp are one instant.
	h := s.log.Handler()
	if !h.Enabled(ctx, slog.LevelInfo) {
		return nil
	}
	now := s.now()
	var errs []error
	for _, d := range sortedDims(sets) {
		for _, line := range split(sets[d]) {
			rec := slog.NewRecord(now, slog.LevelInfo, "metrics", 0)
			rec.AddAttrs(s.attrs(now, d, line)...)
			if err := h.Handle(ctx, rec); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}
