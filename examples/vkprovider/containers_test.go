package vkprovider_test

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/reaper-k8s/reaper/examples/vkprovider"
	"github.com/reaper-k8s/reaper/internal/ec2server"
	"github.com/reaper-k8s/reaper/pkg/podstatus"
)

// Pods of several containers, end to end: each container's exit line
// reaches Reaper from the instance's log stream as the wrapper writes it,
// every line but the Pod's last saying that others run on.

const busybox = "public.ecr.aws/docker/library/busybox:1.37"

// onNode is a Pod spec of the containers for the virtual node.
func onNode(inits, containers []corev1.Container) corev1.PodSpec {
	return corev1.PodSpec{
		NodeName:       nodeName,
		Tolerations:    []corev1.Toleration{{Key: vkprovider.Taint.Key, Operator: corev1.TolerationOpEqual, Value: vkprovider.Taint.Value, Effect: vkprovider.Taint.Effect}},
		RestartPolicy:  corev1.RestartPolicyNever,
		InitContainers: inits,
		Containers:     containers,
	}
}

func exits(name string, code int) corev1.Container {
	return corev1.Container{Name: name, Image: busybox, Command: []string{"sh", "-c", fmt.Sprintf("exit %d", code)}}
}

// statusNamed is the status of the container called name, init or
// regular.
func statusNamed(pod *corev1.Pod, name string) corev1.ContainerStatus {
	for _, cs := range slices.Concat(pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses) {
		if cs.Name == name {
			return cs
		}
	}
	return corev1.ContainerStatus{}
}

// isRunning says whether the container called name runs.
func isRunning(pod *corev1.Pod, name string) error {
	if cs := statusNamed(pod, name); cs.State.Running == nil {
		return fmt.Errorf("container %s: %+v, want running", name, cs.State)
	}
	return nil
}

// isTerminated says whether the container called name shows the exit
// code and reason.
func isTerminated(pod *corev1.Pod, name string, code int32, reason string) error {
	if t := statusNamed(pod, name).State.Terminated; t == nil || t.ExitCode != code || t.Reason != reason {
		return fmt.Errorf("container %s: %+v, want terminated %d %s", name, statusNamed(pod, name).State, code, reason)
	}
	return nil
}

// isPhase says whether the Pod is in phase.
func isPhase(pod *corev1.Pod, phase corev1.PodPhase) error {
	if pod.Status.Phase != phase {
		return fmt.Errorf("phase %s, want %s", pod.Status.Phase, phase)
	}
	return nil
}

// hasCondition says whether the Pod's condition typ has status.
func hasCondition(pod *corev1.Pod, typ corev1.PodConditionType, status corev1.ConditionStatus) error {
	for _, c := range pod.Status.Conditions {
		if c.Type == typ && c.Status == status {
			return nil
		}
	}
	return fmt.Errorf("conditions %+v, want %s %s", pod.Status.Conditions, typ, status)
}

// whole says whether the Pod has a complete status for each of its
// containers, in spec order, each in exactly one state.
func whole(pod *corev1.Pod) error {
	for _, l := range []struct {
		spec []corev1.Container
		sts  []corev1.ContainerStatus
	}{{pod.Spec.InitContainers, pod.Status.InitContainerStatuses}, {pod.Spec.Containers, pod.Status.ContainerStatuses}} {
		if len(l.sts) != len(l.spec) {
			return fmt.Errorf("%d statuses for %d containers", len(l.sts), len(l.spec))
		}
		for i, cs := range l.sts {
			states := 0
			for _, set := range []bool{cs.State.Waiting != nil, cs.State.Running != nil, cs.State.Terminated != nil} {
				if set {
					states++
				}
			}
			if cs.Name != l.spec[i].Name || cs.Image == "" || states != 1 {
				return fmt.Errorf("status %d %+v for container %s: want its name, image and one state", i, cs, l.spec[i].Name)
			}
		}
	}
	return nil
}

// all is every check of the Pod, nil when all hold.
func all(pod *corev1.Pod, checks ...func(*corev1.Pod) error) error {
	for _, check := range append([]func(*corev1.Pod) error{whole}, checks...) {
		if err := check(pod); err != nil {
			return err
		}
	}
	return nil
}

// waitPod waits until the Pod passes the checks and returns it.
func waitPod(t *testing.T, pod *corev1.Pod, checks ...func(*corev1.Pod) error) *corev1.Pod {
	t.Helper()
	var err error
	for deadline := time.Now().Add(jobTimeout); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		got, getErr := lab.Stack.Kube.CoreV1().Pods(pod.Namespace).Get(t.Context(), pod.Name, metav1.GetOptions{})
		if getErr != nil {
			t.Fatal(getErr)
		}
		if err = all(got, checks...); err == nil {
			return got
		}
	}
	t.Fatalf("Pod %s: %v", pod.Name, err)
	return nil
}

