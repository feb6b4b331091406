// Package workqueue is Reaper's work queue on Amazon SQS: the messages the
// exitrecorder, statechange and sweeper functions hand to the reconciler,
// and the client that sends them. A message names one instance and what
// happened to it; the reconciler coalesces a batch of them into few EC2
// calls (docs/concepts.md, "The work queue").
package workqueue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/reaper-k8s/reaper/pkg/exitline"
	"github.com/reaper-k8s/reaper/pkg/model"
)

// Version is the message format's version, carried in every body.
const Version = 1

// Kind says what a message reports about its instance.
type Kind string

const (
	// KindExit: an exit line was recorded for the instance. The message
	// carries the line's claim (Pod and exit), which the reconciler checks
	// against the instance's launch tags before it acts on it.
	KindExit Kind = "exit"
	// KindState: EventBridge reported a state change of the instance;
	// whether the instance is this deployment's is still to be checked.
	KindState Kind = "state"
	// KindSweep: the sweeper found work left on the instance's record.
	KindSweep Kind = "sweep"
	// KindOrphan: the sweeper found the owned instance running with no
	// live Pod; the reconciler checks the Pod again before it terminates.
	KindOrphan Kind = "orphan"
	// KindStillRunning: the sweeper found the instance running well after
	// Reaper's terminate of it was accepted; the reconciler describes it
	// again and terminates it again if EC2 agrees.
	KindStillRunning Kind = "still-running"
)

// Message is one work item. Its body is the project's own JSON.
type Message struct {
	V          int    `json:"v"`
	Kind       Kind   `json:"kind"`
	InstanceID string `json:"instanceId"`
	// Pod and Exit are an exit message's claim.
	Pod  *model.PodRef `json:"pod,omitempty"`
	Exit *model.Exit   `json:"exit,omitempty"`
	// TokenHash is the hash (model.ExitTokenHash) of the exit token the
	// claim's line carried, "" when it carried none: the reconciler
	// believes the claim for an instance with an exit-token tag only when
	// they are equal. The token itself never reaches the queue.
	TokenHash string `json:"tokenHash,omitempty"`
	// State and At are a state message's state change.
	State string    `json:"state,omitempty"`
	At    time.Time `json:"at,omitzero"`
	// QueuedAt is when its work was first queued: set by the first Send,
	// kept by the sends that carry the work on (a deferral, a dead
	// letter). The reconciler takes the longest-queued work first.
	QueuedAt time.Time `json:"queuedAt,omitzero"`
	// Checks counts the times the reconciler found EC2 not yet in the
	// state a message claims (its answers are eventually consistent); it
	// sends the message again a while later, at most MaxChecks times.
	Checks int `json:"checks,omitempty"`
	// Attempt counts the batches that took this work up before and could
	// not finish it (for want of time or EC2 tokens): its delay grows with
	// it, and after MaxAttempts it goes to the dead-letter queue.
	Attempt int `json:"attempt,omitempty"`
	// Running is, on an orphan message, how many owned instances the
	// sweep found running: the reconciler caps the orphans it terminates
	// in a batch by it, as the sweep does.
	Running int `json:"running,omitempty"`
	// Reason says why the work went to the dead-letter queue (set only
	// there).
	Reason string `json:"reason,omitempty"`
}

// MaxAttempts is how many batches may take up one piece of work and fail
// to finish it before it goes to the dead-letter queue: a message that
// comes back carries its count, so work that can never finish (a Pod
// write slower than any batch) stops circling and is seen.
const MaxAttempts = 8

// MaxChecks is how many times the reconciler checks a message's claim
// against EC2 before it refuses it: a message claiming more checks was not
// written by Reaper.
const MaxChecks = 5

// Exit is the message for an exit recorded for instance id.
func Exit(id string, pod model.PodRef, exit model.Exit) Message {
	return Message{Kind: KindExit, InstanceID: id, Pod: &pod, Exit: &exit}
}

