package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-lambda-go/events"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reaper-k8s/reaper/internal/ec2server"
	"github.com/reaper-k8s/reaper/internal/replay"
	"github.com/reaper-k8s/reaper/pkg/exitline"
	"github.com/reaper-k8s/reaper/pkg/instances"
)

// pass is one batch of exits ready to handle: a running Pod per exit, its
// managed instance on the EC2 test server and the payload CloudWatch Logs
// would deliver. Exits are one-shot, so every pass gets fresh ones.
type pass struct {
	ns       string
	pods     []*corev1.Pod
	ids      []string
	payloads [][]byte
	// known is each instance as the tag lookup would describe it.
	known map[string]instances.Instance
}

// fixtureWorkers bounds concurrent fixture writes to the apiserver.
const fixtureWorkers = 16

// prepare creates n exits in a namespace of their own.
func (w *world) prepare(ctx context.Context, n int) (*pass, error) {
	w.mu.Lock()
	w.passes++
	seq := w.passes
	w.mu.Unlock()
	p := &pass{
		ns:       fmt.Sprintf("bench-%03d", seq),
		pods:     make([]*corev1.Pod, n),
		ids:      make([]string, n),
		payloads: make([][]byte, n),
		known:    make(map[string]instances.Instance, n),
	}
	if err := w.stack.EnsureNamespaces(ctx, p.ns); err != nil {
		return nil, err
	}
	next := make(chan int)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for range fixtureWorkers {
		wg.Go(func() {
			for i := range next {
				pod, err := w.lab.RunningPod(ctx, p.ns, fmt.Sprintf("exit-%04d", i), corev1.RestartPolicyNever)
				if err != nil {
					errs[i] = err
					continue
				}
				id := fmt.Sprintf("i-0be4c%06x%06x", seq, i)
				w.lab.AddInstance(id, pod, true)
				p.pods[i], p.ids[i] = pod, id
				p.payloads[i], errs[i] = exitPayload(id, pod, i)
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	for i, id := range p.ids {
		p.known[id] = instances.Instance{ID: id, State: instances.Running, Managed: true, Pod: podRef(p.pods[i])}
	}
	return p, nil
}

// cleanup removes a pass's Pods, Events and instances, so that every pass
// meets a stack of the same size.
func (w *world) cleanup(ctx context.Context, p *pass) error {
	for _, id := range p.ids {
		w.stack.EC2.RemoveInstance(id)
	}
	w.stack.EC2.ResetCalls()
	now := int64(0)
	if err := w.stack.Kube.CoreV1().Pods(p.ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &now}, metav1.ListOptions{}); err != nil {
		return err
	}
	return w.stack.Kube.CoreV1().Events(p.ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
}

// exitPayload is the subscription payload carrying the Pod's container's
// exit line (exit code 0, no restart), encoded as CloudWatch Logs delivers
// it and as the Lambda runtime hands it to the function: JSON.
func exitPayload(id string, pod *corev1.Pod, i int) ([]byte, error) {
	now := time.Now().UTC()
	line, err := json.Marshal(exitline.Line{
		Reaper: exitline.Kind, V: exitline.Version, InstanceID: id,
		PodNamespace: pod.Namespace, PodName: pod.Name, PodUID: string(pod.UID),
		Container: "main", ContainerID: replay.BareContainerID(pod),
		ExitCode: 0, StartedAt: now.Add(-time.Hour), FinishedAt: now,
	})
	if err != nil {
		return nil, err
	}
	ev, err := exitline.Encode(events.CloudwatchLogsData{
		Owner: "123456789012", LogGroup: "/reaper/exits", LogStream: id,
		SubscriptionFilters: []string{"reaper-exits"}, MessageType: "DATA_MESSAGE",
		LogEvents: []events.CloudwatchLogsLogEvent{{
			ID: fmt.Sprintf("3808%032d", i), Timestamp: now.UnixMilli(), Message: string(line),
		}},
	})
	if err != nil {
		return nil, err
	}
	return json.Marshal(ev)
}

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

// ec2Counts counts, per instance of the pass, the TerminateInstances and
// DescribeInstances requests the EC2 test server received that named it.
func ec2Counts(calls []ec2server.Call, p *pass) (terminates, lookups map[string]int, byAction map[string]int) {
	terminates, lookups, byAction = map[string]int{}, map[string]int{}, map[string]int{}
	for _, c := range calls {
		byAction[c.Action]++
		var named []string
		switch c.Action {
		case "TerminateInstances":
			named = c.InstanceIDs
		case "DescribeInstances":
			named = append(named, c.InstanceIDs...)
			for k, vs := range c.Params {
				// Filter.N.Value.M of an instance-id filter.
				rest, ok := strings.CutPrefix(k, "Filter.")
				n, _, ok2 := strings.Cut(rest, ".Value.")
				if !ok || !ok2 {
					continue
				}
				if _, err := strconv.Atoi(n); err == nil && c.Params.Get("Filter."+n+".Name") == "instance-id" {
					named = append(named, vs...)
				}
			}
		}
		for _, id := range named {
			if _, ok := p.known[id]; !ok {
				continue
			}
			if c.Action == "TerminateInstances" {
				terminates[id]++
			} else {
				lookups[id]++
			}
		}
	}
	return terminates, lookups, byAction
}
