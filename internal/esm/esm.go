// Package esm emulates an AWS Lambda event source mapping for an Amazon SQS
// standard queue: it polls the queue through the SQS API, batches messages,
// invokes a function with an aws-lambda-go events.SQSEvent and deletes what
// the function handled, the way Lambda does. It talks to SQS only through
// an SDK client, so it runs against internal/sqsserver or a real queue, and
// it invokes through an injected func, so any runner can host the function
// (the Lambda runtime interface emulator, or a handler called in-process).
//
// Batching follows the Lambda developer guide ("Using Lambda with Amazon
// SQS"): a batch is invoked when it holds BatchSize messages, when its
// MaximumBatchingWindow has passed since its first message arrived, or when
// one more message would take the invocation payload past 6 MB. Messages
// are received ten at a time, as ReceiveMessage allows.
//
// Results follow the same guide's rules for ReportBatchItemFailures: after
// a successful invocation every message not listed in the response's
// batchItemFailures is deleted; the listed ones, and every message of a
// failed invocation, are left for SQS to make visible again after the
// visibility timeout, where they are received (and counted) again until the
// queue's redrive policy moves them to its dead-letter queue.
//
// Differences from Lambda: one poller forms batches, one after the other,
// so batches are as full as the window allows (Lambda's several pollers can
// split a burst across batches); a poller only gathers a batch when an
// invocation slot is free; windows shorter than Lambda's 1 s minimum are
// accepted to keep tests fast; there is no backoff after function errors.
package esm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

// Limits of the Lambda SQS event source mapping ("Using Lambda with Amazon
// SQS"; "Lambda quotas" for the payload).
const (
	MaxBatchSize      = 10000
	MaxBatchingWindow = 300 * time.Second
	// MaxPayloadBytes is Lambda's limit on a synchronous invocation's
	// request: 6 MB.
	MaxPayloadBytes = 6 * 1024 * 1024
	// DefaultBatchSize is Lambda's default for SQS.
	DefaultBatchSize = 10
)

const (
	receiveMax = 10 // ReceiveMessage's MaxNumberOfMessages limit
	idleWait   = 20 // seconds: the longest long poll, as Lambda's pollers use
	// shortPoll is the pause between short polls while a window that ends
	// within a second is open: long polls wait whole seconds and would
	// overshoot it. (The SDK leaves a zero WaitTimeSeconds out, so on a
	// queue with a ReceiveMessageWaitTimeSeconds of its own these polls
	// wait that long for a message.)
	shortPoll    = 25 * time.Millisecond
	errorBackoff = 100 * time.Millisecond
	drainPoll    = 25 * time.Millisecond
	// settleTimeout bounds the deletes after an invocation, which run even
	// when Stop has cancelled the invocation's context: a function that
	// returned has done its work.
	settleTimeout = 10 * time.Second
)

// Client is the part of the SQS API a Mapping uses; *sqs.Client implements it.
type Client interface {
	ReceiveMessage(context.Context, *sqs.ReceiveMessageInput, ...func(*sqs.Options)) (*sqs.ReceiveMessageOutput, error)
	DeleteMessageBatch(context.Context, *sqs.DeleteMessageBatchInput, ...func(*sqs.Options)) (*sqs.DeleteMessageBatchOutput, error)
	GetQueueAttributes(context.Context, *sqs.GetQueueAttributesInput, ...func(*sqs.Options)) (*sqs.GetQueueAttributesOutput, error)
}

// InvokeFunc runs the function on one event (a JSON events.SQSEvent) and
// returns its response. It returns an error when the invocation failed,
// function errors included, and returns soon after ctx is cancelled (Stop
// waits for it). A response that is Lambda's function-error document
// ({"errorType":…,"errorMessage":…}) also counts as a failed invocation,
// because the runtime interface emulator answers function errors that way,
// with HTTP 200.
type InvokeFunc func(ctx context.Context, payload []byte) (response []byte, err error)