// State is the message for a state change of instance id.
func State(id, state string, at time.Time) Message {
	return Message{Kind: KindState, InstanceID: id, State: state, At: at}
}

// Sweep is the message for work the sweeper found on id's record.
func Sweep(id string) Message { return Message{Kind: KindSweep, InstanceID: id} }

// Orphan is the message for an owned instance the sweeper found orphaned.
func Orphan(id string, running int) Message {
	return Message{Kind: KindOrphan, InstanceID: id, Running: running}
}

// StillRunning is the message for an instance the sweeper found running
// after Reaper's terminate of it.
func StillRunning(id string) Message { return Message{Kind: KindStillRunning, InstanceID: id} }

// Body is what a received message says, one type per Kind (ExitClaim,
// StateChange, SweepRequest, OrphanCheck, StillRunningCheck), checked by
// that kind's parser when the message is parsed (Parse): the reconciler
// works on these and never on the optional fields of a Message.
type Body interface {
	Kind() Kind
}

// ExitClaim is an exit message's body: a host's claim that a container of
// Pod ended as Exit, with the hash of the exit token its line carried
// ("" none). Nothing in it is believed before it is checked against the
// instance's launch tags.
type ExitClaim struct {
	Pod       model.PodRef
	Exit      model.Exit
	TokenHash string
}

// StateChange is a state message's body: EventBridge reported the
// instance in State at At; EC2 confirms it before it is recorded.
type StateChange struct {
	State string
	At    time.Time
}

// SweepRequest is a sweep message's body: look at the instance's record.
type SweepRequest struct{}

// OrphanCheck is an orphan message's body: the sweep found the instance
// running with no live Pod among Running owned instances running.
type OrphanCheck struct {
	Running int
}

// StillRunningCheck is a still-running message's body: the sweep found the
// instance running after Reaper's terminate of it.
type StillRunningCheck struct{}

func (ExitClaim) Kind() Kind         { return KindExit }
func (StateChange) Kind() Kind       { return KindState }
func (SweepRequest) Kind() Kind      { return KindSweep }
func (OrphanCheck) Kind() Kind       { return KindOrphan }
func (StillRunningCheck) Kind() Kind { return KindStillRunning }

// Item is a received message with what SQS says of it.
type Item struct {
	// Message is the message as it came: what the reconciler sends on
	// when it sends the work back as it came.
	Message
	// Body is what it says, parsed and checked for its kind.
	Body Body
	// MessageID names the SQS message, for batch item failures.
	MessageID string
	// SentAt is SQS's SentTimestamp; ReceiveCount its ApproximateReceiveCount.
	SentAt       time.Time
	ReceiveCount int
}

// Attempts is how often the item's work was taken up before and not
// finished: the batches that deferred it (Attempt, carried by the message
// they sent back) and SQS's earlier receives of this message (a batch item
// failure brings it back as it came). One count bounds both.
func (it Item) Attempts() int { return it.Attempt + max(it.ReceiveCount-1, 0) }

// FirstQueued is when the item's work was first queued: its QueuedAt, or
// SQS's SentTimestamp for a message without one.
func (it Item) FirstQueued() time.Time {
	if it.QueuedAt.IsZero() || (!it.SentAt.IsZero() && it.SentAt.Before(it.QueuedAt)) {
		return it.SentAt
	}
	return it.QueuedAt
}

// Parse decodes one SQS record of an event source mapping's batch.
func Parse(rec events.SQSMessage) (Item, error) {
	it := Item{MessageID: rec.MessageId}
	if ms, err := strconv.ParseInt(rec.Attributes["SentTimestamp"], 10, 64); err == nil {
		it.SentAt = time.UnixMilli(ms)
	}
	it.ReceiveCount, _ = strconv.Atoi(rec.Attributes["ApproximateReceiveCount"])
	if err := json.Unmarshal([]byte(rec.Body), &it.Message); err != nil {
		return it, fmt.Errorf("message %s: %w", rec.MessageId, err)
	}
	body, err := it.Message.validate()
	if err != nil {
		return it, fmt.Errorf("message %s: %w", rec.MessageId, err)
	}
	it.Body = body
	return it, nil
}

