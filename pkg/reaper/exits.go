package reaper

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"

	"github.com/aws/aws-lambda-go/events"

	"github.com/reaper-k8s/reaper/pkg/exitline"
	"github.com/reaper-k8s/reaper/pkg/ledger"
)

// ExitSummary counts what one exit batch came to.
type ExitSummary struct {
	InstanceID string `json:"instanceId"`
	Lines      int    `json:"lines"`
	Recorded   int    `json:"recorded"`
	Rejected   int    `json:"rejected"`
	PodResult  string `json:"podResult,omitempty"`
	Terminate  string `json:"terminate,omitempty"`
}

// HandleLogsEvent is the exitrecorder's handler: one CloudWatch Logs
// subscription payload, the lines of one instance.
func (r *Reaper) HandleLogsEvent(ctx context.Context, ev events.CloudwatchLogsEvent) (ExitSummary, error) {
	batch, err := exitline.FromLogsEvent(ev)
	if err != nil {
		// A payload that cannot be decoded or attributed will not decode
		// better on a retry: log it and count it, do not fail.
		r.Log.ErrorContext(ctx, "payload rejected", "error", err)
		return ExitSummary{Rejected: 1}, nil
	}
	if batch.Control {
		return ExitSummary{}, nil
	}
	return r.HandleExits(ctx, batch)
}

// HandleExits records a batch's exit lines and reconciles the instance. Bad
// lines are logged and counted, never fatal to the batch. The exits are in
// the ledger before any side effect, so an error returned here (the
// invocation is retried) loses nothing and the retry redoes only what is
// missing.
//
// While the exits are written, the Pod and (when the workload has ended) the
// instance are read ahead: the steps need both reads, and making them after
// the write would put two more round trips on every exit. A read that turns
// stale in between costs nothing in safety: the status patch is
// conditional on the Pod's resourceVersion and UID, and terminating an
// instance that has gone meanwhile answers that it is gone.
func (r *Reaper) HandleExits(ctx context.Context, b exitline.Batch) (ExitSummary, error) {
	sum := ExitSummary{InstanceID: b.InstanceID, Lines: len(b.Lines) + len(b.Rejected), Rejected: len(b.Rejected)}
	for _, rej := range b.Rejected {
		r.Log.LogAttrs(ctx, slog.LevelWarn, "exit line rejected",
			slog.String("instance", b.InstanceID), slog.String("eventId", rej.EventID), slog.String("error", rej.Err.Error()))
	}
	if len(b.Lines) == 0 {
		return sum, nil
	}

	readAhead := r.readAhead(ctx, b)
	var (
		rec ledger.Record
		err error
	)
	for _, l := range b.Lines {
		pod, exit := FromLine(l)
		if r.DryRun {
			rec, err = r.dryRecord(ctx, b.InstanceID, pod, exit)
		} else {
			rec, err = r.Ledger.RecordExit(ctx, b.InstanceID, pod, exit)
		}
		if err != nil {
			// Nothing after this line was recorded: fail so the batch is
			// delivered again. The reads end with the invocation.
			readAhead()
			return sum, fmt.Errorf("record exit of %s: %w", b.InstanceID, err)
		}
		sum.Recorded++
	}
	rep, err := r.Reconcile(ctx, rec, readAhead())
	sum.PodResult, sum.Terminate = string(rep.PodResult), string(rep.TerminateResult)
	return sum, err
}

// readAhead starts the reads the batch's steps will need and returns a
// function that waits for them. A read that fails is left out; the step
// then reads for itself and reports the error.
func (r *Reaper) readAhead(ctx context.Context, b exitline.Batch) func() Seen {
	last := b.Lines[len(b.Lines)-1]
	ref, _ := FromLine(last)
	var (
		wg   sync.WaitGroup
		seen Seen
	)
	wg.Go(func() {
		if snap, err := r.Pods.Read(ctx, ref); err == nil {
			seen.Pod = &snap
		}
	})
	if slices.ContainsFunc(b.Lines, func(l exitline.Line) bool { return !l.WillRestart }) {
		wg.Go(func() {
			if found, err := r.Fleet.Describe(ctx, []string{b.InstanceID}); err == nil {
				seen.Instances = found
			}
		})
	}
	return func() Seen {
		wg.Wait()
		return seen
	}
}

// dryRecord is RecordExit without the write: the record as it would stand.
func (r *Reaper) dryRecord(ctx context.Context, id string, pod ledger.PodRef, exit ledger.Exit) (ledger.Record, error) {
	rec, _, err := r.Ledger.Get(ctx, id)
	if err != nil {
		return rec, err
	}
	if rec.Exit == nil || rec.Exit.RestartCount <= exit.RestartCount {
		rec.InstanceID, rec.Pod, rec.Exit = id, pod, &exit
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
