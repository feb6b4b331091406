package replay

import (
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	ddbtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	corev1 "k8s.io/api/core/v1"

	"github.com/reaper-k8s/reaper/internal/ec2server"
	"github.com/reaper-k8s/reaper/pkg/intake"
	"github.com/reaper-k8s/reaper/pkg/ledger"
	"github.com/reaper-k8s/reaper/pkg/model"
	"github.com/reaper-k8s/reaper/pkg/reaper"
)

// The tests of this file are EC2's eventually consistent answers, through
// the built functions: an instance missing from DescribeInstances for a
// while after its launch, and one EC2 still lists running well after it
// accepted Reaper's terminate.

// rejectionsOf counts the exit claims for instance id (any, when "") the
// reconcilers of l did not believe for reason, from their logs.
func rejectionsOf(l *Lab, id, reason string) int {
	n := 0
	for _, f := range l.Reconcilers {
		_, notBelieved := ReconcilerLines(f.Logs())
		for _, nb := range notBelieved {
			if (id == "" || nb.Instance == id) && nb.Reason == reason {
				n++
			}
		}
	}
	return n
}

// An exit claim comes for an instance EC2 does not list yet. It is checked
// again, DeferDelay apart, before it is refused: the Pod of the instance
// EC2 lists by the second check ends as its line says, and its instance is
// terminated; a claim for an id EC2 never lists is refused at the last
// check, a minute or more after it came, once, and changes nothing.
func TestClaimBeforeEC2ListsTheInstance(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pods := map[string]*corev1.Pod{}
	ids := map[string]string{"listed-late": hostileInstance(0xf0a, 1), "never-listed": hostileInstance(0xf0a, 2)}
	start := time.Now()
	for name, id := range ids {
		pod, err := lab.RunningPod(ctx, "eventual", name, corev1.RestartPolicyNever)
		if err != nil {
			t.Fatal(err)
		}
		pods[name] = pod
		payload, err := ExitPayload(id, pod, 0, 1)
		if err != nil {
			t.Fatal(err)
		}
		var sum intake.ExitSummary
		if err := lab.InvokeOnly(ctx, "exitrecorder", payload, &sum); err != nil || sum.Queued != 1 {
			t.Fatalf("exitrecorder: %+v, %v", sum, err)
		}
	}
	waitFor(t, 30*time.Second, "first checks", func() bool {
		return lookups(ids["listed-late"]) > 0 && lookups(ids["never-listed"]) > 0
	})
	lab.AddInstance(ids["listed-late"], pods["listed-late"], true)
	if rejectionsOf(lab, ids["listed-late"], model.ReasonInstanceUnknown) != 0 {
		t.Fatal("the claim was refused at its first check")
	}
	wantUntouched(t, pods["listed-late"])

	waitFor(t, reaper.DeferDelay+30*time.Second, "the late-listed instance's Pod ends", func() bool {
		return getPod(t, "eventual", "listed-late").Status.Phase != corev1.PodRunning
	})
	if took := time.Since(start); took < reaper.DeferDelay {
		t.Fatalf("the Pod ended %s after the claim came: at its first check, not once EC2 listed the instance", took)
	}
	wantEnded(t, getPod(t, "eventual", "listed-late"), corev1.PodSucceeded, 0, "Completed")
	waitFor(t, 10*time.Second, "the late-listed instance is terminated", func() bool {
		return instanceState(t, ids["listed-late"]) == ec2server.Terminated
	})

	never := ids["never-listed"]
	waitFor(t, 2*reaper.DeferDelay+30*time.Second, "the never-listed claim is refused", func() bool {
		return rejectionsOf(lab, never, model.ReasonInstanceUnknown) > 0
	})
	if took := time.Since(start); took < time.Minute {
		t.Fatalf("refused %s after the claim came, want a minute of checks at least", took)
	}
	time.Sleep(2 * time.Second) // a refusal too many would show by now
	if n := rejectionsOf(lab, never, model.ReasonInstanceUnknown); n != 1 {
		t.Fatalf("refused %d times, want once", n)
	}
	wantUntouched(t, pods["never-listed"])
	if n := terminateCalls(never); n != 0 {
		t.Fatalf("an instance nobody knows was named in %d TerminateInstances", n)
	}
}

