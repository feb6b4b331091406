package esm_test

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/reaper-k8s/reaper/internal/esm"
	"github.com/reaper-k8s/reaper/internal/sqsserver"
)

type fixture struct {
	srv       *sqsserver.Server
	client    *sqs.Client
	transport *http.Transport
	url       string
}

// newFixture starts a server with a queue "work" (and "work-dlq" when
// maxReceiveCount > 0) and a real SDK client on its own transport,
// through sqsserver.BufferedBodies as every SDK client of the server
// should be.
func newFixture(t *testing.T, visibility, maxReceiveCount int) *fixture {
	t.Helper()
	srv := sqsserver.New()
	t.Cleanup(srv.Close)
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	f := &fixture{srv: srv, transport: tr, client: srv.Client(tr)}
	attrs := map[string]string{"VisibilityTimeout": strconv.Itoa(visibility)}
	if maxReceiveCount > 0 {
		f.createQueue(t, "work-dlq", nil)
		attrs["RedrivePolicy"] = fmt.Sprintf(`{"deadLetterTargetArn":%q,"maxReceiveCount":%d}`, sqsserver.QueueARN("work-dlq"), maxReceiveCount)
	}
	f.url = f.createQueue(t, "work", attrs)
	return f
}

func (f *fixture) createQueue(t *testing.T, name string, attrs map[string]string) string {
	t.Helper()
	out, err := f.client.CreateQueue(context.Background(), &sqs.CreateQueueInput{QueueName: &name, Attributes: attrs})
	if err != nil {
		t.Fatal(err)
	}
	return aws.ToString(out.QueueUrl)
}

// send puts bodies on the queue in batches of ten.
func (f *fixture) send(t *testing.T, bodies ...string) {
	t.Helper()
	for chunk := range slices.Chunk(bodies, 10) {
		var entries []types.SendMessageBatchRequestEntry
		for i, b := range chunk {
			entries = append(entries, types.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), MessageBody: aws.String(b)})
		}
		out, err := f.client.SendMessageBatch(context.Background(), &sqs.SendMessageBatchInput{QueueUrl: &f.url, Entries: entries})
		if err != nil || len(out.Failed) > 0 {
			t.Fatalf("SendMessageBatch: %v %+v", err, out)
		}
	}
}

// start runs a mapping for the test and stops it at cleanup.
func (f *fixture) start(t *testing.T, cfg esm.Config) *esm.Mapping {
	t.Helper()
	cfg.Client, cfg.QueueURL = f.client, f.url
	m, err := esm.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Stop)
	return m
}

func waitDrained(t *testing.T, m *esm.Mapping, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := m.WaitDrained(ctx); err != nil {
		t.Fatalf("%v; stats %+v", err, m.Stats())
	}
}

// recorder is a function that records every event it gets and answers
// through respond.
type recorder struct {
	respond func(events.SQSEvent) (string, error)
	delay   time.Duration

	mu      sync.Mutex
	events  []events.SQSEvent
	raw     [][]byte
	running int
	peak    int
}

func (r *recorder) invoke(ctx context.Context, payload []byte) ([]byte, error) {
	var ev events.SQSEvent
	if err := json.Unmarshal(payload, &ev); err != nil {
		return nil, fmt.Errorf("decode event: %w", err)
	}
	r.mu.Lock()
	r.events = append(r.events, ev)
	r.raw = append(r.raw, payload)
	r.running++
	r.peak = max(r.peak, r.running)
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.running--
		r.mu.Unlock()
	}()
	if r.delay > 0 {
		select {
		case <-time.After(r.delay):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if r.respond == nil {
		return nil, nil
	}
	resp, err := r.respond(ev)
	return []byte(resp), err
}

// receiveCounts maps each body to the ApproximateReceiveCount of each
// delivery, in delivery order.
func (r *recorder) receiveCounts() map[string][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string][]string{}
	for _, ev := range r.events {
		for _, rec := range ev.Records {
			out[rec.Body] = append(out[rec.Body], rec.Attributes["ApproximateReceiveCount"])
		}
	}
	return out
}

