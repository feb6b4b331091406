package reaper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/reaper-k8s/reaper/pkg/instances"
	"github.com/reaper-k8s/reaper/pkg/kube"
	"github.com/reaper-k8s/reaper/pkg/ledger"
	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/model"
	"github.com/reaper-k8s/reaper/pkg/workqueue"
)

// Queue is the work queue (package workqueue).
type Queue interface {
	Send(ctx context.Context, delay time.Duration, msgs ...workqueue.Message) error
}

// DeferDelay is how long work the reconciler's share of EC2's buckets
// could not cover waits on the queue before it is tried again.
const DeferDelay = 30 * time.Second

// deadlineMargin is kept free at the end of an invocation for the ledger
// writes and the response after the last EC2 call.
const deadlineMargin = 10 * time.Second

// BatchSummary is what one reconciler batch came to; it is logged as one
// line.
type BatchSummary struct {
	Messages  int `json:"messages"`
	Instances int `json:"instances"`
	// Invalid messages are dropped: they will not parse better later.
	Invalid int `json:"invalid"`
	// Lookups are the instances described.
	Lookups int `json:"lookups"`
	// Skipped instances are not this deployment's, or unknown to EC2 and
	// to the ledger.
	Skipped    int `json:"skipped"`
	Rejected   int `json:"rejected"`
	Reconciled int `json:"reconciled"`
	Patched    int `json:"patched"`
	Terminated int `json:"terminated"`
	Orphans    int `json:"orphans"`
	// Deferred instances went back on the queue for want of EC2 tokens.
	Deferred int `json:"deferred"`
	// Failed instances are returned as batch item failures.
	Failed int `json:"failed"`
}

// HandleQueueEvent is the reconciler's handler: one batch of the work
// queue, from the event source mapping. The messages of the instances whose
// work failed are returned as batch item failures and come back after the
// visibility timeout; everything else is deleted.
func (r *Reaper) HandleQueueEvent(ctx context.Context, ev events.SQSEvent) (events.SQSEventResponse, error) {
	defer r.flushMetrics(ctx)
	var resp events.SQSEventResponse
	byInstance := map[string][]workqueue.Item{}
	sum := BatchSummary{Messages: len(ev.Records)}
	now := r.Now()
	for _, rec := range ev.Records {
		it, err := workqueue.Parse(rec)
		if err != nil {
			sum.Invalid++
			r.Log.LogAttrs(ctx, slog.LevelError, "work item rejected", slog.String("messageId", rec.MessageId), slog.String("error", err.Error()))
			continue
		}
		if !it.SentAt.IsZero() {
			r.Metrics.Observe(metrics.QueueAge, now.Sub(it.SentAt))
		}
		byInstance[it.InstanceID] = append(byInstance[it.InstanceID], it)
	}
	sum.Instances = len(byInstance)
	failed := r.ReconcileBatch(ctx, byInstance, &sum)
	for id := range failed {
		for _, it := range byInstance[id] {
			resp.BatchItemFailures = append(resp.BatchItemFailures, events.SQSBatchItemFailure{ItemIdentifier: it.MessageID})
		}
	}
	sum.Failed = len(failed)
	r.Metrics.Count(metrics.WorkItemsFailed, sum.Failed)
	r.Log.LogAttrs(ctx, logLevel(), "batch",
		slog.Int("messages", sum.Messages), slog.Int("instances", sum.Instances), slog.Int("invalid", sum.Invalid),
		slog.Int("lookups", sum.Lookups), slog.Int("skipped", sum.Skipped), slog.Int("rejected", sum.Rejected),
		slog.Int("reconciled", sum.Reconciled), slog.Int("patched", sum.Patched), slog.Int("terminated", sum.Terminated),
		slog.Int("orphans", sum.Orphans), slog.Int("deferred", sum.Deferred), slog.Int("failed", sum.Failed))
	return resp, nil
}

