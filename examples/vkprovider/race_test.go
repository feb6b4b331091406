package vkprovider_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reaper-k8s/reaper/examples/vkprovider"
	"github.com/reaper-k8s/reaper/internal/ec2server"
	"github.com/reaper-k8s/reaper/internal/labstack"
	"github.com/reaper-k8s/reaper/pkg/intake"
)

// racePods is how many Pods race the provider: enough for the provider's
// write to land first in some of them were Reaper to terminate before it
// writes.
const racePods = 200

// A provider that reports "instance gone" as soon as it sees the instance
// shutting down (polling every few ms, notifying at once) never ends a Pod:
// Reaper has written the Pod's exit before it terminates the instance, so
// each Pod keeps Reaper's phase, exit code and reason.
func TestE2ENoRaceWithInstanceStateProvider(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	const raceNode = vkprovider.NodePrefix + "node-race"
	provCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- vkprovider.RunStatusFromInstance(provCtx, vkprovider.Config{
			NodeName: raceNode, Cluster: labstack.Cluster, Kube: lab.Stack.Kube, EC2: ec2Client,
			ImageID: "ami-0123456789abcdef0", InstanceType: ec2types.InstanceTypeG5Xlarge, StatusSyncPeriod: 5 * time.Millisecond,
			InstanceProfile: hostProfile, SubnetIDs: hostSubnets, SecurityGroupIDs: hostSecurityGroups,
		})
	}()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("provider: %v", err)
		}
	})

	ns := "e2e-no-race"
	if err := lab.Stack.EnsureNamespaces(ctx, ns); err != nil {
		t.Fatal(err)
	}
	pods := lab.Stack.Kube.CoreV1().Pods(ns)
	w, err := pods.Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	watched := watchPods(w)
	defer w.Stop()
	create := func(name string) *corev1.Pod {
		pod, err := pods.Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PodSpec{NodeName: raceNode, RestartPolicy: corev1.RestartPolicyNever,
				Tolerations: []corev1.Toleration{{Key: vkprovider.Taint.Key, Operator: corev1.TolerationOpEqual, Value: vkprovider.Taint.Value, Effect: vkprovider.Taint.Effect}},
				Containers:  []corev1.Container{{Name: "main", Image: "public.ecr.aws/docker/library/busybox:1.37"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return pod
	}

	// The control Pod shows the provider does race: its instance goes with
	// nothing from Reaper, and the provider ends it as gone.
	control := create("control")
	lab.Stack.EC2.SetState(waitRunning(t, control), ec2server.Terminated)
	for deadline := time.Now().Add(jobTimeout); ; time.Sleep(20 * time.Millisecond) {
		got, err := pods.Get(ctx, control.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if cs := got.Status.ContainerStatuses; got.Status.Phase == corev1.PodFailed && len(cs) == 1 && cs[0].State.Terminated != nil && cs[0].State.Terminated.Reason == vkprovider.InstanceGone {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("control Pod: phase %s, containers %+v; want Failed, %s", got.Status.Phase, got.Status.ContainerStatuses, vkprovider.InstanceGone)
		}
	}

	// Each Pod's exit goes once it is Running; odd Pods fail.
	codes := map[string]int{}
	for i := range racePods {
		codes[create(fmt.Sprintf("worker-%03d", i)).Name] = 3 * (i % 2)
	}
	sent := map[string]bool{}
	var list *corev1.PodList
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if list, err = pods.List(ctx, metav1.ListOptions{}); err != nil {
			t.Fatal(err)
		}
		ended := 0
		for _, pod := range list.Items {
			if _, ok := codes[pod.Name]; !ok {
				continue
			}
			if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
				ended++
			}
			if sent[pod.Name] || pod.Status.Phase != corev1.PodRunning {
				continue
			}
			// Not waiting for the reconciler: it takes the exits in
			// batches, all the Pod writes before one terminate.
			id, err := instanceOf(ctx, &pod)
			if err != nil {
				t.Fatal(err)
			}
			token, err := hostToken(id, &pod)
			if err != nil {
				t.Fatal(err)
			}
			payload, err := exitEvent(id, &pod, host{exitCode: codes[pod.Name]}, time.Now().UTC().Truncate(time.Millisecond), token)
			if err != nil {
				t.Fatal(err)
			}
			var sum intake.ExitSummary
			if err := lab.InvokeOnly(ctx, "exitrecorder", payload, &sum); err != nil || sum.Recorded != 1 || sum.Queued != 1 {
				t.Fatalf("exitrecorder for %s: %+v, %v; want the line recorded and its claim queued", pod.Name, sum, err)
			}
			sent[pod.Name] = true
		}
		if ended == racePods {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d Pods ended, %d exit lines sent", ended, racePods, len(sent))
		}
	}
	// Every terminate sent, then many provider polls for a late "instance
	// gone" to land.
	if err := lab.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if list, err = pods.List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, pod := range list.Items {
		code, ok := codes[pod.Name]
		if !ok {
			continue
		}
		phase, reason := corev1.PodSucceeded, "Completed"
		if code != 0 {
			phase, reason = corev1.PodFailed, "Error"
		}
		if len(pod.Status.ContainerStatuses) != 1 {
			t.Errorf("Pod %s: %d container statuses", pod.Name, len(pod.Status.ContainerStatuses))
			continue
		}
		term := pod.Status.ContainerStatuses[0].State.Terminated
		if pod.Status.Phase != phase || term == nil || int(term.ExitCode) != code || term.Reason != reason {
			t.Errorf("Pod %s: phase %s, container %+v; want %s, exit %d %s", pod.Name, pod.Status.Phase, pod.Status.ContainerStatuses[0].State, phase, code, reason)
		}
	}
	if created, flips := watched(); created != racePods+1 || len(flips) > 0 {
		t.Errorf("%d Pods created (want %d), terminal statuses changed: %v", created, racePods+1, flips)
	}
}
