// Package ledger is Reaper's memory: one DynamoDB item per instance saying
// what is known about it (its Pod, its container's exit, whether and how the
// instance went away) and which side effects are already done. Every write is
// conditional, so redelivered and out-of-order events never move it backwards.
//
// A provider can read it too: Get(instanceID) returns the exit a Pod's
// container reported even after the Pod or the instance is gone.
package ledger

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/reaper-k8s/reaper/pkg/model"
)

// Table schema, shared with the CDK construct.
const (
	KeyAttribute = "instanceId"
	TTLAttribute = "expiresAt"
	// PendingIndex is a sparse global secondary index on PendingAttribute:
	// only records that may still need work carry the attribute, so the
	// sweeper queries a handful of items instead of scanning a month of
	// history every minute. The attribute is a string: the record's shard
	// (pendingValue).
	PendingIndex     = "pending"
	PendingAttribute = "pending"
)

// pendingShards is how many values PendingAttribute takes. An index puts
// all items with one key value in one partition, and a partition takes at
// most 1,000 write units and 3,000 read units a second
// (https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/bp-partition-key-design.html).
// Every write of a pending record is also a write to the index, and an
// index that cannot keep up throttles the table's own writes; 16 values
// give the index 16 partitions' worth.
const pendingShards = 16

// pendingQueries is how many shards Pending queries at once.
const pendingQueries = 4

// pendingValue is the PendingAttribute of an instance's record: its shard,
// "0" to "15", from a hash of the id, so that every write puts a record on
// the same shard.
func pendingValue(instanceID string) string {
	h := fnv.New32a()
	h.Write([]byte(instanceID))
	return strconv.Itoa(int(h.Sum32() % pendingShards))
}

// Retention is how long an item outlives its last write (DynamoDB TTL).
const Retention = 30 * 24 * time.Hour

// Record is the ledger item of one instance.
type Record struct {
	InstanceID string       `dynamodbav:"instanceId" json:"instanceId,omitempty"`
	Pod        model.PodRef `dynamodbav:"pod" json:"pod,omitempty"`
	// ExitTokenHash is the instance's exit-token tag (model.ExitTokenHash
	// of its launch's token) as EC2 described it when a write that knew
	// the tags was made; "" when the instance has none, or no such write
	// was made yet. Set once, never cleared or replaced: once EC2 no
	// longer describes the instance, a claim is checked against it.
	ExitTokenHash string `dynamodbav:"exitTokenHash,omitempty" json:"exitTokenHash,omitempty"`
	// Exits is the latest exit recorded of each container of the Pod
	// (highest restart count; a container's first terminal exit is
	// final), by container name. Each is an attribute of its own
	// (exitAttribute), so that one container's write never reads or
	// rewrites another's.
	Exits map[string]model.Exit `dynamodbav:"-" json:"exits,omitempty"`
	// LegacyExit is the one exit older versions recorded per instance. It
	// is read as its container's (Runs, ExitOf) while the record has none
	// of the new form for that container, so that an upgrade loses no
	// recorded exit; it is never written again, and the write rules weigh
	// the new form alone (the reconciler's own check before a write,
	// FinalExit, keeps it final).
	LegacyExit *model.Exit `dynamodbav:"exit,omitempty" json:"exit,omitempty"`
	// Gone is the newest state seen in which the instance no longer runs its
	// Pod (stopping, stopped, shutting-down, terminated). It stays set.
	Gone *model.Gone `dynamodbav:"gone,omitempty" json:"gone,omitempty"`
	// GoneSeenAt is when Reaper first recorded the instance gone, on its
	// own clock: an event delivered hours after the time it carries does
	// not date the exit-wait window in the past (GoneSince).
	GoneSeenAt time.Time `dynamodbav:"goneSeenAt,omitempty" json:"goneSeenAt,omitempty"`
	// ExitQueuedUntil is until when an exit claim for the instance, not yet
	// checked, waits on the work queue (ExitQueued): the exit-wait window
	// stays open until then, so that the Pod ends with that exit, not as
	// lost.
	ExitQueuedUntil time.Time `dynamodbav:"exitQueuedUntil,omitempty" json:"exitQueuedUntil,omitempty"`
	// LastState and LastStateAt are the newest EC2 state seen, for latency
	// figures and so older events never overwrite newer ones.
	LastState     string    `dynamodbav:"lastState,omitempty" json:"lastState,omitempty"`
	LastStateAt   time.Time `dynamodbav:"lastStateAt,omitempty" json:"lastStateAt,omitempty"`
	LastStateRank int       `dynamodbav:"lastStateRank,omitempty" json:"lastStateRank,omitempty"`
	// PodSynced is the outcome the Pod's status already carries (see
	// model.Outcome.Key); empty until the first status write.
	PodSynced string `dynamodbav:"podSynced,omitempty" json:"podSynced,omitempty"`
	// PodEnded is whether the Pod had ended (its phase terminal, or the
	// Pod gone) once PodSynced was written, as decided then; nil on a
	// record no version of this field wrote.
	PodEnded *bool `dynamodbav:"podEnded,omitempty" json:"podEnded,omitempty"`
	// PodEndedAt is when Reaper learned what ended the Pod (the receipt of
	// the exit that ended it), set once, when the Pod is first written
	// ended: its instance's power-off grace runs from it, and no line
	// that comes after moves it.
	PodEndedAt time.Time `dynamodbav:"podEndedAt,omitempty" json:"podEndedAt,omitempty"`
	// PodSyncedAt is when PodSynced was last written: a host that powers
	// off once its Pod is written is given its power-off grace from then.
	PodSyncedAt time.Time `dynamodbav:"podSyncedAt,omitempty" json:"podSyncedAt,omitempty"`
	// Terminated is when Reaper's terminate request for the instance
	// succeeded (or found it already gone).
	Terminated time.Time `dynamodbav:"terminated,omitempty" json:"terminated,omitempty"`
	// TerminateRefused is EC2's last refusal to terminate the instance
	// (termination protection, a policy): Reaper asks again only after a
	// while, not on every sweep.
	TerminateRefused *Refusal  `dynamodbav:"terminateRefused,omitempty" json:"terminateRefused,omitempty"`
	UpdatedAt        time.Time `dynamodbav:"updatedAt" json:"updatedAt,omitempty"`
	// Pending is set while the record may need work (PendingIndex).
	Pending string `dynamodbav:"pending,omitempty" json:"pending,omitempty"`
	// Version counts the writes that can add work, so that clearing
	// Pending never hides work recorded in between.
	Version   int64 `dynamodbav:"version" json:"version"`
	ExpiresAt int64 `dynamodbav:"expiresAt" json:"expiresAt,omitempty"`
}

