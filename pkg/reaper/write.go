package reaper

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"

	"github.com/reaper-k8s/reaper/pkg/instances"
	"github.com/reaper-k8s/reaper/pkg/kube"
	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/model"
	"github.com/reaper-k8s/reaper/pkg/workqueue"
)

// decide is the batch's decide phase: one Plan per believed record, and
// whether each orphan message's instance is still a candidate
// (mayBeOrphan), at most as many as the orphan cap allows (capOrphans).
// Nothing after it decides again.
func (b *batchRun) decide() {
	now := b.Now()
	running := 0
	for _, e := range b.live() {
		if e.view != nil {
			e.plan = Decide(*e.view, e.ec2, e.livePod(), now, b.Policy)
		}
		for _, it := range e.items {
			if c, ok := it.Body.(workqueue.OrphanCheck); ok {
				e.orphan = e.ec2 != nil && mayBeOrphan(*e.ec2, e.stored, now)
				running = max(running, c.Running)
			}
		}
	}
	b.capOrphans(running)
}

// capOrphans keeps as this batch's orphan candidates at most its part of
// Policy.orphanLimit of the running owned instances the sweep counted (the
// orphan messages' Running), the oldest first: Policy.Reconcilers batches
// may run at once, so together they end no more than one sweep may, even
// when orphan messages gather on the queue (several sweeps', a redrive).
// The rest are held back, counted, and their messages dropped: the next
// sweep finds them again if they are still orphans, so they neither circle
// on the queue nor reach the dead-letter queue.
func (b *batchRun) capOrphans(running int) {
	if b.Policy.OrphanCap <= 0 {
		return
	}
	var candidates []*entry
	for _, e := range b.live() {
		if e.orphan {
			candidates = append(candidates, e)
		}
	}
	limit := b.Policy.batchOrphanLimit(running)
	if len(candidates) <= limit {
		return
	}
	slices.SortFunc(candidates, func(x, y *entry) int {
		return cmp.Or(x.ec2.LaunchTime.Compare(y.ec2.LaunchTime), cmp.Compare(x.id, y.id))
	})
	for _, e := range candidates[limit:] {
		e.orphan = false
	}
	b.sum.OrphansHeldBack = len(candidates) - limit
	b.Metrics.Count(metrics.OrphansHeldBack, b.sum.OrphansHeldBack)
}

// writePods is the batch's Pod phase: it writes each planned outcome to
// its Pod as readPods read it. Pods that phase did not read (a plan it did
// not foresee) and the orphan candidates' are read here, in LIST pages
// (the reads may take half the phase's time: a slow apiserver then still
// leaves the other half to write those that were read). A write the phase
// had no time for keeps errNoTime: its record comes back, and its instance
// is not terminated before its Pod tells its exit (endAfterPod).
func (b *batchRun) writePods(ctx context.Context) {
	var writes []*entry
	var refs []model.PodRef
	for _, e := range b.live() {
		if e.view != nil && e.plan.Pod != nil {
			writes = append(writes, e)
			if e.view.Pod.UID == "" {
				e.podErr = fmt.Errorf("instance %s: no Pod known for it (no exit line and no pod tags)", e.id)
				continue
			}
			e.podErr = errNoTime // until it is written
			if e.snap == nil || e.snap.Ref != e.view.Pod {
				e.snap = nil
				refs = append(refs, e.view.Pod)
			}
		}
	}
	orphans := b.sameClusterOrphans(ctx)
	for _, e := range orphans {
		refs = append(refs, e.ec2.Pod)
	}
	var snaps map[model.PodRef]kube.Snapshot
	var readErr error
	if len(refs) > 0 {
		readCtx, cancelRead := until(ctx, halfway(b.p.work))
		snaps, readErr = b.Pods.ReadMany(readCtx, refs)
		readErr = outOfTime(readCtx, readErr)
		cancelRead()
	}
	for _, e := range orphans {
		if snap, ok := snaps[e.ec2.Pod]; ok {
			e.snap = &snap
		} else {
			e.conclude(fmt.Errorf("read pod %s: %w", e.ec2.Pod, readErr))
		}
	}
	var g errgroup.Group
	g.SetLimit(podWorkers)
	for _, e := range writes {
		if e.snap == nil {
			if snap, ok := snaps[e.view.Pod]; ok {
				e.snap = &snap
			}
		}
		switch {
		case e.view.Pod.UID == "":
		case e.snap == nil:
			e.podErr = fmt.Errorf("read pod %s: %w", e.view.Pod, cmp.Or(readErr, e.podReadErr))
		case ctx.Err() == nil:
			snap := *e.snap
			g.Go(func() error {
				e.pod, e.podErr = b.Pods.ApplyTo(ctx, snap, *e.plan.Pod)
				e.podErr = outOfTime(ctx, e.podErr)
				return nil
			})
		}
	}
	_ = g.Wait()
}

