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
