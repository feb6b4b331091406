package reaper

import (
	"context"
	"log/slog"

	"github.com/aws/aws-lambda-go/events"

	"github.com/reaper-k8s/reaper/pkg/instances"
	"github.com/reaper-k8s/reaper/pkg/ledger"
	"github.com/reaper-k8s/reaper/pkg/statechange"
)

// StateSummary is what one state change came to.
type StateSummary struct {
	InstanceID string `json:"instanceId"`
	State      string `json:"state"`
	// Skipped says why nothing was done, when nothing was.
	Skipped   string `json:"skipped,omitempty"`
	PodResult string `json:"podResult,omitempty"`
	Terminate string `json:"terminate,omitempty"`
	// WaitUntil is when the exit-wait window closes, if it is open.
	WaitUntil string `json:"waitUntil,omitempty"`
}

// HandleEC2Event is the statechange function's handler: one EventBridge
// "EC2 Instance State-change Notification".
func (r *Reaper) HandleEC2Event(ctx context.Context, ev events.CloudWatchEvent) (StateSummary, error) {
	defer r.flushMetrics(ctx)
	m, err := statechange.Parse(ev)
	if err != nil {
		// Retrying a malformed event cannot help: log it and count it.
		r.Log.ErrorContext(ctx, "event rejected", "id", ev.ID, "error", err)
		return StateSummary{Skipped: "rejected"}, nil
	}
	return r.HandleStateChange(ctx, m)
}

// HandleStateChange records an instance's state change and, for the states
// in which the instance no longer runs its Pod, makes sure the Pod ends with
// the exit the ledger holds. With no exit yet, the exit-wait window opens: a
// late exit line still wins, and the sweeper finalizes the Pod as lost once
// the window has passed.
func (r *Reaper) HandleStateChange(ctx context.Context, m statechange.Message) (StateSummary, error) {
	sum := StateSummary{InstanceID: m.InstanceID, State: m.State}
	// One lookup answers both whether the instance is this deployment's
	// and which Pod it runs. One EC2 no longer knows may still have a
	// record; Reconcile then decides whether the record is believed.
	found, err := r.Fleet.Describe(ctx, []string{m.InstanceID})
	if err != nil {
		return sum, err
	}
	inst, known := found[m.InstanceID]
	if known && !inst.Owned {
		sum.Skipped = "not owned"
		r.Log.LogAttrs(ctx, slog.LevelDebug, "state change skipped", slog.String("instance", m.InstanceID),
			slog.String("state", m.State), slog.Bool("managed", inst.Managed), slog.String("cluster", inst.Cluster))
		return sum, nil
	}
	if !known {
		if _, ok, err := r.Ledger.Get(ctx, m.InstanceID); err != nil || !ok {
			sum.Skipped = "unknown"
			r.Log.LogAttrs(ctx, slog.LevelDebug, "state change skipped", slog.String("instance", m.InstanceID),
				slog.String("state", m.State), slog.Bool("described", false))
			return sum, err
		}
	}
	sc := ledger.StateChange{State: m.State, At: m.Time, Rank: statechange.Rank(m.State), Gone: instances.Gone(m.State)}
	var rec ledger.Record
	if r.DryRun {
		rec, _, err = r.Ledger.Get(ctx, m.InstanceID)
		rec.InstanceID, rec.LastState = m.InstanceID, m.State
		if rec.Pod == (ledger.PodRef{}) {
			rec.Pod = inst.Pod
		}
		if sc.Gone && rec.Gone == nil {
			rec.Gone = &ledger.Gone{State: m.State, At: m.Time}
		}
	} else {
		rec, err = r.Ledger.RecordState(ctx, m.InstanceID, inst.Pod, sc)
	}
	if err != nil {
		return sum, err
	}
	if !sc.Gone {
		return sum, nil // recorded for latency figures only
	}
	rep, err := r.Reconcile(ctx, rec, Seen{Instances: found})
	sum.PodResult, sum.Terminate = string(rep.PodResult), string(rep.TerminateResult)
	if rep.Rejected {
		sum.Skipped = rep.Distrust
	}
	if !rep.Plan.WaitUntil.IsZero() {
		sum.WaitUntil = rep.Plan.WaitUntil.UTC().Format("2006-01-02T15:04:05Z")
	}
	return sum, err
}
