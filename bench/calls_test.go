package bench

import (
	"context"
	"maps"
	"slices"
	"strings"

	"github.com/reaper-k8s/reaper/internal/replay"
)

// counts are the outside requests seen so far, by kind ("DynamoDB
// UpdateItem", "kube PATCH pods/status", ...), counted where they arrive:
// the EC2 and SQS test servers' call logs, the counting proxy in front of
// dynalite, and the apiserver's apiserver_request_total. Counting at the
// servers leaves the functions wired exactly as their mains wire them; every
// attempt counts, retries included.
type counts map[string]int

// count reads every counter. Of the apiserver's requests only those on
// Pods and Events count, the resources the functions touch: the others
// are the apiserver's own (leases, say) and the benchmark's (/metrics).
func (w *world) count(ctx context.Context) (counts, error) {
	c := counts{}
	for action, n := range w.stack.EC2.TallySince(0).Requests {
		c["EC2 "+action] += n
	}
	queue := w.lab.QueueURL[strings.LastIndex(w.lab.QueueURL, "/")+1:]
	for _, call := range w.stack.SQS.Calls() {
		if call.Queue == queue {
			c["SQS "+call.Action]++
		}
	}
	for op, n := range w.dynamo.Counts() {
		c["DynamoDB "+op] += n
	}
	kube, err := replay.KubeRequests(ctx, w.stack)
	if err != nil {
		return nil, err
	}
	for kind, n := range kube {
		if _, resource, _ := strings.Cut(kind, " "); strings.HasPrefix(resource, "pods") || resource == "events" {
			c["kube "+kind] += n
		}
	}
	return c, nil
}

// since is what was counted between before and c.
func (c counts) since(before counts) counts {
	out := counts{}
	for k, v := range c {
		if d := v - before[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

// kindOrder lists the request kinds of the exit path in the order the
// report shows them; kinds seen besides these follow, sorted.
var kindOrder = []string{
	"DynamoDB UpdateItem",
	"DynamoDB BatchGetItem",
	"SQS SendMessageBatch",
	"EC2 DescribeInstances",
	"kube GET pods",
	"kube PATCH pods/status",
	"kube POST events",
	"EC2 TerminateInstances",
}

func kinds(seen counts) []string {
	var out, extra []string
	for _, k := range kindOrder {
		if seen[k] > 0 {
			out = append(out, k)
		}
	}
	for k := range maps.Keys(seen) {
		if !slices.Contains(kindOrder, k) {
			extra = append(extra, k)
		}
	}
	slices.Sort(extra)
	return append(out, extra...)
}

// metricName turns a kind into a benchmark unit: "kube PATCH pods/status"
// becomes "kube-PATCH-pods.status/exit".
func metricName(kind string) string {
	r := strings.NewReplacer(" ", "-", "/", ".", "DynamoDB", "ddb", "EC2", "ec2", "SQS", "sqs")
	return r.Replace(kind) + "/exit"
}