// MaxContainers is how many containers' exits a record keeps
// (model.MaxContainers).
const MaxContainers = model.MaxContainers

// exitAttributePrefix starts the name of the attribute holding one
// container's latest exit: "exit:<container>". A container's name is a
// DNS label, so it never holds the '.' of a document path.
const exitAttributePrefix = "exit:"

func exitAttribute(container string) string { return exitAttributePrefix + container }

// Runs are the record's exits, in container name order: the latest of
// each container, an older version's (LegacyExit) where there is no other.
func (r Record) Runs() []model.Exit {
	runs := make([]model.Exit, 0, len(r.Exits)+1)
	for _, name := range slices.Sorted(maps.Keys(r.Exits)) {
		runs = append(runs, r.Exits[name])
	}
	if l := r.LegacyExit; l != nil {
		if _, newer := r.Exits[l.Container]; !newer {
			runs = append(runs, *l)
			slices.SortFunc(runs, func(a, b model.Exit) int { return strings.Compare(a.Container, b.Container) })
		}
	}
	return runs
}

// Latest is the exit Reaper received last, of any container (nil: none).
func (r Record) Latest() *model.Exit { return model.Outcome{Exits: r.Runs()}.Latest() }

// ExitOf is the latest exit recorded of the container called name.
func (r Record) ExitOf(name string) (model.Exit, bool) {
	if e, ok := r.Exits[name]; ok {
		return e, true
	}
	if l := r.LegacyExit; l != nil && l.Container == name {
		return *l, true
	}
	return model.Exit{}, false
}

// decode reads a record from a DynamoDB item.
func decode(item map[string]types.AttributeValue) (Record, error) {
	var rec Record
	if err := attributevalue.UnmarshalMap(item, &rec); err != nil {
		return Record{}, err
	}
	for name, av := range item {
		container, ok := strings.CutPrefix(name, exitAttributePrefix)
		if !ok {
			continue
		}
		var e model.Exit
		if err := attributevalue.Unmarshal(av, &e); err != nil {
			return Record{}, fmt.Errorf("%s: %w", name, err)
		}
		if rec.Exits == nil {
			rec.Exits = map[string]model.Exit{}
		}
		rec.Exits[container] = e
	}
	return rec, nil
}

