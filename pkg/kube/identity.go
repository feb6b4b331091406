package kube

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/reaper-k8s/reaper/pkg/model"
)

// IdentityNamespace is the namespace whose UID identifies a cluster: every
// cluster has it from its first start, and a cluster recreated under the
// same name or endpoint gets a new one.
const IdentityNamespace = "kube-system"

// identity caches the cluster identity: the client's endpoint cannot change
// within a process, so one read serves every batch it runs.
type identity struct {
	mu  sync.Mutex
	uid string
}

// ClusterIdentity is the UID of the IdentityNamespace of the cluster the
// writer reaches. A provider writes the same value into each instance's
// cluster identity tag (model.DefaultTagClusterUID), so Reaper can tell
// that a Pod it finds missing is missing from the cluster the instance
// was launched for, and not from another one a wrong endpoint points at.
func (w *StatusWriter) ClusterIdentity(ctx context.Context) (string, error) {
	w.identity.mu.Lock()
	defer w.identity.mu.Unlock()
	if w.identity.uid != "" {
		return w.identity.uid, nil
	}
	var ns corev1.Namespace
	if err := w.client.Get().Resource("namespaces").Name(IdentityNamespace).Do(ctx).Into(&ns); err != nil {
		return "", fmt.Errorf("read the cluster identity (namespace %s): %w", IdentityNamespace, err)
	}
	w.identity.uid = string(ns.UID)
	return w.identity.uid, nil
}

// Warn posts a Warning Event on the Pod ref names, saying what Reaper could
// not do for it (reason, message) on instance. The Event is named after
// the Pod's UID, the reason and the instance, so saying it again posts
// nothing new.
func (w *StatusWriter) Warn(ctx context.Context, ref model.PodRef, instance, reason, message string) error {
	sum := sha256.Sum256([]byte(ref.UID + "/" + reason + "/" + instance))
	now := metav1.NewTime(w.now())
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{Name: shortName(ref.Name, "."+hex.EncodeToString(sum[:8])), Namespace: ref.Namespace},
		InvolvedObject: corev1.ObjectReference{
			Kind: "Pod", APIVersion: "v1", Namespace: ref.Namespace, Name: ref.Name, UID: types.UID(ref.UID),
		},
		Reason:              reason,
		Message:             message,
		Type:                corev1.EventTypeWarning,
		Source:              corev1.EventSource{Component: Component},
		ReportingController: "reaper.io/" + Component,
		ReportingInstance:   instance,
		FirstTimestamp:      now,
		LastTimestamp:       now,
		Count:               1,
	}
	err := w.client.Post().Namespace(ref.Namespace).Resource("events").Body(ev).Do(ctx).Error()
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("post event on pod %s: %w", ref, err)
	}
	return nil
}
