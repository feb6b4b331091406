package reaper

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/reaper-k8s/reaper/pkg/instances"
	"github.com/reaper-k8s/reaper/pkg/kube"
	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/model"
)

// endAfterPod is the End the entry's Pod step leaves: the plan's when the
// Pod was written or needs no write; Plan.EndUnwritten when the write
// failed, since a failed write must not hide the exit nor keep a GPU
// billing. When the batch had no time for the write, none: a provider that
// derives the Pod's status from the instance's state would otherwise see
// the instance go first and write its own "instance gone" status, which
// the terminal guard then keeps. On the entry's last attempt, though, it
// is Plan.EndUnwritten: a Pod that can never be written in time (an
// admission chain slower than any batch) must not keep its instance
// billing.
func (e *entry) endAfterPod() End {
	switch {
	case e.view == nil:
		return End{}
	case e.plan.Pod == nil || e.podErr == nil:
		return e.plan.End
	case !deferrable(e.podErr) || e.lastAttempt():
		return e.plan.EndUnwritten
	}
	return End{}
}

// orphanConfirmed says whether the entry is an orphan whose Pod, read
// again in this batch, is deleted, replaced or finished.
func (e *entry) orphanConfirmed() bool {
	return e.orphan && e.snap != nil && e.snap.Result != kube.Current
}

// terminate is the batch's terminate phase: one Terminate for the
// instances the plans end now and the confirmed orphans (at most 1,000 ids
// a call, waiting for tokens at most maxTokenWait), and beside it, on
// their own bucket and in their own call, the Pod-written tags.
func (b *batchRun) terminate(ctx context.Context) {
	var targets []string
	known := map[string]instances.Instance{}
	for _, e := range b.live() {
		if e.ec2 != nil {
			known[e.id] = *e.ec2
		}
		e.end = e.endAfterPod()
		if e.end.Now || e.orphanConfirmed() {
			targets = append(targets, e.id)
		}
		if e.orphanConfirmed() {
			b.Log.LogAttrs(ctx, slog.LevelWarn, "orphaned instance", slog.String("instance", e.id),
				slog.String("pod", e.ec2.Pod.String()), slog.String("pod state", string(e.snap.Result)))
		}
	}
	termCtx, cancel := b.p.terminateContext(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() { b.tagPodWritten(termCtx) })
	if len(targets) > 0 {
		out := b.Fleet.Terminate(termCtx, targets, known)
		for _, e := range b.live() {
			if !e.end.Now && !e.orphanConfirmed() {
				continue
			}
			e.term, e.refusal = out.Outcome[e.id], out.Refusals[e.id]
			if err, left := out.Left[e.id]; left {
				e.termErr = outOfTime(termCtx, fmt.Errorf("terminate: %w", err))
			}
		}
	}
	wg.Wait()
}

// tagPodWritten tags, with Policy.PodWrittenTag, the instances still
// running whose Pod this batch wrote and which are left their grace to
// power off: a host that waits for the tag (through the instance
// metadata) powers off only once its Pod tells its exit, so that a
// provider deriving the Pod's status from the instance's state never
// writes "instance gone" first. One CreateTags per 1,000 ids, its value
// the time of the writes, on the tag bucket: it takes none of the
// terminate's tokens. A tag not put is logged and counted; the instance is
// then terminated when its grace ends.
func (b *batchRun) tagPodWritten(ctx context.Context) {
	if b.Policy.PodWrittenTag == "" {
		return
	}
	var ids []string
	for _, e := range b.live() {
		if e.view != nil && e.plan.Pod != nil && e.podErr == nil && e.plan.PodEnds && !e.end.At.IsZero() &&
			e.ec2 != nil && e.ec2.Owned && !model.IsEnding(e.ec2.State) {
			ids = append(ids, e.id)
		}
	}
	if len(ids) == 0 {
		return
	}
	value := b.Now().UTC().Format(time.RFC3339)
	if left, err := b.Fleet.Tag(ctx, ids, b.Policy.PodWrittenTag, value); err != nil {
		b.Metrics.Count(metrics.PodWrittenTagsFailed, len(left))
		b.Log.LogAttrs(ctx, slog.LevelWarn, "pod-written tag not put", slog.Int("instances", len(left)),
			slog.String("tag", b.Policy.PodWrittenTag), slog.String("error", err.Error()))
	}
}

// terminationRefused reports an instance EC2 would not terminate
// (termination protection, a policy): a warning, a count by EC2's code,
// and an Event on its Pod, whose owner is the one to know. Reaper asks
// again after RefusalBackoff.
func (r *Reaper) terminationRefused(ctx context.Context, id string, pod model.PodRef, code string) {
	r.Metrics.By(metrics.Reason(code)).Count(metrics.TerminationsRefused, 1)
	r.Log.LogAttrs(ctx, slog.LevelWarn, "termination refused", slog.String("instance", id), slog.String("pod", pod.String()),
		slog.String("code", code), slog.Duration("askAgainIn", RefusalBackoff))
	if pod.UID == "" {
		return
	}
	msg := fmt.Sprintf("EC2 refused to terminate instance %s (%s): it keeps running and billing. Termination protection (disableApiTermination) or a policy denying ec2:TerminateInstances does this; Reaper asks again in %s.", id, code, RefusalBackoff)
	if err := r.Pods.Warn(ctx, pod, id, "TerminationRefused", msg); err != nil {
		r.Log.LogAttrs(ctx, slog.LevelWarn, "event not posted", slog.String("instance", id), slog.String("error", err.Error()))
	}
}