func failures(ids ...string) string {
	var resp events.SQSEventResponse
	for _, id := range ids {
		resp.BatchItemFailures = append(resp.BatchItemFailures, events.SQSBatchItemFailure{ItemIdentifier: id})
	}
	b, _ := json.Marshal(resp)
	return string(b)
}

func drainQueue(t *testing.T, f *fixture, url string) []string {
	t.Helper()
	var bodies []string
	for {
		out, err := f.client.ReceiveMessage(context.Background(), &sqs.ReceiveMessageInput{QueueUrl: &url, MaxNumberOfMessages: 10})
		if err != nil {
			t.Fatal(err)
		}
		if len(out.Messages) == 0 {
			slices.Sort(bodies)
			return bodies
		}
		for _, m := range out.Messages {
			bodies = append(bodies, aws.ToString(m.Body))
		}
	}
}

func TestPartialBatchFailure(t *testing.T) {
	f := newFixture(t, 1, 2)
	var bodies []string
	for i := range 7 {
		bodies = append(bodies, fmt.Sprintf("ok-%d", i))
	}
	bodies = append(bodies, "once-7", "always-8", "always-9")
	f.send(t, bodies...)
	// One message attribute, to check how records carry them.
	_, err := f.client.SendMessage(context.Background(), &sqs.SendMessageInput{QueueUrl: &f.url, MessageBody: aws.String("ok-attr"),
		MessageAttributes: map[string]types.MessageAttributeValue{"kind": {DataType: aws.String("String"), StringValue: aws.String("exit")}}})
	if err != nil {
		t.Fatal(err)
	}

	rec := &recorder{respond: func(ev events.SQSEvent) (string, error) {
		var failed []string
		for _, r := range ev.Records {
			if strings.HasPrefix(r.Body, "always-") || (strings.HasPrefix(r.Body, "once-") && r.Attributes["ApproximateReceiveCount"] == "1") {
				failed = append(failed, r.MessageId)
			}
		}
		return failures(failed...), nil
	}}
	m := f.start(t, esm.Config{Invoke: rec.invoke, BatchSize: 10, ReportBatchItemFailures: true})
	waitDrained(t, m, 20*time.Second)

	counts := rec.receiveCounts()
	for _, b := range append(bodies[:7:7], "ok-attr") {
		if !slices.Equal(counts[b], []string{"1"}) {
			t.Errorf("%s delivered with receive counts %v, want once", b, counts[b])
		}
	}
	for _, b := range []string{"once-7", "always-8", "always-9"} {
		if !slices.Equal(counts[b], []string{"1", "2"}) {
			t.Errorf("%s delivered with receive counts %v, want [1 2]", b, counts[b])
		}
	}
	// The first batch is the ten sent together; the eleventh comes next;
	// the three failures come back after the timeout; the two that keep
	// failing go to the dead-letter queue on their third receive.
	if got := drainQueue(t, f, f.srv.QueueURL("work-dlq")); !slices.Equal(got, []string{"always-8", "always-9"}) {
		t.Errorf("dead-letter queue holds %v", got)
	}
	s := m.Stats()
	if s.Deleted != 9 || s.ReportedFailures != 5 || s.FailedInvocations != 0 || s.Errors != 0 {
		t.Errorf("stats = %+v, want 9 deleted and 5 reported failures", s)
	}
	if total := sum(s.BatchSizes); total != 14 || s.Invocations != len(s.BatchSizes) {
		t.Errorf("batch sizes %v, want 14 records over %d invocations", s.BatchSizes, s.Invocations)
	}

	// The records are Lambda's.
	ev := rec.events[0]
	r := ev.Records[0]
	if r.EventSource != "aws:sqs" || r.EventSourceARN != sqsserver.QueueARN("work") || r.AWSRegion != sqsserver.Region {
		t.Errorf("record source = %q %q %q", r.EventSource, r.EventSourceARN, r.AWSRegion)
	}
	sum := md5.Sum([]byte(r.Body))
	if r.Md5OfBody != hex.EncodeToString(sum[:]) || r.ReceiptHandle == "" || r.MessageId == "" {
		t.Errorf("record = %+v", r)
	}
	for _, name := range []string{"ApproximateReceiveCount", "SentTimestamp", "SenderId", "ApproximateFirstReceiveTimestamp"} {
		if r.Attributes[name] == "" {
			t.Errorf("record attributes %v lack %s", r.Attributes, name)
		}
	}
	var withAttr events.SQSMessage
	var withAttrRaw []byte
	for i, ev := range rec.events {
		for _, r := range ev.Records {
			if r.Body == "ok-attr" {
				withAttr, withAttrRaw = r, rec.raw[i]
			}
		}
	}
	if a := withAttr.MessageAttributes["kind"]; a.DataType != "String" || aws.ToString(a.StringValue) != "exit" || withAttr.Md5OfMessageAttributes == "" {
		t.Errorf("message attributes %+v, digest %q", withAttr.MessageAttributes, withAttr.Md5OfMessageAttributes)
	}
	if !strings.Contains(string(withAttrRaw), `"stringListValues":[],"binaryListValues":[]`) {
		t.Errorf("list values are not Lambda's empty lists: %s", withAttrRaw)
	}
}

