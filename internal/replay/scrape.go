package replay

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/reaper-k8s/reaper/internal/labstack"
)

var reportLineRE = regexp.MustCompile(`^REPORT RequestId: \S+\s+(?:Init Duration: [0-9.]+ ms\s+)?Duration: ([0-9.]+) ms`)

// batchCosts reads a reconciler's log: each "batch" line, with the
// duration of the emulator's REPORT line that follows it.
func batchCosts(logs string) []BatchCost {
	var out []BatchCost
	for line := range strings.SplitSeq(logs, "\n") {
		if m := reportLineRE.FindStringSubmatch(line); m != nil {
			if len(out) > 0 && out[len(out)-1].Duration == 0 {
				ms, _ := strconv.ParseFloat(m[1], 64)
				out[len(out)-1].Duration = time.Duration(ms * float64(time.Millisecond))
			}
			continue
		}
		if !strings.Contains(line, `"msg":"batch"`) {
			continue
		}
		var c BatchCost
		if json.Unmarshal([]byte(line[strings.IndexByte(line, '{'):]), &c.BatchSummary) == nil {
			out = append(out, c)
		}
	}
	return out
}

// KubeRequests reads the apiserver's request counter
// (apiserver_request_total) summed by "VERB resource[/subresource]"; a
// request to a path outside the API (/metrics, /healthz) counts as
// "VERB -".
func KubeRequests(ctx context.Context, stack *labstack.Stack) (map[string]int, error) {
	raw, err := stack.Kube.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("apiserver metrics: %w", err)
	}
	out := map[string]int{}
	for line := range strings.SplitSeq(string(raw), "\n") {
		rest, ok := strings.CutPrefix(line, "apiserver_request_total{")
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(rest, "} ")
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if !ok || err != nil {
			continue
		}
		l := map[string]string{}
		for _, m := range metricLabelRE.FindAllStringSubmatch(labels, -1) {
			l[m[1]] = m[2]
		}
		key := l["verb"] + " -"
		if l["resource"] != "" {
			key = l["verb"] + " " + l["resource"]
			if l["subresource"] != "" {
				key += "/" + l["subresource"]
			}
		}
		out[key] += int(v)
	}
	return out, nil
}

var metricLabelRE = regexp.MustCompile(`(\w+)="([^"]*)"`)