// validate checks a message's envelope, then parses its body with its
// kind's parser, as the exitrecorder checks a line: whoever may send to
// the queue could have written it.
func (m Message) validate() (Body, error) {
	switch {
	case m.V != Version:
		return nil, fmt.Errorf("version %d, want %d", m.V, Version)
	case !model.ValidInstanceID(m.InstanceID):
		return nil, fmt.Errorf("instanceId %.40q is not an EC2 instance id", m.InstanceID)
	case m.Attempt < 0 || m.Attempt > MaxAttempts:
		return nil, fmt.Errorf("attempt %d, want 0 to %d", m.Attempt, MaxAttempts)
	case m.Checks < 0 || m.Checks > MaxChecks:
		return nil, fmt.Errorf("checks %d, want 0 to %d", m.Checks, MaxChecks)
	}
	parse, ok := parsers[m.Kind]
	if !ok {
		return nil, fmt.Errorf("unknown kind %q", m.Kind)
	}
	return parse(m)
}

// parsers are the body parsers, one per kind.
var parsers = map[Kind]func(Message) (Body, error){
	KindExit:         parseExit,
	KindState:        parseState,
	KindSweep:        func(Message) (Body, error) { return SweepRequest{}, nil },
	KindOrphan:       parseOrphan,
	KindStillRunning: func(Message) (Body, error) { return StillRunningCheck{}, nil },
}

func parseExit(m Message) (Body, error) {
	switch {
	case m.Pod == nil || m.Exit == nil:
		return nil, errors.New("exit message without pod or exit")
	case m.TokenHash != "" && !model.ValidExitTokenHash(m.TokenHash):
		return nil, fmt.Errorf("tokenHash %.80q is not a SHA-256 in lower-case hex", m.TokenHash)
	}
	if err := exitline.ValidateClaim(*m.Pod, *m.Exit); err != nil {
		return nil, fmt.Errorf("exit claim: %w", err)
	}
	return ExitClaim{Pod: *m.Pod, Exit: *m.Exit, TokenHash: m.TokenHash}, nil
}

func parseState(m Message) (Body, error) {
	switch {
	case m.State == "" || m.At.IsZero():
		return nil, errors.New("state message without state or time")
	case !model.KnownState(m.State):
		return nil, fmt.Errorf("state %.40q is not an EC2 instance state", m.State)
	}
	return StateChange{State: m.State, At: m.At}, nil
}

func parseOrphan(m Message) (Body, error) {
	if m.Running < 0 {
		return nil, fmt.Errorf("running %d, want 0 or more", m.Running)
	}
	return OrphanCheck{Running: m.Running}, nil
}

// SQS limits on SendMessageBatch: ten entries, 256 KiB in all.
const (
	batchEntries = 10
	batchBytes   = 256 * 1024
)

// MaxDelay is the longest delay SQS gives a message.
const MaxDelay = 15 * time.Minute

// Queue sends work items to one SQS queue.
type Queue struct {
	client *sqs.Client
	url    string
	now    func() time.Time
}

// New returns the Queue at url.
func New(client *sqs.Client, url string) *Queue {
	return &Queue{client: client, url: url, now: time.Now}
}

