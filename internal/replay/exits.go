package replay

import (
	"context"
	"encoding/json"
	"errors"
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
	Payload    []byte
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
	return l.createExits(ctx, namespace, "", n, names, created)
}

// createExits is CreateExits, with Pods bound to node (BoundPod) rather
// than running on VirtualNode when node is not empty.
func (l *Lab) createExits(ctx context.Context, namespace, node string, n int, names ExitNames, created func(done int)) ([]Exit, error) {
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
				if node == "" {
					pod, err = l.RunningPod(ctx, namespace, name, corev1.RestartPolicyNever)
				} else {
					pod, err = l.BoundPod(ctx, namespace, name, node, corev1.RestartPolicyNever)
				}
				if err != nil {
					errs[i] = err
					continue
				}
				l.AddInstance(id, pod, true)
				exits[i] = Exit{Pod: pod, InstanceID: id, Code: code}
				exits[i].Payload, errs[i] = ExitPayload(id, pod, code, i)
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
