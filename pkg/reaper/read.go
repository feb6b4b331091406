package reaper

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/reaper-k8s/reaper/pkg/metrics"
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
	lookup = b.unknownLast(lookup)
	b.sum.Lookups = len(lookup)
	if len(lookup) == 0 {
		return
	}
	lookupIDs := make([]string, len(lookup))
	for i, e := range lookup {
		lookupIDs[i] = e.id
	}
	described := b.Fleet.Describe(ctx, lookupIDs)
	var unknown []string
	for _, e := range lookup {
		if err, left := described.Left[e.id]; left {
			e.conclude(outOfTime(ctx, fmt.Errorf("check instance against its tags: %w", err)))
			continue
		}
		e.asked = true
		if inst, ok := described.Found[e.id]; ok {
			e.ec2 = &inst
		} else if e.stored == nil {
			unknown = append(unknown, e.id)
		}
	}
	b.unknown.add(unknown, b.Now())
}

// maxRechecks is the most claims for instances EC2 did not know (checked
// again, unknownChecks) a batch describes: one DescribeInstances. A flood
// of made-up instance ids then costs a call a batch at most, after the
// claims of the instances the ledger knows and the new ones.
const maxRechecks = 200

// unknownLast orders the lookups so that EC2's tokens go first to the
// instances the ledger knows (a Pod of), then to new ones, then to the claims EC2
// did not know when last asked; those EC2 answered unknown lately
// (unknownIDs) are taken as unknown without a call, and the rechecks
// beyond maxRechecks are held back: their messages go back on the queue
// as they came, DeferDelay later, neither checked nor counted as an
// attempt, since they are neither a shortage of tokens nor a failure (a
// flood of made-up ids drains at maxRechecks a batch, and never reaches
// the dead-letter queue). Both are counted.
func (b *batchRun) unknownLast(lookup []*entry) []*entry {
	var known, fresh, rechecks []*entry
	now := b.Now()
	for _, e := range lookup {
		switch {
		case e.stored != nil && e.stored.Pod.UID != "":
			known = append(known, e)
		case e.rechecked():
			rechecks = append(rechecks, e)
		case b.unknown.lately(e.id, now):
			e.asked = true
			b.sum.UnknownRemembered++
		default:
			fresh = append(fresh, e)
		}
	}
	if len(rechecks) > maxRechecks {
		for _, e := range rechecks[maxRechecks:] {
			e.heldBack = true
			for _, it := range e.items {
				b.sendAgain(e, it.Message)
			}
		}
		b.sum.RechecksHeldBack = len(rechecks) - maxRechecks
		rechecks = rechecks[:maxRechecks]
	}
	b.Metrics.Count(metrics.UnknownInstancesRemembered, b.sum.UnknownRemembered)
	return slices.Concat(known, fresh, rechecks)
}

// rechecked says whether one of the entry's messages is a check made again.
func (e *entry) rechecked() bool {
	return slices.ContainsFunc(e.items, func(it workqueue.Item) bool { return it.Checks > 0 })
}

// unknownTTL is how long a warm reconciler takes an instance id EC2
// answered it does not know for unknown, without asking again, on a first
// claim for it; checks made again (unknownChecks) always ask.
const unknownTTL = 2 * time.Minute

// unknownIDs are the instance ids EC2 lately answered it does not know,
// with when, in one warm process.
type unknownIDs struct {
	mu   sync.Mutex
	seen map[string]time.Time
}

// lately says whether EC2 answered it does not know id less than
// unknownTTL before now.
func (u *unknownIDs) lately(id string, now time.Time) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	at, ok := u.seen[id]
	return ok && now.Sub(at) < unknownTTL
}

// add remembers ids as answered unknown at now, and forgets those older
// than unknownTTL.
func (u *unknownIDs) add(ids []string, now time.Time) {
	if len(ids) == 0 {
		return
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.seen == nil {
		u.seen = map[string]time.Time{}
	}
	maps.DeleteFunc(u.seen, func(_ string, at time.Time) bool { return now.Sub(at) >= unknownTTL })
	for _, id := range ids {
		u.seen[id] = now
	}
}

// needsLookup says whether the entry's instance must be described: unless
// Reaper already checked and terminated it and its messages are state
// changes or wake-ups (sweeps), which only have the record's own verdict
// carried out. In a burst those are most messages, and they need no EC2
// call.
func (e *entry) needsLookup() bool {
	settled := e.stored != nil && !e.stored.Terminated.IsZero()
	return !settled || slices.ContainsFunc(e.items, func(it workqueue.Item) bool {
		switch it.Body.(type) {
		case workqueue.StateChange, workqueue.SweepRequest:
			return false
		}
		return true
	})
}
