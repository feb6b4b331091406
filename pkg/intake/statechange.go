package intake

import (
	"context"
	"fmt"

	"github.com/aws/aws-lambda-go/events"

	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/statechange"
	"github.com/reaper-k8s/reaper/pkg/workqueue"
)

// StateSummary is what one state change came to.
type StateSummary struct {
	InstanceID string `json:"instanceId"`
	State      string `json:"state"`
	// Skipped says why nothing was done, when nothing was.
	Skipped string `json:"skipped,omitempty"`
	// Queued: the state change went to the reconciler.
	Queued bool `json:"queued,omitempty"`
}

// HandleEC2Event is the statechange function's handler: one EventBridge
// "EC2 Instance State-change Notification".
func (in *Intake) HandleEC2Event(ctx context.Context, ev events.CloudWatchEvent) (StateSummary, error) {
	defer in.flushMetrics(ctx)
	m, err := statechange.Parse(ev)
	if err != nil {
		// Retrying a malformed event cannot help: log it and count it.
		in.Log.ErrorContext(ctx, "event rejected", "id", ev.ID, "error", err)
		return StateSummary{Skipped: "rejected"}, nil
	}
	return in.HandleStateChange(ctx, m)
}

// HandleStateChange hands an instance's state change to the reconciler.
// The event does not say whose the instance is (EC2 state-change events
// carry no tags), and a tag lookup per event would spend the account's
// DescribeInstances bucket one call per instance when thousands end
// together; the reconciler checks a batch of them in one call per 200.
func (in *Intake) HandleStateChange(ctx context.Context, m statechange.Message) (StateSummary, error) {
	sum := StateSummary{InstanceID: m.InstanceID, State: m.State}
	if _, err := in.Queue.Send(ctx, 0, workqueue.State(m.InstanceID, m.State, m.Time)); err != nil {
		return sum, fmt.Errorf("hand state change of %s to the reconciler: %w", m.InstanceID, err)
	}
	sum.Queued = true
	in.Metrics.Count(metrics.WorkItemsQueued, 1)
	return sum, nil
}
