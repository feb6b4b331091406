// Package workqueue is Reaper's work queue on Amazon SQS: the messages the
// exitrecorder, statechange and sweeper functions hand to the reconciler,
// and the client that sends them. A message names one instance and what
// happened to it; the reconciler coalesces a batch of them into few EC2
// calls (design §3, "the work queue").
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
)

// Message is one work item. Its body is the project's own JSON.
type Message struct {
	V          int    `json:"v"`
	Kind       Kind   `json:"kind"`
	InstanceID string `json:"instanceId"`
	// Pod and Exit are an exit message's claim.
	Pod  *model.PodRef `json:"pod,omitempty"`
	Exit *model.Exit   `json:"exit,omitempty"`
	// State and At are a state message's state change.
	State string    `json:"state,omitempty"`
	At    time.Time `json:"at,omitzero"`
	// QueuedAt is when the producer sent it (the reconciler measures the
	// time to its decisions from it).
	QueuedAt time.Time `json:"queuedAt,omitzero"`
	// Checks counts the times the reconciler found EC2 not yet in the
	// state a state message claims (its answers are eventually
	// consistent); it sends the message again a while later, a few times.
	Checks int `json:"checks,omitempty"`
}

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
func Orphan(id string) Message { return Message{Kind: KindOrphan, InstanceID: id} }

// Item is a received message with what SQS says of it.
type Item struct {
	Message
	// MessageID names the SQS message, for batch item failures.
	MessageID string
	// SentAt is SQS's SentTimestamp; ReceiveCount its ApproximateReceiveCount.
	SentAt       time.Time
	ReceiveCount int
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
	if err := it.Message.validate(); err != nil {
		return it, fmt.Errorf("message %s: %w", rec.MessageId, err)
	}
	return it, nil
}

func (m Message) validate() error {
	switch {
	case m.V != Version:
		return fmt.Errorf("version %d, want %d", m.V, Version)
	case !model.ValidInstanceID(m.InstanceID):
		return fmt.Errorf("instanceId %.40q is not an EC2 instance id", m.InstanceID)
	}
	switch m.Kind {
	case KindExit:
		if m.Pod == nil || m.Exit == nil {
			return errors.New("exit message without pod or exit")
		}
	case KindState:
		if m.State == "" || m.At.IsZero() {
			return errors.New("state message without state or time")
		}
	case KindSweep, KindOrphan:
	default:
		return fmt.Errorf("unknown kind %q", m.Kind)
	}
	return nil
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

// Send sends msgs, ten to a request, each delivered no sooner than delay
// (at most MaxDelay). Entries SQS refuses are sent again once; an error
// says how many were not sent, and the caller fails its invocation so that
// its own event comes back.
func (q *Queue) Send(ctx context.Context, delay time.Duration, msgs ...Message) error {
	now := q.now().UTC()
	bodies := make([]string, len(msgs))
	for i, m := range msgs {
		m.V, m.QueuedAt = Version, now
		b, err := json.Marshal(m)
		if err != nil {
			return fmt.Errorf("work queue: encode %s: %w", m.InstanceID, err)
		}
		bodies[i] = string(b)
	}
	seconds := int32(min(max(delay, 0), MaxDelay) / time.Second)
	reqs := batches(bodies)
	errs := make([]error, len(reqs))
	// A reconciler defers up to a whole batch (10,000 messages, 1,000
	// requests) inside the seconds it keeps for settling: the requests go
	// out sendWorkers at a time.
	var wg sync.WaitGroup
	next := make(chan int)
	for range min(sendWorkers, len(reqs)) {
		wg.Go(func() {
			for i := range next {
				errs[i] = q.sendAll(ctx, reqs[i], seconds)
			}
		})
	}
	for i := range reqs {
		next <- i
	}
	close(next)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("work queue: %w", err)
	}
	return nil
}

// sendWorkers bounds a Send's requests in flight.
const sendWorkers = 8

// sendAll sends one request's bodies; entries SQS refuses one by one (an
// internal error, say) are sent again once, as the SDK retries whole
// requests only.
func (q *Queue) sendAll(ctx context.Context, batch []string, seconds int32) error {
	failed, err := q.sendBatch(ctx, batch, seconds)
	if err == nil && len(failed) > 0 {
		failed, err = q.sendBatch(ctx, failed, seconds)
	}
	if err == nil && len(failed) > 0 {
		err = fmt.Errorf("%d of %d entries refused", len(failed), len(batch))
	}
	return err
}

// sendBatch sends one SendMessageBatch and returns the bodies SQS did not
// take.
func (q *Queue) sendBatch(ctx context.Context, bodies []string, delaySeconds int32) ([]string, error) {
	entries := make([]types.SendMessageBatchRequestEntry, len(bodies))
	for i, b := range bodies {
		entries[i] = types.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), MessageBody: aws.String(b), DelaySeconds: delaySeconds}
	}
	out, err := q.client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(q.url), Entries: entries})
	if err != nil {
		return bodies, err
	}
	var failed []string
	for _, f := range out.Failed {
		if i, err := strconv.Atoi(aws.ToString(f.Id)); err == nil && i < len(bodies) {
			failed = append(failed, bodies[i])
		}
	}
	return failed, nil
}

// batches splits bodies into SendMessageBatch requests within SQS's limits.
func batches(bodies []string) [][]string {
	var out [][]string
	var cur []string
	size := 0
	for _, b := range bodies {
		if len(cur) == batchEntries || (len(cur) > 0 && size+len(b) > batchBytes) {
			out = append(out, cur)
			cur, size = nil, 0
		}
		cur = append(cur, b)
		size += len(b)
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return slices.Clip(out)
}
