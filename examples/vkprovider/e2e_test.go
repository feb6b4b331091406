package vkprovider_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/reaper-k8s/reaper/examples/vkprovider"
	"github.com/reaper-k8s/reaper/internal/ec2server"
	"github.com/reaper-k8s/reaper/internal/labstack"
	"github.com/reaper-k8s/reaper/internal/replay"
	"github.com/reaper-k8s/reaper/pkg/exitline"
	"github.com/reaper-k8s/reaper/pkg/intake"
	"github.com/reaper-k8s/reaper/pkg/model"
)

const (
	nodeName = "reaper-virtual-node-e2e"
	// syncPeriod is the provider's status period: short, so that a test
	// spans many of them.
	syncPeriod = 200 * time.Millisecond
	// jobTimeout bounds a Job's run from creation to its end.
	jobTimeout = 40 * time.Second
	// dryRunWait is how long a Job must stay unfinished when Reaper writes
	// nothing: many status periods and Job controller syncs.
	dryRunWait = 5 * time.Second
	// dryRunRecorder is the exitrecorder of a deployment with
	// REAPER_DRY_RUN=true (dryLab): its work queue and reconciler are dry
	// too, as one deployment's knob makes them.
	dryRunRecorder = "exitrecorder-dry-run"
	// exitWait is the labs' exit-wait window: short, so that a lost Pod is
	// finalized within a test.
	exitWait = 3 * time.Second
	// ledgerOnly records the exit in the ledger, as when Reaper's Pod write
	// has not landed (the apiserver was down), checks that the Pod stays
	// Running while its instance runs, and then powers the host off, as
	// the default user-data does once the line is shipped.
	ledgerOnly = "ledger-only"
)

var (
	lab *replay.Lab
	// dryLab is a second deployment on the same stack with Reaper's writes
	// switched off: its own ledger table, queue and reconciler.
	dryLab    *replay.Lab
	ec2Client *ec2.Client
)

func TestMain(m *testing.M) {
	env := []string{"REAPER_EXIT_WAIT=" + exitWait.String(), "REAPER_ORPHAN_GRACE=1m"}
	stack := labstack.Options{Controllers: []string{"job-controller"}}
	replay.RunTests(10*time.Minute, stack, "reaper-ledger", env, func(ctx context.Context, l *replay.Lab) (int, error) {
		lab = l
		return run(ctx, m)
	})
}

// run starts the dry-run lab and the provider on the shared lab's stack and
// runs the tests.
func run(ctx context.Context, m *testing.M) (int, error) {
	var err error
	dryLab, err = replay.NewLabWith(ctx, lab.Stack, "reaper-ledger-dry-run",
		map[string]string{"exitrecorder": lab.Bootstraps["exitrecorder"], "reconciler": lab.Bootstraps["reconciler"]},
		replay.LabOptions{Env: []string{"REAPER_DRY_RUN=true", "REAPER_EXIT_WAIT=" + exitWait.String()}, MaxConcurrency: 1})
	if err != nil {
		return 0, err
	}
	defer dryLab.Stop()

	ec2Client = ec2.NewFromConfig(lab.Stack.AWSConfig(ctx))
	provCtx, stopProvider := context.WithCancel(ctx)
	provDone := make(chan error, 1)
	go func() {
		provDone <- vkprovider.Run(provCtx, vkprovider.Config{
			NodeName: nodeName, Cluster: labstack.Cluster, Kube: lab.Stack.Kube, EC2: ec2Client, Ledger: lab.Ledger,
			ImageID: "ami-0123456789abcdef0", InstanceType: ec2types.InstanceTypeG5Xlarge, StatusSyncPeriod: syncPeriod,
			InstanceProfile: hostProfile, SubnetIDs: hostSubnets, SecurityGroupIDs: hostSecurityGroups,
		})
	}()
	defer func() {
		stopProvider()
		<-provDone
	}()

	code := m.Run()
	if code != 0 {
		for name, f := range lab.Functions {
			fmt.Fprintf(os.Stderr, "--- %s output:\n%s\n", name, f.Logs())
		}
		for i, f := range lab.Reconcilers[1:] {
			fmt.Fprintf(os.Stderr, "--- reconciler %d output:\n%s\n", i+2, f.Logs())
		}
		for name, f := range dryLab.Functions {
			fmt.Fprintf(os.Stderr, "--- dry-run %s output:\n%s\n", name, f.Logs())
		}
	}
	return code, nil
}