// GoneSince is when the exit-wait window of a gone instance starts: the
// later of the time its gone state carries and when Reaper first recorded
// it gone. Zero when it is not gone.
func (r Record) GoneSince() time.Time {
	if r.Gone == nil {
		return time.Time{}
	}
	if r.GoneSeenAt.After(r.Gone.At) {
		return r.GoneSeenAt
	}
	return r.Gone.At
}

// Table is the DynamoDB-backed ledger.
type Table struct {
	client *dynamodb.Client
	name   string
	now    func() time.Time
}

// New returns the ledger stored in the named table.
func New(client *dynamodb.Client, table string) *Table {
	return &Table{client: client, name: table, now: time.Now}
}

// Name is the table's name.
func (t *Table) Name() string { return t.name }

// Get returns the record of an instance, or ok=false if there is none. It is
// a strongly consistent read.
func (t *Table) Get(ctx context.Context, instanceID string) (rec Record, ok bool, err error) {
	out, err := t.client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      &t.name,
		Key:            key(instanceID),
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return Record{}, false, fmt.Errorf("ledger get %s: %w", instanceID, err)
	}
	if out.Item == nil {
		return Record{}, false, nil
	}
	rec, err = decode(out.Item)
	if err != nil {
		return Record{}, false, fmt.Errorf("ledger get %s: decode: %w", instanceID, err)
	}
	return rec, true, nil
}

// RecordExit stores a checked exit (its Pod agrees with the instance's
// launch tags) as its container's, unless the ledger already holds a later
// one of that container (higher restart count) or a terminal one of the
// same Pod: a container's first terminal exit is final, so a host cannot
// replace it (nor move its receipt, from which the power-off grace runs)
// by sending lines again. Other containers' exits are not touched. It
// returns the record as it stands afterwards.
//
// exitTokenHash is the instance's exit-token tag as EC2 describes it now
// ("" when it does not, or the instance has none): a record that has
// none yet keeps it (withTokenHash).
func (t *Table) RecordExit(ctx context.Context, instanceID string, pod model.PodRef, exitTokenHash string, exit model.Exit) (Record, error) {
	now := t.now().UTC()
	exit.ReceivedAt = now
	attr := exitAttribute(exit.Container)
	otherPod := expression.Name("pod.uid").NotEqual(expression.Value(pod.UID))
	condition := expression.Or(
		expression.Name(attr).AttributeNotExists(),
		expression.And(expression.Name(attr+".restartCount").LessThanEqual(expression.Value(exit.RestartCount)),
			expression.Or(otherPod, expression.Name(attr+".willRestart").Equal(expression.Value(true)))))
	update := stamped(now).
		Set(expression.Name(attr), expression.Value(exit)).
		Set(expression.Name("pod"), expression.Value(pod)).
		Set(expression.Name(PendingAttribute), expression.Value(pendingValue(instanceID))).
		Add(expression.Name("version"), expression.Value(1))
	update = withTokenHash(update, exitTokenHash)
	rec, err := t.update(ctx, instanceID, expression.NewBuilder().WithUpdate(update).WithCondition(condition))
	if err != nil {
		return Record{}, fmt.Errorf("ledger record exit %s: %w", instanceID, err)
	}
	return rec, nil
}

// Refusal is EC2's refusal to terminate an instance: its error code, and
// when.
type Refusal struct {
	Code string    `dynamodbav:"code" json:"code"`
	At   time.Time `dynamodbav:"at" json:"at"`
}

// Adopt records the Pod of a running instance the ledger has no record of
// yet, from its launch tags, and returns the record as it stands: nothing
// else, no state and no work, so that the instance's Pod is known once EC2
// no longer lists it, with its exit-token tag (exitTokenHash, "" none),
// against which a claim is then checked. A record that exists is left as
// it is.
func (t *Table) Adopt(ctx context.Context, instanceID string, pod model.PodRef, exitTokenHash string) (Record, error) {
	now := t.now().UTC()
	update := stamped(now).
		Set(expression.Name("pod"), expression.Value(pod)).
		Set(expression.Name("version"), expression.Value(0))
	update = withTokenHash(update, exitTokenHash)
	condition := expression.AttributeNotExists(expression.Name(KeyAttribute))
	rec, err := t.update(ctx, instanceID, expression.NewBuilder().WithUpdate(update).WithCondition(condition))
	if err != nil {
		return Record{}, fmt.Errorf("ledger adopt %s: %w", instanceID, err)
	}
	return rec, nil
}

