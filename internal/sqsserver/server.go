// Package sqsserver is an in-process stand-in for Amazon SQS standard queues,
// speaking the JSON protocol (awsJson1_0: POST /, X-Amz-Target
// AmazonSQS.<Action>) that aws-sdk-go-v2's sqs client uses. Tests point the
// real client at it (sqs.Options.BaseEndpoint or AWS_ENDPOINT_URL_SQS), so
// request encoding, response parsing, checksum validation, error mapping and
// retries are exercised for real.
//
// Actions: CreateQueue, GetQueueAttributes, SendMessage(Batch), ReceiveMessage
// and DeleteMessageBatch. Behaviour follows SQS where consumers depend on it:
//
//   - A received message stays invisible for the visibility timeout (the
//     queue's, or the ReceiveMessage override) and then becomes receivable
//     again with ApproximateReceiveCount one higher and a new receipt handle.
//   - With a RedrivePolicy, a receive that finds a message already received
//     maxReceiveCount times moves it to the dead-letter queue instead of
//     returning it, as SQS does. The moved message keeps its id, body,
//     attributes and SentTimestamp, and gains the DeadLetterQueueSourceArn
//     system attribute; it also keeps its receive count, which is this
//     server's choice (SQS does not document it).
//   - Long polling (WaitTimeSeconds) answers as soon as a message is
//     receivable: sent, delay over or visibility expired.
//   - Deleting with a receipt handle from an earlier receive of a message
//     that has been received again succeeds but deletes nothing, as the
//     DeleteMessage reference documents; deleting a message that is already
//     gone succeeds too.
//   - MD5OfMessageBody/MD5OfBody and MD5OfMessageAttributes are computed as
//     SQS computes them; the SDK checks the body digests.
//   - Also as SQS: DelaySeconds, MessageRetentionPeriod (counted from the
//     original send), the size, character and attribute rules for messages,
//     and the request-wide rules for batches.
//   - Errors carry the modeled shape in "__type" and the legacy Query code in
//     the x-amzn-query-error header, which the SDK (SQS is awsQuery
//     compatible) uses as the error code: a missing queue comes back as
//     *types.QueueDoesNotExist whose ErrorCode() is
//     AWS.SimpleQueueService.NonExistentQueue, exactly as from SQS.
//
// SDK clients of a Server should send through BufferedBodies, which keeps a
// race in the SDK's HTTP handling from retrying requests.
//
// Other actions answer InvalidAction. No caller in this module uses
// GetQueueUrl (queues are named by the URL CreateQueue returns), PurgeQueue,
// DeleteMessage (consumers delete in batches) or
// ChangeMessageVisibility(Batch). Also left out: FIFO queues, message groups
// and deduplication, message system attributes on send (AWSTraceHeader),
// list-valued message attributes (SQS reserves them too), queue deletion,
// SetQueueAttributes, tags, policies, encryption and message move tasks.
// Where SQS samples a subset of its servers on a short poll and may return
// fewer messages than are available, this server returns every receivable
// message up to MaxNumberOfMessages, in the order they were sent, so tests
// are deterministic. Requests are not authenticated.
//
// A Server is safe for concurrent use.
package sqsserver

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/reaper-k8s/reaper/internal/callrecord"
)

// The identity the server answers as: queue URLs are
// <server URL>/<AccountID>/<name> and ARNs arn:aws:sqs:<Region>:<AccountID>:<name>.
const (
	AccountID = "123456789012"
	Region    = "us-east-1"
	// SenderID is the SenderId system attribute of every message: the unique
	// id of the principal that sent it, which SQS reports and this server
	// does not track.
	SenderID = "AIDAIT2UOQQY3AUEKVGXU"
)

// Call is one request the server answered. Its ErrorCode is the code the
// SDK reports (x-amzn-query-error); Injected says a fault from FailNext
// answered it.
type Call struct {
	callrecord.Call
	Queue string // the queue the request named (the last path segment of a QueueUrl); "" when none or faulted
	// Count is how many messages the call carried: the entries of a batch
	// request, the messages of a ReceiveMessage answer, 1 for SendMessage,
	// 0 for queue actions.
	Count int
}

// Depth is how many messages a queue holds, by state.
type Depth struct {
	Visible  int // receivable now (ApproximateNumberOfMessages)
	InFlight int // received and within their visibility timeout (ApproximateNumberOfMessagesNotVisible)
	Delayed  int // sent with a delay that has not passed (ApproximateNumberOfMessagesDelayed)
}

// Server is a fake SQS endpoint on a loopback httptest server.
type Server struct {
	http *httptest.Server
	// now is the one clock behind every visibility, delay and retention
	// decision. Tests inside this package replace it; the long-poll timers
	// still run on real time.
	now func() time.Time
	// closed ends every long poll, so Close does not wait out WaitTimeSeconds.
	closed    chan struct{}
	closeOnce sync.Once

	mu     sync.Mutex
	queues map[string]*queue // by name
	faults []*fault

	calls callrecord.Record[Call]
}