// host plays one exit: what the wrapper on the instance writes and the
// CloudWatch agent ships.
type host struct {
	// container is the container that exited; "" is "main".
	container string
	exitCode  int
	// signal names the signal that ended it ("SIGTERM": the wrapper
	// stopping a sidecar once the regular containers ended).
	signal string
	// runtimeRestarted: the container runtime restarted under the
	// container, and the wrapper still learned its own outcome.
	runtimeRestarted bool
	// othersRunning: other containers of the Pod run on, or are still to
	// start, after this one; every line but the Pod's last.
	othersRunning bool
	// restartCount counts the times the host restarted the container
	// before this run.
	restartCount int32
	// goneFirst terminates the instance (as a spot reclaim or the wrapper's
	// own power-off does) several status periods before the line arrives.
	goneFirst bool
}

// jobRun is what became of a Job.
type jobRun struct {
	job *batchv1.Job
	// pods are the Job's Pods at the end, in creation order.
	pods []corev1.Pod
	// created counts the Pods ever created for the Job.
	created int
	// flips describes every status change of a Pod after it was terminal.
	flips []string
	// exits are exitrecorder's answers, one per Pod it was sent.
	exits []intake.ExitSummary
}

// runJob creates a Job of one completion bound to the virtual node and
// plays the host of each of its Pods: once the provider reports the Pod
// Running, the exit line goes through the named exitrecorder. It returns
// when the Job is Complete or Failed and then `settle` has passed, or with an
// error at the timeout. Each tweak changes the Job before it is created.
func runJob(ctx context.Context, ns string, backoffLimit int32, exit host, recorder string, timeout, settle time.Duration, tweaks ...func(*batchv1.Job)) (*jobRun, error) {
	if err := lab.Stack.EnsureNamespaces(ctx, ns); err != nil {
		return nil, err
	}
	jobs := lab.Stack.Kube.BatchV1().Jobs(ns)
	pods := lab.Stack.Kube.CoreV1().Pods(ns)
	w, err := pods.Watch(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	watched := watchPods(w)
	defer w.Stop()

	job := newJob(backoffLimit)
	for _, tweak := range tweaks {
		tweak(job)
	}
	job, err = jobs.Create(ctx, job, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	selector := metav1.FormatLabelSelector(job.Spec.Selector)
	out := &jobRun{}
	sent := map[types.UID]bool{}
	deadline := time.Now().Add(timeout)
	var ended time.Time
	for {
		if time.Now().After(deadline) {
			st := out.job.Status
			return out, fmt.Errorf("Job %s/%s did not end within %v: conditions %v, active %d, succeeded %d, failed %d",
				ns, job.Name, timeout, st.Conditions, st.Active, st.Succeeded, st.Failed)
		}
		if out.job, err = jobs.Get(ctx, job.Name, metav1.GetOptions{}); err != nil {
			return out, err
		}
		list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return out, err
		}
		out.pods = list.Items
		for _, pod := range list.Items {
			if sent[pod.UID] || pod.Status.Phase != corev1.PodRunning {
				continue
			}
			sum, err := sendExit(ctx, recorder, &pod, exit)
			if err != nil {
				return out, err
			}
			sent[pod.UID] = true
			out.exits = append(out.exits, sum)
		}
		if ended.IsZero() && (condition(out.job, batchv1.JobComplete) || condition(out.job, batchv1.JobFailed)) {
			ended = time.Now()
		}
		if !ended.IsZero() && time.Since(ended) >= settle {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	out.created, out.flips = watched()
	return out, nil
}

// newJob is a Job of one completion whose Pods run on the virtual node.
func newJob(backoffLimit int32) *batchv1.Job {
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "train"},
		Spec: batchv1.JobSpec{
			BackoffLimit: &backoffLimit,
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				NodeName:      nodeName,
				Tolerations:   []corev1.Toleration{{Key: vkprovider.Taint.Key, Operator: corev1.TolerationOpEqual, Value: vkprovider.Taint.Value, Effect: vkprovider.Taint.Effect}},
				RestartPolicy: corev1.RestartPolicyNever,
				Containers:    []corev1.Container{{Name: "main", Image: "public.ecr.aws/docker/library/busybox:1.37", Command: []string{"sh", "-c", "exit 0"}}},
			}},
		},
	}
}

