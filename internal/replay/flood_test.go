package replay

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/reaper-k8s/reaper/internal/ec2server"
	"github.com/reaper-k8s/reaper/pkg/model"
	"github.com/reaper-k8s/reaper/pkg/reaper"
	"github.com/reaper-k8s/reaper/pkg/workqueue"
)

// The tests of this file are work that comes in floods, through the built
// functions: claims for instance ids nobody launched, and orphan messages
// gathered on the queue.

// enqueue sends msgs straight to deployment l's work queue, as any
// principal that may send there could.
func enqueue(t *testing.T, l *Lab, msgs ...workqueue.Message) {
	t.Helper()
	q := workqueue.New(sqs.NewFromConfig(lab.Stack.AWSConfig(t.Context())), l.QueueURL)
	if unsent, err := q.Send(t.Context(), 0, msgs...); err != nil {
		t.Fatalf("%d messages not sent: %v", len(unsent), err)
	}
}

// madeUpClaims are exit claims for n instance ids nobody launched, of
// Pods nobody created.
func madeUpClaims(n int) []workqueue.Message {
	msgs := make([]workqueue.Message, n)
	now := time.Now().UTC()
	for i := range msgs {
		pod := model.PodRef{Namespace: "flood", Name: fmt.Sprintf("made-up-%03d", i), UID: fmt.Sprintf("00000000-0000-4000-8000-%012d", i)}
		msgs[i] = workqueue.Exit(hostileInstance(0xf0c, i), pod, model.Exit{Container: "main", ExitCode: 0,
			StartedAt: now.Add(-time.Hour), FinishedAt: now, ReceivedAt: now})
	}
	return msgs
}

// madeUpLookups counts the DescribeInstances calls that named one of the
// first n made-up ids.
func madeUpLookups(n int) int {
	calls := 0
	for _, c := range lab.Stack.EC2.Calls() {
		for i := range n {
			if c.Action == "DescribeInstances" && names(c, hostileInstance(0xf0c, i)) {
				calls++
				break
			}
		}
	}
	return calls
}

// batchesOf are the batch lines of deployment l's reconcilers so far.
func batchesOf(l *Lab) []reaper.BatchSummary {
	var out []reaper.BatchSummary
	for _, f := range l.Reconcilers {
		batches, _ := ReconcilerLines(f.Logs())
		out = append(out, batches...)
	}
	return out
}

// Claims for 250 instance ids nobody launched come twice, each time with
// real exits among them. The real exits end in the batch they came in.
// The second time, EC2 is not asked again of the ids it answered unknown
// moments before. The checks made again of the made-up ids go at most 200
// to a batch, the rest held back; every made-up claim is refused after its
// last check, and the flood ends.
func TestMadeUpInstanceIDsAreCheap(t *testing.T) {
	t.Parallel()
	const (
		cluster = "reaper-made-up-ids"
		madeUp  = 250
	)
	ctx := t.Context()
	// One warm reconciler (what it remembers is its own), with the
	// construct's batching window, so that a wave is one batch.
	d := deployment(t, cluster, LabOptions{MaxConcurrency: 1, BatchingWindow: time.Second}, "exitrecorder", "reconciler")
	realExits := func(wave int) []string {
		t.Helper()
		var names []string
		for i := range 3 {
			name := fmt.Sprintf("real-%d-%d", wave, i)
			pod, err := lab.RunningPod(ctx, "flood", name, corev1.RestartPolicyNever)
			if err != nil {
				t.Fatal(err)
			}
			id := hostileInstance(0xf0d, wave*10+i)
			d.AddTaggedInstance(id, lab.InstanceTags(pod, true, cluster))
			payload, err := ExitPayload(id, pod, 0, 1)
			if err != nil {
				t.Fatal(err)
			}
			if err := d.InvokeOnly(ctx, "exitrecorder", payload, nil); err != nil {
				t.Fatal(err)
			}
			names = append(names, name)
		}
		return names
	}
	// wave sends the made-up claims and three real exits, and waits until
	// the real ones ended and done says the made-up ones were taken up.
	wave := func(n int, done func() bool) {
		t.Helper()
		sent := time.Now()
		enqueue(t, d, madeUpClaims(madeUp)...)
		for _, name := range realExits(n) {
			waitFor(t, 10*time.Second, name+" ends", func() bool { return getPod(t, "flood", name).Status.Phase != corev1.PodRunning })
			wantEnded(t, getPod(t, "flood", name), corev1.PodSucceeded, 0, "Completed")
		}
		waitFor(t, 10*time.Second, fmt.Sprintf("wave %d taken up", n), done)
		if took := time.Since(sent); took > reaper.DeferDelay/2 {
			t.Fatalf("wave %d took %s: its checks made again would mix with the next wave", n, took)
		}
	}
	remembered := func() int {
		n := 0
		for _, b := range batchesOf(d) {
			n += b.UnknownRemembered
		}
		return n
	}
	wave(1, func() bool {
		for i := range madeUp {
			if lookups(hostileInstance(0xf0c, i)) == 0 {
				return false
			}
		}
		return true
	})
	first := madeUpLookups(madeUp)
	wave(2, func() bool { return remembered() >= madeUp })
	if again := madeUpLookups(madeUp) - first; again != 0 {
		t.Fatalf("the second wave asked EC2 %d more times of ids it answered unknown moments before", again)
	}
	if n := remembered(); n != madeUp {
		t.Fatalf("%d claims taken for unknown without a call, want %d", n, madeUp)
	}

	if err := d.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	heldBack := 0
	for _, b := range batchesOf(d) {
		heldBack += b.RechecksHeldBack
		if b.RechecksHeldBack > 0 && b.Lookups != 200 {
			t.Fatalf("a batch described %d instances, holding back %d checks made again, want 200: %+v", b.Lookups, b.RechecksHeldBack, b)
		}
		t.Logf("batch: %d messages, %d instances, %d looked up, %d remembered unknown, %d checks held back, %d deferred",
			b.Messages, b.Instances, b.Lookups, b.UnknownRemembered, b.RechecksHeldBack, b.Deferred)
	}
	if heldBack == 0 {
		t.Fatalf("no check made again was held back: %+v", batchesOf(d))
	}
	for i := range madeUp {
		if n := rejectionsOf(d, hostileInstance(0xf0c, i), model.ReasonInstanceUnknown); n != 2 {
			t.Fatalf("made-up claim %d refused %d times, want once a wave", i, n)
		}
	}
}