// StateChange is an EC2 state an instance reached.
type StateChange struct {
	State string
	At    time.Time
	// SeenAt is when Reaper learned it, on its own clock (zero: the time
	// of the write): the first gone state's is the record's GoneSeenAt.
	SeenAt time.Time
	// AddsNoWork says the writer read the record off the pending index and
	// found that this state leaves nothing to do (the exit terminal, its
	// Pod written, the instance terminated): a gone state then keeps the
	// record off the index, which saves the write that would take it off
	// again. A write that does add work always sets the index itself.
	AddsNoWork bool
}

// seenAt is when Reaper learned sc, or now when the writer did not say.
func (sc StateChange) seenAt(now time.Time) time.Time {
	if sc.SeenAt.IsZero() {
		return now
	}
	return sc.SeenAt
}

// Rank orders states of one lifecycle, for events with equal times.
func (sc StateChange) Rank() int { return model.StateRank(sc.State) }

// Gone says whether the instance no longer runs its Pod in this state.
func (sc StateChange) Gone() bool { return model.IsGone(sc.State) }

// RecordState notes the state an instance reached. A gone state also sets
// Gone. An event older than the newest one recorded changes nothing and the
// record is returned as it is, so events applied in any order end the same.
// pod and exitTokenHash are what the instance's launch tags say, as far as
// EC2 describes them (empty: it does not); a record keeps the first it is
// given of each.
func (t *Table) RecordState(ctx context.Context, instanceID string, pod model.PodRef, exitTokenHash string, sc StateChange) (Record, error) {
	now := t.now().UTC()
	at, rank := expression.Value(timeAV(sc.At)), expression.Value(sc.Rank())
	lastStateAt := expression.Name("lastStateAt")
	condition := expression.Or(
		lastStateAt.AttributeNotExists(),
		lastStateAt.LessThan(at),
		expression.And(lastStateAt.Equal(at), expression.Name("lastStateRank").LessThanEqual(rank)))
	update := stamped(now).
		Set(expression.Name("lastState"), expression.Value(sc.State)).
		Set(lastStateAt, at).
		Set(expression.Name("lastStateRank"), rank).
		Add(expression.Name("version"), expression.Value(1))
	if pod != (model.PodRef{}) {
		update = update.Set(expression.Name("pod"), expression.Name("pod").IfNotExists(expression.Value(pod)))
	}
	update = withTokenHash(update, exitTokenHash)
	if sc.Gone() {
		update = update.Set(expression.Name("gone"), expression.Value(model.Gone{State: sc.State, At: sc.At.UTC()})).
			Set(expression.Name("goneSeenAt"), expression.Name("goneSeenAt").IfNotExists(expression.Value(timeAV(sc.seenAt(now)))))
		if !sc.AddsNoWork {
			update = update.Set(expression.Name(PendingAttribute), expression.Value(pendingValue(instanceID)))
		}
	}
	rec, err := t.update(ctx, instanceID, expression.NewBuilder().WithUpdate(update).WithCondition(condition))
	if err != nil {
		return Record{}, fmt.Errorf("ledger record state %s: %w", instanceID, err)
	}
	return rec, nil
}

// Done are side effects to mark as done in one write.
type Done struct {
	// PodSynced is the outcome key the Pod now carries ("" = unchanged).
	PodSynced string
	// PodEnded, with PodSynced, says whether the Pod has ended with it
	// (Record.PodEnded), and PodEndedAt since when (Record.PodEndedAt,
	// kept if set).
	PodEnded   bool
	PodEndedAt time.Time
	// Terminated is set when the instance was terminated (or found gone).
	Terminated bool
	// Refused is EC2's error code when it refused to terminate the
	// instance ("" = it did not).
	Refused string
	// Pod, when set, names the instance's Pod if the record has none yet
	// (an orphan terminated by the sweep has no record before), and
	// ExitTokenHash its exit-token tag if the record has none yet.
	Pod           model.PodRef
	ExitTokenHash string
	// Settled says nothing is left to do for the record as it was read at
	// Version: it leaves the pending index, unless a write in between
	// (a higher version) added work.
	Settled bool
	// ForgetStates, with Settled, says the record settles ended by
	// Reaper's own steps (its terminal exit written to its Pod, its
	// instance terminated): the instance's states are removed, as a record
	// so settled never records them, so that it ends the same whichever
	// came first, EC2's state changes or Reaper's settling.
	ForgetStates bool
	Version      int64
}