// watchPods records the Pods' statuses from w. The function it returns
// stops recording and reports how many Pods were created and every status
// change of a Pod after its first terminal status.
func watchPods(w watch.Interface) func() (int, []string) {
	var (
		mu       sync.Mutex
		created  = map[types.UID]bool{}
		terminal = map[types.UID]*corev1.PodStatus{}
		flips    []string
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			mu.Lock()
			created[pod.UID] = true
			if first, ok := terminal[pod.UID]; ok && ev.Type != watch.Deleted && !apiequality.Semantic.DeepEqual(first, &pod.Status) {
				flips = append(flips, fmt.Sprintf("%s at resourceVersion %s: phase %s after %s", pod.Name, pod.ResourceVersion, pod.Status.Phase, first.Phase))
			}
			if _, ok := terminal[pod.UID]; !ok && (pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed) {
				terminal[pod.UID] = pod.Status.DeepCopy()
			}
			mu.Unlock()
		}
	}()
	return func() (int, []string) {
		w.Stop()
		<-done
		mu.Lock()
		defer mu.Unlock()
		return len(created), flips
	}
}

// sendExit finds the Pod's instance by its launch tags, as Reaper does, and
// sends the exit line from its log stream. It returns once the reconciler
// has done the work the exitrecorder queued.
func sendExit(ctx context.Context, recorder string, pod *corev1.Pod, exit host) (intake.ExitSummary, error) {
	var sum intake.ExitSummary
	id, err := instanceOf(ctx, pod)
	if err != nil {
		return sum, err
	}
	if exit.goneFirst {
		lab.Stack.EC2.SetState(id, ec2server.Terminated)
		if err := staysRunning(ctx, pod, "when its instance went, before its exit line"); err != nil {
			return sum, err
		}
	}
	finished := time.Now().UTC().Truncate(time.Millisecond)
	if recorder == ledgerOnly {
		if _, err := lab.Ledger.RecordExit(ctx, id, model.PodRef{Namespace: pod.Namespace, Name: pod.Name, UID: string(pod.UID)}, "",
			model.Exit{Container: exit.name(), ExitCode: exit.exitCode, StartedAt: finished.Add(-time.Minute), FinishedAt: finished}); err != nil {
			return sum, err
		}
		// The provider reads the ledger only for instances that ended:
		// while this one runs, the exit is Reaper's to write.
		if err := staysRunning(ctx, pod, "from the ledger while its instance ran"); err != nil {
			return sum, err
		}
		lab.Stack.EC2.SetState(id, ec2server.ShuttingDown)
		return intake.ExitSummary{InstanceID: id, Lines: 1, Recorded: 1}, nil
	}
	token, err := hostToken(id, pod)
	if err != nil {
		return sum, err
	}
	payload, err := exitEvent(id, pod, exit, finished, token)
	if err != nil {
		return sum, err
	}
	if recorder == dryRunRecorder {
		return sum, dryLab.Invoke(ctx, "exitrecorder", payload, &sum)
	}
	return sum, lab.Invoke(ctx, recorder, payload, &sum)
}

// staysRunning waits several of the provider's status periods and fails
// unless the Pod is still Running; when says in what situation it turned.
func staysRunning(ctx context.Context, pod *corev1.Pod, when string) error {
	time.Sleep(5 * syncPeriod)
	got, err := lab.Stack.Kube.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if got.Status.Phase != corev1.PodRunning {
		return fmt.Errorf("pod %s turned %s %s", pod.Name, got.Status.Phase, when)
	}
	return nil
}

// instanceOf finds the Pod's instance by its launch tags.
func instanceOf(ctx context.Context, pod *corev1.Pod) (string, error) {
	out, err := ec2Client.DescribeInstances(ctx, &ec2.DescribeInstancesInput{Filters: []ec2types.Filter{
		{Name: aws.String("tag:" + model.DefaultTagPodUID), Values: []string{string(pod.UID)}},
	}})
	if err != nil {
		return "", err
	}
	if len(out.Reservations) != 1 {
		return "", fmt.Errorf("pod %s: %d instances tagged with its UID", pod.Name, len(out.Reservations))
	}
	return aws.ToString(out.Reservations[0].Instances[0].InstanceId), nil
}

// configuredToken is the exit token in the wrapper's configuration, as sh
// reads it.
var configuredToken = regexp.MustCompile(`(?m)^REAPER_EXIT_TOKEN='([^']*)'$`)