// An operator redrives a dead-letter queue full of orphan messages, or
// several sweeps' gather on the queue: 12 instances whose Pods are gone,
// each named by an orphan message, among 12 running. A batch ends no more
// of them than one sweep may (REAPER_ORPHAN_CAP of the running ones, five
// at least), the oldest first, and drops the rest, counted: later sweeps
// find them again and end them, each sweep no more than the cap. Every one
// is terminated once, and nothing reaches the dead-letter queue.
func TestGatheredOrphansAreCapped(t *testing.T) {
	t.Parallel()
	const (
		cluster = "reaper-gathered-orphans"
		orphans = 12
		floor   = 5
	)
	d := deployment(t, cluster, LabOptions{MaxConcurrency: 1, Env: []string{"REAPER_ORPHAN_CAP=0.1"}}, "sweeper", "reconciler")
	var msgs []workqueue.Message
	var oldest []string
	for i := range orphans {
		id := hostileInstance(0xf0e, i)
		pod := &corev1.Pod{}
		pod.Namespace, pod.Name, pod.UID = "gathered", fmt.Sprintf("gone-%02d", i), types.UID(fmt.Sprintf("00000000-0000-4000-8000-%012d", i))
		// The higher i, the older.
		lab.Stack.EC2.AddInstance(ec2server.Instance{ID: id, State: ec2server.Running, Tags: lab.InstanceTags(pod, true, cluster),
			LaunchTime: time.Now().Add(-time.Hour - time.Duration(i)*time.Minute)})
		msgs = append(msgs, workqueue.Orphan(id, orphans))
		if i >= orphans-floor {
			oldest = append(oldest, id)
		}
	}
	enqueue(t, d, msgs...)
	if err := d.DrainSent(t.Context(), time.Now()); err != nil {
		t.Fatal(err)
	}
	var ended []string
	for _, m := range msgs {
		if terminateCalls(m.InstanceID) > 0 {
			ended = append(ended, m.InstanceID)
		}
	}
	if !slices.Equal(ended, oldest) {
		t.Fatalf("the first batch ended %v, want the %d oldest %v", ended, floor, oldest)
	}
	if b := batchesOf(d); len(b) != 1 || b[0].OrphansHeldBack != orphans-floor {
		t.Fatalf("batches %+v, want one holding back %d orphans", b, orphans-floor)
	}
	for sweeps := 0; slices.ContainsFunc(msgs, func(m workqueue.Message) bool { return terminateCalls(m.InstanceID) == 0 }); sweeps++ {
		if sweeps == 3 {
			t.Fatalf("orphans left after %d sweeps", sweeps)
		}
		if err := d.Invoke(t.Context(), "sweeper", []byte(`{"source":"aws.events","detail-type":"Scheduled Event"}`), nil); err != nil {
			t.Fatal(err)
		}
		if err := d.Drain(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range msgs {
		if n := terminateCalls(m.InstanceID); n != 1 || instanceState(t, m.InstanceID) != ec2server.Terminated {
			t.Fatalf("orphan %s: %d terminate calls, state %s", m.InstanceID, n, instanceState(t, m.InstanceID))
		}
	}
	for _, b := range batchesOf(d) {
		if b.Terminated > floor || b.Deferred > 0 || b.DeadLettered > 0 {
			t.Fatalf("a batch terminated %d orphans (the cap: %d), or deferred or dead-lettered work: %+v", b.Terminated, floor, b)
		}
	}
}