// Config describes a mapping, after Lambda's CreateEventSourceMapping.
type Config struct {
	// Client is required. Against internal/sqsserver, build it on
	// sqsserver.BufferedBodies, or requests the SDK retries can leave
	// messages in flight that no batch holds.
	Client   Client
	QueueURL string     // required
	Invoke   InvokeFunc // required
	// BatchSize is the most messages per invocation, 1 to MaxBatchSize;
	// zero means DefaultBatchSize. Over 10 needs a MaximumBatchingWindow.
	BatchSize int
	// MaximumBatchingWindow is how long a batch may keep gathering after
	// its first message arrives, up to MaxBatchingWindow. Zero invokes with
	// what one receive returns.
	MaximumBatchingWindow time.Duration
	// MaxConcurrency caps concurrent invocations (Lambda's
	// ScalingConfig.MaximumConcurrency, 2 to 1,000 there; 1 is accepted
	// here, as the runtime interface emulator runs one invocation at a
	// time). Zero means no cap.
	MaxConcurrency int
	// ReportBatchItemFailures is FunctionResponseTypes
	// ["ReportBatchItemFailures"]: the response's batchItemFailures name
	// the messages to keep. Without it the response is ignored and a
	// successful invocation deletes the whole batch.
	ReportBatchItemFailures bool
}

// Stats counts what a Mapping did.
type Stats struct {
	Invocations int
	// FailedInvocations left their whole batch on the queue: the invoke
	// failed, the function failed, or the response broke Lambda's rules
	// for batchItemFailures.
	FailedInvocations int
	BatchSizes        []int // messages per invocation, in invocation order
	ReportedFailures  int   // messages kept because batchItemFailures listed them
	Deleted           int   // messages deleted after successful invocations
	PeakConcurrency   int   // most invocations running at once
	Errors            int   // failed SQS calls and delete entries
	LastError         error // the latest of those
}

// Mapping is a running (or runnable) event source mapping. Its methods are
// safe for concurrent use.
type Mapping struct {
	cfg       Config
	arn       string
	region    string
	slots     chan struct{} // one per running invocation; nil without a cap
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	lifecycle sync.Mutex // serialises Start and Stop

	mu      sync.Mutex
	state   int // notStarted, running, stopped
	stats   Stats
	running int
	// held counts messages received and not yet settled (deleted or left
	// after their invocation); activity changes whenever held does, so
	// WaitDrained can tell a quiet moment from a busy one between two looks.
	held     int
	activity uint64
}

const (
	notStarted = iota
	running
	stopped
)

// New checks cfg and returns a Mapping ready to Start.
func New(cfg Config) (*Mapping, error) {
	if cfg.BatchSize == 0 {
		cfg.BatchSize = DefaultBatchSize
	}
	switch {
	case cfg.Client == nil || cfg.QueueURL == "" || cfg.Invoke == nil:
		return nil, errors.New("esm: Client, QueueURL and Invoke are required")
	case cfg.BatchSize < 1 || cfg.BatchSize > MaxBatchSize:
		return nil, fmt.Errorf("esm: batch size %d is outside 1 to %d", cfg.BatchSize, MaxBatchSize)
	case cfg.MaximumBatchingWindow < 0 || cfg.MaximumBatchingWindow > MaxBatchingWindow:
		return nil, fmt.Errorf("esm: batching window %v is outside 0 to %v", cfg.MaximumBatchingWindow, MaxBatchingWindow)
	case cfg.BatchSize > receiveMax && cfg.MaximumBatchingWindow == 0:
		return nil, fmt.Errorf("esm: batch size %d needs a batching window, as Lambda requires for batches over %d", cfg.BatchSize, receiveMax)
	case cfg.MaxConcurrency < 0:
		return nil, fmt.Errorf("esm: max concurrency %d is negative", cfg.MaxConcurrency)
	}
	m := &Mapping{cfg: cfg}
	if cfg.MaxConcurrency > 0 {
		m.slots = make(chan struct{}, cfg.MaxConcurrency)
	}
	return m, nil
}