// stateAttributes are the attributes a state change writes.
var stateAttributes = []string{"lastState", "lastStateAt", "lastStateRank", "gone", "goneSeenAt"}

// MarkDone records finished side effects. Steps only ever move to done,
// and a step done twice is still done.
func (t *Table) MarkDone(ctx context.Context, instanceID string, d Done) error {
	now := t.now().UTC()
	update := stamped(now)
	if d.PodSynced != "" {
		update = update.Set(expression.Name("podSynced"), expression.Value(d.PodSynced)).
			Set(expression.Name("podEnded"), expression.Value(d.PodEnded)).
			Set(expression.Name("podSyncedAt"), expression.Value(timeAV(now)))
		if d.PodEnded && !d.PodEndedAt.IsZero() {
			update = update.Set(expression.Name("podEndedAt"), expression.Name("podEndedAt").IfNotExists(expression.Value(timeAV(d.PodEndedAt))))
		}
	}
	if d.Terminated {
		update = update.Set(expression.Name("terminated"), expression.Name("terminated").IfNotExists(expression.Value(timeAV(now))))
	}
	if d.Pod != (model.PodRef{}) {
		update = update.Set(expression.Name("pod"), expression.Name("pod").IfNotExists(expression.Value(d.Pod)))
	}
	update = withTokenHash(update, d.ExitTokenHash)
	if d.Refused != "" {
		update = update.Set(expression.Name("terminateRefused"), expression.Value(Refusal{Code: d.Refused, At: now}))
	}
	builder := expression.NewBuilder()
	if d.Settled {
		version := expression.Name("version")
		builder = builder.WithCondition(expression.Or(version.AttributeNotExists(), version.Equal(expression.Value(d.Version))))
		update = update.Remove(expression.Name(PendingAttribute))
		if d.ForgetStates {
			for _, name := range stateAttributes {
				update = update.Remove(expression.Name(name))
			}
		}
	} else {
		update = update.Set(expression.Name(PendingAttribute), expression.Value(pendingValue(instanceID)))
	}
	expr, err := builder.WithUpdate(update).Build()
	if err != nil {
		return fmt.Errorf("ledger mark done %s: %w", instanceID, err)
	}
	_, err = t.client.UpdateItem(ctx, t.updateInput(instanceID, expr))
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		// Work was recorded since the read: mark the steps, stay pending.
		return t.MarkDone(ctx, instanceID, Done{PodSynced: d.PodSynced, PodEnded: d.PodEnded, PodEndedAt: d.PodEndedAt, Terminated: d.Terminated, Refused: d.Refused, Pod: d.Pod, ExitTokenHash: d.ExitTokenHash})
	}
	if err != nil {
		return fmt.Errorf("ledger mark done %s: %w", instanceID, err)
	}
	return nil
}

// Pending calls fn for every record that may still need work, for the
// sweeper. It queries the index's shards, pendingQueries at a time, and
// calls fn on the calling goroutine only, one record at a time, in no
// particular order. The first error of a query or of fn ends it, and
// Pending returns that error once its queries have stopped. The index is
// eventually consistent: a record written a moment ago may only show up in
// the next sweep.
func (t *Table) Pending(ctx context.Context, fn func(Record) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	shards := make(chan string, pendingShards)
	for s := range pendingShards {
		shards <- strconv.Itoa(s)
	}
	close(shards)
	pages := make(chan []map[string]types.AttributeValue)
	var wg sync.WaitGroup
	for range pendingQueries {
		wg.Go(func() {
			for shard := range shards {
				if err := t.pendingShard(ctx, shard, pages); err != nil {
					cancel(err)
					return
				}
			}
		})
	}
	go func() {
		wg.Wait()
		close(pages)
	}()
	// Read every page, even after an error, so that no query waits to
	// send one.
	for page := range pages {
		for _, item := range page {
			if ctx.Err() != nil {
				break
			}
			rec, err := decode(item)
			if err != nil {
				cancel(fmt.Errorf("ledger pending: decode: %w", err))
				break
			}
			if err := fn(rec); err != nil {
				cancel(err)
				break
			}
		}
	}
	return context.Cause(ctx)
}