// hostToken is the exit token the host of instance id puts in its lines:
// the one in the user-data the provider launched it with, as the EC2 test
// server received it in the RunInstances whose client token is the Pod's
// UID. The instance's exit-token tag must be its hash.
func hostToken(id string, pod *corev1.Pod) (string, error) {
	for _, c := range lab.Stack.EC2.Calls() {
		if c.Action != "RunInstances" || c.Params.Get("ClientToken") != string(pod.UID) {
			continue
		}
		script, err := base64.StdEncoding.DecodeString(c.Params.Get("UserData"))
		if err != nil {
			return "", err
		}
		if zr, err := gzip.NewReader(bytes.NewReader(script)); err == nil {
			if script, err = io.ReadAll(zr); err != nil {
				return "", err
			}
		}
		m := configuredToken.FindSubmatch(script)
		if m == nil || len(m[1]) == 0 {
			return "", fmt.Errorf("pod %s: the user-data carries no exit token", pod.Name)
		}
		token := string(m[1])
		if inst, _ := lab.Stack.EC2.Instance(id); inst.Tags[model.DefaultTagExitToken] != model.ExitTokenHash(token) {
			return "", fmt.Errorf("instance %s has tags %v, want %s=%s, the hash of its user-data's token",
				id, inst.Tags, model.DefaultTagExitToken, model.ExitTokenHash(token))
		}
		return token, nil
	}
	return "", fmt.Errorf("pod %s: no RunInstances for it", pod.Name)
}

// name is the name of the container that exited.
func (h host) name() string {
	if h.container == "" {
		return "main"
	}
	return h.container
}

// exitSeq numbers the log events sent, as CloudWatch Logs gives each its
// own id.
var exitSeq atomic.Int64

// exitEvent is the CloudWatch Logs payload of the Pod's exit line, from
// its instance's log stream, with the host's exit token. The container id
// is the instance's, with the container's name for the containers other
// than main: ids differ between the containers of a Pod.
func exitEvent(id string, pod *corev1.Pod, exit host, finished time.Time, token string) ([]byte, error) {
	containerID := "docker://" + id[2:]
	if exit.name() != "main" {
		containerID += "-" + exit.name()
	}
	ev, err := replay.ExitLogsEvent(id, pod, exitline.Line{Container: exit.name(), ContainerID: containerID, ExitCode: exit.exitCode,
		Signal: exit.signal, RuntimeRestarted: exit.runtimeRestarted, OthersRunning: exit.othersRunning, RestartCount: exit.restartCount,
		StartedAt: finished.Add(-time.Minute), FinishedAt: finished, Token: token}, int(exitSeq.Add(1)))
	if err != nil {
		return nil, err
	}
	return json.Marshal(ev)
}