// Start looks the queue up (its ARN goes into every record) and starts
// polling. ctx bounds the lookup only; the mapping runs until Stop.
func (m *Mapping) Start(ctx context.Context) error {
	m.lifecycle.Lock()
	defer m.lifecycle.Unlock()
	m.mu.Lock()
	state := m.state
	m.mu.Unlock()
	if state != notStarted {
		return errors.New("esm: mapping already started")
	}
	out, err := m.cfg.Client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
		QueueUrl:       &m.cfg.QueueURL,
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameQueueArn},
	})
	if err != nil {
		return fmt.Errorf("esm: look up queue %s: %w", m.cfg.QueueURL, err)
	}
	m.arn = out.Attributes[string(types.QueueAttributeNameQueueArn)]
	// arn:aws:sqs:<region>:<account>:<name>
	if parts := strings.Split(m.arn, ":"); len(parts) == 6 {
		m.region = parts[3]
	}
	runCtx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	m.mu.Lock()
	m.state = running
	m.mu.Unlock()
	m.wg.Add(1)
	go m.poll(runCtx)
	return nil
}

// Stop ends polling, cancels the context of running invocations and waits
// for every goroutine of the mapping to return. Messages it had received
// and not settled reappear after their visibility timeout. Stop is
// idempotent, and a no-op before Start.
func (m *Mapping) Stop() {
	m.lifecycle.Lock()
	defer m.lifecycle.Unlock()
	m.mu.Lock()
	wasRunning := m.state == running
	if m.state != notStarted {
		m.state = stopped
	}
	m.mu.Unlock()
	if wasRunning {
		m.cancel()
		m.wg.Wait()
	}
}

// Stats returns a snapshot of the counters.
func (m *Mapping) Stats() Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.stats
	s.BatchSizes = slices.Clone(s.BatchSizes)
	return s
}

// WaitDrained returns once the queue has no visible, in-flight or delayed
// messages and the mapping holds none (no batch gathering, no invocation
// running), or an error when ctx ends first or the mapping is not running.
// Messages in the dead-letter queue do not count: they have left this one.
func (m *Mapping) WaitDrained(ctx context.Context) error {
	tick := time.NewTicker(drainPoll)
	defer tick.Stop()
	for {
		ok, why, err := m.drained(ctx)
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("esm: queue not drained (%s): %w", why, ctx.Err())
		case <-tick.C:
		}
	}
}

// drained takes one look. The mapping's state is read before and after
// the queue's: a message is always either counted by the queue or held
// by the mapping (it is deleted only after its invocation), and an
// unchanged activity counter shows nothing moved from one to the other
// in between.
func (m *Mapping) drained(ctx context.Context) (bool, string, error) {
	m.mu.Lock()
	state, held, before := m.state, m.held, m.activity
	m.mu.Unlock()
	if state != running {
		return false, "", errors.New("esm: mapping is not running")
	}
	if held > 0 {
		return false, fmt.Sprintf("%d messages held by the mapping", held), nil
	}
	names := []types.QueueAttributeName{
		types.QueueAttributeNameApproximateNumberOfMessages,
		types.QueueAttributeNameApproximateNumberOfMessagesNotVisible,
		types.QueueAttributeNameApproximateNumberOfMessagesDelayed,
	}
	out, err := m.cfg.Client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: &m.cfg.QueueURL, AttributeNames: names})
	if err != nil {
		return false, fmt.Sprintf("GetQueueAttributes: %v", err), nil // retried until ctx ends
	}
	var counts []string
	for _, name := range names {
		if v := out.Attributes[string(name)]; v != "0" {
			counts = append(counts, fmt.Sprintf("%s=%s", name, v))
		}
	}
	if len(counts) > 0 {
		return false, strings.Join(counts, " "), nil
	}
	m.mu.Lock()
	after := m.activity
	m.mu.Unlock()
	return after == before, "the mapping received messages meanwhile", nil
}

func (m *Mapping) fail(err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.stats.Errors++
	m.stats.LastError = err
}

// hold and release track messages between their receive and settlement.
func (m *Mapping) hold(n int) {
	if n == 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.held += n
	m.activity++
}

func (m *Mapping) release(n int) { m.hold(-n) }

