package kube

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/reaper-k8s/reaper/pkg/model"
)

// TestEventNameValid: for a Pod name of any valid length, with a '.' or '-'
// where the name is cut, the Event's name is a valid name, the same for
// the same Pod and outcome, and another for another outcome.
func TestEventNameValid(t *testing.T) {
	exit0 := model.Outcome{Exits: []model.Exit{{Container: "main"}}}
	exit1 := model.Outcome{Exits: []model.Exit{{Container: "main", RestartCount: 1}}}
	for n := 1; n <= 253; n++ {
		for _, sep := range []string{"-", "."} {
			// A separator every other character, so that some cut falls
			// on one.
			name := []byte(strings.Repeat("a", n))
			for i := 1; i < n-1; i += 2 {
				name[i] = sep[0]
			}
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: string(name), UID: "5f0c8e1a-7b5d-4c3e-9a41-2d6f0b8c1e11"}}
			if errs := validation.IsDNS1123Subdomain(pod.Name); len(errs) != 0 {
				t.Fatalf("fixture %q is not a Pod name: %v", pod.Name, errs)
			}
			got := eventName(pod, exit0)
			if errs := validation.IsDNS1123Subdomain(got); len(errs) != 0 {
				t.Fatalf("pod %q: event name %q: %v", pod.Name, got, errs)
			}
			if got != eventName(pod, exit0) || got == eventName(pod, exit1) {
				t.Fatalf("pod %q: event name %q not one per Pod and outcome", pod.Name, got)
			}
		}
	}
}

// TestApplyToNeedsARead: a Current snapshot no read made (it carries no
// Pod) is refused by the writer and the dry run's alike, before any
// request.
func TestApplyToNeedsARead(t *testing.T) {
	ref := model.PodRef{Namespace: "jobs", Name: "train", UID: "5f0c8e1a-7b5d-4c3e-9a41-2d6f0b8c1e11"}
	snap := Snapshot{Ref: ref, Result: Current}
	o := model.Outcome{Exits: []model.Exit{{Container: "main"}}}
	w := &StatusWriter{} // no client: a request would panic
	if _, err := w.ApplyTo(t.Context(), snap, o); err == nil || !strings.Contains(err.Error(), ref.String()) {
		t.Errorf("StatusWriter.ApplyTo: %v, want an error naming %s", err, ref)
	}
	if _, err := (ReadOnly{StatusWriter: w}).ApplyTo(t.Context(), snap, o); err == nil {
		t.Errorf("ReadOnly.ApplyTo: no error")
	}
	// Not Current: the snapshot is its own answer.
	if a, err := w.ApplyTo(t.Context(), Snapshot{Ref: ref, Result: PodGone}, o); err != nil || a.Result != PodGone {
		t.Errorf("gone: %+v, %v; want %s", a, err, PodGone)
	}
}