// ReconcileBatch carries out the work items of a batch, grouped by
// instance, and returns the instances whose work failed (with why). It
// reads their ledger records together and describes, 200 ids a call, every
// instance whose tags are still to be checked; then applies what the
// messages report (state changes, checked exit claims), and reconciles the
// records together (ReconcileMany: the Pod writes, then the terminations).
// Work for which the reconciler's share of EC2's buckets runs out before
// its deadline is put back on the queue with a delay.
func (r *Reaper) ReconcileBatch(ctx context.Context, byInstance map[string][]workqueue.Item, sum *BatchSummary) map[string]error {
	if deadline, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline.Add(-deadlineMargin))
		defer cancel()
	}
	failed := map[string]error{}
	ids := slices.Sorted(maps.Keys(byInstance))
	records, err := r.Ledger.GetMany(ctx, ids)
	if err != nil {
		for _, id := range ids {
			failed[id] = err
		}
		return failed
	}

	// An instance needs its tags checked unless all its messages report
	// state changes of an instance Reaper already checked and terminated:
	// in a burst those are most messages, and they need no EC2 call.
	var lookup []string
	for _, id := range ids {
		rec, ok := records[id]
		settled := ok && !rec.Unverified && !rec.Terminated.IsZero()
		if !settled || slices.ContainsFunc(byInstance[id], func(it workqueue.Item) bool { return it.Kind != workqueue.KindState }) {
			lookup = append(lookup, id)
		}
	}
	sum.Lookups = len(lookup)
	known := map[string]instances.Instance{}
	if len(lookup) > 0 {
		known, err = r.Fleet.Describe(ctx, lookup)
	}
	if err != nil {
		// Fail closed: nothing acts on what EC2 has not confirmed. The
		// exits are in the ledger already; the messages come back.
		err = fmt.Errorf("check %d instances against their tags: %w", len(lookup), err)
		deferred := errors.Is(err, instances.ErrNoTokens)
		for _, id := range lookup {
			failed[id] = err
		}
		if deferred {
			r.deferWork(ctx, lookup, byInstance, failed, sum)
		}
		if len(lookup) == len(ids) {
			return failed
		}
	}

	var (
		work    []ledger.Record
		orphans []string
	)
	for _, id := range ids {
		if _, ok := failed[id]; ok {
			continue
		}
		rec, err := r.apply(ctx, id, byInstance[id], records, known, sum)
		switch {
		case err != nil:
			failed[id] = err
		case rec != nil:
			work = append(work, *rec)
		}
		if slices.ContainsFunc(byInstance[id], func(it workqueue.Item) bool { return it.Kind == workqueue.KindOrphan }) {
			orphans = append(orphans, id)
		}
	}

	reps, errs := r.ReconcileMany(ctx, work, known)
	var paced []string
	for i, rep := range reps {
		id := rep.InstanceID
		switch {
		case rep.Rejected:
			sum.Rejected++
		default:
			sum.Reconciled++
		}
		if rep.PodResult == kube.Patched {
			sum.Patched++
		}
		if rep.TerminateResult == instances.Terminating {
			sum.Terminated++
		}
		if errs[i] != nil {
			failed[id] = errs[i]
			if errors.Is(errs[i], instances.ErrNoTokens) {
				paced = append(paced, id)
			}
		}
	}
	r.deferWork(ctx, paced, byInstance, failed, sum)

	if err := r.terminateOrphans(ctx, orphans, records, known, sum); err != nil {
		for _, id := range orphans {
			failed[id] = err
		}
	}
	return failed
}

// apply records what an instance's messages report and returns its record
// if there is one to reconcile. State changes of instances that are not
// this deployment's, and exit claims the instance's tags do not back, are
// logged and dropped.
func (r *Reaper) apply(ctx context.Context, id string, items []workqueue.Item, records map[string]ledger.Record, known map[string]instances.Instance, sum *BatchSummary) (*ledger.Record, error) {
	rec, haveRecord := records[id]
	inst, described := known[id]
	if described && !inst.Owned {
		sum.Skipped++
		r.Log.LogAttrs(ctx, slog.LevelDebug, "work skipped", slog.String("instance", id),
			slog.Bool("managed", inst.Managed), slog.String("cluster", inst.Cluster))
		for _, it := range items {
			if it.Kind == workqueue.KindExit {
				if err := r.rejectClaim(ctx, id, *it.Pod, rec, inst, described); err != nil {
					return nil, err
				}
			}
		}
		return nil, nil
	}
	var reconcile bool
	for _, it := range items {
		switch it.Kind {
		case workqueue.KindState:
			if !described && !haveRecord {
				continue // not ours as far as anyone knows
			}
			sc := ledger.StateChange{State: it.State, At: it.At, Rank: model.StateRank(it.State), Gone: model.IsGone(it.State)}
			next, err := r.Ledger.RecordState(ctx, id, inst.Pod, sc)
			if err != nil {
				return nil, err
			}
			rec, haveRecord = next, true
			reconcile = reconcile || sc.Gone
		case workqueue.KindExit:
			if distrust(inst, described, *it.Pod) != "" {
				if err := r.rejectClaim(ctx, id, *it.Pod, rec, inst, described); err != nil {
					return nil, err
				}
				continue
			}
			next, err := r.Ledger.RecordExit(ctx, id, *it.Pod, *it.Exit, true)
			if err != nil {
				return nil, fmt.Errorf("record exit of %s: %w", id, err)
			}
			rec, haveRecord, reconcile = next, true, true
			r.Metrics.Observe(metrics.FinishToRecorded, r.Now().Sub(it.Exit.FinishedAt))
		case workqueue.KindSweep:
			reconcile = reconcile || haveRecord
		}
	}
	if !reconcile {
		if !haveRecord && !described && slices.ContainsFunc(items, func(it workqueue.Item) bool { return it.Kind == workqueue.KindState }) {
			sum.Skipped++
		}
		return nil, nil
	}
	return &rec, nil
}

