package vkprovider

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reaper-k8s/reaper/pkg/userdata"
)

// jobPod is the seed's Job Pod as the apiserver defaults it: an init
// container that downloads into an emptyDir, a sidecar, then the
// provisioner.
func jobPod() *corev1.Pod {
	always := corev1.ContainerRestartPolicyAlways
	grace := int64(45)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "batch", Name: "provision-8fj2k", UID: "7a2b3c4d-5e6f-4a8b-9c0d-1e2f3a4b5c6d"},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: &grace,
			Volumes: []corev1.Volume{{Name: "work", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
			InitContainers: []corev1.Container{
				{Name: "proxy", Image: "envoyproxy/envoy:v1.31", RestartPolicy: &always,
					TerminationMessagePath: "/dev/termination-log", TerminationMessagePolicy: corev1.TerminationMessageReadFile},
				{Name: "downloader", Image: "fetch:2", Command: []string{"/bin/fetch"}, Args: []string{"--to", "/work"},
					Env:                    []corev1.EnvVar{{Name: "REGION", Value: "eu-west-1"}},
					VolumeMounts:           []corev1.VolumeMount{{Name: "work", MountPath: "/work"}},
					TerminationMessagePath: "/dev/termination-log", TerminationMessagePolicy: corev1.TerminationMessageReadFile},
			},
			Containers: []corev1.Container{{Name: "provisioner", Image: "provision:3",
				VolumeMounts:           []corev1.VolumeMount{{Name: "work", MountPath: "/work", ReadOnly: true}},
				TerminationMessagePath: "/tmp/msg", TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError}},
		},
	}
}

// A Pod of several containers maps to what the host runs, field by field.
func TestHostPod(t *testing.T) {
	up, err := hostPod(jobPod())
	if err != nil {
		t.Fatal(err)
	}
	if len(up.InitContainers) != 2 || up.InitContainers[0].RestartPolicy != userdata.RestartAlways || up.InitContainers[1].RestartPolicy != "" ||
		len(up.Containers) != 1 || up.RestartPolicy != userdata.RestartNever || *up.TerminationGracePeriodSeconds != 45 ||
		len(up.Volumes) != 1 || up.Volumes[0].EmptyDir == nil {
		t.Errorf("host Pod: %+v", up)
	}
	d := up.InitContainers[1]
	if d.Command[0] != "/bin/fetch" || d.Args[1] != "/work" || d.Env[0] != (userdata.EnvVar{Name: "REGION", Value: "eu-west-1"}) ||
		d.VolumeMounts[0] != (userdata.VolumeMount{Name: "work", MountPath: "/work"}) {
		t.Errorf("downloader: %+v", d)
	}
	p := up.Containers[0]
	if p.TerminationMessagePath != "/tmp/msg" || p.TerminationMessagePolicy != userdata.TerminationMessageFallbackToLogsOnError || !p.VolumeMounts[0].ReadOnly {
		t.Errorf("provisioner: %+v", p)
	}
	if _, err := userdata.Launch(up, userdata.Options{Cluster: "prod"}); err != nil {
		t.Errorf("Launch: %v", err)
	}
}

// What the host cannot do as the spec says is refused, every problem in
// one error.
func TestHostPodRefusals(t *testing.T) {
	pod := jobPod()
	pod.Spec.Volumes = append(pod.Spec.Volumes,
		corev1.Volume{Name: "cfg", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{}}},
		corev1.Volume{Name: "mem", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}})
	pod.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debug", Image: "busybox"}}}
	pod.Spec.HostNetwork = true
	pod.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "PW", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{Key: "pw"}}}}
	pod.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{{}}
	pod.Spec.Containers[0].VolumeMounts[0].SubPath = "sub"
	_, err := hostPod(pod)
	for _, want := range []string{"volume cfg: only emptyDir", `volume mem: emptyDir medium "Memory"`, "ephemeral containers", "hostNetwork",
		"env PW comes from a reference", "envFrom", "with a subPath"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %v, want it to mention %q", err, want)
		}
	}
}

// The service account token the apiserver's ServiceAccount admission
// mounts into every Pod (a projected volume, in every container) is
// refused once, with what to set, not as an unknown volume kind and a
// mount of a missing volume in each container.
func TestHostPodServiceAccountToken(t *testing.T) {
	pod := jobPod()
	const vol = "kube-api-access-x7k2p"
	expiry := int64(3607)
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: vol, VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
		Sources: []corev1.VolumeProjection{
			{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{ExpirationSeconds: &expiry, Path: "token"}},
			{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"}}},
		},
	}}})
	mount := corev1.VolumeMount{Name: vol, MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true}
	for i := range pod.Spec.InitContainers {
		pod.Spec.InitContainers[i].VolumeMounts = append(pod.Spec.InitContainers[i].VolumeMounts, mount)
	}
	pod.Spec.Containers[0].VolumeMounts = append(pod.Spec.Containers[0].VolumeMounts, mount)
	_, err := hostPod(pod)
	want := "volume " + vol + ": the service account token is not supported: set automountServiceAccountToken: false on the Pod or its ServiceAccount"
	if err == nil || err.Error() != want {
		t.Errorf("refusal %v\nwant %s", err, want)
	}
}