func condition(job *batchv1.Job, typ batchv1.JobConditionType) bool {
	for _, c := range job.Status.Conditions {
		if c.Type == typ && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// wantPodsEnded checks that the Job made n Pods and each ended with phase
// and the container's exit code, its instance terminated, and that no
// terminal status was ever changed.
func wantPodsEnded(t *testing.T, r *jobRun, n int, phase corev1.PodPhase, code int32) {
	t.Helper()
	if r.created != n || len(r.pods) != n {
		t.Fatalf("%d Pods created, %d left; want %d", r.created, len(r.pods), n)
	}
	for _, pod := range r.pods {
		wantHostLaunch(t, &pod)
		if pod.Status.Phase != phase || len(pod.Status.ContainerStatuses) != 1 {
			t.Fatalf("Pod %s: phase %s, %d container statuses; want %s and 1", pod.Name, pod.Status.Phase, len(pod.Status.ContainerStatuses), phase)
		}
		term := pod.Status.ContainerStatuses[0].State.Terminated
		if term == nil || term.ExitCode != code {
			t.Fatalf("Pod %s container state %+v, want terminated with exit code %d", pod.Name, pod.Status.ContainerStatuses[0].State, code)
		}
	}
	for _, sum := range r.exits {
		wantIdentityTag(t, sum.InstanceID)
		if sum.Recorded != 1 || sum.Queued != 1 || sum.Rejected != 0 {
			t.Errorf("exitrecorder: %+v, want the line recorded and its claim queued", sum)
		}
		if i, ok := lab.Stack.EC2.Instance(sum.InstanceID); !ok || (i.State != ec2server.Terminated && i.State != ec2server.ShuttingDown) {
			t.Errorf("instance %s: %+v, want terminated", sum.InstanceID, i)
		}
	}
	if len(r.exits) != n {
		t.Errorf("%d exit lines sent, want %d", len(r.exits), n)
	}
	if len(r.flips) > 0 {
		t.Errorf("terminal Pod statuses changed: %v", r.flips)
	}
}

// wantIdentityTag checks that the provider launched the instance with the
// cluster identity tag: the UID of the cluster's kube-system namespace,
// which Reaper compares with the apiserver it reaches before it treats the
// instance as an orphan.
func wantIdentityTag(t *testing.T, id string) {
	t.Helper()
	ns, err := lab.Stack.Kube.CoreV1().Namespaces().Get(t.Context(), metav1.NamespaceSystem, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	i, ok := lab.Stack.EC2.Instance(id)
	if !ok || ns.UID == "" || i.Tags[model.DefaultTagClusterUID] != string(ns.UID) {
		t.Errorf("instance %s has tags %v, want %s=%s (the UID of namespace %s)", id, i.Tags, model.DefaultTagClusterUID, ns.UID, metav1.NamespaceSystem)
	}
}

// Jobs whose Pods end through Reaper, as the Job controller sees them:
//   - exit 0 completes the Job with its one Pod Succeeded, and no second
//     Pod is ever made;
//   - exit 3 with backoffLimit 1: the controller retries once and both Pods
//     end Failed with the real exit code;
//   - the installer whose work restarted the container runtime under it:
//     the line says so and carries its exit 0, and the Job completes once;
//   - the instance goes before its exit line: the provider sees it
//     terminated and writes nothing, so the late line still ends the Pod;
//   - after the terminal status the provider keeps syncing for many of its
//     periods with the instance terminated, and the status never changes.
//
// runJob fails any of them whose Pod status changes after it ended.
func TestE2EJobs(t *testing.T) {
	for _, tc := range []struct {
		name         string
		backoffLimit int32
		host         host
		settle       time.Duration
		want         batchv1.JobConditionType
		pods         int
		phase        corev1.PodPhase
	}{
		{"succeeds", 0, host{exitCode: 0}, 2 * syncPeriod, batchv1.JobComplete, 1, corev1.PodSucceeded},
		{"fails", 1, host{exitCode: 3}, 2 * syncPeriod, batchv1.JobFailed, 2, corev1.PodFailed},
		{"installer", 0, host{exitCode: 0, runtimeRestarted: true}, 2 * syncPeriod, batchv1.JobComplete, 1, corev1.PodSucceeded},
		{"gone-first", 0, host{exitCode: 0, goneFirst: true}, 2 * syncPeriod, batchv1.JobComplete, 1, corev1.PodSucceeded},
		{"no-flip", 0, host{exitCode: 0}, 15 * syncPeriod, batchv1.JobComplete, 1, corev1.PodSucceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r, err := runJob(t.Context(), "e2e-"+tc.name, tc.backoffLimit, tc.host, "exitrecorder", jobTimeout, tc.settle)
			if err != nil {
				t.Fatal(err)
			}
			succeeded, failed := int32(tc.pods), int32(0)
			if tc.phase == corev1.PodFailed {
				succeeded, failed = 0, int32(tc.pods)
			}
			if !condition(r.job, tc.want) || r.job.Status.Succeeded != succeeded || r.job.Status.Failed != failed {
				t.Fatalf("Job status %+v, want %s with %d succeeded, %d failed", r.job.Status, tc.want, succeeded, failed)
			}
			wantPodsEnded(t, r, tc.pods, tc.phase, int32(tc.host.exitCode))
		})
	}
}

// The provider's own read of the ledger: when the ledger holds the exit
// but no Pod write has landed, the Pod stays Running while its instance
// runs, and once the host has powered itself off GetPodStatus reports the
// exit from the ledger, not "instance gone": the Job ends with the real
// exit code.
func TestE2EProviderReadsLedger(t *testing.T) {
	t.Parallel()
	r, err := runJob(t.Context(), "e2e-ledger", 0, host{exitCode: 7}, ledgerOnly, jobTimeout, 2*syncPeriod)
	if err != nil {
		t.Fatal(err)
	}
	if !condition(r.job, batchv1.JobFailed) || r.job.Status.Failed != 1 {
		t.Fatalf("Job status %+v, want Failed with 1 failed", r.job.Status)
	}
	if r.created != 1 || len(r.pods) != 1 || len(r.flips) > 0 {
		t.Fatalf("%d Pods created, %d left, flips %v; want 1, 1, none", r.created, len(r.pods), r.flips)
	}
	pod := r.pods[0]
	if term := pod.Status.ContainerStatuses[0].State.Terminated; pod.Status.Phase != corev1.PodFailed || term == nil || term.ExitCode != 7 || term.Reason != "Error" {
		t.Fatalf("Pod %s: phase %s, container %+v; want Failed, exit 7 Error", pod.Name, pod.Status.Phase, pod.Status.ContainerStatuses[0].State)
	}
}

// A ledger record of an earlier Pod of the same name (another UID) on the
// instance is not this Pod's exit: the provider keeps reporting Running.
func TestE2EProviderIgnoresOtherUID(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	ns := "e2e-other-uid"
	if err := lab.Stack.EnsureNamespaces(ctx, ns); err != nil {
		t.Fatal(err)
	}
	pods := lab.Stack.Kube.CoreV1().Pods(ns)
	pod, err := pods.Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "worker"},
		Spec: corev1.PodSpec{NodeName: nodeName, RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "main", Image: "public.ecr.aws/docker/library/busybox:1.37"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	id := waitRunning(t, pod)
	wantIdentityTag(t, id)
	if _, err := lab.Ledger.RecordExit(ctx, id, model.PodRef{Namespace: ns, Name: pod.Name, UID: "00000000-0000-4000-8000-000000000000"}, "",
		model.Exit{Container: "main", ExitCode: 1, FinishedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * syncPeriod)
	got, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status.Phase != corev1.PodRunning {
		t.Fatalf("Pod %s phase %s after another UID's exit, want Running", got.Name, got.Status.Phase)
	}
}

// waitRunning waits until the provider reports the Pod Running and returns
// its instance.
func waitRunning(t *testing.T, pod *corev1.Pod) string {
	t.Helper()
	ctx := t.Context()
	for deadline := time.Now().Add(jobTimeout); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		got, err := lab.Stack.Kube.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Status.Phase != corev1.PodRunning {
			continue
		}
		out, err := ec2Client.DescribeInstances(ctx, &ec2.DescribeInstancesInput{Filters: []ec2types.Filter{
			{Name: aws.String("tag:" + model.DefaultTagPodUID), Values: []string{string(pod.UID)}},
		}})
		if err != nil || len(out.Reservations) != 1 {
			t.Fatalf("instance of %s: %v, %d found", pod.Name, err, len(out.Reservations))
		}
		return aws.ToString(out.Reservations[0].Instances[0].InstanceId)
	}
	t.Fatalf("Pod %s never Running", pod.Name)
	return ""
}

// With Reaper's writes switched off (REAPER_DRY_RUN=true for the
// exitrecorder and the reconciler behind its queue: nothing written, the
// ledger included) none of the Jobs above ends: the Pod stays Running, its
// instance runs on, and the Job controller creates no second Pod. So what
// the tests above see comes from Reaper.
func TestE2EDryRunNothingEnds(t *testing.T) {
	t.Parallel()
	for name, exit := range map[string]host{"succeeds": {exitCode: 0}, "fails": {exitCode: 3}, "installer": {exitCode: 0, runtimeRestarted: true}} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r, err := runJob(t.Context(), "e2e-dry-"+name, 1, exit, dryRunRecorder, dryRunWait, 0)
			if err == nil {
				t.Fatalf("Job ended with Reaper's writes off: %+v", r.job.Status)
			}
			if errors.Is(err, context.Canceled) || len(r.exits) != 1 || len(r.pods) != 1 {
				t.Fatalf("%v; %d exit lines sent, %d Pods; want 1 and 1", err, len(r.exits), len(r.pods))
			}
			pod := r.pods[0]
			if pod.Status.Phase != corev1.PodRunning {
				t.Errorf("Pod %s phase %s, want Running", pod.Name, pod.Status.Phase)
			}
			if i, _ := lab.Stack.EC2.Instance(r.exits[0].InstanceID); i.State != ec2server.Running {
				t.Errorf("instance %s %s, want running", i.ID, i.State)
			}
			if rec, ok, err := dryLab.Ledger.Get(t.Context(), r.exits[0].InstanceID); ok || err != nil {
				t.Errorf("dry-run ledger holds %+v, %v; want nothing written", rec, err)
			}
		})
	}
}