// pendingShard sends the pages of one shard of the pending index to pages.
func (t *Table) pendingShard(ctx context.Context, shard string, pages chan<- []map[string]types.AttributeValue) error {
	expr, err := expression.NewBuilder().WithKeyCondition(expression.Key(PendingAttribute).Equal(expression.Value(shard))).Build()
	if err != nil {
		return fmt.Errorf("ledger pending, shard %s: %w", shard, err)
	}
	p := dynamodb.NewQueryPaginator(t.client, &dynamodb.QueryInput{
		TableName:                 &t.name,
		IndexName:                 aws.String(PendingIndex),
		KeyConditionExpression:    expr.KeyCondition(),
		ExpressionAttributeNames:  expr.Names(),
		ExpressionAttributeValues: expr.Values(),
	})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return fmt.Errorf("ledger pending, shard %s: %w", shard, err)
		}
		select {
		case pages <- page.Items:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	return nil
}

// batchGetLimit is BatchGetItem's limit of keys per call.
const batchGetLimit = 100

// BatchGetItem returns the keys a partition had no read capacity left for
// as UnprocessedKeys, in a successful answer the SDK's retryer does not
// see. Asking again at once meets the same limit, so GetMany waits first,
// as the DynamoDB docs advise: unprocessedFirstWait, doubling up to
// unprocessedMaxWait, each wait jittered so that readers refused together
// do not come back together.
const (
	unprocessedFirstWait = 50 * time.Millisecond
	unprocessedMaxWait   = time.Second
)

// Fetched is what a GetMany read.
type Fetched struct {
	// Found are the records read (ids without a record are absent from
	// both maps).
	Found map[string]Record
	// Left are the ids whose chunk (100 keys) could not be read, each with
	// its chunk's error.
	Left map[string]error
}

// GetMany reads the records of ids (strongly consistent reads, 100 keys a
// call). Keys left unprocessed are asked for again after a backoff, for as
// long as ctx allows. A chunk that cannot be read costs its own ids only:
// those it did not read are Left with its error, and the next chunk is
// read.
func (t *Table) GetMany(ctx context.Context, ids []string) Fetched {
	f := Fetched{Found: make(map[string]Record, len(ids)), Left: map[string]error{}}
	for chunk := range slices.Chunk(ids, batchGetLimit) {
		err := t.getChunk(ctx, chunk, f.Found)
		if err == nil {
			continue
		}
		for _, id := range chunk {
			if _, read := f.Found[id]; !read {
				f.Left[id] = err
			}
		}
	}
	return f
}

// getChunk reads the records of at most batchGetLimit ids into found.
func (t *Table) getChunk(ctx context.Context, chunk []string, found map[string]Record) error {
	keys := make([]map[string]types.AttributeValue, len(chunk))
	for i, id := range chunk {
		keys[i] = key(id)
	}
	request := map[string]types.KeysAndAttributes{t.name: {Keys: keys, ConsistentRead: aws.Bool(true)}}
	wait := unprocessedFirstWait
	for {
		res, err := t.client.BatchGetItem(ctx, &dynamodb.BatchGetItemInput{RequestItems: request})
		if err != nil {
			return fmt.Errorf("ledger get many: %w", err)
		}
		for _, item := range res.Responses[t.name] {
			rec, err := decode(item)
			if err != nil {
				return fmt.Errorf("ledger get many: decode: %w", err)
			}
			found[rec.InstanceID] = rec
		}
		request = res.UnprocessedKeys
		if len(request) == 0 {
			return nil
		}
		if err := sleep(ctx, wait/2+rand.N(wait/2)); err != nil {
			return fmt.Errorf("ledger get many: %d keys unprocessed: %w", len(request[t.name].Keys), err)
		}
		wait = min(2*wait, unprocessedMaxWait)
	}
}

