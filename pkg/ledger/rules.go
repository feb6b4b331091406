package ledger

import (
	"context"
	"maps"
	"time"

	"github.com/reaper-k8s/reaper/pkg/model"
)

// The rules of the ledger's conditional writes, in Go: what each write does
// to a record as it stands. The table's writes state them as DynamoDB
// condition and update expressions, so that concurrent writers need no
// read first; ReadOnly (a dry run) and the tests' in-memory ledger apply
// them here. TestRulesMatchTable holds both forms to the same answers.

// WithExit is rec after RecordExit(id, pod, exitTokenHash, exit) at now,
// and whether the write applies (false: rec is returned as it was). A
// later exit of the container wins, unless its recorded one is a
// terminal exit of the same Pod (it is final). Other containers' exits
// stay. An exit of the older form (LegacyExit) is not weighed: the
// reconciler checks it before it writes (FinalExit). The record keeps the
// first exit-token hash it is given (keepTokenHash).
func WithExit(rec Record, id string, pod model.PodRef, exitTokenHash string, exit model.Exit, now time.Time) (Record, bool) {
	if prev, ok := rec.Exits[exit.Container]; ok &&
		(prev.RestartCount > exit.RestartCount || (prev.Terminal() && rec.Pod.UID == pod.UID)) {
		return rec, false
	}
	now = now.UTC()
	exit.ReceivedAt = now
	exits := maps.Clone(rec.Exits)
	if exits == nil {
		exits = map[string]model.Exit{}
	}
	exits[exit.Container] = exit
	rec.InstanceID, rec.Pod, rec.Exits = id, pod, exits
	keepTokenHash(&rec, exitTokenHash)
	rec.Pending = pendingValue(id)
	touch(&rec, now)
	rec.Version++
	return rec, true
}

// FinalExit says whether rec holds a terminal exit of pod's container
// called container: nothing replaces it.
func FinalExit(rec Record, pod model.PodRef, container string) bool {
	e, ok := rec.ExitOf(container)
	return ok && e.Terminal() && rec.Pod.UID == pod.UID
}

// WithState is rec after RecordState(id, pod, exitTokenHash, sc) at now,
// and whether the write applies: only a state at least as new as the
// newest one recorded does.
func WithState(rec Record, id string, pod model.PodRef, exitTokenHash string, sc StateChange, now time.Time) (Record, bool) {
	if !rec.LastStateAt.IsZero() && (rec.LastStateAt.After(sc.At) || (rec.LastStateAt.Equal(sc.At) && rec.LastStateRank > sc.Rank())) {
		return rec, false
	}
	rec.InstanceID, rec.LastState, rec.LastStateAt, rec.LastStateRank = id, sc.State, sc.At.UTC(), sc.Rank()
	if rec.Pod == (model.PodRef{}) {
		rec.Pod = pod
	}
	keepTokenHash(&rec, exitTokenHash)
	if sc.Gone() {
		rec.Gone = &model.Gone{State: sc.State, At: sc.At.UTC()}
		if rec.GoneSeenAt.IsZero() {
			rec.GoneSeenAt = sc.seenAt(now).UTC()
		}
		if !sc.AddsNoWork {
			rec.Pending = pendingValue(id)
		}
	}
	touch(&rec, now.UTC())
	rec.Version++
	return rec, true
}

// WithDone is rec after MarkDone(id, d) at now. A record written since
// d.Version was read stays pending.
func WithDone(rec Record, id string, d Done, now time.Time) Record {
	now = now.UTC()
	rec.InstanceID = id
	if d.PodSynced != "" {
		rec.PodSynced, rec.PodSyncedAt, rec.PodEnded = d.PodSynced, now, &d.PodEnded
		if d.PodEnded && !d.PodEndedAt.IsZero() && rec.PodEndedAt.IsZero() {
			rec.PodEndedAt = d.PodEndedAt.UTC()
		}
	}
	if d.Terminated && rec.Terminated.IsZero() {
		rec.Terminated = now
	}
	if d.Refused != "" {
		rec.TerminateRefused = &Refusal{Code: d.Refused, At: now}
	}
	if rec.Pod == (model.PodRef{}) {
		rec.Pod = d.Pod
	}
	keepTokenHash(&rec, d.ExitTokenHash)
	rec.Pending = pendingValue(id)
	if d.Settled && (rec.Version == 0 || rec.Version == d.Version) {
		rec.Pending = ""
		if d.ForgetStates {
			rec.LastState, rec.LastStateAt, rec.LastStateRank, rec.Gone, rec.GoneSeenAt = "", time.Time{}, 0, nil, time.Time{}
		}
	}
	touch(&rec, now)
	return rec
}

func touch(rec *Record, now time.Time) {
	rec.UpdatedAt, rec.ExpiresAt = now, now.Add(Retention).Unix()
}

// keepTokenHash gives rec the exit-token hash h if it has none: the first
// one a record is given stays, and "" changes nothing (withTokenHash).
func keepTokenHash(rec *Record, h string) {
	if rec.ExitTokenHash == "" {
		rec.ExitTokenHash = h
	}
}

// WithAdopt is rec after Adopt(id, pod, exitTokenHash) at now, and whether
// the write applies: only where there is no record.
func WithAdopt(rec Record, id string, pod model.PodRef, exitTokenHash string, now time.Time) (Record, bool) {
	if rec.InstanceID != "" {
		return rec, false
	}
	rec = Record{InstanceID: id, Pod: pod, ExitTokenHash: exitTokenHash}
	touch(&rec, now.UTC())
	return rec, true
}

// ReadOnly is the ledger of a dry run. It reads the table, answers each
// write with the record as the write would leave it (by the rules above),
// and writes nothing.
type ReadOnly struct {
	*Table
}

// RecordExit returns the record as RecordExit would leave it.
func (t ReadOnly) RecordExit(ctx context.Context, instanceID string, pod model.PodRef, exitTokenHash string, exit model.Exit) (Record, error) {
	rec, _, err := t.Get(ctx, instanceID)
	if err != nil {
		return Record{}, err
	}
	rec, _ = WithExit(rec, instanceID, pod, exitTokenHash, exit, t.now())
	return rec, nil
}

// RecordState returns the record as RecordState would leave it.
func (t ReadOnly) RecordState(ctx context.Context, instanceID string, pod model.PodRef, exitTokenHash string, sc StateChange) (Record, error) {
	rec, _, err := t.Get(ctx, instanceID)
	if err != nil {
		return Record{}, err
	}
	rec, _ = WithState(rec, instanceID, pod, exitTokenHash, sc, t.now())
	return rec, nil
}

// Adopt returns the record as Adopt would leave it.
func (t ReadOnly) Adopt(ctx context.Context, instanceID string, pod model.PodRef, exitTokenHash string) (Record, error) {
	rec, _, err := t.Get(ctx, instanceID)
	if err != nil {
		return Record{}, err
	}
	rec, _ = WithAdopt(rec, instanceID, pod, exitTokenHash, t.now())
	return rec, nil
}

// MarkDone does nothing: a dry run marks no step done.
func (ReadOnly) MarkDone(context.Context, string, Done) error { return nil }

// ExitQueued does nothing: a dry run marks no claim queued.
func (ReadOnly) ExitQueued(context.Context, string, time.Time) error { return nil }
