// Package kube is Reaper's side of the Kubernetes API: reaching the
// apiserver from the access mode the configuration names (a kubeconfig
// file, a kubeconfig in Secrets Manager, or an EKS cluster with an IAM
// token: access.go), reading Pods, one by one or a batch at a time in LIST
// pages (read.go), and writing Reaper's decisions to them: a Pod's status,
// through the status subresource, and an Event saying why (status.go).
package kube

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"

	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/model"
	"github.com/reaper-k8s/reaper/pkg/podstatus"
)

// Result is what applying an outcome to a Pod came to. Every result but an
// error means the step is done.
type Result string

const (
	// Patched: the Pod's status now carries the outcome.
	Patched Result = "patched"
	// AlreadyTerminal: the Pod had ended before; it was not touched.
	AlreadyTerminal Result = "already-terminal"
	// Current: the Pod is live (a read's answer) and, from ApplyTo,
	// already shows this outcome or a later one.
	Current Result = "current"
	// PodGone: no Pod of that name exists any more.
	PodGone Result = "pod-gone"
	// PodReplaced: a Pod of that name exists with another UID.
	PodReplaced Result = "pod-replaced"
	// DryRun: the write was decided, not made (ReadOnly).
	DryRun Result = "dry-run"
)

// Component is the Event source Reaper posts as.
const Component = "reaper"

// maxConflicts bounds re-reads after a resourceVersion conflict: each one
// means somebody else wrote the Pod in between.
const maxConflicts = 5

// StatusWriter applies outcomes to Pods.
type StatusWriter struct {
	client rest.Interface
	now    func() time.Time
	// Log receives what does not fail a step but must be seen: an Event
	// that could not be posted. nil logs to slog.Default().
	Log *slog.Logger
	// Metrics counts the Events that could not be posted
	// (metrics.EventsNotPosted); nil counts nothing.
	Metrics  *metrics.Recorder
	identity identity
}

// NewStatusWriter returns a writer over a core/v1 client (NewClient).
func NewStatusWriter(client rest.Interface) *StatusWriter {
	return &StatusWriter{client: client, now: time.Now}
}

// Snapshot is one read of the Pod a PodRef names, made by Read, ReadMany
// or SnapshotOf: a Current one carries the Pod read.
type Snapshot struct {
	Ref model.PodRef
	// Result is Current when the Pod exists with the ref's UID and has not
	// ended; otherwise AlreadyTerminal, PodGone or PodReplaced.
	Result Result
	pod    *corev1.Pod // set when Current
}

// Pod is the Pod as read when the snapshot is Current (nil otherwise): its
// spec says what its containers are. The caller must not modify it.
func (s Snapshot) Pod() *corev1.Pod { return s.pod }

// SnapshotOf is what a read that found pod (nil: none) says about ref,
// for a Pods implementation of Reaper's other than StatusWriter's.
func SnapshotOf(ref model.PodRef, pod *corev1.Pod) Snapshot { return snapshot(ref, pod) }

// snapshot is what a read that found pod (nil: no Pod of that name) says
// about ref.
func snapshot(ref model.PodRef, pod *corev1.Pod) Snapshot {
	snap := Snapshot{Ref: ref}
	switch {
	case pod == nil:
		snap.Result = PodGone
	case string(pod.UID) != ref.UID:
		snap.Result = PodReplaced
	case podstatus.Terminal(pod.Status.Phase):
		snap.Result = AlreadyTerminal
	default:
		snap.Result, snap.pod = Current, pod
	}
	return snap
}

// Read reads the Pod ref names with one GET: ApplyTo reads again so after
// a conflict. A batch reads its Pods with ReadMany, in LIST pages.
func (w *StatusWriter) Read(ctx context.Context, ref model.PodRef) (Snapshot, error) {
	pod, err := w.getPod(ctx, ref)
	if err != nil {
		return Snapshot{Ref: ref}, err
	}
	return snapshot(ref, pod), nil
}

// getPod reads the Pod of ref's namespace and name, whatever its UID; nil
// when there is none.
func (w *StatusWriter) getPod(ctx context.Context, ref model.PodRef) (*corev1.Pod, error) {
	var pod corev1.Pod
	err := w.client.Get().Namespace(ref.Namespace).Resource("pods").Name(ref.Name).Do(ctx).Into(&pod)
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("get pod %s: %w", ref, err)
	}
	return &pod, nil
}

