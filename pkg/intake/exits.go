// Package intake takes in the events that report a Pod's end: the exit
// lines the hosts ship (the exitrecorder) and EC2's state changes (the
// statechange function), and hands them to the reconciler through the work
// queue. It calls neither EC2 nor Kubernetes, and writes no ledger: a
// lookup per event would spend the account's shared buckets one call per
// exit when thousands end together, so the reconciler checks them in
// batches (package reaper), and only what the instance's launch tags back
// ever reaches the ledger.
package intake

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/reaper-k8s/reaper/pkg/exitline"
	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/model"
	"github.com/reaper-k8s/reaper/pkg/workqueue"
)

// Queue is the work queue (package workqueue).
type Queue interface {
	Send(ctx context.Context, delay time.Duration, msgs ...workqueue.Message) (unsent []workqueue.Message, err error)
}

// Intake queues what the events report.
type Intake struct {
	Queue Queue
	Log   *slog.Logger
	// Metrics records what the handlers did (nil records nothing); each
	// handler flushes it before it returns.
	Metrics *metrics.Recorder
	Now     func() time.Time
}

// ExitSummary counts what one exit batch came to.
type ExitSummary struct {
	InstanceID string `json:"instanceId"`
	Lines      int    `json:"lines"`
	// Recorded counts the well-formed lines once every one of their claims
	// is on the queue (0 when any could not be queued): nothing is
	// recorded in the ledger here. The queue holds the claims until the
	// reconciler has checked them and written the ledger: the queue
	// message is the exit's write-ahead record. metrics.ExitsRecorded
	// counts the same.
	Recorded int `json:"recorded"`
	// Queued counts the exit claims handed to the reconciler, which checks
	// them against the instance's tags: one per Pod, container and token
	// the lines name, less those the queue did not take.
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
func (in *Intake) recordRejections(s ExitSummary) {
	for reason, n := range s.RejectedFor {
		in.Metrics.By(metrics.Reason(reason)).Count(metrics.LinesRejected, n)
	}
}

// HandleLogsEvent is the exitrecorder's handler: one CloudWatch Logs
// subscription payload, the lines of one instance.
func (in *Intake) HandleLogsEvent(ctx context.Context, ev events.CloudwatchLogsEvent) (ExitSummary, error) {
	defer in.flushMetrics(ctx)
	batch, err := exitline.FromLogsEvent(ev, in.Now())
	if err != nil {
		// A payload that cannot be decoded or attributed will not decode
		// better on a retry: log it and count it, do not fail. A stream
		// not named as EC2 names instances (exitline.ErrBadStream) is one:
		// its lines name no instance Reaper could ask EC2 about.
		in.Log.ErrorContext(ctx, "payload rejected", "reason", model.ReasonUndecodable, "error", err)
		var sum ExitSummary
		sum.reject(model.ReasonUndecodable)
		in.recordRejections(sum)
		return sum, nil
	}
	if batch.Control {
		return ExitSummary{}, nil
	}
	return in.HandleExits(ctx, batch)
}

// HandleExits hands the reconciler the latest exit line of each container
// of each Pod the batch's lines name, one for each token they carry, as a
// claim to check
// against the instance's launch tags. Bad lines are logged and counted, never fatal to the batch. An
// error returned here (any claim could not be queued) fails the
// invocation: Lambda retries it, and then keeps the event in the
// function's failure destination, so no exit is lost. The claims that did
// land are queued again by the retry, which the reconciler takes as the
// duplicates it already expects.
//
// No EC2 call is made here: a tag lookup per exit would spend the
// account's DescribeInstances bucket one call per exit in a burst; the
// reconciler makes one per 200 instances. Nor is the ledger written: a
// line is a host's word, and only what its instance's tags back is
// recorded, by the reconciler, once per batch.
func (in *Intake) HandleExits(ctx context.Context, b exitline.Batch) (sum ExitSummary, err error) {
	sum = ExitSummary{InstanceID: b.InstanceID, Lines: len(b.Lines) + len(b.Rejected)}
	defer func() { in.recordRejections(sum) }()
	for _, rej := range b.Rejected {
		sum.reject(rej.Reason)
		in.Log.LogAttrs(ctx, slog.LevelWarn, "exit line rejected", slog.String("instance", b.InstanceID),
			slog.String("eventId", rej.EventID), slog.String("reason", rej.Reason), slog.String("error", rej.Err.Error()))
	}
	if len(b.Lines) == 0 {
		return sum, nil
	}
	// One claim per Pod, container and token: a forged line naming
	// another Pod, or carrying another token than the instance's, cannot
	// hide the real one, whatever its restart count, nor one container's
	// line another's. A container's status is derived from its latest
	// exit alone (its restart counts order them). The token goes no
	// further: the claim carries its hash, which the instance's tag must
	// equal.
	type claimant struct{ uid, container, tokenHash string }
	claimants := make([]claimant, len(b.Lines))
	latest := map[claimant]int{}
	for i, l := range b.Lines {
		claimants[i] = claimant{l.PodUID, l.Container, l.TokenHash()}
		latest[claimants[i]] = i
	}
	msgs := make([]workqueue.Message, 0, len(latest))
	for i, l := range b.Lines {
		if c := claimants[i]; latest[c] == i {
			pod, exit := l.Claim()
			m := workqueue.Exit(b.InstanceID, pod, exit)
			m.TokenHash = c.tokenHash
			msgs = append(msgs, m)
		}
	}
	unsent, err := in.Queue.Send(ctx, 0, msgs...)
	sum.Queued = len(msgs) - len(unsent)
	in.Metrics.Count(metrics.WorkItemsQueued, sum.Queued)
	if err != nil {
		return sum, fmt.Errorf("hand exit of %s to the reconciler: %w", b.InstanceID, err)
	}
	sum.Recorded = len(b.Lines)
	in.Metrics.Count(metrics.ExitsRecorded, sum.Recorded)
	return sum, nil
}

// flushMetrics writes what the invocation recorded; a failed write is
// logged, never the invocation's error.
func (in *Intake) flushMetrics(ctx context.Context) {
	if err := in.Metrics.Flush(ctx); err != nil {
		in.Log.WarnContext(ctx, "metrics not written", "error", err)
	}
}
