package sqsserver

import (
	"context"
	"encoding/json"
	"io"
	"maps"
	"mime"
	"net/http"
	"net/url"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/reaper-k8s/reaper/internal/callrecord"
)

const (
	jsonContentType = "application/x-amz-json-1.0"
	// maxRequestBytes bounds a request body, leaving room for the JSON
	// escaping of a batch at the 1 MiB limit.
	maxRequestBytes      = 8 << 20
	maxBatchEntries      = 10
	maxReceive           = 10
	maxWaitSeconds       = 20
	maxVisibilitySeconds = 43200
	maxDelaySeconds      = 900
)

var (
	queueNamePattern    = regexp.MustCompile(`^[A-Za-z0-9_-]{1,80}$`)
	batchEntryIDPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,80}$`)
)

// ServeHTTP implements the SQS JSON protocol: POST / with the action in
// X-Amz-Target and a JSON body, JSON answers.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	arrived := s.now()
	action, hasTarget := strings.CutPrefix(r.Header.Get("X-Amz-Target"), "AmazonSQS.")
	call := Call{Call: callrecord.Call{Action: action, Time: arrived}}
	mediaType, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	body, readErr := io.ReadAll(http.MaxBytesReader(w, r.Body, maxRequestBytes))

	var (
		out  any
		aerr *apiError
	)
	switch {
	case r.Method != http.MethodPost || !hasTarget:
		aerr = errorf(codeInvalidAction, "sqsserver expects POST with X-Amz-Target AmazonSQS.<Action>.")
	case mediaType != jsonContentType:
		aerr = errorf(codeInvalidAction, "sqsserver speaks only the JSON protocol (Content-Type %s), not %q.", jsonContentType, mediaType)
	case readErr != nil:
		aerr = errorf(codeSerialization, "cannot read the request: %v", readErr)
	default:
		s.mu.Lock()
		code, injected := s.takeFault(action)
		s.mu.Unlock()
		if injected {
			call.Injected = true
			aerr = errorf(code, "Injected fault.")
		} else {
			out, aerr = s.dispatch(r.Context(), action, body, &call)
		}
	}
	if aerr != nil {
		call.ErrorCode = aerr.code
	}
	s.calls.Add(call)

	w.Header().Set("Content-Type", jsonContentType)
	w.Header().Set("x-amzn-RequestId", newUUID())
	if aerr != nil {
		w.Header().Set("x-amzn-query-error", aerr.code+";"+aerr.fault())
		writeJSON(w, aerr.status(), struct {
			Type    string `json:"__type"`
			Message string `json:"message"`
		}{aerr.shape(), aerr.message})
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// named is implemented by every request shape, through byURL or byName:
// the queue it names, for the call record.
type named interface{ queueName() string }

type byURL struct{ QueueUrl string }

func (r byURL) queueName() string {
	if u, err := url.Parse(r.QueueUrl); err == nil && r.QueueUrl != "" {
		return path.Base(u.Path)
	}
	return ""
}

type byName struct{ QueueName string }

func (r byName) queueName() string { return r.QueueName }

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

func decode[T named](body []byte, call *Call) (T, *apiError) {
	var in T
	if err := json.Unmarshal(body, &in); err != nil {
		return in, errorf(codeSerialization, "cannot decode the request: %v", err)
	}
	call.Queue = in.queueName()
	return in, nil
}

// dispatch runs one action; call collects what the record needs.
func (s *Server) dispatch(ctx context.Context, action string, body []byte, call *Call) (any, *apiError) {
	switch action {
	case "CreateQueue":
		return run(body, call, s.createQueue)
	case "GetQueueAttributes":
		return run(body, call, s.getQueueAttributes)
	case "SendMessage":
		call.Count = 1
		return run(body, call, s.sendMessage)
	case "SendMessageBatch":
		return runBatch(body, call, s.sendMessageBatch)
	case "DeleteMessageBatch":
		return runBatch(body, call, s.deleteMessageBatch)
	case "ReceiveMessage":
		in, aerr := decode[receiveInput](body, call)
		if aerr != nil {
			return nil, aerr
		}
		out, aerr := s.receiveMessage(ctx, in)
		call.Count = len(out.Messages)
		return out, aerr
	default:
		return nil, errorf(codeInvalidAction, "The action %s is not valid for this endpoint.", action)
	}
}

func run[In named, Out any](body []byte, call *Call, fn func(In) (Out, *apiError)) (any, *apiError) {
	in, aerr := decode[In](body, call)
	if aerr != nil {
		return nil, aerr
	}
	return fn(in)
}

// batchInput is implemented by the batch request shapes, so the call
// record can count their entries.
type batchInput interface {
	named
	entryCount() int
}

func runBatch[In batchInput, Out any](body []byte, call *Call, fn func(In) (Out, *apiError)) (any, *apiError) {
	in, aerr := decode[In](body, call)
	if aerr != nil {
		return nil, aerr
	}
	call.Count = in.entryCount()
	return fn(in)
}

// Request and answer shapes: member names are the SQS model's, which the
// SDK's JSON codec uses as keys.

type createQueueInput struct {
	byName
	Attributes map[string]string
}

type createQueueOutput struct{ QueueUrl string }

func (s *Server) createQueue(in createQueueInput) (createQueueOutput, *apiError) {
	switch {
	case in.QueueName == "":
		return createQueueOutput{}, errorf(codeMissingParameter, "The request must contain the parameter QueueName.")
	case strings.HasSuffix(in.QueueName, ".fifo"):
		return createQueueOutput{}, errorf(codeUnsupportedOperation, "sqsserver does not model FIFO queues.")
	case !queueNamePattern.MatchString(in.QueueName):
		return createQueueOutput{}, errorf(codeInvalidParameterValue, "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length")
	}
	attrs := defaultQueueAttributes
	names := slices.Sorted(maps.Keys(in.Attributes)) // the first bad one, deterministically
	for _, name := range names {
		if aerr := attrs.set(name, in.Attributes[name]); aerr != nil {
			return createQueueOutput{}, aerr
		}
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if rp := attrs.redrive; rp != nil {
		if _, ok := s.queueByARN(rp.DeadLetterTargetArn); !ok {
			return createQueueOutput{}, errorf(codeInvalidParameterValue, "Value %s for parameter RedrivePolicy is invalid. Reason: Dead letter target does not exist.", in.Attributes["RedrivePolicy"])
		}
	}
	if q, ok := s.queues[in.QueueName]; ok {
		// CreateQueue is idempotent only while every attribute it names
		// matches the existing queue's.
		for _, name := range names {
			have, _ := q.attrs.get(name)
			want, _ := attrs.get(name)
			if have != want {
				return createQueueOutput{}, errorf(codeQueueAlreadyExists, "A queue already exists with the same name and a different value for attribute %s", name)
			}
		}
		return createQueueOutput{QueueUrl: q.url(s.http.URL)}, nil
	}
	q := newQueue(in.QueueName, attrs, s.now())
	s.queues[q.name] = q
	return createQueueOutput{QueueUrl: q.url(s.http.URL)}, nil
}

type getQueueAttributesInput struct {
	byURL
	AttributeNames []string
}

type getQueueAttributesOutput struct {
	Attributes map[string]string `json:",omitempty"`
}

func (s *Server) getQueueAttributes(in getQueueAttributesInput) (getQueueAttributesOutput, *apiError) {
	all := slices.Contains(in.AttributeNames, "All")
	for _, name := range in.AttributeNames {
		_, settable := intAttributes[name]
		known := name == "All" || name == "RedrivePolicy" || settable ||
			slices.Contains(computedAttributes, name) || slices.Contains(unmodeledAttributes, name)
		if !known {
			return getQueueAttributesOutput{}, errorf(codeInvalidAttributeName, "Unknown Attribute %s.", name)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	q, aerr := s.lookup(in.QueueUrl)
	if aerr != nil {
		return getQueueAttributesOutput{}, aerr
	}
	now := s.now()
	q.tidy(now)
	d := q.depth(now)
	created := strconv.FormatInt(q.created.Unix(), 10)
	values := map[string]string{
		"ApproximateNumberOfMessages":           strconv.Itoa(d.Visible),
		"ApproximateNumberOfMessagesNotVisible": strconv.Itoa(d.InFlight),
		"ApproximateNumberOfMessagesDelayed":    strconv.Itoa(d.Delayed),
		"CreatedTimestamp":                      created,
		"LastModifiedTimestamp":                 created, // attributes never change after CreateQueue here
		"QueueArn":                              QueueARN(q.name),
	}
	for name := range intAttributes {
		values[name], _ = q.attrs.get(name)
	}
	if v, ok := q.attrs.get("RedrivePolicy"); ok {
		values["RedrivePolicy"] = v
	}
	out := getQueueAttributesOutput{Attributes: map[string]string{}}
	for name, v := range values {
		if all || slices.Contains(in.AttributeNames, name) {
			out.Attributes[name] = v
		}
	}
	return out, nil
}

// sendFields are the members SendMessage and a SendMessageBatch entry share.
type sendFields struct {
	MessageBody             *string
	DelaySeconds            *int
	MessageAttributes       map[string]attributeValue
	MessageSystemAttributes map[string]json.RawMessage
	MessageDeduplicationId  *string
	MessageGroupId          *string
}

type sendMessageInput struct {
	byURL
	sendFields
}

type sendMessageOutput struct {
	MessageId              string
	MD5OfMessageBody       string
	MD5OfMessageAttributes string `json:",omitempty"`
}

func (s *Server) sendMessage(in sendMessageInput) (sendMessageOutput, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q, aerr := s.lookup(in.QueueUrl)
	if aerr != nil {
		return sendMessageOutput{}, aerr
	}
	m, _, aerr := newMessage(q, in.sendFields, s.now())
	if aerr != nil {
		return sendMessageOutput{}, aerr
	}
	q.add(m)
	return sendMessageOutput{MessageId: m.id, MD5OfMessageBody: m.md5Body, MD5OfMessageAttributes: m.md5Attrs}, nil
}

// newMessage validates a send and builds its message, also returning the
// size that counts against MaximumMessageSize. Called with s.mu held.
func newMessage(q *queue, f sendFields, now time.Time) (*message, int, *apiError) {
	if f.MessageBody == nil || *f.MessageBody == "" {
		return nil, 0, errorf(codeMissingParameter, "The request must contain the parameter MessageBody.")
	}
	body := *f.MessageBody
	if r, ok := invalidRune(body); !ok {
		return nil, 0, errorf(codeInvalidMessageContents, "Invalid binary character '#x%X' was found in the message body, the set of allowed characters is #x9 | #xA | #xD | #x20 to #xD7FF | #xE000 to #xFFFD | #x10000 to #x10FFFF", r)
	}
	delay := q.attrs.delay
	if f.DelaySeconds != nil {
		delay = *f.DelaySeconds
		if delay < 0 || delay > maxDelaySeconds {
			return nil, 0, errorf(codeInvalidParameterValue, "Value %d for parameter DelaySeconds is invalid. Reason: DelaySeconds must be >= 0 and <= %d.", delay, maxDelaySeconds)
		}
	}
	if f.MessageGroupId != nil || f.MessageDeduplicationId != nil {
		return nil, 0, errorf(codeUnsupportedOperation, "sqsserver does not model message groups or deduplication.")
	}
	if len(f.MessageSystemAttributes) > 0 {
		return nil, 0, errorf(codeUnsupportedOperation, "sqsserver does not model message system attributes on send.")
	}
	attrSize, aerr := checkMessageAttributes(f.MessageAttributes)
	if aerr != nil {
		return nil, 0, aerr
	}
	size := len(body) + attrSize
	if size > q.attrs.maximumMessageSize {
		return nil, 0, errorf(codeInvalidParameterValue, "One or more parameters are invalid. Reason: Message must be shorter than %d bytes.", q.attrs.maximumMessageSize)
	}
	return &message{
		id:          newUUID(),
		body:        body,
		attrs:       f.MessageAttributes,
		md5Body:     md5Hex(body),
		md5Attrs:    md5OfAttributes(f.MessageAttributes),
		sentAt:      now,
		availableAt: now.Add(time.Duration(delay) * time.Second),
	}, size, nil
}

type batchResultError struct {
	Id          string
	SenderFault bool
	Code        string
	Message     string
}

func entryError(id string, e *apiError) batchResultError {
	return batchResultError{Id: id, SenderFault: e.fault() == "Sender", Code: e.code, Message: e.message}
}

// checkBatchIDs applies SQS's request-wide batch rules.
func checkBatchIDs(ids []string) *apiError {
	switch {
	case len(ids) == 0:
		return errorf(codeEmptyBatchRequest, "There should be at least one entry in the request.")
	case len(ids) > maxBatchEntries:
		return errorf(codeTooManyEntries, "Maximum number of entries per request are %d. You have sent %d.", maxBatchEntries, len(ids))
	}
	seen := map[string]bool{}
	for _, id := range ids {
		if !batchEntryIDPattern.MatchString(id) {
			return errorf(codeInvalidBatchEntryID, "A batch entry id can only contain alphanumeric characters, hyphens and underscores. It can be at most 80 letters long.")
		}
		if seen[id] {
			return errorf(codeBatchIDsNotDistinct, "Id %s repeated.", id)
		}
		seen[id] = true
	}
	return nil
}

type sendBatchEntry struct {
	Id string
	sendFields
}

type sendMessageBatchInput struct {
	byURL
	Entries []sendBatchEntry
}

func (in sendMessageBatchInput) entryCount() int { return len(in.Entries) }

type sendBatchResultEntry struct {
	Id string
	sendMessageOutput
}

type sendMessageBatchOutput struct {
	Successful []sendBatchResultEntry
	Failed     []batchResultError
}

func (s *Server) sendMessageBatch(in sendMessageBatchInput) (sendMessageBatchOutput, *apiError) {
	ids := make([]string, len(in.Entries))
	for i, e := range in.Entries {
		ids[i] = e.Id
	}
	if aerr := checkBatchIDs(ids); aerr != nil {
		return sendMessageBatchOutput{}, aerr
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	q, aerr := s.lookup(in.QueueUrl)
	if aerr != nil {
		return sendMessageBatchOutput{}, aerr
	}
	// Validate every entry before storing any, so a batch that is too long
	// as a whole stores nothing.
	now := s.now()
	out := sendMessageBatchOutput{Successful: []sendBatchResultEntry{}, Failed: []batchResultError{}}
	var good []*message
	var goodIDs []string
	total := 0
	for _, e := range in.Entries {
		m, size, aerr := newMessage(q, e.sendFields, now)
		if aerr != nil {
			out.Failed = append(out.Failed, entryError(e.Id, aerr))
			continue
		}
		total += size
		good, goodIDs = append(good, m), append(goodIDs, e.Id)
	}
	if total > q.attrs.maximumMessageSize {
		return sendMessageBatchOutput{}, errorf(codeBatchRequestTooLong, "Batch requested message too long, maximum allowed length is %d bytes.", q.attrs.maximumMessageSize)
	}
	for i, m := range good {
		q.add(m)
		out.Successful = append(out.Successful, sendBatchResultEntry{Id: goodIDs[i], sendMessageOutput: sendMessageOutput{
			MessageId: m.id, MD5OfMessageBody: m.md5Body, MD5OfMessageAttributes: m.md5Attrs,
		}})
	}
	return out, nil
}

type receiveInput struct {
	byURL
	AttributeNames              []string
	MessageSystemAttributeNames []string
	MessageAttributeNames       []string
	MaxNumberOfMessages         *int
	VisibilityTimeout           *int
	WaitTimeSeconds             *int
}

type messageOutput struct {
	MessageId              string
	ReceiptHandle          string
	MD5OfBody              string
	Body                   string
	Attributes             map[string]string         `json:",omitempty"`
	MD5OfMessageAttributes string                    `json:",omitempty"`
	MessageAttributes      map[string]attributeValue `json:",omitempty"`
}

type receiveOutput struct {
	Messages []messageOutput `json:",omitempty"`
}

func optionalInRange(v *int, def, lo, hi int, name, reason string) (int, *apiError) {
	if v == nil {
		return def, nil
	}
	if *v < lo || *v > hi {
		return 0, errorf(codeInvalidParameterValue, "Value %d for parameter %s is invalid. Reason: %s", *v, name, reason)
	}
	return *v, nil
}

// receiveMessage answers at once when a message is receivable, otherwise
// waits up to WaitTimeSeconds for one: woken by a send (or a move to the
// dead-letter queue), or by a timer set for the next delay or visibility
// timeout to end.
func (s *Server) receiveMessage(ctx context.Context, in receiveInput) (receiveOutput, *apiError) {
	limit, aerr := optionalInRange(in.MaxNumberOfMessages, 1, 1, maxReceive, "MaxNumberOfMessages", "Must be between 1 and 10, if provided.")
	if aerr != nil {
		return receiveOutput{}, aerr
	}
	s.mu.Lock()
	q, aerr := s.lookup(in.QueueUrl)
	var defaultVisibility, defaultWait int
	if q != nil {
		defaultVisibility, defaultWait = q.attrs.visibilityTimeout, q.attrs.receiveWait
	}
	s.mu.Unlock()
	if aerr != nil {
		return receiveOutput{}, aerr
	}
	visibility, aerr := optionalInRange(in.VisibilityTimeout, defaultVisibility, 0, maxVisibilitySeconds, "VisibilityTimeout", "Must be between 0 and 43200, if provided.")
	if aerr != nil {
		return receiveOutput{}, aerr
	}
	wait, aerr := optionalInRange(in.WaitTimeSeconds, defaultWait, 0, maxWaitSeconds, "WaitTimeSeconds", "Must be >= 0 and <= 20, if provided.")
	if aerr != nil {
		return receiveOutput{}, aerr
	}
	systemNames := append(slices.Clone(in.AttributeNames), in.MessageSystemAttributeNames...)

	deadline := s.now().Add(time.Duration(wait) * time.Second)
	for {
		// A client that has gone (its context cancelled while it waited)
		// would never see what a receive took.
		if ctx.Err() != nil {
			return receiveOutput{}, nil
		}
		s.mu.Lock()
		now := s.now()
		q.tidy(now)
		got := s.take(q, limit, time.Duration(visibility)*time.Second, now)
		if len(got) > 0 || !now.Before(deadline) {
			out := receiveOutput{}
			for _, m := range got {
				out.Messages = append(out.Messages, render(m, systemNames, in.MessageAttributeNames))
			}
			s.mu.Unlock()
			return out, nil
		}
		next, changed := q.nextChange(now), q.changed
		s.mu.Unlock()

		d := deadline.Sub(now)
		if !next.IsZero() && next.Sub(now) < d {
			d = next.Sub(now)
		}
		timer := time.NewTimer(d)
		select {
		case <-changed:
		case <-timer.C:
		case <-ctx.Done():
		case <-s.closed:
			timer.Stop()
			return receiveOutput{}, nil
		}
		timer.Stop()
	}
}

// take receives up to limit visible messages in send order. A message that
// has used up its receives under the queue's RedrivePolicy moves to the
// dead-letter queue instead, at the moment a receive would have returned it,
// as SQS does. Called with s.mu held.
func (s *Server) take(q *queue, limit int, visibility time.Duration, now time.Time) []*message {
	var dlq *queue
	if rp := q.attrs.redrive; rp != nil {
		dlq, _ = s.queueByARN(rp.DeadLetterTargetArn)
	}
	var got []*message
	for _, m := range q.msgs {
		if len(got) == limit {
			break
		}
		if m.deleted || m.state(now) != visible {
			continue
		}
		if dlq != nil && m.receiveCount >= q.attrs.redrive.MaxReceiveCount {
			q.remove(m)
			moved := *m
			moved.deleted, moved.handle = false, ""
			moved.availableAt, moved.dlqSource = now, QueueARN(q.name)
			dlq.add(&moved)
			continue
		}
		m.receive(q.name, now, visibility)
		got = append(got, m)
	}
	return got
}

// render builds a received message as ReceiveMessage returns it: only the
// system and message attributes asked for, and the digest of the message
// attributes returned.
func render(m *message, systemNames, attributeNames []string) messageOutput {
	out := messageOutput{MessageId: m.id, ReceiptHandle: m.handle, MD5OfBody: m.md5Body, Body: m.body}
	system := map[string]string{
		"SenderId":                         SenderID,
		"SentTimestamp":                    millis(m.sentAt),
		"ApproximateReceiveCount":          strconv.Itoa(m.receiveCount),
		"ApproximateFirstReceiveTimestamp": millis(m.firstReceiveAt),
	}
	if m.dlqSource != "" {
		system["DeadLetterQueueSourceArn"] = m.dlqSource
	}
	all := slices.Contains(systemNames, "All")
	for name, v := range system {
		if all || slices.Contains(systemNames, name) {
			if out.Attributes == nil {
				out.Attributes = map[string]string{}
			}
			out.Attributes[name] = v
		}
	}
	if attrs := selectAttributes(m.attrs, attributeNames); len(attrs) > 0 {
		out.MessageAttributes = attrs
		out.MD5OfMessageAttributes = md5OfAttributes(attrs)
	}
	return out
}

func millis(t time.Time) string { return strconv.FormatInt(t.UnixMilli(), 10) }

// deleteOne deletes the message a receipt handle names. A handle that is
// well formed but no longer the message's latest, or whose message is gone,
// deletes nothing and still succeeds, as the DeleteMessage reference
// documents. Called with s.mu held.
func deleteOne(q *queue, handle string) *apiError {
	queueName, id, ok := parseHandle(handle)
	if !ok || queueName != q.name {
		return errorf(codeReceiptHandleIsInvalid, "The input receipt handle \"%s\" is not a valid receipt handle.", handle)
	}
	if m, ok := q.byID[id]; ok && m.handle == handle {
		q.remove(m)
	}
	return nil
}

type batchReceiptEntry struct {
	Id            string
	ReceiptHandle string
}

type deleteMessageBatchInput struct {
	byURL
	Entries []batchReceiptEntry
}

func (in deleteMessageBatchInput) entryCount() int { return len(in.Entries) }

type batchIDEntry struct{ Id string }

type deleteMessageBatchOutput struct {
	Successful []batchIDEntry
	Failed     []batchResultError
}

func (s *Server) deleteMessageBatch(in deleteMessageBatchInput) (deleteMessageBatchOutput, *apiError) {
	ids := make([]string, len(in.Entries))
	for i, e := range in.Entries {
		ids[i] = e.Id
	}
	if aerr := checkBatchIDs(ids); aerr != nil {
		return deleteMessageBatchOutput{}, aerr
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	q, aerr := s.lookup(in.QueueUrl)
	if aerr != nil {
		return deleteMessageBatchOutput{}, aerr
	}
	out := deleteMessageBatchOutput{Successful: []batchIDEntry{}, Failed: []batchResultError{}}
	for _, e := range in.Entries {
		if aerr := deleteOne(q, e.ReceiptHandle); aerr != nil {
			out.Failed = append(out.Failed, entryError(e.Id, aerr))
		} else {
			out.Successful = append(out.Successful, batchIDEntry{Id: e.Id})
		}
	}
	return out, nil
}
