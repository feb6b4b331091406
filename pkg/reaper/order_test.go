package reaper

import (
	"strings"
	"testing"
	"time"

	"github.com/reaper-k8s/reaper/internal/fakes"
	"github.com/reaper-k8s/reaper/pkg/workqueue"
)

// Under a steady shortage, 300 exits arriving 30 a batch while the share
// of the terminate bucket covers 25, the oldest work goes first whatever
// the instance ids say (here each new instance's id sorts before every
// older one's): no work reaches its last attempt, none is dead-lettered,
// and no instance waits while a newer one is terminated.
func TestOldestWorkFirst(t *testing.T) {
	const exits, perBatch, share = 300, 30, 25
	w := fakes.NewWorld()
	for n := 1; n <= exits; n++ {
		w.Pods[podOf(n)], w.Instances[instanceOf(n)] = true, owned(instanceOf(n), podOf(n))
	}
	w.TerminateShare = share
	core, _, q := newBatchCore(w)
	dead := &fakes.Queue{}
	core.DeadLetters = dead
	start := testNow()
	arrived := map[string]time.Time{} // instance → when its exit was queued
	attempts := map[string]int{}      // instance → attempts when terminated
	var carried []workqueue.Message
	next := exits // the next new instance: ids count down
	for round := 0; len(carried) > 0 || next > 0; round++ {
		if round > 2*exits/share {
			t.Fatalf("no end after %d batches", round)
		}
		now := start.Add(time.Duration(round) * 10 * time.Second)
		core.Now = func() time.Time { return now }
		msgs := carried
		for range min(perBatch, next) {
			m := exitMsg(next, 0)
			m.QueuedAt = now
			arrived[instanceOf(next)] = now
			msgs = append(msgs, m)
			next--
		}
		before := len(w.Log)
		resp, err := core.HandleQueueEvent(t.Context(), batch(t, msgs...))
		if err != nil || len(resp.BatchItemFailures) != 0 {
			t.Fatalf("batch %d: failures %v, %v", round, failures(resp), err)
		}
		attemptOf := map[string]int{}
		for _, m := range msgs {
			attemptOf[m.InstanceID] = max(attemptOf[m.InstanceID], m.Attempt)
		}
		var ended []string
		for _, step := range w.Log[before:] {
			if ids, ok := strings.CutPrefix(step, "terminate "); ok {
				ended = append(ended, strings.Fields(strings.Trim(ids, "[]"))...)
			}
		}
		carried = nil
		for _, s := range q.Sent {
			carried = append(carried, s.Msgs...)
		}
		q.Sent = nil
		for _, id := range ended {
			attempts[id] = attemptOf[id]
			for _, m := range carried {
				if arrived[m.InstanceID].Before(arrived[id]) {
					t.Fatalf("batch %d: %s (queued %v) terminated while %s (queued %v) waits", round, id, arrived[id].Sub(start), m.InstanceID, arrived[m.InstanceID].Sub(start))
				}
			}
		}
	}
	if len(attempts) != exits || len(dead.Sent) != 0 {
		t.Fatalf("%d instances terminated, %d dead letters: want %d and none", len(attempts), len(dead.Sent), exits)
	}
	spread, maxAttempt := make([]int, workqueue.MaxAttempts), 0
	for _, a := range attempts {
		spread[a]++
		maxAttempt = max(maxAttempt, a)
	}
	t.Logf("instances by the attempt that terminated them (0: the first try): %v", spread)
	if maxAttempt >= workqueue.MaxAttempts-1 {
		t.Fatalf("an instance waited until its last attempt (%d): spread %v", maxAttempt, spread)
	}
}