// rejectClaim logs and counts an exit claim the instance's tags do not
// back. If the record holds the claim unverified (the exitrecorder wrote
// it), the record is settled untouched: nothing acts on it, and no sweep
// comes back to it.
func (r *Reaper) rejectClaim(ctx context.Context, id string, pod model.PodRef, rec ledger.Record, inst instances.Instance, described bool) error {
	reason := distrust(inst, described, pod)
	r.Metrics.By(metrics.Reason(reason)).Count(metrics.LinesRejected, 1)
	r.Log.LogAttrs(ctx, slog.LevelWarn, "exit line not believed", slog.String("instance", id),
		slog.String("reason", reason), slog.String("claimed", pod.String()), slog.String("claimedUID", pod.UID),
		slog.String("tags", inst.Pod.String()), slog.String("cluster", inst.Cluster))
	if !rec.Unverified || rec.Pod != pod || rec.Pending == "" {
		return nil
	}
	return r.Ledger.MarkDone(ctx, id, ledger.Done{Settled: true, Version: rec.Version})
}

// deferWork puts the messages of instances whose work waits for EC2 tokens
// back on the queue, delayed, and takes them off the failures; if that
// fails they stay failures and SQS brings them back after the visibility
// timeout. The messages go back as they came: an exit claim not yet checked
// is still to be checked.
func (r *Reaper) deferWork(ctx context.Context, ids []string, byInstance map[string][]workqueue.Item, failed map[string]error, sum *BatchSummary) {
	if len(ids) == 0 {
		return
	}
	var msgs []workqueue.Message
	for _, id := range ids {
		for _, it := range byInstance[id] {
			msgs = append(msgs, it.Message)
		}
	}
	// The batch's own deadline is spent; the send gets a moment of its own.
	sendCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), deadlineMargin/2)
	defer cancel()
	if err := r.Queue.Send(sendCtx, DeferDelay, msgs...); err != nil {
		r.Log.LogAttrs(ctx, slog.LevelError, "work not deferred", slog.Int("instances", len(ids)), slog.String("error", err.Error()))
		return
	}
	for _, id := range ids {
		delete(failed, id)
	}
	sum.Deferred += len(ids)
	r.Metrics.Count(metrics.WorkItemsDeferred, len(ids))
}

// terminateOrphans ends the instances the sweeper found running without a
// live Pod, once it is clear they still are: owned, running, no terminal
// exit in the ledger, and the Pod they were launched for deleted, replaced
// or finished (read again now).
func (r *Reaper) terminateOrphans(ctx context.Context, ids []string, records map[string]ledger.Record, known map[string]instances.Instance, sum *BatchSummary) error {
	var (
		mu      sync.Mutex
		targets []string
	)
	err := forEach(ctx, ids, func(id string) error {
		inst, ok := known[id]
		if !ok || !inst.Owned || (inst.State != model.StateRunning && inst.State != model.StatePending) || inst.Pod.UID == "" {
			return nil
		}
		if rec, ok := records[id]; ok && rec.Exit != nil && rec.Exit.Terminal() {
			return nil // its record ends it
		}
		pod, err := r.Pods.Read(ctx, inst.Pod)
		if err != nil || pod.Result == kube.Current {
			return err
		}
		r.Log.LogAttrs(ctx, slog.LevelWarn, "orphaned instance", slog.String("instance", id),
			slog.String("pod", inst.Pod.String()), slog.String("pod state", string(pod.Result)))
		mu.Lock()
		targets = append(targets, id)
		mu.Unlock()
		return nil
	})
	if len(targets) == 0 {
		return err
	}
	slices.Sort(targets)
	out, termErr := r.Fleet.Terminate(ctx, targets, known)
	errs := []error{err, termErr}
	for _, id := range targets {
		switch out[id] {
		case instances.WouldTerminate:
			sum.Orphans++
		case instances.Terminating:
			sum.Orphans++
			r.Metrics.Count(metrics.OrphansTerminated, 1)
			// Remember it, so that later sweeps and its state-change
			// events know the instance is settled: nothing is left to do
			// until those events report it gone (its Pod is not live).
			errs = append(errs, r.Ledger.MarkDone(ctx, id, ledger.Done{Terminated: true, Pod: known[id].Pod, Settled: true, Version: records[id].Version}))
		}
	}
	return errors.Join(errs...)
}
