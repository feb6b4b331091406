package replay

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/reaper-k8s/reaper/internal/ec2server"
	"github.com/reaper-k8s/reaper/pkg/podstatus"
)

// instanceGoneWriter plays a provider that derives Pod status from the
// instance's state, as virtual-kubelet providers do: it polls the EC2 test
// server every millisecond and, the moment a watched instance is shutting
// down or terminated, writes its own terminal status — Failed, exit 255,
// "InstanceGone" — unless the Pod has already ended. It counts the Pods it
// ended itself.
type instanceGoneWriter struct {
	mu    sync.Mutex
	pods  map[string]*corev1.Pod // by instance id
	ended map[string]bool
}

func (w *instanceGoneWriter) run(ctx context.Context, t *testing.T) {
	for ctx.Err() == nil {
		time.Sleep(time.Millisecond)
		w.mu.Lock()
		var gone []string
		for id := range w.pods {
			if i, ok := lab.Stack.EC2.Instance(id); ok && (i.State == ec2server.ShuttingDown || i.State == ec2server.Terminated) {
				gone = append(gone, id)
			}
		}
		w.mu.Unlock()
		for _, id := range gone {
			w.mu.Lock()
			pod := w.pods[id]
			delete(w.pods, id)
			w.mu.Unlock()
			cur, err := lab.Stack.Kube.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
			if err != nil || podstatus.Terminal(cur.Status.Phase) {
				continue
			}
			patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"uid": pod.UID}, "status": map[string]any{
				"phase": corev1.PodFailed, "reason": "InstanceGone",
				"containerStatuses": []corev1.ContainerStatus{{Name: "main", Image: cur.Spec.Containers[0].Image, ImageID: cur.Status.ContainerStatuses[0].ImageID,
					State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 255, Reason: "InstanceGone"}}}},
			}})
			if _, err := lab.Stack.Kube.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil && ctx.Err() == nil {
				t.Errorf("provider write to %s: %v", pod.Name, err)
				continue
			}
			w.mu.Lock()
			w.ended[pod.Name] = true
			w.mu.Unlock()
		}
	}
}

// The Pod write lands before the terminate is sent, so a provider that
// reacts to the instance's end at once finds the Pod already ended and
// leaves Reaper's status alone: every Pod ends with its real exit.
func TestPodWriteBeforeTerminate(t *testing.T) {
	t.Parallel()
	const n = 20
	w := &instanceGoneWriter{pods: map[string]*corev1.Pod{}, ended: map[string]bool{}}
	var payloads [][]byte
	for i := range n {
		pod, err := lab.RunningPod(t.Context(), "race", fmt.Sprintf("race-%02d", i), corev1.RestartPolicyNever)
		if err != nil {
			t.Fatal(err)
		}
		id := fmt.Sprintf("i-%017x", 0x0dace0000000000+i)
		lab.AddInstance(id, pod, true)
		w.pods[id] = pod
		p, err := ExitPayload(id, pod, 0, i)
		if err != nil {
			t.Fatal(err)
		}
		payloads = append(payloads, p)
	}
	ctx, stop := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); w.run(ctx, t) }()
	for _, p := range payloads {
		invokeExit(t, p)
	}
	// Give the provider time to see the last instance go.
	time.Sleep(200 * time.Millisecond)
	stop()
	<-done
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.ended) > 0 || len(w.pods) > 0 {
		t.Fatalf("the provider ended %d of %d Pods before Reaper (%v); %d instances never went", len(w.ended), n, w.ended, len(w.pods))
	}
	for i := range n {
		wantEnded(t, getPod(t, "race", fmt.Sprintf("race-%02d", i)), corev1.PodSucceeded, 0, "Completed")
	}
}

// Exits that reach the queue together are reconciled in one batch: one
// tag lookup for all the instances, every Pod first, then one
// TerminateInstances for all of them.
func TestBatchTerminatesTogether(t *testing.T) {
	t.Parallel()
	const n = 5
	// A deployment of its own with a long batching window, so that the n
	// exits land in one batch.
	bins := map[string]string{"exitrecorder": lab.Bootstraps["exitrecorder"], "reconciler": lab.Bootstraps["reconciler"]}
	batched, err := NewLabWith(t.Context(), lab.Stack, "reaper-batched", bins, LabOptions{BatchingWindow: 2 * time.Second, MaxConcurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(batched.Stop)
	var ids []string
	var payloads [][]byte
	for i := range n {
		pod, err := lab.RunningPod(t.Context(), "batch", fmt.Sprintf("batch-%02d", i), corev1.RestartPolicyNever)
		if err != nil {
			t.Fatal(err)
		}
		id := fmt.Sprintf("i-%017x", 0x0ba7c0000000000+i)
		lab.AddInstance(id, pod, true)
		ids = append(ids, id)
		p, err := ExitPayload(id, pod, 0, i)
		if err != nil {
			t.Fatal(err)
		}
		payloads = append(payloads, p)
	}
	for _, p := range payloads {
		if err := batched.InvokeOnly(t.Context(), "exitrecorder", p, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := batched.Drain(t.Context()); err != nil {
		t.Fatal(err)
	}
	if sizes := batched.Mapping.Stats().BatchSizes; len(sizes) != 1 || sizes[0] != n {
		t.Fatalf("batch sizes %v, want one batch of %d", sizes, n)
	}
	var terminates [][]string
	describes := 0
	for _, c := range lab.Stack.EC2.Calls() {
		switch {
		case c.ErrorCode != "" || !slices.ContainsFunc(ids, func(id string) bool { return names(c, id) }):
		case c.Action == "TerminateInstances":
			terminates = append(terminates, c.InstanceIDs)
		case c.Action == "DescribeInstances":
			describes++
		}
	}
	if len(terminates) != 1 || len(terminates[0]) != n {
		t.Fatalf("TerminateInstances calls %v, want one naming all of %v", terminates, ids)
	}
	if describes != 1 {
		t.Fatalf("%d tag lookups for one batch", describes)
	}
	for i, id := range ids {
		wantEnded(t, getPod(t, "batch", fmt.Sprintf("batch-%02d", i)), corev1.PodSucceeded, 0, "Completed")
		if instanceState(t, id) != ec2server.Terminated {
			t.Fatalf("instance %s: %s", id, instanceState(t, id))
		}
	}
}
