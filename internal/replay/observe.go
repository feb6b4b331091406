package replay

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reaper-k8s/reaper/internal/labstack"
	"github.com/reaper-k8s/reaper/pkg/app/reaperapp"
	"github.com/reaper-k8s/reaper/pkg/config"
	"github.com/reaper-k8s/reaper/pkg/reaper"
)

// PodState is what a Pod says of itself.
type PodState struct {
	// Gone: the Pod does not exist.
	Gone  bool
	Phase corev1.PodPhase
	// ExitCode and Reason are of the container's last end (Completed,
	// Error, OOMKilled, ContainerStatusUnknown), nil and "" before it ended;
	// while it waits to restart, Reason is why (CrashLoopBackOff).
	ExitCode *int32
	Reason   string
	Restarts int32
	// Disruption is the DisruptionTarget condition's reason, if any.
	Disruption string
}

// ObservePod reads what the Pod namespace/name says of itself now.
func (l *Lab) ObservePod(ctx context.Context, namespace, name string) (PodState, error) {
	p, err := l.Stack.Kube.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return PodState{Gone: true}, nil
	}
	if err != nil {
		return PodState{}, err
	}
	s := PodState{Phase: p.Status.Phase}
	for _, cs := range p.Status.ContainerStatuses {
		s.Restarts = cs.RestartCount
		term := cs.State.Terminated
		if term == nil {
			term = cs.LastTerminationState.Terminated
		}
		if term != nil {
			s.ExitCode, s.Reason = &term.ExitCode, term.Reason
		}
		if cs.State.Waiting != nil {
			s.Reason = cs.State.Waiting.Reason
		}
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue {
			s.Disruption = c.Reason
		}
	}
	return s, nil
}

// Observe fills in what the world's Pods and instances are now, and what
// the ledger holds of the instances.
func (l *Lab) Observe(ctx context.Context, w *World) error {
	policy, err := l.Policy()
	if err != nil {
		return err
	}
	for i := range w.Pods {
		v := &w.Pods[i]
		if v.PodState, err = l.ObservePod(ctx, v.Namespace, v.Name); err != nil {
			return err
		}
	}
	for i := range w.Instances {
		v := &w.Instances[i]
		if inst, ok := l.Stack.EC2.Instance(v.ID); ok {
			v.After = inst.State
		}
		rec, ok, err := l.Ledger.Get(ctx, v.ID)
		if err != nil {
			return err
		}
		if ok {
			v.Record = &rec
			v.WaitUntil = reaper.Decide(rec, nil, nil, time.Now(), policy).WaitUntil
		}
	}
	return nil
}

// Policy is the decision policy the lab's functions run with, read from
// their environment.
func (l *Lab) Policy() (reaper.Policy, error) {
	vars := map[string]string{}
	for _, kv := range l.Env {
		k, v, _ := strings.Cut(kv, "=")
		vars[k] = v // the last one wins, as in a process's environment
	}
	cfg, err := config.Read(func(k string) string { return vars[k] }, config.Needs{})
	if err != nil {
		return reaper.Policy{}, err
	}
	return reaperapp.Policy(cfg), nil
}

// LogsSince returns what a function logged after offset once at least
// calls invocations, and every one that started there, have their REPORT
// line, which the emulator writes after answering. It waits a second at
// most.
func LogsSince(f *labstack.Function, offset, calls int) string {
	deadline := time.Now().Add(time.Second)
	for {
		logs := f.Logs()
		if len(logs) < offset {
			return logs
		}
		seg := logs[offset:]
		reports := strings.Count(seg, "REPORT RequestId:")
		if (reports >= calls && reports == strings.Count(seg, "START RequestId:")) || time.Now().After(deadline) {
			return seg
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// NotBelieved is an exit claim the reconciler rejected.
type NotBelieved struct {
	Instance, Reason string
}

// ReconcilerLines picks the reconciler's batch summaries and rejected exit
// claims out of log output (slog JSON lines among the emulator's).
func ReconcilerLines(logs string) (batches []reaper.BatchSummary, notBelieved []NotBelieved) {
	for line := range strings.Lines(logs) {
		if !strings.HasPrefix(line, "{") {
			continue
		}
		var l struct {
			Msg      string `json:"msg"`
			Instance string `json:"instance"`
			Reason   string `json:"reason"`
			reaper.BatchSummary
		}
		if json.Unmarshal([]byte(line), &l) != nil {
			continue
		}
		switch l.Msg {
		case "batch":
			batches = append(batches, l.BatchSummary)
		case "exit line not believed":
			notBelieved = append(notBelieved, NotBelieved{Instance: l.Instance, Reason: l.Reason})
		}
	}
	return batches, notBelieved
}

// Tail is the last n lines of logs.
func Tail(logs string, n int) string {
	lines := slices.Collect(strings.Lines(logs))
	return strings.Join(lines[max(0, len(lines)-n):], "")
}
