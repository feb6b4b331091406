package reaper

import (
	"context"
	"log/slog"
	"time"

	"github.com/reaper-k8s/reaper/pkg/instances"
	"github.com/reaper-k8s/reaper/pkg/kube"
	"github.com/reaper-k8s/reaper/pkg/ledger"
	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/model"
	"github.com/reaper-k8s/reaper/pkg/workqueue"
)

// Ledger is the instance ledger (package ledger).
type Ledger interface {
	Get(ctx context.Context, instanceID string) (ledger.Record, bool, error)
	RecordExit(ctx context.Context, instanceID string, pod model.PodRef, exitTokenHash string, exit model.Exit) (ledger.Record, error)
	RecordState(ctx context.Context, instanceID string, pod model.PodRef, exitTokenHash string, sc ledger.StateChange) (ledger.Record, error)
	Adopt(ctx context.Context, instanceID string, pod model.PodRef, exitTokenHash string) (ledger.Record, error)
	MarkDone(ctx context.Context, instanceID string, d ledger.Done) error
	ExitQueued(ctx context.Context, instanceID string, until time.Time) error
	Pending(ctx context.Context, fn func(ledger.Record) error) error
	GetMany(ctx context.Context, ids []string) ledger.Fetched
}

// Pods reads Pods, a batch at a time, and writes their status from what
// was read (package kube). ClusterIdentity says which cluster they are
// read from; Warn tells a Pod's owner what Reaper could not do.
type Pods interface {
	ReadMany(ctx context.Context, refs []model.PodRef) (map[model.PodRef]kube.Snapshot, error)
	ApplyTo(ctx context.Context, snap kube.Snapshot, o model.Outcome) (kube.Applied, error)
	ClusterIdentity(ctx context.Context) (string, error)
	Warn(ctx context.Context, ref model.PodRef, instance, reason, message string) error
}

// Fleet reads and terminates EC2 instances (package instances).
type Fleet interface {
	Describe(ctx context.Context, ids []string) instances.Described
	Terminate(ctx context.Context, ids []string, known map[string]instances.Instance) instances.Terminated
	Tag(ctx context.Context, ids []string, key, value string) ([]string, error)
	ListOwned(ctx context.Context, fn func(instances.Instance) error) error
}

// Queue is a work queue (package workqueue): it returns the messages it
// could not send.
type Queue interface {
	Send(ctx context.Context, delay time.Duration, msgs ...workqueue.Message) ([]workqueue.Message, error)
}

// Reaper carries out plans.
type Reaper struct {
	Ledger Ledger
	Pods   Pods
	Fleet  Fleet
	Policy Policy
	// Queue takes the work the reconciler does in batches.
	Queue Queue
	// DeadLetters takes, with its reason, the work the reconciler could
	// not finish in workqueue.MaxAttempts batches (the work queue's
	// dead-letter queue). Without it such work is returned as a batch item
	// failure, and SQS moves it there after its maxReceiveCount.
	DeadLetters Queue
	Log         *slog.Logger
	// Metrics records what the handlers did (nil records nothing); each
	// handler flushes it before it returns.
	Metrics *metrics.Recorder
	Now     func() time.Time

	// unknown are the instance ids EC2 lately answered it does not know.
	unknown unknownIDs
}

// flushMetrics writes what the invocation recorded; a failed write is
// logged, never the invocation's error.
func (r *Reaper) flushMetrics(ctx context.Context) {
	if err := r.Metrics.Flush(ctx); err != nil {
		r.Log.WarnContext(ctx, "metrics not written", "error", err)
	}
}

// errorLevel is the level of a summary line whose work ended with err.
func errorLevel(err error) slog.Level {
	if err != nil {
		return slog.LevelError
	}
	return slog.LevelInfo
}
