package replay

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/reaper-k8s/reaper/examples/vkprovider"
	"github.com/reaper-k8s/reaper/internal/labstack"
)

// terminalWatch records when and how each Pod of a namespace is first seen
// Succeeded or Failed.
type terminalWatch struct {
	mu   sync.Mutex
	ends map[string]podEnd
	// changed is signalled (without blocking) at each new terminal Pod.
	changed chan struct{}
	err     error
}

// podEnd is a terminal Pod's status as seen at a time.
type podEnd struct {
	at     time.Time
	phase  corev1.PodPhase
	reason string
	// code is the container's exit code, -1 when it has none.
	code int
}

// endOf is the terminal status of pod now, and whether it has one.
func endOf(pod *corev1.Pod) (podEnd, bool) {
	if pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed {
		return podEnd{}, false
	}
	e := podEnd{at: time.Now(), phase: pod.Status.Phase, code: -1}
	for _, cs := range pod.Status.ContainerStatuses {
		if t := cs.State.Terminated; t != nil {
			e.reason, e.code = t.Reason, int(t.ExitCode)
		}
	}
	return e, true
}

// truthful says e is what an exit with code ends its Pod with: Succeeded
// with 0, Failed with the code, and not a provider's "instance gone".
func (e podEnd) truthful(code int) bool {
	phase := corev1.PodSucceeded
	if code != 0 {
		phase = corev1.PodFailed
	}
	return e.phase == phase && e.code == code && e.reason != vkprovider.InstanceGone
}

// watchTerminal lists the namespace's Pods, then watches them until ctx
// ends, listing again when the apiserver closes the watch.
func watchTerminal(ctx context.Context, stack *labstack.Stack, namespace string) (*terminalWatch, error) {
	w := &terminalWatch{ends: map[string]podEnd{}, changed: make(chan struct{}, 1)}
	pods := stack.Kube.CoreV1().Pods(namespace)
	start := func() (watch.Interface, error) {
		list, err := pods.List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, err
		}
		for i := range list.Items {
			w.see(&list.Items[i])
		}
		return pods.Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	}
	wi, err := start()
	if err != nil {
		return nil, fmt.Errorf("watch pods of %s: %w", namespace, err)
	}
	go func() {
		for {
			for ev := range wi.ResultChan() {
				if pod, ok := ev.Object.(*corev1.Pod); ok {
					w.see(pod)
				}
			}
			wi.Stop()
			if ctx.Err() != nil {
				return
			}
			if wi, err = start(); err != nil {
				w.mu.Lock()
				w.err = err
				w.mu.Unlock()
				return
			}
		}
	}()
	return w, nil
}

func (w *terminalWatch) see(pod *corev1.Pod) {
	e, ok := endOf(pod)
	if !ok {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.ends[pod.Name]; ok {
		return
	}
	w.ends[pod.Name] = e
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

// wait waits until n Pods are terminal, or for at most patience once no
// new one arrives.
func (w *terminalWatch) wait(ctx context.Context, n int, patience time.Duration) error {
	for {
		w.mu.Lock()
		got, err := len(w.ends), w.err
		w.mu.Unlock()
		if got >= n {
			return nil
		}
		if err != nil {
			return fmt.Errorf("watch pods: %w", err)
		}
		t := time.NewTimer(patience)
		select {
		case <-w.changed:
			t.Stop()
		case <-t.C:
			return fmt.Errorf("%d of %d Pods terminal", got, n)
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
}