type fault struct {
	action    string // "" matches every action
	remaining int
	code      string
}

// New starts a Server listening on 127.0.0.1. Close it when done.
func New() *Server {
	s := &Server{now: time.Now, closed: make(chan struct{}), queues: map[string]*queue{}}
	s.http = httptest.NewServer(s)
	return s
}

// URL is the endpoint to give the SDK, e.g. http://127.0.0.1:41234.
func (s *Server) URL() string { return s.http.URL }

// Close ends pending long polls, shuts the listener down and waits for
// in-flight requests.
func (s *Server) Close() {
	s.closeOnce.Do(func() { close(s.closed) })
	s.http.Close()
}

// QueueURL returns the URL the server gives the queue called name, whether
// or not it exists yet.
func (s *Server) QueueURL(name string) string {
	return s.http.URL + "/" + AccountID + "/" + name
}

// Client returns the real SDK client for the server: its region, test
// credentials, and request bodies buffered (see BufferedBodies) over base
// (http.DefaultTransport when nil). optFns adjust the options further.
func (s *Server) Client(base http.RoundTripper, optFns ...func(*sqs.Options)) *sqs.Client {
	return sqs.New(sqs.Options{
		Region:       Region,
		Credentials:  credentials.NewStaticCredentialsProvider("AKIDTEST", "secret", ""),
		BaseEndpoint: aws.String(s.URL()),
		HTTPClient:   &http.Client{Transport: BufferedBodies{Base: base}},
	}, optFns...)
}

// QueueARN returns the ARN of the queue called name, whether or not it
// exists yet: what a RedrivePolicy's deadLetterTargetArn names.
func QueueARN(name string) string {
	return "arn:aws:sqs:" + Region + ":" + AccountID + ":" + name
}

// Depth counts the messages of the queue called name; ok is false when
// there is no such queue.
func (s *Server) Depth(name string) (d Depth, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q, ok := s.queues[name]
	if !ok {
		return Depth{}, false
	}
	now := s.now()
	q.tidy(now)
	return q.depth(now), true
}

// SentBefore counts the messages of the queue called name that were sent
// at or before t and are still in it (visible, in flight or delayed): a
// message leaves only when it is deleted, moved to a dead-letter queue or
// expires. ok is false when there is no such queue.
func (s *Server) SentBefore(name string, t time.Time) (n int, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q, ok := s.queues[name]
	if !ok {
		return 0, false
	}
	q.tidy(s.now())
	for _, m := range q.msgs {
		if !m.deleted && !m.sentAt.After(t) {
			n++
		}
	}
	return n, true
}

// Calls returns a copy of every request answered since New or ResetCalls,
// in the order they were answered (a long poll is recorded when it ends).
func (s *Server) Calls() []Call { return s.calls.Calls() }

// CallCount returns how many requests for action were answered, faulted
// ones included.
func (s *Server) CallCount(action string) int { return s.calls.Count(action) }

// ResetCalls forgets the recorded calls. Queues and faults stay.
func (s *Server) ResetCalls() { s.calls.Reset() }

// FailNext answers the next n requests for action ("" for any action) with
// the error code, without touching any queue. code is what the SDK reports
// as ErrorCode(): a modeled SQS code (e.g. "RequestThrottled", which the SDK
// retries as a throttle, or "AWS.SimpleQueueService.NonExistentQueue") gets
// its modeled shape and HTTP status; "InternalError" and
// "ServiceUnavailable" get 500 and 503, which the SDK retries; anything else
// is a 400. Faults queue up in the order they were registered.
func (s *Server) FailNext(action string, n int, code string) {
	if n <= 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = append(s.faults, &fault{action: action, remaining: n, code: code})
}

// takeFault returns the code of the fault that answers this request, if
// any, and consumes one use of it. Called with s.mu held.
func (s *Server) takeFault(action string) (string, bool) {
	for i, f := range s.faults {
		if f.action != "" && f.action != action {
			continue
		}
		f.remaining--
		if f.remaining == 0 {
			s.faults = append(s.faults[:i], s.faults[i+1:]...)
		}
		return f.code, true
	}
	return "", false
}

// lookup resolves a QueueUrl. Any host is accepted: only the
// /<account>/<name> path identifies the queue, as clients may hold URLs
// built for another endpoint. Called with s.mu held.
func (s *Server) lookup(queueURL string) (*queue, *apiError) {
	var parts []string
	if u, err := url.Parse(queueURL); err == nil {
		parts = strings.Split(strings.Trim(u.EscapedPath(), "/"), "/")
	}
	if len(parts) != 2 {
		return nil, errorf(codeInvalidAddress, "The address %s is not valid for this endpoint.", queueURL)
	}
	q, ok := s.queues[parts[1]]
	if !ok || parts[0] != AccountID {
		return nil, errorf(codeNonExistentQueue, "The specified queue does not exist.")
	}
	return q, nil
}