func sum(xs []int) int {
	n := 0
	for _, x := range xs {
		n += x
	}
	return n
}

func TestFailedInvocationKeepsWholeBatch(t *testing.T) {
	f := newFixture(t, 1, 0)
	f.send(t, "a", "b", "c")
	attempt := 0
	rec := &recorder{respond: func(events.SQSEvent) (string, error) {
		attempt++ // invocations of one batch are sequential here
		switch attempt {
		case 1:
			return "", errors.New("runtime exited")
		case 2: // what the runtime interface emulator answers for a handler error
			return `{"errorMessage":"boom","errorType":"errorString"}`, nil
		}
		return "{}", nil
	}}
	m := f.start(t, esm.Config{Invoke: rec.invoke, ReportBatchItemFailures: true})
	waitDrained(t, m, 20*time.Second)

	counts := rec.receiveCounts()
	for _, b := range []string{"a", "b", "c"} {
		if !slices.Equal(counts[b], []string{"1", "2", "3"}) {
			t.Errorf("%s delivered with receive counts %v, want [1 2 3]", b, counts[b])
		}
	}
	if s := m.Stats(); s.Invocations != 3 || s.FailedInvocations != 2 || s.Deleted != 3 || !slices.Equal(s.BatchSizes, []int{3, 3, 3}) {
		t.Errorf("stats = %+v", s)
	}
}

func TestWaitDrainedHonoursDeadline(t *testing.T) {
	f := newFixture(t, 1, 0)
	f.send(t, "stuck")
	rec := &recorder{respond: func(events.SQSEvent) (string, error) { return "", errors.New("always fails") }}
	m := f.start(t, esm.Config{Invoke: rec.invoke})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := m.WaitDrained(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitDrained = %v, want the deadline", err)
	}
}

func TestBatchingWindowCoalesces(t *testing.T) {
	f := newFixture(t, 30, 0)
	rec := &recorder{}
	m := f.start(t, esm.Config{Invoke: rec.invoke, BatchSize: 100, MaximumBatchingWindow: time.Second})
	// Five separate sends, well within one window of the first.
	for i := range 5 {
		f.send(t, fmt.Sprintf("m-%d", i))
		time.Sleep(20 * time.Millisecond)
	}
	waitDrained(t, m, 10*time.Second)
	f.send(t, "after")
	waitDrained(t, m, 10*time.Second)

	if s := m.Stats(); !slices.Equal(s.BatchSizes, []int{5, 1}) || s.Deleted != 6 {
		t.Errorf("stats = %+v, want batches [5 1]", s)
	}
}

