package replay

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/reaper-k8s/reaper/pkg/reaper"
	"github.com/reaper-k8s/reaper/pkg/workqueue"
)

// memQueue is the work queue of an in-process core: it keeps what the
// core sends, and the test decides when a batch runs and what comes back,
// so that interleavings can include batches at any point, batches of
// several instances, failed items and SQS's duplicate deliveries.
type memQueue struct {
	mu      sync.Mutex
	seq     int
	pending []events.SQSMessage
}

func (q *memQueue) Send(_ context.Context, _ time.Duration, msgs ...workqueue.Message) ([]workqueue.Message, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for i, m := range msgs {
		m.V = workqueue.Version
		b, err := json.Marshal(m)
		if err != nil {
			return msgs[i:], err
		}
		q.seq++
		q.pending = append(q.pending, events.SQSMessage{MessageId: fmt.Sprintf("m-%d", q.seq), Body: string(b),
			Attributes: map[string]string{"SentTimestamp": strconv.FormatInt(time.Now().UnixMilli(), 10)}})
	}
	return nil, nil
}

// batch hands the pending messages to the core's reconciler as one batch.
// The failed ones stay; with rng, a delivered one may stay too (SQS
// delivers at least once).
func (q *memQueue) batch(t *testing.T, core *reaper.Reaper, rng *rand.Rand) {
	t.Helper()
	q.mu.Lock()
	batch := q.pending
	q.pending = nil
	q.mu.Unlock()
	if len(batch) == 0 {
		return
	}
	resp, err := core.HandleQueueEvent(t.Context(), events.SQSEvent{Records: batch})
	if err != nil {
		t.Fatalf("reconciler: %v", err)
	}
	failed := map[string]bool{}
	for _, f := range resp.BatchItemFailures {
		failed[f.ItemIdentifier] = true
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, m := range batch {
		if failed[m.MessageId] || (rng != nil && rng.IntN(4) == 0) {
			q.pending = append(q.pending, m)
		}
	}
}

// drain runs batches until nothing is pending.
func (q *memQueue) drain(t *testing.T, core *reaper.Reaper) {
	t.Helper()
	for range 10 {
		q.batch(t, core, nil)
		q.mu.Lock()
		n := len(q.pending)
		q.mu.Unlock()
		if n == 0 {
			return
		}
	}
	t.Fatalf("work queue not drained: %d items keep failing", len(q.pending))
}
