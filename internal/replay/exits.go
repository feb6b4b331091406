package replay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/reaper-k8s/reaper/pkg/exitline"
)

// Exit is a running Pod on a managed instance of its own, with the
// subscription payload that ends it with Code.
type Exit struct {
	Pod        *corev1.Pod
	InstanceID string
	Code       int
	// Before are the payloads of the Pod's other containers' exits, to
	// deliver, in order, before Payload, the Pod's last.
	Before  [][]byte
	Payload []byte
}

// ExitNames names the i-th exit of a batch: its Pod, its instance and its
// exit code.
type ExitNames func(i int) (pod, instanceID string, code int)

// fixtureWorkers bounds concurrent fixture writes to the apiserver.
const fixtureWorkers = 16

// CreateExits creates n exits in namespace (created when missing), named by
// names, fixtureWorkers at a time: each a running Pod (restart policy Never)
// on a managed instance, and its payload (ExitPayload with seq i).
// created, when not nil, is told how many are done after each one. An exit
// whose Pod could not be created is left zero, with its error among those
// returned.
func (l *Lab) CreateExits(ctx context.Context, namespace string, n int, names ExitNames, created func(done int)) ([]Exit, error) {
	return l.createExits(ctx, namespace, "", n, 1, names, created)
}

// createExits is CreateExits, with Pods bound to node (BoundPod) rather
// than running on VirtualNode when node is not empty.
func (l *Lab) createExits(ctx context.Context, namespace, node string, n, containers int, names ExitNames, created func(done int)) ([]Exit, error) {
	if err := l.Stack.EnsureNamespaces(ctx, namespace); err != nil {
		return nil, err
	}
	exits := make([]Exit, n)
	errs := make([]error, n)
	var done atomic.Int64
	next := make(chan int)
	var wg sync.WaitGroup
	for range fixtureWorkers {
		wg.Go(func() {
			for i := range next {
				name, id, code := names(i)
				var pod *corev1.Pod
				var err error
				switch {
				case containers > 1:
					pod, err = l.ShapedPod(ctx, namespace, name, PodShape{Containers: burstContainers(containers), Policy: corev1.RestartPolicyNever}, true)
				case node == "":
					pod, err = l.RunningPod(ctx, namespace, name, corev1.RestartPolicyNever)
				default:
					pod, err = l.BoundPod(ctx, namespace, name, node, corev1.RestartPolicyNever)
				}
				if err != nil {
					errs[i] = err
					continue
				}
				l.AddInstance(id, pod, true)
				exits[i] = Exit{Pod: pod, InstanceID: id, Code: code}
				if containers > 1 {
					exits[i].Before, exits[i].Payload, errs[i] = containerPayloads(id, pod, code, i)
				} else {
					exits[i].Payload, errs[i] = ExitPayload(id, pod, code, i)
				}
				if c := done.Add(1); created != nil {
					created(int(c))
				}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return exits, errors.Join(errs...)
}

// burstContainers are the regular containers of a burst's Pod of n: the
// others first, "main", which ends last, at the end, where a status's
// reader looking for the Pod's exit code finds it.
func burstContainers(n int) []string {
	names := make([]string, 0, n)
	for i := 1; i < n; i++ {
		names = append(names, fmt.Sprintf("side-%d", i))
	}
	return append(names, "main")
}

// containerPayloads are the payloads of the exits of pod's containers
// (burstContainers): the others' (exit 0, othersRunning), each a payload
// of its own, then main's with code.
func containerPayloads(id string, pod *corev1.Pod, code, seq int) (before [][]byte, last []byte, err error) {
	for _, c := range pod.Spec.Containers {
		line := exitline.Line{Container: c.Name, ContainerID: BareContainerID(pod) + c.Name, OthersRunning: c.Name != "main"}
		if c.Name == "main" {
			line.ExitCode = code
		}
		ev, err := ExitLogsEvent(id, pod, line, seq*len(pod.Spec.Containers)+len(before))
		if err != nil {
			return nil, nil, err
		}
		b, err := json.Marshal(ev)
		if err != nil {
			return nil, nil, err
		}
		if c.Name == "main" {
			return before, b, nil
		}
		before = append(before, b)
	}
	return nil, nil, fmt.Errorf("pod %s has no container main", pod.Name)
}

// ExitPayload is the subscription payload carrying the exit line of the
// Pod's container (restart policy Never: no restart), encoded as
// CloudWatch Logs delivers it and as the Lambda runtime hands it to the
// function: JSON. seq makes the log event id unique.
func ExitPayload(instanceID string, pod *corev1.Pod, code, seq int) ([]byte, error) {
	ev, err := ExitLogsEvent(instanceID, pod, exitline.Line{ContainerID: BareContainerID(pod), ExitCode: code}, seq)
	if err != nil {
		return nil, err
	}
	return json.Marshal(ev)
}

// exitPayloadAt is ExitPayload for an exit whose line says it finished at
// finishedAt.
func exitPayloadAt(e Exit, seq int, finishedAt time.Time) ([]byte, error) {
	ev, err := ExitLogsEvent(e.InstanceID, e.Pod, exitline.Line{ContainerID: BareContainerID(e.Pod), ExitCode: e.Code, FinishedAt: finishedAt.UTC()}, seq)
	if err != nil {
		return nil, err
	}
	return json.Marshal(ev)
}