func TestFullBatchDoesNotWaitForWindow(t *testing.T) {
	f := newFixture(t, 30, 0)
	var bodies []string
	for i := range 20 {
		bodies = append(bodies, strconv.Itoa(i))
	}
	f.send(t, bodies...)
	rec := &recorder{}
	m := f.start(t, esm.Config{Invoke: rec.invoke, BatchSize: 20, MaximumBatchingWindow: 60 * time.Second})
	// Far less than the window: only a full batch is invoked this soon.
	waitDrained(t, m, 10*time.Second)
	if s := m.Stats(); !slices.Equal(s.BatchSizes, []int{20}) {
		t.Errorf("batch sizes %v, want [20]", s.BatchSizes)
	}
}

func TestMaxConcurrency(t *testing.T) {
	f := newFixture(t, 30, 0)
	var bodies []string
	for i := range 12 {
		bodies = append(bodies, strconv.Itoa(i))
	}
	f.send(t, bodies...)
	rec := &recorder{delay: 100 * time.Millisecond}
	m := f.start(t, esm.Config{Invoke: rec.invoke, BatchSize: 1, MaxConcurrency: 2})
	waitDrained(t, m, 20*time.Second)

	rec.mu.Lock()
	peak := rec.peak
	rec.mu.Unlock()
	s := m.Stats()
	// Twelve 100 ms invocations from a backlog: two at a time, never three.
	if peak != 2 || s.PeakConcurrency != 2 {
		t.Errorf("peak concurrency %d (mapping says %d), want 2", peak, s.PeakConcurrency)
	}
	if s.Invocations != 12 || s.Deleted != 12 {
		t.Errorf("stats = %+v, want 12 invocations of 1", s)
	}
}

func TestLargeBacklogGoesInBatchesOfBatchSize(t *testing.T) {
	f := newFixture(t, 60, 0)
	const n = 2500
	bodies := make([]string, n)
	for i := range bodies {
		bodies[i] = strconv.Itoa(i)
	}
	f.send(t, bodies...)
	rec := &recorder{}
	// Each batch takes 50 receives, some 0.3 s under the race detector: the
	// window is long enough that only full batches are invoked.
	m := f.start(t, esm.Config{Invoke: rec.invoke, BatchSize: 500, MaximumBatchingWindow: 10 * time.Second})
	waitDrained(t, m, 60*time.Second)

	if s := m.Stats(); !slices.Equal(s.BatchSizes, []int{500, 500, 500, 500, 500}) || s.Deleted != n {
		t.Errorf("batch sizes %v, deleted %d; want five of 500 and %d", s.BatchSizes, s.Deleted, n)
	}
	counts := rec.receiveCounts()
	if len(counts) != n {
		t.Errorf("%d distinct messages delivered, want %d", len(counts), n)
	}
	for body, c := range counts {
		if len(c) != 1 {
			t.Errorf("%s delivered %d times", body, len(c))
		}
	}
	// Ten per ReceiveMessage, as the API allows.
	if got := f.srv.CallCount("ReceiveMessage"); got < n/10 {
		t.Errorf("%d ReceiveMessage calls for %d messages", got, n)
	}
}

