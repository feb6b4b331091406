package vkprovider_test

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/reaper-k8s/reaper/examples/vkprovider"
	"github.com/reaper-k8s/reaper/internal/ec2server"
	"github.com/reaper-k8s/reaper/internal/replay"
	"github.com/reaper-k8s/reaper/pkg/intake"
	"github.com/reaper-k8s/reaper/pkg/reaper"
)

// Exit 42 matches the FailJob rule: the Job fails at its first Pod, though
// backoffLimit 3 would have retried it.
func TestE2EPodFailurePolicyFailJob(t *testing.T) {
	t.Parallel()
	failOn42 := func(j *batchv1.Job) {
		container := "main"
		j.Spec.PodFailurePolicy = &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{{
			Action: batchv1.PodFailurePolicyActionFailJob,
			OnExitCodes: &batchv1.PodFailurePolicyOnExitCodesRequirement{
				ContainerName: &container, Operator: batchv1.PodFailurePolicyOnExitCodesOpIn, Values: []int32{42},
			},
		}}}
	}
	r, err := runJob(t.Context(), "e2e-pfp-fail-job", 3, host{exitCode: 42}, "exitrecorder", jobTimeout, 2*syncPeriod, failOn42)
	if err != nil {
		t.Fatal(err)
	}
	failed := false
	for _, c := range r.job.Status.Conditions {
		failed = failed || (c.Type == batchv1.JobFailed && c.Status == corev1.ConditionTrue && c.Reason == batchv1.JobReasonPodFailurePolicy)
	}
	if !failed || r.job.Status.Failed != 1 {
		t.Fatalf("Job status %+v, want Failed by PodFailurePolicy with 1 failed", r.job.Status)
	}
	wantPodsEnded(t, r, 1, corev1.PodFailed, 42)
}