// Send sends msgs, ten to a SendMessageBatch, each delivered no sooner
// than delay (at most MaxDelay). Entries SQS refuses one by one are sent
// again once; a failed request fails only its own entries. unsent are the
// messages SQS did not take in the end (nil when all landed), err says why
// (nil iff unsent is empty).
func (q *Queue) Send(ctx context.Context, delay time.Duration, msgs ...Message) (unsent []Message, err error) {
	now := q.now().UTC()
	bodies := make([]string, 0, len(msgs))
	// sent[i] is the message of bodies[i].
	sent := make([]int, 0, len(msgs))
	var errs []error
	for i, m := range msgs {
		m.V = Version
		if m.QueuedAt.IsZero() {
			m.QueuedAt = now
		}
		b, err := json.Marshal(m)
		if err != nil {
			unsent = append(unsent, msgs[i])
			errs = append(errs, fmt.Errorf("encode %s: %w", m.InstanceID, err))
			continue
		}
		bodies, sent = append(bodies, string(b)), append(sent, i)
	}
	seconds := int32(min(max(delay, 0), MaxDelay) / time.Second)
	reqs := batches(bodies)
	results := make([]requestResult, len(reqs))
	// A reconciler defers up to a whole batch (10,000 messages, 1,000
	// requests) inside the seconds it keeps for settling: the requests go
	// out sendWorkers at a time.
	var wg sync.WaitGroup
	next := make(chan int)
	for range min(sendWorkers, len(reqs)) {
		wg.Go(func() {
			for i := range next {
				results[i] = q.sendAll(ctx, bodies, reqs[i], seconds)
			}
		})
	}
	for i := range reqs {
		next <- i
	}
	close(next)
	wg.Wait()
	for _, r := range results {
		for _, b := range r.unsent {
			unsent = append(unsent, msgs[sent[b]])
		}
		if r.err != nil {
			errs = append(errs, r.err)
		}
	}
	if len(unsent) == 0 {
		return nil, nil
	}
	return unsent, fmt.Errorf("work queue: %d of %d messages not sent: %w", len(unsent), len(msgs), errors.Join(errs...))
}

// sendWorkers bounds a Send's requests in flight.
const sendWorkers = 8

// requestResult is what became of one request's entries: unsent are the
// indexes (into a Send's bodies) of those SQS did not take, err why.
type requestResult struct {
	unsent []int
	err    error
}

// sendAll sends the bodies of one request (indexes into bodies); entries
// SQS refuses one by one (an internal error, say) are sent again once, as
// the SDK retries whole requests only.
func (q *Queue) sendAll(ctx context.Context, bodies []string, request []int, seconds int32) requestResult {
	failed, err := q.sendBatch(ctx, bodies, request, seconds)
	if err == nil && len(failed) > 0 {
		failed, err = q.sendBatch(ctx, bodies, failed, seconds)
	}
	if err == nil && len(failed) > 0 {
		err = fmt.Errorf("%d of %d entries refused twice", len(failed), len(request))
	}
	return requestResult{unsent: failed, err: err}
}

// sendBatch sends one SendMessageBatch of the bodies entries (indexes into
// bodies) and returns those SQS did not take: the entries it refused, or
// all of them with the request's error.
func (q *Queue) sendBatch(ctx context.Context, bodies []string, entries []int, delaySeconds int32) ([]int, error) {
	in := make([]types.SendMessageBatchRequestEntry, len(entries))
	for i, b := range entries {
		in[i] = types.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), MessageBody: aws.String(bodies[b]), DelaySeconds: delaySeconds}
	}
	out, err := q.client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(q.url), Entries: in})
	if err != nil {
		return entries, err
	}
	var failed []int
	for _, f := range out.Failed {
		if i, err := strconv.Atoi(aws.ToString(f.Id)); err == nil && i >= 0 && i < len(entries) {
			failed = append(failed, entries[i])
		}
	}
	return failed, nil
}

// batches splits bodies into SendMessageBatch requests within SQS's
// limits, each request the indexes of its bodies.
func batches(bodies []string) [][]int {
	var out [][]int
	var cur []int
	size := 0
	for i, b := range bodies {
		if len(cur) == batchEntries || (len(cur) > 0 && size+len(b) > batchBytes) {
			out = append(out, cur)
			cur, size = nil, 0
		}
		cur = append(cur, i)
		size += len(b)
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return slices.Clip(out)
}