// sleep waits for d, or until ctx ends and returns its cause.
func sleep(ctx context.Context, d time.Duration) error {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// updateInput is the conditional update of instanceID's item expr states.
func (t *Table) updateInput(instanceID string, expr expression.Expression) *dynamodb.UpdateItemInput {
	return &dynamodb.UpdateItemInput{
		TableName:                 &t.name,
		Key:                       key(instanceID),
		UpdateExpression:          expr.Update(),
		ConditionExpression:       expr.Condition(),
		ExpressionAttributeNames:  expr.Names(),
		ExpressionAttributeValues: expr.Values(),
	}
}

// update applies a conditional write and returns the record as it stands
// after it. A failed condition means the ledger already knows something
// newer: the write is history, and the record is read as it is.
func (t *Table) update(ctx context.Context, instanceID string, builder expression.Builder) (Record, error) {
	expr, err := builder.Build()
	if err != nil {
		return Record{}, err
	}
	in := t.updateInput(instanceID, expr)
	in.ReturnValues = types.ReturnValueAllNew
	out, err := t.client.UpdateItem(ctx, in)
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		rec, _, err := t.Get(ctx, instanceID)
		return rec, err
	}
	if err != nil {
		return Record{}, err
	}
	rec, err := decode(out.Attributes)
	if err != nil {
		return Record{}, fmt.Errorf("decode: %w", err)
	}
	return rec, nil
}

// tokenHashAttribute holds Record.ExitTokenHash.
const tokenHashAttribute = "exitTokenHash"

// withTokenHash adds to update the setting of the record's exit-token hash
// to h ("" sets nothing) where it has none: a record keeps the first hash
// it is given, which is the instance's launch tag, so that no write clears
// or replaces it.
func withTokenHash(update expression.UpdateBuilder, h string) expression.UpdateBuilder {
	if h == "" {
		return update
	}
	name := expression.Name(tokenHashAttribute)
	return update.Set(name, name.IfNotExists(expression.Value(h)))
}

// stamped is the start of every write's update: the time of the write and
// the expiry it moves out.
func stamped(now time.Time) expression.UpdateBuilder {
	return expression.Set(expression.Name("updatedAt"), expression.Value(timeAV(now))).
		Set(expression.Name(TTLAttribute), expression.Value(expiry(now)))
}

func key(instanceID string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{KeyAttribute: &types.AttributeValueMemberS{Value: instanceID}}
}

// timeLayout is RFC 3339 with a fixed-width fraction, so that stored times
// compare correctly as strings in condition expressions.
const timeLayout = "2006-01-02T15:04:05.000000000Z07:00"

func timeAV(t time.Time) types.AttributeValue {
	return &types.AttributeValueMemberS{Value: t.UTC().Format(timeLayout)}
}

func expiry(now time.Time) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: fmt.Sprint(now.Add(Retention).Unix())}
}

// CreateTable creates the ledger table with the key schema the CDK construct
// deploys (on-demand billing). An existing table is success.
func CreateTable(ctx context.Context, client *dynamodb.Client, name string) error {
	_, err := client.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:   &name,
		BillingMode: types.BillingModePayPerRequest,
		AttributeDefinitions: []types.AttributeDefinition{
			{AttributeName: aws.String(KeyAttribute), AttributeType: types.ScalarAttributeTypeS},
			{AttributeName: aws.String(PendingAttribute), AttributeType: types.ScalarAttributeTypeS},
		},
		KeySchema: []types.KeySchemaElement{{AttributeName: aws.String(KeyAttribute), KeyType: types.KeyTypeHash}},
		GlobalSecondaryIndexes: []types.GlobalSecondaryIndex{{
			IndexName:  aws.String(PendingIndex),
			KeySchema:  []types.KeySchemaElement{{AttributeName: aws.String(PendingAttribute), KeyType: types.KeyTypeHash}},
			Projection: &types.Projection{ProjectionType: types.ProjectionTypeAll},
		}},
	})
	var inUse *types.ResourceInUseException
	if errors.As(err, &inUse) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("create table %s: %w", name, err)
	}
	// The waiter's default first delay is 20 s; a new on-demand table is
	// usually active in a few, and a local one at once.
	waiter := dynamodb.NewTableExistsWaiter(client, func(o *dynamodb.TableExistsWaiterOptions) {
		o.MinDelay, o.MaxDelay = 100*time.Millisecond, 5*time.Second
	})
	return waiter.Wait(ctx, &dynamodb.DescribeTableInput{TableName: &name}, 2*time.Minute)
}
