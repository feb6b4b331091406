package ledger

import (
	"context"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
)

// exitQueuedAttribute holds Record.ExitQueuedUntil.
const exitQueuedAttribute = "exitQueuedUntil"

// ExitQueued records that an exit claim for instanceID, not yet checked,
// waits on the work queue until until (a batch deferred it), so that the
// exit-wait window of the instance stays open for it. The record is made
// if there is none (the instance's gone state may be recorded while the
// claim waits); a later time than until already recorded is kept. Being
// unchecked, the claim says nothing else: no Pod, no exit.
func (t *Table) ExitQueued(ctx context.Context, instanceID string, until time.Time) error {
	now := t.now().UTC()
	name := expression.Name(exitQueuedAttribute)
	update := stamped(now).
		Set(name, expression.Value(timeAV(until))).
		Set(expression.Name("version"), expression.Name("version").IfNotExists(expression.Value(0)))
	condition := expression.AttributeNotExists(name).Or(name.LessThan(expression.Value(timeAV(until))))
	if _, err := t.update(ctx, instanceID, expression.NewBuilder().WithUpdate(update).WithCondition(condition)); err != nil {
		return fmt.Errorf("ledger exit queued %s: %w", instanceID, err)
	}
	return nil
}

// WithExitQueued is the record rec (of instance id, zero if none) after
// ExitQueued(id, until) at now, as the table's condition leaves it, and
// whether the write applies.
func WithExitQueued(rec Record, id string, until, now time.Time) (Record, bool) {
	if !until.After(rec.ExitQueuedUntil) {
		return rec, false
	}
	rec.InstanceID, rec.ExitQueuedUntil, rec.UpdatedAt = id, until, now
	return rec, true
}
