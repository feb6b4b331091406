package reaper

import (
	"context"
	"fmt"
	"slices"

	"github.com/reaper-k8s/reaper/pkg/workqueue"
)

// read is the batch's read phase: every entry's ledger record, 100 a call,
// and EC2's description of the instances whose tags are still to be
// checked, 200 a call. A read that fails costs only the entries of its
// own chunk: those EC2 or the ledger could not answer for in time or for
// want of tokens are deferred, the others whose chunk failed fail; nothing
// acts on what EC2 has not confirmed.
func (b *batchRun) read(ctx context.Context) {
	ids := make([]string, len(b.entries))
	for i, e := range b.entries {
		ids[i] = e.id
	}
	fetched := b.Ledger.GetMany(ctx, ids)
	var lookup []*entry
	for _, e := range b.entries {
		if err, left := fetched.Left[e.id]; left {
			e.conclude(outOfTime(ctx, fmt.Errorf("read the ledger: %w", err)))
			continue
		}
		if rec, ok := fetched.Found[e.id]; ok {
			e.stored = &rec
		}
		if e.needsLookup() {
			lookup = append(lookup, e)
		}
	}
	b.sum.Lookups = len(lookup)
	if len(lookup) == 0 {
		return
	}
	lookupIDs := make([]string, len(lookup))
	for i, e := range lookup {
		lookupIDs[i] = e.id
	}
	described := b.Fleet.Describe(ctx, lookupIDs)
	for _, e := range lookup {
		if err, left := described.Left[e.id]; left {
			e.conclude(outOfTime(ctx, fmt.Errorf("check instance against its tags: %w", err)))
			continue
		}
		e.asked = true
		if inst, ok := described.Found[e.id]; ok {
			e.ec2 = &inst
		}
	}
}

// needsLookup says whether the entry's instance must be described: unless
// Reaper already checked and terminated it and its messages are state
// changes or wake-ups (sweeps), which only have the record's own verdict
// carried out. In a burst those are most messages, and they need no EC2
// call.
func (e *entry) needsLookup() bool {
	settled := e.stored != nil && !e.stored.Unverified && !e.stored.Terminated.IsZero()
	return !settled || slices.ContainsFunc(e.items, func(it workqueue.Item) bool {
		return it.Kind != workqueue.KindState && it.Kind != workqueue.KindSweep
	})
}