// readPods reads, in LIST pages, the Pods of the entries that may write
// one, before their claims are applied: a claim's container is checked
// against its Pod's spec (applyEntry), and the decision reads the spec
// (Decide). It reads no Pod for a record Reaper already ended, nor for an
// instance that is not this deployment's or not known, whose claims name
// Pods nobody checked. A read that fails leaves the entry without its Pod
// (e.podReadErr): its claims are still recorded, and the decision falls
// back on what the record says.
func (b *batchRun) readPods(ctx context.Context) {
	var refs []model.PodRef
	for _, e := range b.live() {
		if ref, ok := e.podToRead(); ok {
			refs = append(refs, ref)
		}
	}
	if len(refs) == 0 {
		return
	}
	readCtx, cancel := until(ctx, halfway(b.p.work))
	snaps, err := b.Pods.ReadMany(readCtx, refs)
	err = outOfTime(readCtx, err)
	cancel()
	for _, e := range b.live() {
		ref, ok := e.podToRead()
		if !ok {
			continue
		}
		if snap, read := snaps[ref]; read {
			e.snap = &snap
		} else {
			e.podReadErr = err
		}
	}
}

// podToRead is the Pod readPods reads for the entry, if any: the one its
// instance's launch tags name, or its record's. It is read for an exit
// claim, and for a record whose Pod lives on with something that may
// need its spec (container exits to weigh, or its instance gone); not for
// a record whose Pod Reaper wrote ended (work deferred after its write
// comes back for the terminate alone), nor for a state change of an
// instance it has no record of (nothing is written before the exit-wait
// window).
func (e *entry) podToRead() (model.PodRef, bool) {
	var ref model.PodRef
	switch {
	case e.ec2 != nil && e.ec2.Owned:
		ref = e.ec2.Pod
	case e.ec2 == nil && e.stored != nil:
		ref = e.stored.Pod
	}
	if ref.UID == "" {
		return model.PodRef{}, false
	}
	if slices.ContainsFunc(e.items, isExit) {
		return ref, true
	}
	rec := e.stored
	if rec == nil || (rec.PodEnded != nil && *rec.PodEnded) || rec.PodSynced == lostKey {
		return model.PodRef{}, false
	}
	return ref, len(rec.Runs()) > 0 || rec.Gone != nil
}

// livePod is the entry's Pod as read in this batch, when it is live (nil:
// not read, gone, replaced or ended).
func (e *entry) livePod() *corev1.Pod {
	if e.snap == nil || e.snap.Result != kube.Current {
		return nil
	}
	return e.snap.Pod()
}

// sameClusterOrphans are the orphan candidates launched for the cluster
// Reaper reaches (sameCluster); those of another identity are dropped,
// counted, and without the identity every candidate's work fails.
func (b *batchRun) sameClusterOrphans(ctx context.Context) []*entry {
	var candidates []*entry
	var insts []instances.Instance
	for _, e := range b.live() {
		if e.orphan {
			candidates = append(candidates, e)
			insts = append(insts, *e.ec2)
		}
	}
	if len(candidates) == 0 {
		return nil
	}
	same, _, err := b.sameCluster(ctx, insts)
	if err != nil {
		for _, e := range candidates {
			e.conclude(outOfTime(ctx, err))
		}
		return nil
	}
	keep := make(map[string]bool, len(same))
	for _, inst := range same {
		keep[inst.ID] = true
	}
	var out []*entry
	for _, e := range candidates {
		if keep[e.id] {
			out = append(out, e)
		} else {
			e.orphan = false
		}
	}
	return out
}