// Applied is what applying an outcome to a Pod came to: the result and,
// when the status was written (Patched, DryRun), the phase it was written
// with, which is the outcome Reaper counts.
type Applied struct {
	Result Result
	Phase  corev1.PodPhase
}

// conflictBackoff paces the re-reads after resourceVersion conflicts:
// each one means somebody else wrote the Pod in between.
var conflictBackoff = wait.Backoff{Steps: maxConflicts, Duration: 10 * time.Millisecond, Factor: 2, Jitter: 0.1}

// ApplyTo makes the Pod of a snapshot (from Read or ReadMany) carry the
// outcome, with no read of its own first. A snapshot that is not Current
// is its own answer, and nothing is written; a Current one without its Pod
// (no read made it) is an error. It never rewrites a Pod that
// is already Succeeded or Failed: it patches with the resourceVersion of
// the snapshot, so a Pod that changed since (and may have ended) comes back
// as a conflict and is read again (retry.RetryOnConflict). The patch also
// carries the Pod's UID, so a replacement Pod of the same name is never
// written. Once the patch has landed, an Event on the Pod says what Reaper
// did; an Event that cannot be posted is logged and counted, and the
// result is still Patched.
func (w *StatusWriter) ApplyTo(ctx context.Context, snap Snapshot, o model.Outcome) (Applied, error) {
	if err := checkRead(snap); err != nil {
		return Applied{}, err
	}
	var applied Applied
	attempt := 0
	err := retry.RetryOnConflict(conflictBackoff, func() error {
		if attempt++; attempt > 1 { // after a conflict
			var err error
			if snap, err = w.Read(ctx, snap.Ref); err != nil {
				return err
			}
		}
		status, res := w.plan(snap, o)
		if res != "" {
			applied = Applied{Result: res}
			return nil
		}
		var err error
		applied, err = w.write(ctx, snap.pod, o, status)
		return err
	})
	if apierrors.IsConflict(err) {
		return Applied{}, fmt.Errorf("patch pod %s status: still conflicting after %d attempts: %w", snap.Ref, maxConflicts, err)
	}
	return applied, err
}

// checkRead refuses a Current snapshot that carries no Pod: one no read
// made, which has nothing to write the outcome from.
func checkRead(snap Snapshot) error {
	if snap.Result == Current && snap.pod == nil {
		return fmt.Errorf("pod %s: a current snapshot without the Pod read", snap.Ref)
	}
	return nil
}

// plan returns the status the snapshot's Pod must be patched to, or (res
// set) why it needs no write.
func (w *StatusWriter) plan(snap Snapshot, o model.Outcome) (corev1.PodStatus, Result) {
	if snap.Result != Current {
		return corev1.PodStatus{}, snap.Result
	}
	status, ok := podstatus.Build(snap.pod, o, w.now())
	if !ok {
		return status, Current
	}
	return status, ""
}

// ReadOnly is the Pod writer of a dry run: it reads Pods and decides as
// StatusWriter does, and answers DryRun where StatusWriter would write.
type ReadOnly struct {
	*StatusWriter
}

// ApplyTo decides the write from the snapshot and makes none.
func (w ReadOnly) ApplyTo(_ context.Context, snap Snapshot, o model.Outcome) (Applied, error) {
	if err := checkRead(snap); err != nil {
		return Applied{}, err
	}
	status, res := w.plan(snap, o)
	if res != "" {
		return Applied{Result: res}, nil
	}
	return Applied{Result: DryRun, Phase: status.Phase}, nil
}

