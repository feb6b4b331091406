package replay

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reaper-k8s/reaper/pkg/kube"
	"github.com/reaper-k8s/reaper/pkg/ledger"
	"github.com/reaper-k8s/reaper/pkg/podstatus"
)

// The exit path reads the Pod while it writes the ledger and hands that
// read to the status writer. These cases make the read stale before the
// patch, against the real apiserver: the patch must not be made from it.
func TestStaleReadAhead(t *testing.T) {
	const ns = "read-ahead"
	client, err := kube.NewClient(lab.Stack.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	w := kube.NewStatusWriter(client, false)
	exit := func(code int) podstatus.Outcome {
		return podstatus.Outcome{InstanceID: "i-0readahead00000001", Exit: &ledger.Exit{
			Container: "main", ExitCode: code, StartedAt: time.Now().Add(-time.Minute), FinishedAt: time.Now(),
		}}
	}
	setup := func(t *testing.T, name string) (ledger.PodRef, kube.Snapshot) {
		pod, err := lab.RunningPod(t.Context(), ns, name, corev1.RestartPolicyNever)
		if err != nil {
			t.Fatal(err)
		}
		ref := ledger.PodRef{Namespace: ns, Name: name, UID: string(pod.UID)}
		snap, err := w.Read(t.Context(), ref)
		if err != nil || snap.Result != kube.Current {
			t.Fatalf("read: %v %v", snap.Result, err)
		}
		return ref, snap
	}

	t.Run("ended in between", func(t *testing.T) {
		ref, snap := setup(t, "ended")
		// Somebody else ends the Pod after the read (another invocation
		// of the same instance, the sweeper).
		if res, err := w.Apply(t.Context(), ref, exit(3), nil); err != nil || res != kube.Patched {
			t.Fatalf("first write: %v %v", res, err)
		}
		before := getPod(t, ns, ref.Name)
		res, err := w.Apply(t.Context(), ref, exit(0), &snap)
		if err != nil || res != kube.AlreadyTerminal {
			t.Fatalf("apply with a stale read: %v %v, want %s", res, err, kube.AlreadyTerminal)
		}
		after := getPod(t, ns, ref.Name)
		if after.ResourceVersion != before.ResourceVersion {
			t.Fatalf("terminal Pod written: resourceVersion %s -> %s", before.ResourceVersion, after.ResourceVersion)
		}
		wantEnded(t, after, corev1.PodFailed, 3, "Error")
	})

	t.Run("changed in between", func(t *testing.T) {
		ref, snap := setup(t, "changed")
		// A write that leaves the Pod running but moves its
		// resourceVersion: the stale patch conflicts and is made again
		// from a new read.
		pod := getPod(t, ns, ref.Name)
		pod.Labels = map[string]string{"touched": "yes"}
		if _, err := lab.Stack.Kube.CoreV1().Pods(ns).Update(t.Context(), pod, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		res, err := w.Apply(t.Context(), ref, exit(0), &snap)
		if err != nil || res != kube.Patched {
			t.Fatalf("apply with a stale read: %v %v", res, err)
		}
		after := getPod(t, ns, ref.Name)
		wantEnded(t, after, corev1.PodSucceeded, 0, "Completed")
		if after.Labels["touched"] != "yes" {
			t.Fatalf("labels %v: the other write was lost", after.Labels)
		}
		// The Event went out with the conflicting attempt and again with
		// the one that succeeded: one Event all the same.
		evs, err := lab.Stack.Kube.CoreV1().Events(ns).List(t.Context(), metav1.ListOptions{
			FieldSelector: "involvedObject.name=" + ref.Name,
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(evs.Items) != 1 || evs.Items[0].Reason != kube.EventContainerExited {
			t.Fatalf("events %+v, want one %s", evs.Items, kube.EventContainerExited)
		}
	})

	t.Run("replaced in between", func(t *testing.T) {
		ref, snap := setup(t, "replaced")
		pods := lab.Stack.Kube.CoreV1().Pods(ns)
		if err := pods.Delete(t.Context(), ref.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
			t.Fatal(err)
		}
		replacement, err := lab.RunningPod(t.Context(), ns, ref.Name, corev1.RestartPolicyNever)
		if err != nil {
			t.Fatal(err)
		}
		res, err := w.Apply(t.Context(), ref, exit(0), &snap)
		if err != nil || res != kube.PodReplaced {
			t.Fatalf("apply with a read of the old Pod: %v %v, want %s", res, err, kube.PodReplaced)
		}
		if after := getPod(t, ns, ref.Name); after.ResourceVersion != replacement.ResourceVersion {
			t.Fatalf("replacement written: resourceVersion %s -> %s", replacement.ResourceVersion, after.ResourceVersion)
		}
	})
}