// acquireSlot waits for an invocation slot; false when ctx ended first.
func (m *Mapping) acquireSlot(ctx context.Context) bool {
	if m.slots == nil {
		return true
	}
	select {
	case m.slots <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

func (m *Mapping) releaseSlot() {
	if m.slots != nil {
		<-m.slots
	}
}

// poll forms batches one after the other and hands each to an invocation.
func (m *Mapping) poll(ctx context.Context) {
	defer m.wg.Done()
	var carry []types.Message // received, did not fit the previous batch
	for {
		if !m.acquireSlot(ctx) {
			return
		}
		b, rest, ok := m.gather(ctx, carry)
		if !ok {
			m.releaseSlot()
			return
		}
		carry = rest
		m.wg.Add(1)
		go m.invoke(ctx, b)
	}
}

// gather receives messages into a batch until it is full, its window has
// passed, or the next message would not fit the payload limit; that
// message and any after it come back as rest. ok is false when ctx ended.
func (m *Mapping) gather(ctx context.Context, carry []types.Message) (b *batch, rest []types.Message, ok bool) {
	b = &batch{}
	var deadline time.Time
	add := func(msgs []types.Message) []types.Message {
		for i, msg := range msgs {
			if !b.add(m.record(msg)) {
				return msgs[i:]
			}
			if deadline.IsZero() { // the window opens with the first message
				deadline = time.Now().Add(m.cfg.MaximumBatchingWindow)
			}
		}
		return nil
	}
	if rest := add(carry); rest != nil {
		return b, rest, true
	}
	for b.len() < m.cfg.BatchSize {
		wait := int32(idleWait)
		if b.len() > 0 {
			remaining := time.Until(deadline)
			if remaining <= 0 {
				break
			}
			wait = int32(min(remaining/time.Second, idleWait))
			if wait == 0 && !sleep(ctx, min(shortPoll, remaining)) {
				return nil, nil, false
			}
		}
		out, err := m.cfg.Client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl:                    &m.cfg.QueueURL,
			MaxNumberOfMessages:         int32(min(receiveMax, m.cfg.BatchSize-b.len())),
			WaitTimeSeconds:             wait,
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll},
			MessageAttributeNames:       []string{"All"},
		})
		if err != nil {
			if ctx.Err() != nil {
				return nil, nil, false
			}
			m.fail(fmt.Errorf("esm: receive: %w", err))
			if !sleep(ctx, errorBackoff) {
				return nil, nil, false
			}
			continue
		}
		m.hold(len(out.Messages))
		if rest := add(out.Messages); rest != nil {
			return b, rest, true
		}
	}
	return b, nil, true
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// record builds the event record Lambda builds for a received message.
func (m *Mapping) record(msg types.Message) events.SQSMessage {
	rec := events.SQSMessage{
		MessageId:              aws.ToString(msg.MessageId),
		ReceiptHandle:          aws.ToString(msg.ReceiptHandle),
		Body:                   aws.ToString(msg.Body),
		Md5OfBody:              aws.ToString(msg.MD5OfBody),
		Md5OfMessageAttributes: aws.ToString(msg.MD5OfMessageAttributes),
		Attributes:             map[string]string{},
		MessageAttributes:      map[string]events.SQSMessageAttribute{},
		EventSourceARN:         m.arn,
		EventSource:            "aws:sqs",
		AWSRegion:              m.region,
	}
	maps.Copy(rec.Attributes, msg.Attributes)
	for k, v := range msg.MessageAttributes {
		// Lambda sends empty lists, not nulls, for the reserved list values.
		rec.MessageAttributes[k] = events.SQSMessageAttribute{
			StringValue:      v.StringValue,
			BinaryValue:      v.BinaryValue,
			StringListValues: append([]string{}, v.StringListValues...),
			BinaryListValues: append([][]byte{}, v.BinaryListValues...),
			DataType:         aws.ToString(v.DataType),
		}
	}
	return rec
}

// batch is an event being assembled. Records are encoded as they are
// added, which sizes the payload and builds it: an events.SQSEvent encodes
// as {"Records":[r1,r2,…]}.
type batch struct {
	encoded [][]byte
	ids     []string
	handles []string
	size    int // of the payload so far
}

var (
	eventOpen  = []byte(`{"Records":[`)
	eventClose = []byte(`]}`)
)

func (b *batch) len() int { return len(b.ids) }

