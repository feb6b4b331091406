package reaper

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/aws/aws-lambda-go/events"

	"github.com/reaper-k8s/reaper/pkg/exitline"
	"github.com/reaper-k8s/reaper/pkg/ledger"
	"github.com/reaper-k8s/reaper/pkg/metrics"
)

// ExitSummary counts what one exit batch came to.
type ExitSummary struct {
	InstanceID string `json:"instanceId"`
	Lines      int    `json:"lines"`
	// Recorded counts the lines the ledger now reflects: one write per
	// batch, of the latest exit, which carries the earlier ones' count.
	Recorded int `json:"recorded"`
	Rejected int `json:"rejected"`
	// RejectedFor counts the rejected lines by reason.
	RejectedFor map[string]int `json:"rejectedFor,omitempty"`
	PodResult   string         `json:"podResult,omitempty"`
	Terminate   string         `json:"terminate,omitempty"`
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

// HandleExits checks a batch's exit lines against the instance's launch
// tags, records the latest believed exit and reconciles the instance. Bad
// and unbelieved lines are logged and counted, never fatal to the batch.
// The exit is in the ledger before any side effect, so an error returned
// here (the invocation is retried) loses nothing and the retry redoes only
// what is missing.
//
// The tag lookup and a read of the Pod go out together; the Pod read is
// used only for the Pod the tags name. If the lookup fails, the exit is
// still recorded, marked unverified, and nothing acts on it: the invocation
// fails and its retry, or a sweep, checks it again.
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

	seen, lookupErr := r.readAhead(ctx, b)
	if lookupErr != nil {
		pod, exit := FromLine(b.Lines[len(b.Lines)-1])
		if _, err := r.record(ctx, b.InstanceID, pod, exit, false); err != nil {
			return sum, fmt.Errorf("record unverified exit of %s: %w", b.InstanceID, err)
		}
		return sum, fmt.Errorf("check exit lines of %s against its tags: %w", b.InstanceID, lookupErr)
	}
	inst, known := seen.Instances[b.InstanceID]
	var believed []exitline.Line
	for _, l := range b.Lines {
		pod, _ := FromLine(l)
		if reason := distrust(inst, known, pod); reason != "" {
			sum.reject(reason)
			r.Log.LogAttrs(ctx, slog.LevelWarn, "exit line not believed", slog.String("instance", b.InstanceID),
				slog.String("reason", reason), slog.String("claimed", pod.String()), slog.String("claimedUID", pod.UID),
				slog.String("tags", inst.Pod.String()), slog.String("cluster", inst.Cluster))
			continue
		}
		believed = append(believed, l)
	}
	if len(believed) == 0 {
		return sum, nil
	}
	// The status is derived from the latest exit alone (restart counts
	// order them), so one write of it stands for the whole batch.
	pod, exit := FromLine(believed[len(believed)-1])
	rec, err := r.record(ctx, b.InstanceID, pod, exit, true)
	if err != nil {
		return sum, fmt.Errorf("record exit of %s: %w", b.InstanceID, err)
	}
	sum.Recorded = len(believed)
	r.Metrics.Count(metrics.ExitsRecorded, sum.Recorded)
	r.Metrics.Observe(metrics.FinishToRecorded, r.Now().Sub(exit.FinishedAt))
	rep, err := r.Reconcile(ctx, rec, seen)
	sum.PodResult, sum.Terminate = string(rep.PodResult), string(rep.TerminateResult)
	return sum, err
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

// readAhead looks the instance up and reads the Pod the latest line names,
// together. A failed Pod read is left out (the Pod step reads for itself
// and reports the error); a failed lookup is returned.
func (r *Reaper) readAhead(ctx context.Context, b exitline.Batch) (Seen, error) {
	ref, _ := FromLine(b.Lines[len(b.Lines)-1])
	var (
		wg        sync.WaitGroup
		seen      Seen
		lookupErr error
	)
	wg.Go(func() {
		if snap, err := r.Pods.Read(ctx, ref); err == nil {
			seen.Pod = &snap
		}
	})
	wg.Go(func() { seen.Instances, lookupErr = r.Fleet.Describe(ctx, []string{b.InstanceID}) })
	wg.Wait()
	return seen, lookupErr
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
