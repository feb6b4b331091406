package labstack_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/reaper-k8s/reaper/internal/labstack"
)

// TestJobController runs the real Job controller and plays the kubelet by
// hand: the Job must end Complete from nothing but a Pod status written
// through the API, the way Reaper writes it for a container that exited 0.
func TestJobController(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	start := time.Now()
	stack := labstack.MustStart(t, labstack.Options{Parts: labstack.Kube, Controllers: []string{"job-controller"}})
	t.Logf("stack with the Job controller started in %v", time.Since(start).Round(time.Millisecond))

	jobs := stack.Kube.BatchV1().Jobs("default")
	pods := stack.Kube.CoreV1().Pods("default")
	job, err := jobs.Create(ctx, &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "train"},
		Spec: batchv1.JobSpec{
			// One failure would end the Job, so a second Pod can only come
			// from the controller misreading the first one.
			BackoffLimit: new(int32(0)),
			Template: corev1.PodTemplateSpec{
				Spec: corev1.PodSpec{
					// No scheduler runs: the Pod is bound from the start, as
					// to a virtual node.
					NodeName:      "reaper-virtual-node",
					RestartPolicy: corev1.RestartPolicyNever,
					Containers:    []corev1.Container{{Name: "main", Image: "busybox"}},
				},
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	selector := metav1.FormatLabelSelector(job.Spec.Selector)
	jobPods := func(ctx context.Context) ([]corev1.Pod, error) {
		list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return nil, err
		}
		return list.Items, nil
	}

	var pod corev1.Pod
	poll(t, "the Job controller to create the Pod", func(ctx context.Context) (bool, error) {
		items, err := jobPods(ctx)
		if err != nil || len(items) == 0 {
			return false, err
		}
		if len(items) > 1 {
			return false, fmt.Errorf("%d Pods for one completion", len(items))
		}
		pod = items[0]
		return true, nil
	})
	if pod.Spec.NodeName != "reaper-virtual-node" || pod.Spec.ServiceAccountName != "" {
		t.Errorf("Pod %s: nodeName %q, serviceAccountName %q", pod.Name, pod.Spec.NodeName, pod.Spec.ServiceAccountName)
	}

	// What the kubelet reports for a container that exited 0, guarded by
	// the UID so it cannot land on a replacement of the same name.
	patch, _ := json.Marshal(map[string]any{
		"metadata": map[string]any{"uid": pod.UID},
		"status": map[string]any{
			"phase": "Succeeded",
			"containerStatuses": []map[string]any{{
				"name": "main", "image": "busybox", "imageID": "", "containerID": "containerd://abc",
				"ready": false, "restartCount": 0, "started": false,
				"state": map[string]any{"terminated": map[string]any{
					"exitCode": 0, "reason": "Completed", "containerID": "containerd://abc",
					"startedAt": "2026-01-01T00:00:00Z", "finishedAt": "2026-01-01T00:01:00Z",
				}},
			}},
		},
	})
	if _, err := pods.Patch(ctx, pod.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		t.Fatalf("patch status: %v", err)
	}

	poll(t, "the Job to complete", func(ctx context.Context) (bool, error) {
		got, err := jobs.Get(ctx, job.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		job = got
		if jobCondition(job, batchv1.JobFailed) {
			return false, fmt.Errorf("Job failed: %+v", job.Status)
		}
		return jobCondition(job, batchv1.JobComplete), nil
	})
	if st := job.Status; st.Succeeded != 1 || st.Failed != 0 || st.Active != 0 {
		t.Errorf("Job status: succeeded %d, failed %d, active %d; want 1, 0, 0", st.Succeeded, st.Failed, st.Active)
	}

	items, err := jobPods(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(items) != 1 || items[0].UID != pod.UID {
		t.Fatalf("want only Pod %s (%s), have %d Pods", pod.Name, pod.UID, len(items))
	}
	// The controller drops its tracking finalizer once it has counted the
	// Pod: the success was taken from this Pod's status.
	if slices.Contains(items[0].Finalizers, batchv1.JobTrackingFinalizer) {
		t.Errorf("Pod still has %s: %v", batchv1.JobTrackingFinalizer, items[0].Finalizers)
	}
}

func jobCondition(job *batchv1.Job, typ batchv1.JobConditionType) bool {
	for _, c := range job.Status.Conditions {
		if c.Type == typ && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// poll fails the test unless cond holds within 30 s; an error from cond
// fails it at once.
func poll(t *testing.T, what string, cond wait.ConditionWithContextFunc) {
	t.Helper()
	start := time.Now()
	if err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true, cond); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
	t.Logf("waited %v for %s", time.Since(start).Round(time.Millisecond), what)
}