// backdateTerminate sets when Reaper's terminate of id was accepted, in
// deployment l's ledger, to ago before now: EC2 has listed it running for
// that long since.
func backdateTerminate(t *testing.T, l *Lab, id string, ago time.Duration) {
	t.Helper()
	at, err := attributevalue.Marshal(time.Now().Add(-ago).UTC())
	if err != nil {
		t.Fatal(err)
	}
	db := dynamodb.NewFromConfig(lab.Stack.AWSConfig(t.Context()))
	_, err = db.UpdateItem(t.Context(), &dynamodb.UpdateItemInput{
		TableName:                 aws.String(l.Table),
		Key:                       map[string]ddbtypes.AttributeValue{ledger.KeyAttribute: &ddbtypes.AttributeValueMemberS{Value: id}},
		UpdateExpression:          aws.String("SET #t = :at"),
		ConditionExpression:       aws.String("attribute_exists(#t)"),
		ExpressionAttributeNames:  map[string]string{"#t": "terminated"},
		ExpressionAttributeValues: map[string]ddbtypes.AttributeValue{":at": at},
	})
	if err != nil {
		t.Fatal(err)
	}
}

// EC2 accepted Reaper's terminate of two instances and lists both running
// still: one for minutes (the terminate did not take), one for a minute
// (EC2's answers lag). The sweep hands on the first alone, and the
// reconciler terminates it again; the Pods keep the exits they were
// written with.
func TestTerminateThatDidNotTake(t *testing.T) {
	t.Parallel()
	const cluster = "reaper-did-not-take"
	ctx := t.Context()
	d := deployment(t, cluster, LabOptions{MaxConcurrency: 1}, "exitrecorder", "sweeper", "reconciler")
	ids := map[string]string{"did-not-take": hostileInstance(0xf0b, 1), "lagging": hostileInstance(0xf0b, 2)}
	written := map[string]*corev1.Pod{}
	for name, id := range ids {
		pod, err := lab.RunningPod(ctx, "did-not-take", name, corev1.RestartPolicyNever)
		if err != nil {
			t.Fatal(err)
		}
		d.AddTaggedInstance(id, lab.InstanceTags(pod, true, cluster))
		payload, err := ExitPayload(id, pod, 0, 1)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Invoke(ctx, "exitrecorder", payload, nil); err != nil {
			t.Fatal(err)
		}
		written[name] = getPod(t, "did-not-take", name)
		wantEnded(t, written[name], corev1.PodSucceeded, 0, "Completed")
		if n := terminateCalls(id); n != 1 || instanceState(t, id) != ec2server.Terminated {
			t.Fatalf("%s: %d terminate calls, state %s", name, n, instanceState(t, id))
		}
		lab.Stack.EC2.SetState(id, ec2server.Running)
	}
	backdateTerminate(t, d, ids["did-not-take"], 3*time.Minute)
	backdateTerminate(t, d, ids["lagging"], time.Minute)

	var sum reaper.SweepSummary
	if err := d.Invoke(ctx, "sweeper", []byte(`{"source":"aws.events","detail-type":"Scheduled Event"}`), &sum); err != nil {
		t.Fatalf("sweeper: %v", err)
	}
	if sum.StillRunning != 1 {
		t.Fatalf("sweep %+v, want one instance still running", sum)
	}
	if n := terminateCalls(ids["did-not-take"]); n != 2 || instanceState(t, ids["did-not-take"]) != ec2server.Terminated {
		t.Fatalf("the terminate that did not take: %d terminate calls, state %s", n, instanceState(t, ids["did-not-take"]))
	}
	if n := terminateCalls(ids["lagging"]); n != 1 {
		t.Fatalf("the lagging answer: %d terminate calls, want the first alone", n)
	}
	for name, pod := range written {
		if now := getPod(t, "did-not-take", name); now.ResourceVersion != pod.ResourceVersion {
			t.Fatalf("pod %s written again: %+v", name, now.Status)
		}
	}
}