// write patches the Pod's status and, once the patch has landed, posts the
// Event saying what happened. The Event waits for the patch because until
// then what it would say is not known: the Pod may turn out replaced, gone
// or changed (a conflict, returned as the apiserver's error).
func (w *StatusWriter) write(ctx context.Context, pod *corev1.Pod, o model.Outcome, status corev1.PodStatus) (Applied, error) {
	patch, err := statusPatch(pod, status)
	if err != nil {
		return Applied{}, err
	}
	var patched corev1.Pod
	err = w.client.Patch(types.StrategicMergePatchType).Namespace(pod.Namespace).Resource("pods").Name(pod.Name).
		SubResource("status").Param("fieldManager", Component).Body(patch).Do(ctx).Into(&patched)
	switch {
	case apierrors.IsConflict(err):
		return Applied{}, err
	case apierrors.IsNotFound(err):
		return Applied{Result: PodGone}, nil
	case isUIDMismatch(err):
		return Applied{Result: PodReplaced}, nil
	case err != nil:
		return Applied{}, fmt.Errorf("patch pod %s/%s status: %w", pod.Namespace, pod.Name, err)
	}
	if err := w.event(ctx, &patched, o); err != nil {
		// The status is what matters and it is written: the step is done.
		w.logger().LogAttrs(ctx, slog.LevelWarn, "event not posted", slog.String("pod", pod.Namespace+"/"+pod.Name),
			slog.String("error", err.Error()))
		w.Metrics.Count(metrics.EventsNotPosted, 1)
	}
	return Applied{Result: Patched, Phase: patched.Status.Phase}, nil
}

func (w *StatusWriter) logger() *slog.Logger {
	if w.Log != nil {
		return w.Log
	}
	return slog.Default()
}

// statusPatch is a strategic-merge patch of the status with the UID and
// resourceVersion as preconditions.
func statusPatch(pod *corev1.Pod, status corev1.PodStatus) ([]byte, error) {
	return json.Marshal(map[string]any{
		"metadata": map[string]any{"uid": pod.UID, "resourceVersion": pod.ResourceVersion},
		"status":   status,
	})
}

// isUIDMismatch recognises the apiserver's answer to a UID precondition that
// does not hold: 422 Invalid on metadata.uid (not a 409).
func isUIDMismatch(err error) bool {
	var status apierrors.APIStatus
	if !apierrors.IsInvalid(err) || !errors.As(err, &status) {
		return false
	}
	if d := status.Status().Details; d != nil {
		for _, c := range d.Causes {
			if c.Field == "metadata.uid" {
				return true
			}
		}
	}
	return false
}

// event posts what Reaper did to pod (as the patch left it). Its name is
// derived from the Pod's UID and the outcome, so a retried step posts it
// once.
func (w *StatusWriter) event(ctx context.Context, pod *corev1.Pod, o model.Outcome) error {
	reason, msg, kind := podstatus.Event(o, pod.Status.Phase)
	now := metav1.NewTime(w.now())
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{Name: eventName(pod, o), Namespace: pod.Namespace},
		InvolvedObject: corev1.ObjectReference{
			Kind: "Pod", APIVersion: "v1", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID, ResourceVersion: pod.ResourceVersion,
		},
		Reason:              reason,
		Message:             msg,
		Type:                kind,
		Source:              corev1.EventSource{Component: Component},
		ReportingController: "reaper.io/" + Component,
		ReportingInstance:   o.InstanceID,
		FirstTimestamp:      now,
		LastTimestamp:       now,
		Count:               1,
	}
	err := w.client.Post().Namespace(pod.Namespace).Resource("events").Body(ev).Do(ctx).Error()
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("post event on pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}

// maxNameLength is the longest name a DNS subdomain, which Pod and Event
// names are, may have.
const maxNameLength = 253

// eventName is "<Pod name>.<hash of the Pod's UID and the outcome>", the
// Pod name's part cut short where the whole would exceed maxNameLength: a
// cut valid name, its trailing '-' and '.' trimmed, is still a DNS
// subdomain, and the hash keeps it unique.
func eventName(pod *corev1.Pod, o model.Outcome) string {
	sum := sha256.Sum256([]byte(string(pod.UID) + "/" + o.Key()))
	return shortName(pod.Name, "."+hex.EncodeToString(sum[:8]))
}

// shortName is name and suffix, name cut short where the whole would
// exceed maxNameLength.
func shortName(name, suffix string) string {
	if len(name) > maxNameLength-len(suffix) {
		name = strings.TrimRight(name[:maxNameLength-len(suffix)], "-.")
	}
	return name + suffix
}
