package replay

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reaper-k8s/reaper/internal/ec2server"
	"github.com/reaper-k8s/reaper/internal/labstack"
	"github.com/reaper-k8s/reaper/pkg/exitline"
	"github.com/reaper-k8s/reaper/pkg/intake"
	"github.com/reaper-k8s/reaper/pkg/model"
)

// The tests of this file are the attacks and operators' mistakes of the
// fault matrix (docs/security.md, "Fault matrix"), through the built
// functions. They sweep, so like those of ends_test.go none runs in
// parallel.

// hostileInstance is the n-th instance id of a hostile test.
func hostileInstance(prefix uint64, n int) string {
	return fmt.Sprintf("i-%017x", prefix<<40+uint64(n))
}

// exitPayload is a subscription payload of the given lines, in order, on
// instance id's stream.
func exitPayload(t *testing.T, id string, lines ...string) []byte {
	t.Helper()
	var evs []events.CloudwatchLogsLogEvent
	for i, l := range lines {
		evs = append(evs, events.CloudwatchLogsLogEvent{ID: fmt.Sprintf("%d", i+1), Timestamp: time.Now().UnixMilli(), Message: l})
	}
	ev, err := exitline.Encode(events.CloudwatchLogsData{Owner: Account, LogGroup: model.DefaultLogGroup("reaper-test"), LogStream: id,
		SubscriptionFilters: []string{"reaper-exits"}, MessageType: "DATA_MESSAGE", LogEvents: evs})
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// line is the exit line of pod on instance id.
func line(t *testing.T, id string, pod *corev1.Pod, code int, restart int32) string {
	t.Helper()
	now := time.Now().UTC()
	b, err := json.Marshal(exitline.Line{Reaper: exitline.Kind, V: exitline.Version, InstanceID: id,
		PodNamespace: pod.Namespace, PodName: pod.Name, PodUID: string(pod.UID), Container: "main", ContainerID: BareContainerID(pod),
		ExitCode: code, StartedAt: now.Add(-time.Hour), FinishedAt: now, RestartCount: restart})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// A host writes, ahead of its Pod's real line, a line naming another Pod
// with the same restart count, and a line a megabyte long: the real exit
// still ends its Pod, the other Pod is untouched.
func TestForgedLinesAheadOfTheRealOne(t *testing.T) {
	ctx := t.Context()
	real, err := lab.RunningPod(ctx, "hostile", "real-exit", corev1.RestartPolicyNever)
	if err != nil {
		t.Fatal(err)
	}
	victim, err := lab.RunningPod(ctx, "hostile", "victim", corev1.RestartPolicyNever)
	if err != nil {
		t.Fatal(err)
	}
	id := hostileInstance(0xf01, 1)
	lab.AddInstance(id, real, true)
	lab.AddInstance(hostileInstance(0xf01, 2), victim, true)
	huge := strings.Replace(line(t, id, real, 0, 0), BareContainerID(real), strings.Repeat("f", 1<<20), 1)
	sum := invokeExit(t, exitPayload(t, id, line(t, id, victim, 1, 0), huge, line(t, id, real, 0, 0)))
	if sum.Rejected != 1 || sum.Queued != 2 {
		t.Fatalf("summary %+v, want the huge line rejected and two claims queued", sum)
	}
	wantEnded(t, getPod(t, "hostile", "real-exit"), corev1.PodSucceeded, 0, "Completed")
	wantUntouched(t, victim)
	if instanceState(t, id) != ec2server.Terminated {
		t.Fatal("the real exit's instance is still running")
	}
}

// An operator turns termination protection on for one instance among a
// batch's: the others end, the protected one is refused alone, its Pod
// says so, and no sweep asks EC2 again before the backoff.
func TestProtectedInstanceCostsItselfOnly(t *testing.T) {
	ctx := t.Context()
	const n = 31
	var payloads [][]byte
	ids := make([]string, n)
	for i := range n {
		pod, err := lab.RunningPod(ctx, "protected", fmt.Sprintf("job-%02d", i), corev1.RestartPolicyNever)
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = hostileInstance(0xf03, i)
		lab.Stack.EC2.AddInstance(ec2server.Instance{ID: ids[i], State: ec2server.Running, LaunchTime: time.Now().Add(-time.Hour),
			Tags: lab.InstanceTags(pod, true, labstack.Cluster), DisableAPITermination: i == 15})
		payloads = append(payloads, exitPayload(t, ids[i], line(t, ids[i], pod, 0, 0)))
	}
	// Queued together, so that batches hold the protected instance with
	// others.
	for _, p := range payloads {
		var sum intake.ExitSummary
		if err := lab.InvokeOnly(ctx, "exitrecorder", p, &sum); err != nil || sum.Queued != 1 {
			t.Fatalf("exitrecorder: %+v %v", sum, err)
		}
	}
	if err := lab.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	for i, id := range ids {
		want := ec2server.Terminated
		if i == 15 {
			want = ec2server.Running
		}
		if got := instanceState(t, id); got != want {
			t.Fatalf("instance %d (%s) is %s, want %s", i, id, got, want)
		}
		wantEnded(t, getPod(t, "protected", fmt.Sprintf("job-%02d", i)), corev1.PodSucceeded, 0, "Completed")
	}
	if rec := record(t, ids[15]); rec.TerminateRefused == nil || rec.TerminateRefused.Code != "OperationNotPermitted" {
		t.Fatalf("record of the protected instance: %+v", rec)
	}
	evs, err := lab.Stack.Kube.CoreV1().Events("protected").List(ctx, metav1.ListOptions{FieldSelector: "reason=TerminationRefused"})
	if err != nil || len(evs.Items) != 1 || evs.Items[0].InvolvedObject.Name != "job-15" {
		t.Fatalf("events %+v, %v: want one on job-15", evs, err)
	}
	before := terminateCalls(ids[15])
	sweepNow(t)
	sweepNow(t)
	if after := terminateCalls(ids[15]); after != before {
		t.Fatalf("the sweeps asked EC2 again %d times", after-before)
	}
}

// A state change names a running instance "stopped": anyone who can invoke
// statechange or send to the queue could claim that. EC2 says it runs, so
// nothing happens; a state dated an hour ahead is refused and does not
// shadow the real event that follows.
func TestForgedStateChange(t *testing.T) {
	ctx := t.Context()
	pod, err := lab.RunningPod(ctx, "hostile", "forged-stop", corev1.RestartPolicyNever)
	if err != nil {
		t.Fatal(err)
	}
	id := hostileInstance(0xf04, 1)
	lab.AddInstance(id, pod, true)
	for _, ev := range []events.CloudWatchEvent{
		StateChangeEvent("forged-stop", id, model.StateStopped, time.Now()),
		StateChangeEvent("forged-future", id, model.StateRunning, time.Now().Add(time.Hour)),
	} {
		b, err := json.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		// Invoked as is: EC2's own view of the instance stays running.
		if err := lab.Invoke(ctx, "statechange", b, nil); err != nil {
			t.Fatal(err)
		}
	}
	if terminateCalls(id) != 0 || instanceState(t, id) != ec2server.Running {
		t.Fatal("a forged stop terminated a running instance")
	}
	wantUntouched(t, pod)
	// The instance really goes: its own event is recorded.
	b, err := json.Marshal(StateChangeEvent("real-end", id, model.StateTerminated, time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	play(t, LiveStep{Function: "statechange", Payload: b}, nil)
	if rec := record(t, id); rec.Gone == nil || rec.Gone.State != model.StateTerminated {
		t.Fatalf("record %+v, want the real end", rec)
	}
}

// orphanedFleet launches n running owned instances tagged with the cluster
// identity, for Pods of namespace ns that are then deleted, and returns
// their ids.
func orphanedFleet(t *testing.T, ns string, prefix uint64, n int, identity string) []string {
	t.Helper()
	ctx := t.Context()
	ids := make([]string, n)
	for i := range ids {
		pod, err := lab.RunningPod(ctx, ns, fmt.Sprintf("job-%02d", i), corev1.RestartPolicyNever)
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = hostileInstance(prefix, i)
		tags := lab.InstanceTags(pod, true, labstack.Cluster)
		tags[model.DefaultTagClusterUID] = identity
		lab.AddTaggedInstance(ids[i], tags)
		if err := lab.DeletePod(ctx, ns, pod.Name); err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

// The sweeper's Kubernetes endpoint reaches another cluster than the one
// the fleet was launched for (a wrong kubeconfig, a recreated cluster):
// none of the fleet's Pods is there, and no instance is terminated.
func TestWrongClusterTerminatesNothing(t *testing.T) {
	// The Pods live in the cluster of that identity, not in the one reached.
	ids := orphanedFleet(t, "elsewhere", 0xf05, 20, "0e7e0000-0000-4000-8000-0000000000ff")
	if sum := sweepNow(t); sum.IdentityMismatch < len(ids) {
		t.Fatalf("sweep %+v, want the %d instances of another identity counted", sum, len(ids))
	}
	for _, id := range ids {
		if terminateCalls(id) != 0 || instanceState(t, id) != ec2server.Running {
			t.Fatalf("instance %s of another cluster terminated", id)
		}
	}
}

// Many orphans at once, in the cluster Reaper reaches: one sweep ends at
// most the cap's part of the running instances (REAPER_ORPHAN_CAP, 0.1 by
// default) and holds back the rest, and the next sweep goes on.
func TestOrphanCapHoldsBack(t *testing.T) {
	ids := orphanedFleet(t, "capped", 0xf06, 40, lab.ClusterUID)
	terminated := func() int {
		n := 0
		for _, id := range ids {
			if instanceState(t, id) == ec2server.Terminated {
				n++
			}
		}
		return n
	}
	// The sweep hands on at most the cap; each reconciler batch ends at
	// most its part of it (the lab runs two at once), the rest wait for
	// the next sweep.
	sum := sweepNow(t)
	if sum.HeldBack == 0 || sum.Orphans == 0 || terminated() == 0 || terminated() > sum.Orphans {
		t.Fatalf("sweep %+v, %d terminated: want some terminated, no more than the sweep handed on, some held back", sum, terminated())
	}
	first := terminated()
	if first >= len(ids) {
		t.Fatalf("%d of %d orphans terminated in one sweep", first, len(ids))
	}
	sweepNow(t)
	if terminated() <= first {
		t.Fatalf("the next sweep terminated no more (%d)", terminated())
	}
}

// EC2 forgets a terminated instance after about an hour: an exit whose
// lookups failed until then still ends its Pod, believed from the record
// the sweep kept of the instance's tags while EC2 still listed it.
func TestExitAfterEC2Forgot(t *testing.T) {
	ctx := t.Context()
	pod, err := lab.RunningPod(ctx, "hostile", "forgotten", corev1.RestartPolicyNever)
	if err != nil {
		t.Fatal(err)
	}
	id := hostileInstance(0xf07, 1)
	lab.AddInstance(id, pod, true)
	if sum := sweepNow(t); sum.Adopted < 1 {
		t.Fatalf("sweep %+v: the running instance not adopted", sum)
	}
	if rec := record(t, id); rec.Pod.UID != string(pod.UID) {
		t.Fatalf("adopted record %+v", rec)
	}
	lab.Stack.EC2.RemoveInstance(id)
	invokeExit(t, exitPayload(t, id, line(t, id, pod, 3, 0)))
	wantEnded(t, getPod(t, "hostile", "forgotten"), corev1.PodFailed, 3, "Error")
}
