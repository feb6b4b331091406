package reaper

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/aws/aws-lambda-go/events"

	"github.com/reaper-k8s/reaper/pkg/exitline"
	"github.com/reaper-k8s/reaper/pkg/ledger"
	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/workqueue"
)

// ExitSummary counts what one exit batch came to.
type ExitSummary struct {
	InstanceID string `json:"instanceId"`
	Lines      int    `json:"lines"`
	// Recorded counts the lines the ledger now reflects: one write per
	// batch, of the latest exit, which carries the earlier ones' count.
	Recorded int `json:"recorded"`
	// Queued counts the exit claims handed to the reconciler, which checks
	// them against the instance's tags: one per Pod the lines name.
	Queued   int `json:"queued"`
	Rejected int `json:"rejected"`
	// RejectedFor counts the rejected lines by reason.
	RejectedFor map[string]int `json:"rejectedFor,omitempty"`
}

func (s *ExitSummary) reject(reason string) {
	if s.RejectedFor == nil {
		s.RejectedFor = map[string]int{}
	}
	s.Rejected++
	s.RejectedFor[reason]++
}

// recordRejections counts the summary's rejected lines by reason.
func (r *Reaper) recordRejections(s ExitSummary) {
	for reason, n := range s.RejectedFor {
		r.Metrics.By(metrics.Reason(reason)).Count(metrics.LinesRejected, n)
	}
}

// ReasonUndecodable counts a payload that could not be decoded or
// attributed to an instance at all.
const ReasonUndecodable = metrics.ReasonUndecodable

// HandleLogsEvent is the exitrecorder's handler: one CloudWatch Logs
// subscription payload, the lines of one instance.
func (r *Reaper) HandleLogsEvent(ctx context.Context, ev events.CloudwatchLogsEvent) (ExitSummary, error) {
	defer r.flushMetrics(ctx)
	batch, err := exitline.FromLogsEvent(ev, r.Now())
	if err != nil {
		// A payload that cannot be decoded or attributed will not decode
		// better on a retry: log it and count it, do not fail.
		r.Log.ErrorContext(ctx, "payload rejected", "error", err)
		var sum ExitSummary
		sum.reject(ReasonUndecodable)
		r.recordRejections(sum)
		return sum, nil
	}
	if batch.Control {
		return ExitSummary{}, nil
	}
	return r.HandleExits(ctx, batch)
}

// HandleExits records a batch's latest exit in the ledger and hands the
// instance to the reconciler, with the latest exit line of each Pod the
// lines name as a claim to check against the instance's launch tags. Bad
// lines are logged and counted, never fatal to the batch. The exit is in
// the ledger before anything else, marked unverified until the reconciler
// has checked it, so an error returned here (the invocation is retried)
// loses nothing.
//
// No EC2 call is made here: a tag lookup per exit would spend the
// account's DescribeInstances bucket one call per exit in a burst; the
// reconciler makes one per 200 instances.
func (r *Reaper) HandleExits(ctx context.Context, b exitline.Batch) (sum ExitSummary, err error) {
	sum = ExitSummary{InstanceID: b.InstanceID, Lines: len(b.Lines) + len(b.Rejected)}
	defer func() { r.recordRejections(sum) }()
	for _, rej := range b.Rejected {
		sum.reject(rej.Reason)
		r.Log.LogAttrs(ctx, slog.LevelWarn, "exit line rejected", slog.String("instance", b.InstanceID),
			slog.String("eventId", rej.EventID), slog.String("reason", rej.Reason), slog.String("error", rej.Err.Error()))
	}
	if len(b.Lines) == 0 {
		return sum, nil
	}
	// The status is derived from the latest exit alone (restart counts
	// order them), so one write of it stands for the whole batch.
	pod, exit := FromLine(b.Lines[len(b.Lines)-1])
	if _, err := r.record(ctx, b.InstanceID, pod, exit, false); err != nil {
		return sum, fmt.Errorf("record exit of %s: %w", b.InstanceID, err)
	}
	sum.Recorded = len(b.Lines)
	r.Metrics.Count(metrics.ExitsRecorded, sum.Recorded)
	r.Metrics.Observe(metrics.FinishToRecorded, r.Now().Sub(exit.FinishedAt))

	// One claim per Pod: a forged line naming another Pod cannot hide the
	// real one, whatever its restart count.
	latest := map[string]int{}
	for i, l := range b.Lines {
		latest[l.PodUID] = i
	}
	msgs := make([]workqueue.Message, 0, len(latest))
	for i, l := range b.Lines {
		if latest[l.PodUID] == i {
			pod, exit := FromLine(l)
			msgs = append(msgs, workqueue.Exit(b.InstanceID, pod, exit))
		}
	}
	if err := r.Queue.Send(ctx, 0, msgs...); err != nil {
		return sum, fmt.Errorf("hand exit of %s to the reconciler: %w", b.InstanceID, err)
	}
	sum.Queued = len(msgs)
	r.Metrics.Count(metrics.WorkItemsQueued, len(msgs))
	return sum, nil
}

// flushMetrics writes what the invocation recorded; a failed write is
// logged, never the invocation's error.
func (r *Reaper) flushMetrics(ctx context.Context) {
	if err := r.Metrics.Flush(ctx); err != nil {
		r.Log.WarnContext(ctx, "metrics not written", "error", err)
	}
}

// record writes an exit to the ledger, or in a dry run returns the record
// as it would stand.
func (r *Reaper) record(ctx context.Context, id string, pod ledger.PodRef, exit ledger.Exit, verified bool) (ledger.Record, error) {
	if !r.DryRun {
		return r.Ledger.RecordExit(ctx, id, pod, exit, verified)
	}
	rec, _, err := r.Ledger.Get(ctx, id)
	if err != nil {
		return rec, err
	}
	if rec.Exit == nil || rec.Exit.RestartCount <= exit.RestartCount || (verified && rec.Unverified) {
		rec.InstanceID, rec.Pod, rec.Exit, rec.Unverified = id, pod, &exit, !verified
	}
	return rec, nil
}

// FromLine is what the ledger keeps of an exit line: the Pod it names and
// the exit.
func FromLine(l exitline.Line) (ledger.PodRef, ledger.Exit) {
	return ledger.PodRef{Namespace: l.PodNamespace, Name: l.PodName, UID: l.PodUID},
		ledger.Exit{
			Container:        l.Container,
			ContainerID:      l.ContainerID,
			ExitCode:         l.ExitCode,
			OOMKilled:        l.OOMKilled,
			Signal:           l.Signal,
			Error:            l.Error,
			StartedAt:        l.StartedAt,
			FinishedAt:       l.FinishedAt,
			RestartCount:     l.RestartCount,
			RuntimeRestarted: l.RuntimeRestarted,
			WillRestart:      l.WillRestart,
			BackoffSeconds:   l.BackoffSeconds,
		}
}
