// Package kube is Reaper's side of the Kubernetes API: reaching the
// apiserver from the access mode the configuration names (a kubeconfig
// file, a kubeconfig in Secrets Manager, or an EKS cluster with an IAM
// token: access.go), and writing Reaper's decisions to it: a Pod's status,
// through the status subresource, and an Event saying why (status.go).
package kube

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

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
	// Current: the Pod is live and, from Apply, already shows this outcome
	// or a later one.
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
}

// NewStatusWriter returns a writer over a core/v1 client (NewClient).
func NewStatusWriter(client rest.Interface) *StatusWriter {
	return &StatusWriter{client: client, now: time.Now}
}

// Snapshot is one read of the Pod a PodRef names.
type Snapshot struct {
	Ref model.PodRef
	// Result is Current when the Pod exists with the ref's UID and has not
	// ended; otherwise AlreadyTerminal, PodGone or PodReplaced.
	Result Result
	pod    *corev1.Pod // set when Current
}

// Read reads the Pod ref names. A caller that reads ahead, while it does
// other work, hands the snapshot to Apply, which then saves its own read.
func (w *StatusWriter) Read(ctx context.Context, ref model.PodRef) (Snapshot, error) {
	snap := Snapshot{Ref: ref}
	var pod corev1.Pod
	err := w.client.Get().Namespace(ref.Namespace).Resource("pods").Name(ref.Name).Do(ctx).Into(&pod)
	switch {
	case apierrors.IsNotFound(err):
		snap.Result = PodGone
	case err != nil:
		return snap, fmt.Errorf("get pod %s: %w", ref, err)
	case string(pod.UID) != ref.UID:
		snap.Result = PodReplaced
	case podstatus.Terminal(pod.Status.Phase):
		snap.Result = AlreadyTerminal
	default:
		snap.Result, snap.pod = Current, &pod
	}
	return snap, nil
}

// Apply makes the Pod carry the outcome. It never rewrites a Pod that is
// already Succeeded or Failed: it patches with the resourceVersion it read,
// so a Pod that changed in between (and may have ended) comes back as a
// conflict and is read again. The patch also carries the Pod's UID, so a
// replacement Pod of the same name is never written. An Event on the Pod
// says what Reaper did.
func (w *StatusWriter) Apply(ctx context.Context, ref model.PodRef, o model.Outcome) (Result, error) {
	for range maxConflicts {
		snap, status, res, err := w.decide(ctx, ref, o)
		if res != "" || err != nil {
			return res, err
		}
		res, err = w.write(ctx, snap.pod, o, status)
		if res == conflict {
			continue
		}
		return res, err
	}
	return "", fmt.Errorf("patch pod %s status: still conflicting after %d attempts", ref, maxConflicts)
}

// decide reads the Pod and returns the status it must be patched to, or
// (res set) why it needs no write.
func (w *StatusWriter) decide(ctx context.Context, ref model.PodRef, o model.Outcome) (Snapshot, corev1.PodStatus, Result, error) {
	snap, err := w.Read(ctx, ref)
	if err != nil || snap.Result != Current {
		return snap, corev1.PodStatus{}, snap.Result, err
	}
	status, ok := podstatus.Build(snap.pod, o, w.now())
	if !ok {
		return snap, status, Current, nil
	}
	return snap, status, "", nil
}

// ReadOnly is the Pod writer of a dry run: it reads the Pod and decides as
// StatusWriter.Apply does, and answers DryRun where Apply would write.
type ReadOnly struct {
	*StatusWriter
}

// Apply decides the write and makes none.
func (w ReadOnly) Apply(ctx context.Context, ref model.PodRef, o model.Outcome) (Result, error) {
	_, _, res, err := w.decide(ctx, ref, o)
	if res == "" && err == nil {
		res = DryRun
	}
	return res, err
}

// conflict is write's answer when the Pod changed since it was read.
const conflict Result = "conflict"

// write patches the Pod's status and posts the Event. The Event does not
// wait for the patch: what it says is known before the patch, and its name
// is derived from the Pod's UID and the outcome, so the post after a
// conflicting or failed attempt finds the same Event (AlreadyExists) rather
// than making a second one. Posting it after the patch would add a round
// trip to every exit.
func (w *StatusWriter) write(ctx context.Context, pod *corev1.Pod, o model.Outcome, status corev1.PodStatus) (Result, error) {
	patch, err := statusPatch(pod, status)
	if err != nil {
		return "", err
	}
	posted := make(chan error, 1)
	go func() { posted <- w.event(ctx, pod, o, status.Phase) }()
	err = w.client.Patch(types.StrategicMergePatchType).Namespace(pod.Namespace).Resource("pods").Name(pod.Name).
		SubResource("status").Param("fieldManager", Component).Body(patch).Do(ctx).Error()
	evErr := <-posted
	switch {
	case apierrors.IsConflict(err):
		return conflict, nil
	case apierrors.IsNotFound(err):
		return PodGone, nil
	case isUIDMismatch(err):
		return PodReplaced, nil
	case err != nil:
		return "", fmt.Errorf("patch pod %s/%s status: %w", pod.Namespace, pod.Name, err)
	}
	return Patched, evErr
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

// event posts what Reaper did. Its name is derived from the Pod and the
// outcome, so a retried step posts it once.
func (w *StatusWriter) event(ctx context.Context, pod *corev1.Pod, o model.Outcome, phase corev1.PodPhase) error {
	reason, msg, kind := podstatus.Event(o, phase)
	sum := sha256.Sum256([]byte(string(pod.UID) + "/" + o.Key()))
	now := metav1.NewTime(w.now())
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name + "." + hex.EncodeToString(sum[:8]), Namespace: pod.Namespace},
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