// A Pod lost with its spot instance (no exit line) carries DisruptionTarget,
// which the Ignore rule does not count: with backoffLimit 0 the Job still
// makes a second Pod, whose exit 0 completes it. Not parallel: the sweep it
// runs reconciles every test's instances.
func TestE2EPodFailurePolicyIgnoresSpotLoss(t *testing.T) {
	ctx := t.Context()
	ns := "e2e-pfp-ignore"
	if err := lab.Stack.EnsureNamespaces(ctx, ns); err != nil {
		t.Fatal(err)
	}
	job := newJob(0)
	job.Spec.PodFailurePolicy = &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{{
		Action:          batchv1.PodFailurePolicyActionIgnore,
		OnPodConditions: []batchv1.PodFailurePolicyOnPodConditionsPattern{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue}},
	}}}
	jobs := lab.Stack.Kube.BatchV1().Jobs(ns)
	job, err := jobs.Create(ctx, job, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	selector := metav1.FormatLabelSelector(job.Spec.Selector)

	first := waitNewPod(t, ns, selector, nil)
	id := waitRunning(t, first)
	lab.Stack.EC2.SetState(id, ec2server.Terminated)
	var st intake.StateSummary
	if err := lab.Invoke(ctx, "statechange", stateEvent(t, id, ec2server.Terminated), &st); err != nil {
		t.Fatal(err)
	}
	rec, ok, err := lab.Ledger.Get(ctx, id)
	if err != nil || !ok || rec.Gone == nil {
		t.Fatalf("after %+v the ledger holds %+v (found %v, %v); want the instance recorded gone", st, rec, ok, err)
	}
	time.Sleep(time.Until(rec.Gone.At.Add(exitWait)))
	// The sweep that finds the window past queues the Pod's finalization,
	// and Invoke returns once the reconciler has written it.
	pods := lab.Stack.Kube.CoreV1().Pods(ns)
	for deadline := time.Now().Add(jobTimeout); ; time.Sleep(500 * time.Millisecond) {
		var sum reaper.SweepSummary
		if err := lab.Invoke(ctx, "sweeper", []byte(`{"source":"aws.events","detail-type":"Scheduled Event"}`), &sum); err != nil {
			t.Fatal(err)
		}
		got, err := pods.Get(ctx, first.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Status.Phase == corev1.PodFailed {
			if sum.Queued == 0 {
				t.Errorf("sweep %+v queued nothing, yet the Pod was finalized", sum)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sweeps never finalized the lost Pod: last %+v, Pod %s", sum, got.Status.Phase)
		}
	}
	lost, err := pods.Get(ctx, first.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if lost.Status.Phase != corev1.PodFailed || !slices.ContainsFunc(lost.Status.Conditions, func(c corev1.PodCondition) bool {
		return c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue
	}) {
		t.Fatalf("lost Pod %s: phase %s, conditions %+v; want Failed with DisruptionTarget", lost.Name, lost.Status.Phase, lost.Status.Conditions)
	}

	second := waitNewPod(t, ns, selector, map[types.UID]bool{first.UID: true})
	waitRunning(t, second)
	if job, err = jobs.Get(ctx, job.Name, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	if job.Status.Failed != 0 || condition(job, batchv1.JobFailed) {
		t.Fatalf("Job status %+v after the ignored loss, want nothing failed", job.Status)
	}
	sum, err := sendExit(ctx, "exitrecorder", second, host{exitCode: 0})
	if err != nil || sum.Recorded != 1 {
		t.Fatalf("exitrecorder: %+v, %v; want the line recorded", sum, err)
	}
	for deadline := time.Now().Add(jobTimeout); !condition(job, batchv1.JobComplete); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("Job status %+v, want Complete", job.Status)
		}
		if job, err = jobs.Get(ctx, job.Name, metav1.GetOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if job.Status.Succeeded != 1 || job.Status.Failed != 0 {
		t.Fatalf("Job status %+v, want 1 succeeded and 0 failed", job.Status)
	}
	list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil || len(list.Items) != 2 {
		t.Fatalf("Job Pods: %v, %d; want 2", err, len(list.Items))
	}
}

// Deleting one running Pod ends its instance through the provider's
// DeletePod and touches no other instance. Not parallel: the record of
// TerminateInstances calls must be this test's alone.
func TestE2EDeletePodEndsOnlyItsInstance(t *testing.T) {
	ctx := t.Context()
	ns := "e2e-delete"
	if err := lab.Stack.EnsureNamespaces(ctx, ns); err != nil {
		t.Fatal(err)
	}
	pods := lab.Stack.Kube.CoreV1().Pods(ns)
	var ids []string
	var names []string
	for _, name := range []string{"worker-0", "worker-1", "worker-2"} {
		pod, err := pods.Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PodSpec{NodeName: nodeName, RestartPolicy: corev1.RestartPolicyNever,
				Tolerations: []corev1.Toleration{{Key: vkprovider.Taint.Key, Operator: corev1.TolerationOpEqual, Value: vkprovider.Taint.Value, Effect: vkprovider.Taint.Effect}},
				Containers:  []corev1.Container{{Name: "main", Image: "public.ecr.aws/docker/library/busybox:1.37"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, waitRunning(t, pod))
		names = append(names, name)
	}
	start := time.Now()
	if err := pods.Delete(ctx, names[1], metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(jobTimeout); ; time.Sleep(50 * time.Millisecond) {
		if i, _ := lab.Stack.EC2.Instance(ids[1]); i.State == ec2server.ShuttingDown || i.State == ec2server.Terminated {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("instance %s of the deleted Pod still not terminated", ids[1])
		}
	}
	// Several status periods for any stray termination to show.
	time.Sleep(10 * syncPeriod)
	for _, i := range []int{0, 2} {
		if inst, _ := lab.Stack.EC2.Instance(ids[i]); inst.State != ec2server.Running {
			t.Errorf("instance %s of %s is %s, want running", ids[i], names[i], inst.State)
		}
		if got, err := pods.Get(ctx, names[i], metav1.GetOptions{}); err != nil || got.Status.Phase != corev1.PodRunning {
			t.Errorf("Pod %s: %v, want Running", names[i], err)
		}
	}
	terminated := 0
	for _, c := range lab.Stack.EC2.Calls() {
		if c.Action != "TerminateInstances" || c.Time.Before(start) {
			continue
		}
		if !slices.Equal(c.InstanceIDs, ids[1:2]) {
			t.Errorf("TerminateInstances of %v, want only %s", c.InstanceIDs, ids[1])
		}
		terminated++
	}
	if terminated == 0 {
		t.Errorf("no TerminateInstances call for %s", ids[1])
	}
}

// waitNewPod waits for a Pod matching selector and not in seen, and returns it.
func waitNewPod(t *testing.T, ns, selector string, seen map[types.UID]bool) *corev1.Pod {
	t.Helper()
	for deadline := time.Now().Add(jobTimeout); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		list, err := lab.Stack.Kube.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			t.Fatal(err)
		}
		for _, pod := range list.Items {
			if !seen[pod.UID] {
				return &pod
			}
		}
	}
	t.Fatalf("no new Pod for %s in %s", selector, ns)
	return nil
}

// stateEvent is EventBridge's notice that the instance reached state.
func stateEvent(t *testing.T, id string, state ec2server.State) []byte {
	t.Helper()
	payload, err := json.Marshal(replay.StateChangeEvent("state-"+id, id, string(state), time.Now().UTC()))
	if err != nil {
		t.Fatal(err)
	}
	return payload
}