// wantLive waits several of the provider's status periods and wants the
// Pod still to pass the checks, and its instance to run: the line just
// sent ended neither.
func wantLive(t *testing.T, pod *corev1.Pod, id string, checks ...func(*corev1.Pod) error) {
	t.Helper()
	time.Sleep(5 * syncPeriod)
	got, err := lab.Stack.Kube.CoreV1().Pods(pod.Namespace).Get(t.Context(), pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := all(got, checks...); err != nil {
		t.Fatalf("Pod %s: %v", pod.Name, err)
	}
	if i, _ := lab.Stack.EC2.Instance(id); i.State != ec2server.Running {
		t.Fatalf("instance %s %s, want running", id, i.State)
	}
}

// send plays the host's exit line for the Pod and wants it recorded and
// its claim queued.
func send(t *testing.T, pod *corev1.Pod, exit host) {
	t.Helper()
	sum, err := sendExit(t.Context(), "exitrecorder", pod, exit)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Recorded != 1 || sum.Queued != 1 || sum.Rejected != 0 {
		t.Fatalf("exitrecorder for %s of %s: %+v, want the line recorded and its claim queued", exit.name(), pod.Name, sum)
	}
}

// wantTerminatedOnce waits several status periods and wants the instance
// terminated by one TerminateInstances.
func wantTerminatedOnce(t *testing.T, id string) {
	t.Helper()
	time.Sleep(10 * syncPeriod)
	if i, _ := lab.Stack.EC2.Instance(id); i.State != ec2server.Terminated && i.State != ec2server.ShuttingDown {
		t.Errorf("instance %s %s, want terminated", id, i.State)
	}
	n := 0
	for _, c := range lab.Stack.EC2.Calls() {
		if c.Action == "TerminateInstances" && slices.Contains(c.InstanceIDs, id) {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d TerminateInstances of %s, want 1", n, id)
	}
}

// watchNamespace watches the Pods of namespace ns from now on, as
// watchPods reports them, and fails the test at its end if a container's
// end, once shown, was ever taken back (wantEndsKept).
func watchNamespace(t *testing.T, ns string) func() (int, []string) {
	t.Helper()
	ctx := t.Context()
	if err := lab.Stack.EnsureNamespaces(ctx, ns); err != nil {
		t.Fatal(err)
	}
	pods := lab.Stack.Kube.CoreV1().Pods(ns)
	w, err := pods.Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	ends, err := pods.Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wantEndsKept(t, ends)
	return watchPods(w)
}

// wantEndsKept fails the test, at its end, if any Pod from w showed a
// container terminated and later not (other than waiting to restart): a
// container's end comes from Reaper's write alone, and the provider's own
// statuses, which it writes whole, must keep it. Under restartPolicy
// Never the apiserver refuses such a write; the test then sees the
// provider's later changes missing instead (the Pod left Pending once its
// init container ended).
func wantEndsKept(t *testing.T, w watch.Interface) {
	var (
		mu    sync.Mutex
		ended = map[string]*corev1.ContainerStateTerminated{}
		taken []string
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			mu.Lock()
			for _, cs := range slices.Concat(pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses) {
				k := string(pod.UID) + "/" + cs.Name
				if cs.State.Terminated != nil {
					ended[k] = cs.State.Terminated
				} else if first, ok := ended[k]; ok && cs.LastTerminationState.Terminated == nil {
					taken = append(taken, fmt.Sprintf("%s at resourceVersion %s: container %s %+v after terminated %+v",
						pod.Name, pod.ResourceVersion, cs.Name, cs.State, first))
				}
			}
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		w.Stop()
		<-done
		mu.Lock()
		defer mu.Unlock()
		if len(taken) > 0 {
			t.Errorf("container ends taken back: %v", taken)
		}
	})
}

// startJob creates the Job in namespace ns, watching its Pods, and
// returns it with its first Pod and the watch's report (watchPods).
func startJob(t *testing.T, ns string, job *batchv1.Job) (*batchv1.Job, *corev1.Pod, func() (int, []string)) {
	t.Helper()
	watched := watchNamespace(t, ns)
	job, err := lab.Stack.Kube.BatchV1().Jobs(ns).Create(t.Context(), job, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return job, waitNewPod(t, ns, metav1.FormatLabelSelector(job.Spec.Selector), nil), watched
}

// wantJobComplete waits for the Job to end and wants it Complete with one
// Pod succeeded, none failed, and no other Pod ever made, whose terminal
// status never changed.
func wantJobComplete(t *testing.T, job *batchv1.Job, watched func() (int, []string)) {
	t.Helper()
	ctx := t.Context()
	jobs := lab.Stack.Kube.BatchV1().Jobs(job.Namespace)
	for deadline := time.Now().Add(jobTimeout); !condition(job, batchv1.JobComplete) && !condition(job, batchv1.JobFailed); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("Job status %+v, want it ended", job.Status)
		}
		var err error
		if job, err = jobs.Get(ctx, job.Name, metav1.GetOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if !condition(job, batchv1.JobComplete) || job.Status.Succeeded != 1 || job.Status.Failed != 0 {
		t.Fatalf("Job status %+v, want Complete with 1 succeeded and 0 failed", job.Status)
	}
	// Many status periods for a second Pod or a changed status to show.
	time.Sleep(10 * syncPeriod)
	list, err := lab.Stack.Kube.CoreV1().Pods(job.Namespace).List(ctx, metav1.ListOptions{LabelSelector: metav1.FormatLabelSelector(job.Spec.Selector)})
	if err != nil {
		t.Fatal(err)
	}
	if created, flips := watched(); created != 1 || len(list.Items) != 1 || len(flips) > 0 {
		t.Fatalf("%d Pods created, %d left, terminal statuses changed: %v; want 1, 1, none", created, len(list.Items), flips)
	}
}

// The seed's Job: the init container downloader exits 0, then the
// installer, whose work restarts the container runtime under it, exits 0.
// The provider shows the Pod as the kubelet does at its start (the
// downloader running, the installer waiting for it, Pending, not ready),
// since it cannot see the downloader end. The downloader's line, others
// running, ends neither the Pod nor the instance: the Pod shows it
// completed and runs the installer. The installer's line, the Pod's last,
// completes the Job once, with one Pod, and terminates the instance once.
func TestE2EInitThenInstaller(t *testing.T) {
	t.Parallel()
	job := newJob(0)
	job.Spec.Template.Spec = onNode([]corev1.Container{exits("downloader", 0)}, []corev1.Container{exits("installer", 0)})
	job, pod, watched := startJob(t, "e2e-init-installer", job)

	pod = waitPod(t, pod, func(p *corev1.Pod) error { return isRunning(p, "downloader") })
	if err := all(pod, func(p *corev1.Pod) error { return isPhase(p, corev1.PodPending) },
		func(p *corev1.Pod) error {
			if w := statusNamed(p, "installer").State.Waiting; w == nil || w.Reason != podstatus.ReasonPodInitializing {
				return fmt.Errorf("installer %+v, want waiting %s", statusNamed(p, "installer").State, podstatus.ReasonPodInitializing)
			}
			return nil
		},
		func(p *corev1.Pod) error { return hasCondition(p, corev1.PodInitialized, corev1.ConditionFalse) },
		func(p *corev1.Pod) error { return hasCondition(p, corev1.PodReady, corev1.ConditionFalse) },
	); err != nil {
		t.Fatalf("Pod %s while the downloader runs: %v", pod.Name, err)
	}
	id, err := instanceOf(t.Context(), pod)
	if err != nil {
		t.Fatal(err)
	}

	send(t, pod, host{container: "downloader", othersRunning: true})
	initialized := []func(*corev1.Pod) error{
		func(p *corev1.Pod) error { return isPhase(p, corev1.PodRunning) },
		func(p *corev1.Pod) error { return isTerminated(p, "downloader", 0, podstatus.ReasonCompleted) },
		func(p *corev1.Pod) error { return isRunning(p, "installer") },
		func(p *corev1.Pod) error { return hasCondition(p, corev1.PodInitialized, corev1.ConditionTrue) },
		func(p *corev1.Pod) error { return hasCondition(p, corev1.PodReady, corev1.ConditionTrue) },
	}
	waitPod(t, pod, initialized...)
	wantLive(t, pod, id, initialized...)

	send(t, pod, host{container: "installer", runtimeRestarted: true})
	wantJobComplete(t, job, watched)
	waitPod(t, pod, func(p *corev1.Pod) error { return isPhase(p, corev1.PodSucceeded) },
		func(p *corev1.Pod) error { return isTerminated(p, "downloader", 0, podstatus.ReasonCompleted) },
		func(p *corev1.Pod) error { return isTerminated(p, "installer", 0, podstatus.ReasonCompleted) })
	wantTerminatedOnce(t, id)
}

// A Job whose Pod has a native sidecar: main's exit 0 leaves the sidecar
// running, the Pod Running and the instance up; the sidecar's exit when
// the host stops it (143, SIGTERM), the Pod's last line, completes the
// Job: the Pod Succeeded with the sidecar shown terminated, the instance
// terminated once, and still once after the wake-up Reaper queued for the
// end of the sidecar's grace has come and gone.
func TestE2ESidecarJob(t *testing.T) {
	t.Parallel()
	always := corev1.ContainerRestartPolicyAlways
	proxy := corev1.Container{Name: "proxy", Image: busybox, Command: []string{"sleep", "infinity"}, RestartPolicy: &always}
	job := newJob(0)
	job.Spec.Template.Spec = onNode([]corev1.Container{proxy}, []corev1.Container{exits("main", 0)})
	// The sidecar's line comes a few seconds after main's, well within
	// the grace. The sidecar's exit line waits for the queue to drain
	// (sendExit), the wake-up at the grace's end included, and so does
	// every test's line sent meanwhile: a short grace keeps that short.
	grace := int64(10)
	job.Spec.Template.Spec.TerminationGracePeriodSeconds = &grace
	job, pod, watched := startJob(t, "e2e-sidecar", job)

	pod = waitPod(t, pod, func(p *corev1.Pod) error { return isPhase(p, corev1.PodRunning) },
		func(p *corev1.Pod) error { return isRunning(p, "proxy") },
		func(p *corev1.Pod) error { return isRunning(p, "main") },
		func(p *corev1.Pod) error { return hasCondition(p, corev1.PodReady, corev1.ConditionTrue) })
	id, err := instanceOf(t.Context(), pod)
	if err != nil {
		t.Fatal(err)
	}

	send(t, pod, host{othersRunning: true})
	mainEnded := []func(*corev1.Pod) error{
		func(p *corev1.Pod) error { return isPhase(p, corev1.PodRunning) },
		func(p *corev1.Pod) error { return isTerminated(p, "main", 0, podstatus.ReasonCompleted) },
		func(p *corev1.Pod) error { return isRunning(p, "proxy") },
	}
	waitPod(t, pod, mainEnded...)
	wantLive(t, pod, id, mainEnded...)

	send(t, pod, host{container: "proxy", exitCode: 143, signal: "SIGTERM"})
	wantJobComplete(t, job, watched)
	pod = waitPod(t, pod, func(p *corev1.Pod) error { return isPhase(p, corev1.PodSucceeded) },
		func(p *corev1.Pod) error { return isTerminated(p, "main", 0, podstatus.ReasonCompleted) },
		func(p *corev1.Pod) error { return isTerminated(p, "proxy", 143, podstatus.ReasonError) })
	if sig := statusNamed(pod, "proxy").State.Terminated.Signal; sig != 15 {
		t.Errorf("proxy ended by signal %d, want 15", sig)
	}
	wantTerminatedOnce(t, id)
}

// A Pod of two containers: the first one's exit 0 shows while the second
// runs (the Pod Running, its instance up, for many status periods: the
// provider keeps what Reaper wrote); the second one's exit 3 fails the
// Pod with both exits shown, and terminates the instance once.
func TestE2ETwoContainers(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	ns := "e2e-two-containers"
	watched := watchNamespace(t, ns)
	pod, err := lab.Stack.Kube.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "pair"},
		Spec: onNode(nil, []corev1.Container{exits("a", 0), exits("b", 3)})}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod = waitPod(t, pod, func(p *corev1.Pod) error { return isPhase(p, corev1.PodRunning) },
		func(p *corev1.Pod) error { return isRunning(p, "a") },
		func(p *corev1.Pod) error { return isRunning(p, "b") })
	id, err := instanceOf(ctx, pod)
	if err != nil {
		t.Fatal(err)
	}

	send(t, pod, host{container: "a", othersRunning: true})
	aEnded := []func(*corev1.Pod) error{
		func(p *corev1.Pod) error { return isPhase(p, corev1.PodRunning) },
		func(p *corev1.Pod) error { return isTerminated(p, "a", 0, podstatus.ReasonCompleted) },
		func(p *corev1.Pod) error { return isRunning(p, "b") },
		func(p *corev1.Pod) error { return hasCondition(p, corev1.PodReady, corev1.ConditionFalse) },
	}
	waitPod(t, pod, aEnded...)
	wantLive(t, pod, id, aEnded...)

	send(t, pod, host{container: "b", exitCode: 3})
	waitPod(t, pod, func(p *corev1.Pod) error { return isPhase(p, corev1.PodFailed) },
		func(p *corev1.Pod) error { return isTerminated(p, "a", 0, podstatus.ReasonCompleted) },
		func(p *corev1.Pod) error { return isTerminated(p, "b", 3, podstatus.ReasonError) })
	wantTerminatedOnce(t, id)
	if created, flips := watched(); created != 1 || len(flips) > 0 {
		t.Errorf("%d Pods created, terminal statuses changed: %v; want 1, none", created, flips)
	}
}
