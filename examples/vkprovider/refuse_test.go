package vkprovider_test

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reaper-k8s/reaper/examples/vkprovider"
)

// A Pod whose environment comes from references (a Secret's key, a
// ConfigMap) is refused as the provider's own check says, with no instance
// launched: virtual-kubelet's pod controller would otherwise resolve the
// references first and hand the provider literal values, and the Secret's
// value would be rendered into the instance's user-data.
func TestE2ERefusesEnvFromReferences(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	const ns, secret = "e2e-refused", "s3cr3t-value-e2e"
	if err := lab.Stack.EnsureNamespaces(ctx, ns); err != nil {
		t.Fatal(err)
	}
	kube := lab.Stack.Kube.CoreV1()
	if _, err := kube.Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "db"}, StringData: map[string]string{"pw": secret}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "settings"}, Data: map[string]string{"MODE": "full"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod, err := kube.Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "refused"},
		Spec: corev1.PodSpec{
			NodeName:      nodeName,
			Tolerations:   []corev1.Toleration{{Key: vkprovider.Taint.Key, Operator: corev1.TolerationOpEqual, Value: vkprovider.Taint.Value, Effect: vkprovider.Taint.Effect}},
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name: "main", Image: "public.ecr.aws/docker/library/busybox:1.37", Command: []string{"sh", "-c", "exit 0"},
				Env: []corev1.EnvVar{{Name: "PW", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
					LocalObjectReference: corev1.LocalObjectReference{Name: "db"}, Key: "pw"}}}},
				EnvFrom: []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}}}},
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	deadline := time.Now().Add(jobTimeout)
	for {
		got, err := kube.Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Status.Phase == corev1.PodFailed {
			for _, want := range []string{"env PW comes from a reference (valueFrom), which is not supported", "envFrom is not supported"} {
				if !strings.Contains(got.Status.Message, want) {
					t.Errorf("Pod failed with %q: %q, want it to say %q", got.Status.Reason, got.Status.Message, want)
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Pod %s not refused within %v: phase %s, reason %q, message %q", pod.Name, jobTimeout, got.Status.Phase, got.Status.Reason, got.Status.Message)
		}
		time.Sleep(syncPeriod)
	}
	for _, c := range lab.Stack.EC2.Calls() {
		if c.Action == "RunInstances" && c.Params.Get("ClientToken") == string(pod.UID) {
			t.Errorf("an instance was launched for the refused Pod %s", pod.Name)
		}
	}
}
