package metrics

import (
	"cmp"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"
)

// EMF limits: MetricDefinitions in one directive and values in one metric's
// array.
const (
	maxMetrics = 100
	maxValues  = 100
)

// directive is an EMF MetricDirective.
type directive struct {
	Namespace  string
	Dimensions [][]string
	Metrics    []definition
}

// definition is an EMF MetricDefinition. StorageResolution is left out:
// standard resolution (60) is the default and all Reaper needs.
type definition struct {
	Name string
	Unit Unit
}

// chunk is the part of one metric's values that goes on one line.
type chunk struct {
	name   string
	unit   Unit
	values []float64
}

func sortedDims(sets map[Dim]map[string]*series) []Dim {
	return slices.SortedFunc(maps.Keys(sets), func(a, b Dim) int {
		return cmp.Or(strings.Compare(a.Name, b.Name), strings.Compare(a.Value, b.Value))
	})
}

// split lays one dimension set's metrics out on lines within the EMF limits.
// Each round takes the next maxValues values of every metric that has any
// left and spreads them over lines of at most maxMetrics metrics.
func split(set map[string]*series) [][]chunk {
	names := slices.Sorted(maps.Keys(set))
	var lines [][]chunk
	for lo := 0; ; lo += maxValues {
		var round []chunk
		for _, name := range names {
			m := set[name]
			if lo < len(m.values) {
				round = append(round, chunk{name: name, unit: m.unit, values: m.values[lo:min(lo+maxValues, len(m.values))]})
			}
		}
		if len(round) == 0 {
			return lines
		}
		for len(round) > 0 {
			n := min(maxMetrics, len(round))
			lines = append(lines, round[:n])
			round = round[n:]
		}
	}
}

// attrs are the root members of one EMF line: _aws, the dimensions and the
// metrics.
func (s *sink) attrs(now time.Time, d Dim, line []chunk) []slog.Attr {
	keys := []string{FunctionDim}
	dims := []slog.Attr{slog.String(FunctionDim, s.function)}
	if d != (Dim{}) {
		keys = append(keys, d.Name)
		dims = append(dims, slog.String(d.Name, d.Value))
	}
	defs := make([]definition, len(line))
	vals := make([]slog.Attr, len(line))
	for i, c := range line {
		defs[i] = definition{Name: c.name, Unit: c.unit}
		if len(c.values) == 1 {
			vals[i] = slog.Float64(c.name, c.values[0])
		} else {
			vals[i] = slog.Any(c.name, c.values)
		}
	}
	// A group rather than one value keeps Timestamp an attribute of its own,
	// which a handler's ReplaceAttr can see.
	aws := slog.Group("_aws",
		slog.Int64("Timestamp", now.UnixMilli()),
		slog.Any("CloudWatchMetrics", []directive{{Namespace: s.namespace, Dimensions: [][]string{keys}, Metrics: defs}}),
	)
	return slices.Concat([]slog.Attr{aws}, dims, vals)
}