// queueByARN finds a dead-letter target. Called with s.mu held.
func (s *Server) queueByARN(arn string) (*queue, bool) {
	name, ok := strings.CutPrefix(arn, QueueARN(""))
	if !ok {
		return nil, false
	}
	q, ok := s.queues[name]
	return q, ok
}

// queue is one standard queue.
type queue struct {
	name    string
	attrs   queueAttributes
	created time.Time

	msgs []*message          // in send order; deleted ones linger until compact
	byID map[string]*message // live messages only
	// changed is closed (and replaced) whenever a message may have become
	// receivable without a timer a waiter could have set: a send or a move
	// from another queue.
	changed chan struct{}
}

func newQueue(name string, attrs queueAttributes, now time.Time) *queue {
	return &queue{name: name, attrs: attrs, created: now, byID: map[string]*message{}, changed: make(chan struct{})}
}

func (q *queue) url(base string) string { return base + "/" + AccountID + "/" + q.name }

func (q *queue) notify() {
	close(q.changed)
	q.changed = make(chan struct{})
}

func (q *queue) add(m *message) {
	q.msgs = append(q.msgs, m)
	q.byID[m.id] = m
	q.notify()
}

// remove forgets a message. Its slot in msgs is reclaimed by tidy, so
// callers may remove while ranging over msgs.
func (q *queue) remove(m *message) {
	m.deleted = true
	delete(q.byID, m.id)
}

// tidy drops messages older than the retention period (like SQS, age counts
// from the original send, also for messages moved from another queue) and
// reclaims the slots of removed messages once they are the majority. Every
// request that reads a queue's messages calls it first.
func (q *queue) tidy(now time.Time) {
	limit := time.Duration(q.attrs.retention) * time.Second
	for _, m := range q.msgs {
		if !m.deleted && now.Sub(m.sentAt) >= limit {
			q.remove(m)
		}
	}
	if len(q.byID) >= len(q.msgs)/2 {
		return
	}
	live := q.msgs[:0]
	for _, m := range q.msgs {
		if !m.deleted {
			live = append(live, m)
		}
	}
	clear(q.msgs[len(live):])
	q.msgs = live
}

func (q *queue) depth(now time.Time) Depth {
	var d Depth
	for _, m := range q.msgs {
		if m.deleted {
			continue
		}
		switch m.state(now) {
		case visible:
			d.Visible++
		case inFlight:
			d.InFlight++
		case delayed:
			d.Delayed++
		}
	}
	return d
}

// nextChange is the earliest time a delayed or in-flight message becomes
// receivable, or the zero time when none will.
func (q *queue) nextChange(now time.Time) time.Time {
	var next time.Time
	for _, m := range q.msgs {
		if !m.deleted && m.state(now) != visible && (next.IsZero() || m.availableAt.Before(next)) {
			next = m.availableAt
		}
	}
	return next
}

type msgState int

const (
	visible msgState = iota
	inFlight
	delayed
)

// message is one message. Its state follows from availableAt and
// receiveCount alone, so visibility needs no timers: before availableAt a
// message that was never received is delayed, one that was is in flight;
// from availableAt on it is visible.
type message struct {
	id        string
	body      string
	attrs     map[string]attributeValue
	md5Body   string
	md5Attrs  string
	sentAt    time.Time
	dlqSource string // ARN of the queue it was moved from, if any

	availableAt    time.Time
	receiveCount   int
	firstReceiveAt time.Time
	handle         string // receipt handle of the latest receive
	deleted        bool
}

func (m *message) state(now time.Time) msgState {
	switch {
	case !now.Before(m.availableAt):
		return visible
	case m.receiveCount == 0:
		return delayed
	default:
		return inFlight
	}
}

// receive hands the message out for visibility and returns its new receipt
// handle.
func (m *message) receive(queueName string, now time.Time, visibility time.Duration) string {
	m.receiveCount++
	if m.receiveCount == 1 {
		m.firstReceiveAt = now
	}
	m.availableAt = now.Add(visibility)
	m.handle = newHandle(queueName, m.id)
	return m.handle
}

// A receipt handle names the queue and message it was issued for, plus
// random bytes that make each receive's handle unique.
func newHandle(queueName, messageID string) string {
	return base64.StdEncoding.EncodeToString([]byte(queueName + "\x00" + messageID + "\x00" + randomHex(16)))
}

func parseHandle(h string) (queueName, messageID string, ok bool) {
	b, err := base64.StdEncoding.DecodeString(h)
	if err != nil {
		return "", "", false
	}
	parts := strings.Split(string(b), "\x00")
	if len(parts) != 3 {
		return "", "", false
	}
	return parts[0], parts[1], true
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%x", b)
}

// newUUID returns a random RFC 4122 version 4 UUID: the form of SQS message
// and request ids.
func newUUID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}