// add appends a record unless that would take the payload past
// MaxPayloadBytes. A record always fits an empty batch: SQS messages are at
// most 1 MiB.
func (b *batch) add(rec events.SQSMessage) bool {
	enc, _ := json.Marshal(rec) // cannot fail: strings, string maps and byte slices

	size := b.size + len(enc)
	if b.len() == 0 {
		size += len(eventOpen) + len(eventClose)
	} else {
		size++ // the comma
	}
	if b.len() > 0 && size > MaxPayloadBytes {
		return false
	}
	b.encoded = append(b.encoded, enc)
	b.ids = append(b.ids, rec.MessageId)
	b.handles = append(b.handles, rec.ReceiptHandle)
	b.size = size
	return true
}

func (b *batch) payload() []byte {
	var buf bytes.Buffer
	buf.Grow(b.size)
	buf.Write(eventOpen)
	buf.Write(bytes.Join(b.encoded, []byte(",")))
	buf.Write(eventClose)
	return buf.Bytes()
}

// invoke runs the function on a batch and settles its messages.
func (m *Mapping) invoke(ctx context.Context, b *batch) {
	defer m.wg.Done()
	defer m.releaseSlot()
	defer m.release(b.len())

	m.mu.Lock()
	m.stats.Invocations++
	m.stats.BatchSizes = append(m.stats.BatchSizes, b.len())
	m.running++
	m.stats.PeakConcurrency = max(m.stats.PeakConcurrency, m.running)
	m.mu.Unlock()

	resp, err := m.cfg.Invoke(ctx, b.payload())

	keep, failed := outcome(resp, err, b.ids, m.cfg.ReportBatchItemFailures)
	m.mu.Lock()
	m.running--
	if failed {
		m.stats.FailedInvocations++
	} else {
		m.stats.ReportedFailures += len(keep)
	}
	m.mu.Unlock()
	if failed {
		return
	}
	var entries []types.DeleteMessageBatchRequestEntry
	for i, id := range b.ids {
		if !keep[id] {
			entries = append(entries, types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: &b.handles[i]})
		}
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	m.delete(dctx, entries)
}

// delete removes handled messages, ten per request.
func (m *Mapping) delete(ctx context.Context, entries []types.DeleteMessageBatchRequestEntry) {
	for chunk := range slices.Chunk(entries, receiveMax) {
		out, err := m.cfg.Client.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: &m.cfg.QueueURL, Entries: chunk})
		if err != nil {
			m.fail(fmt.Errorf("esm: delete: %w", err))
			continue
		}
		m.mu.Lock()
		m.stats.Deleted += len(out.Successful)
		for _, f := range out.Failed {
			m.stats.Errors++
			m.stats.LastError = fmt.Errorf("esm: delete entry %s: %s: %s", aws.ToString(f.Id), aws.ToString(f.Code), aws.ToString(f.Message))
		}
		m.mu.Unlock()
	}
}

// outcome applies Lambda's rules to an invocation's result. failed means
// the whole batch stays on the queue; otherwise keep holds the ids the
// function reported as failures. With ReportBatchItemFailures, Lambda
// takes an empty or null response, an empty object or an empty or null
// batchItemFailures as complete success, and a response that is not valid
// JSON of that shape, or that names an empty, null or unknown
// itemIdentifier, as complete failure.
func outcome(resp []byte, invokeErr error, ids []string, report bool) (keep map[string]bool, failed bool) {
	if invokeErr != nil || isFunctionError(resp) {
		return nil, true
	}
	resp = bytes.TrimSpace(resp)
	if !report || len(resp) == 0 || string(resp) == "null" {
		return nil, false
	}
	var r events.SQSEventResponse
	if err := json.Unmarshal(resp, &r); err != nil {
		return nil, true
	}
	inBatch := make(map[string]bool, len(ids))
	for _, id := range ids {
		inBatch[id] = true
	}
	keep = map[string]bool{}
	for _, f := range r.BatchItemFailures {
		if !inBatch[f.ItemIdentifier] { // also catches "" and null
			return nil, true
		}
		keep[f.ItemIdentifier] = true
	}
	return keep, false
}

// isFunctionError recognises Lambda's function-error document.
func isFunctionError(resp []byte) bool {
	var doc struct {
		ErrorType    string `json:"errorType"`
		ErrorMessage string `json:"errorMessage"`
	}
	return json.Unmarshal(resp, &doc) == nil && (doc.ErrorType != "" || doc.ErrorMessage != "")
}