func TestPayloadLimitSplitsBatch(t *testing.T) {
	f := newFixture(t, 60, 0)
	big := strings.Repeat("x", 1_000_000)
	for range 7 { // SendMessageBatch allows 1 MiB in all, so one by one
		if _, err := f.client.SendMessage(context.Background(), &sqs.SendMessageInput{QueueUrl: &f.url, MessageBody: &big}); err != nil {
			t.Fatal(err)
		}
	}
	rec := &recorder{}
	m := f.start(t, esm.Config{Invoke: rec.invoke, BatchSize: 10, MaximumBatchingWindow: time.Second})
	waitDrained(t, m, 30*time.Second)

	// Six 1 MB records fit in 6 MiB; a seventh would not.
	if s := m.Stats(); !slices.Equal(s.BatchSizes, []int{6, 1}) {
		t.Errorf("batch sizes %v, want [6 1]", s.BatchSizes)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, p := range rec.raw {
		if len(p) > esm.MaxPayloadBytes {
			t.Errorf("payload of %d bytes", len(p))
		}
	}
}

func TestStopEndsEverything(t *testing.T) {
	f := newFixture(t, 30, 0)
	before := runtime.NumGoroutine()
	rec := &recorder{}
	m := f.start(t, esm.Config{Invoke: rec.invoke})
	f.send(t, "first")
	waitDrained(t, m, 10*time.Second)

	time.Sleep(100 * time.Millisecond) // into the next long poll
	stopped := make(chan struct{})
	go func() { m.Stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("Stop did not end a pending long poll")
	}
	stoppedAt := time.Now()
	m.Stop() // idempotent

	// Nothing polls or invokes any more. (The cancelled long poll itself
	// may still take the message on the server, as SQS can: that is not
	// the mapping receiving it.)
	f.send(t, "second")
	time.Sleep(300 * time.Millisecond)
	if s := m.Stats(); s.Invocations != 1 {
		t.Errorf("invocations after Stop: %d, want 1", s.Invocations)
	}
	for _, c := range f.srv.Calls() {
		if c.Action == "ReceiveMessage" && c.Time.After(stoppedAt) {
			t.Errorf("a ReceiveMessage arrived %v after Stop returned", c.Time.Sub(stoppedAt))
		}
	}
	if err := m.WaitDrained(context.Background()); err == nil {
		t.Error("WaitDrained on a stopped mapping succeeded")
	}

	// Every goroutine the mapping started is gone once the client's idle
	// connections (and so the server's ends of them) are closed.
	deadline := time.Now().Add(5 * time.Second)
	for {
		f.transport.CloseIdleConnections()
		n := runtime.NumGoroutine()
		if n <= before {
			break
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("%d goroutines, %d before Start:\n%s", n, before, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestConfig(t *testing.T) {
	f := newFixture(t, 30, 0)
	invoke := func(context.Context, []byte) ([]byte, error) { return nil, nil }
	for _, tc := range []struct {
		name string
		cfg  esm.Config
	}{
		{"no invoke", esm.Config{Client: f.client, QueueURL: f.url}},
		{"no queue", esm.Config{Client: f.client, Invoke: invoke}},
		{"batch too big", esm.Config{Client: f.client, QueueURL: f.url, Invoke: invoke, BatchSize: 10001, MaximumBatchingWindow: time.Second}},
		{"over 10 without a window", esm.Config{Client: f.client, QueueURL: f.url, Invoke: invoke, BatchSize: 11}},
		{"window too long", esm.Config{Client: f.client, QueueURL: f.url, Invoke: invoke, MaximumBatchingWindow: 301 * time.Second}},
		{"negative concurrency", esm.Config{Client: f.client, QueueURL: f.url, Invoke: invoke, MaxConcurrency: -1}},
	} {
		if _, err := esm.New(tc.cfg); err == nil {
			t.Errorf("%s: New accepted %+v", tc.name, tc.cfg)
		}
	}

	missing, err := esm.New(esm.Config{Client: f.client, QueueURL: f.srv.QueueURL("nope"), Invoke: invoke})
	if err != nil {
		t.Fatal(err)
	}
	if err := missing.Start(context.Background()); !errors.As(err, new(*types.QueueDoesNotExist)) {
		t.Errorf("Start on a missing queue: %v", err)
	}
	missing.Stop() // never started: a no-op

	m := f.start(t, esm.Config{Invoke: invoke})
	if err := m.Start(context.Background()); err == nil {
		t.Error("a second Start succeeded")
	}
}
