// Package events_test generates and checks the sample events in this
// directory: `go test ./events -update` rewrites them from the definitions
// below; a plain run checks that every file decodes into the type its
// function receives and still says what the definitions say.
package events_test

import (
	"bytes"
	"crypto/md5"
	"encoding/json"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/reaper-k8s/reaper/internal/replay"
	"github.com/reaper-k8s/reaper/pkg/exitline"
	"github.com/reaper-k8s/reaper/pkg/model"
	"github.com/reaper-k8s/reaper/pkg/workqueue"
)

var update = flag.Bool("update", false, "rewrite the sample events from their definitions")

// The sample world: one instance running one Pod.
const (
	account    = "123456789012"
	region     = "us-east-1"
	instanceID = "i-0123456789abcdef0"
	namespace  = "default"
	podName    = "sample-job"
	podUID     = "5f0c8e1a-7b5d-4c3e-9a41-2d6f0b8c1e11"
	logGroup   = "/reaper/exits"
	filterName = "reaper-exits"
	// exitToken is the sample launch's exit token, which its lines carry
	// and its claims only as a hash.
	exitToken = "3c9e1f0a7b2d4c6e8f1a3b5c7d9e0f2a4b6c8d0e1f3a5b7c9d1e2f4a6b8c0d2e"
)

var (
	started  = time.Date(2026, 11, 30, 6, 0, 0, 0, time.UTC)
	finished = time.Date(2026, 11, 30, 7, 0, 0, 500_000_000, time.UTC)
)

// exitLine is exit line v1 of the sample Pod's container; change adjusts
// it.
func exitLine(change func(*exitline.Line)) exitline.Line {
	l := exitline.Line{
		Reaper: exitline.Kind, V: exitline.Version, InstanceID: instanceID,
		PodNamespace: namespace, PodName: podName, PodUID: podUID,
		Container: "main", ContainerID: "8c4f2a9e1b7d3c5f6a0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a",
		ExitCode: 0, StartedAt: started, FinishedAt: finished, Token: exitToken,
	}
	if change != nil {
		change(&l)
	}
	return l
}

// line is exitLine as the agent ships it.
func line(change func(*exitline.Line)) string {
	b, err := json.Marshal(exitLine(change))
	if err != nil {
		panic(err)
	}
	return string(b)
}

// logEvent is a log event of the exit-line stream; CloudWatch Logs ids are
// 56-digit strings.
func logEvent(n int, message string) events.CloudwatchLogsLogEvent {
	return events.CloudwatchLogsLogEvent{
		ID:        fmt.Sprintf("3791155609812648763441292918193739430726228452454154%04d", n),
		Timestamp: finished.Add(time.Duration(n) * time.Second).UnixMilli(),
		Message:   message,
	}
}

func logsData(messageType string, logEvents ...events.CloudwatchLogsLogEvent) events.CloudwatchLogsData {
	return events.CloudwatchLogsData{
		Owner: account, LogGroup: logGroup, LogStream: instanceID,
		SubscriptionFilters: []string{filterName}, MessageType: messageType, LogEvents: logEvents,
	}
}

// exitSample is an exitrecorder event and what exitline makes of it.
type exitSample struct {
	data     events.CloudwatchLogsData
	lines    int // valid, deduplicated lines
	rejected int
	control  bool
}

var exitSamples = map[string]exitSample{
	"exitrecorder/exit-0.json": {data: logsData("DATA_MESSAGE", logEvent(1, line(nil))), lines: 1},
	"exitrecorder/exit-1.json": {data: logsData("DATA_MESSAGE", logEvent(1, line(func(l *exitline.Line) { l.ExitCode = 1 }))), lines: 1},
	"exitrecorder/oom.json": {data: logsData("DATA_MESSAGE", logEvent(1, line(func(l *exitline.Line) {
		l.ExitCode, l.OOMKilled, l.Signal = 137, true, "SIGKILL"
	}))), lines: 1},
	// A container that failed once and was restarted in place, then
	// succeeded; the agent also shipped a stray line and repeated the first.
	"exitrecorder/batch.json": {data: logsData("DATA_MESSAGE",
		logEvent(1, line(func(l *exitline.Line) {
			l.ExitCode, l.WillRestart, l.BackoffSeconds = 1, true, 10
			l.FinishedAt = started.Add(10 * time.Minute)
		})),
		logEvent(2, `panic: runtime error: index out of range [3] with length 3`),
		logEvent(3, line(func(l *exitline.Line) {
			l.RestartCount = 1
			l.StartedAt = started.Add(10*time.Minute + 10*time.Second)
		})),
		logEvent(4, line(func(l *exitline.Line) {
			l.ExitCode, l.WillRestart, l.BackoffSeconds = 1, true, 10
			l.FinishedAt = started.Add(10 * time.Minute)
		})),
	), lines: 2, rejected: 1},
	// CloudWatch Logs sends this when the subscription is created.
	"exitrecorder/control.json": {data: events.CloudwatchLogsData{
		Owner: "CloudwatchLogs", LogGroup: "", LogStream: "", SubscriptionFilters: []string{}, MessageType: "CONTROL_MESSAGE",
		LogEvents: []events.CloudwatchLogsLogEvent{{ID: "", Timestamp: finished.UnixMilli(), Message: "CWL CONTROL MESSAGE: Checking health of destination Lambda."}},
	}, control: true},
}

// stateChange is the EventBridge event EC2 sends when the instance reaches
// a state.
func stateChange(n int, state string) events.CloudWatchEvent {
	return replay.StateChangeEvent(fmt.Sprintf("7bf73129-1428-4cd3-a780-95db273d1%03d", n), instanceID, state,
		finished.Truncate(time.Second).Add(time.Duration(n)*time.Second))
}

var cloudWatchSamples = map[string]events.CloudWatchEvent{
	"statechange/running.json":       stateChange(0, "running"),
	"statechange/stopping.json":      stateChange(1, "stopping"),
	"statechange/stopped.json":       stateChange(2, "stopped"),
	"statechange/shutting-down.json": stateChange(3, "shutting-down"),
	"statechange/terminated.json":    stateChange(4, "terminated"),
	"sweeper/scheduled.json": {
		Version: "0", ID: "53dc4d37-cffa-4f76-80c9-8b7d4a4d2eaa", DetailType: "Scheduled Event", Source: "aws.events",
		AccountID: account, Time: finished.Truncate(time.Minute), Region: region,
		Resources: []string{fmt.Sprintf("arn:aws:events:%s:%s:rule/Reaper-ReaperSweep", region, account)},
		Detail:    json.RawMessage(`{}`),
	},
}

// The mixed batch's second instance, running its own Pod.
const (
	secondInstanceID = "i-0123456789abcdef1"
	secondPodName    = "sample-job-2"
	secondPodUID     = "9d2b7c44-1e6a-4f0b-8c35-6a7e9f1d2b22"
	secondExitToken  = "b7d2e9a4c1f6083e5a7c9b1d3f5e7a9c0b2d4f6e8a1c3e5b7d9f0a2c4e6b8d1f"
	workQueueARN     = "arn:aws:sqs:" + region + ":" + account + ":reaper-work"
)

// exitClaim is the work item the exitrecorder sends for the sample Pod's
// exit line; change adjusts the line.
func exitClaim(change func(*exitline.Line)) workqueue.Message {
	l := exitLine(change)
	pod, exit := l.Claim()
	m := workqueue.Exit(l.InstanceID, pod, exit)
	m.TokenHash = l.TokenHash()
	return m
}

// onSecond moves an exit line to the second instance, its Pod and its
// launch's exit token.
func onSecond(l *exitline.Line) {
	l.InstanceID, l.PodName, l.PodUID, l.Token = secondInstanceID, secondPodName, secondPodUID, secondExitToken
}

// queueEvent is the batch the work queue's event source mapping hands the
// reconciler for these work items, each sent n×100 ms after the sample exit
// with its format version and send time, as workqueue.Queue.Send stamps
// them.
func queueEvent(msgs ...workqueue.Message) events.SQSEvent {
	var ev events.SQSEvent
	for n, m := range msgs {
		sent := finished.Add(2*time.Second + time.Duration(n)*100*time.Millisecond)
		m.V, m.QueuedAt = workqueue.Version, sent
		body, err := json.Marshal(m)
		if err != nil {
			panic(err)
		}
		sender := "exitrecorder"
		if m.Kind == workqueue.KindState {
			sender = "statechange"
		}
		ms := strconv.FormatInt(sent.UnixMilli(), 10)
		ev.Records = append(ev.Records, events.SQSMessage{
			MessageId:     fmt.Sprintf("2e1424d4-f796-459a-8184-9c92662be6%02d", n),
			ReceiptHandle: fmt.Sprintf("AQEBwJnKyrHigUMZj6rYigCgxlaS3SLy0a%02d", n),
			Body:          string(body),
			Md5OfBody:     fmt.Sprintf("%x", md5.Sum(body)),
			Attributes: map[string]string{
				"ApproximateReceiveCount":          "1",
				"SentTimestamp":                    ms,
				"SenderId":                         "AROAEXAMPLEREAPERROLE:reaper-" + sender,
				"ApproximateFirstReceiveTimestamp": ms,
			},
			MessageAttributes: map[string]events.SQSMessageAttribute{},
			EventSourceARN:    workQueueARN,
			EventSource:       "aws:sqs",
			AWSRegion:         region,
		})
	}
	return ev
}

// queueSamples are reconciler events and the work items they carry.
var queueSamples = map[string][]workqueue.Message{
	"reconciler/exit-claim.json":   {exitClaim(nil)},
	"reconciler/state-change.json": {workqueue.State(instanceID, "stopped", finished.Truncate(time.Second).Add(2*time.Second))},
	// Two instances, two messages each: the sample instance's running
	// state and exit 0; the second's OOM kill and then its shutdown.
	"reconciler/mixed.json": {
		workqueue.State(instanceID, "running", started),
		exitClaim(nil),
		exitClaim(func(l *exitline.Line) {
			onSecond(l)
			l.ExitCode, l.OOMKilled, l.Signal = 137, true, "SIGKILL"
		}),
		workqueue.State(secondInstanceID, "shutting-down", finished.Truncate(time.Second).Add(time.Second)),
	},
}

func TestMain(m *testing.M) {
	flag.Parse()
	if *update {
		if err := write(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	os.Exit(m.Run())
}

// write renders every sample as indented JSON, as `sam local invoke -e`
// and the runtime interface emulator take it.
func write() error {
	files := map[string]any{}
	for name, s := range exitSamples {
		ev, err := exitline.Encode(s.data)
		if err != nil {
			return err
		}
		files[name] = ev
	}
	for name, ev := range cloudWatchSamples {
		files[name] = ev
	}
	for name, msgs := range queueSamples {
		files[name] = queueEvent(msgs...)
	}
	for name, v := range files {
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(name, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// decodeStrict decodes a file into v, rejecting fields v does not have.
func decodeStrict(t *testing.T, name string, v any) {
	t.Helper()
	raw, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

func TestExitRecorderEvents(t *testing.T) {
	for name, want := range exitSamples {
		t.Run(name, func(t *testing.T) {
			var ev events.CloudwatchLogsEvent
			decodeStrict(t, name, &ev)
			data, err := ev.AWSLogs.Parse()
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(data, want.data) {
				t.Fatalf("payload differs from its definition (run go test ./events -update):\n got %+v\nwant %+v", data, want.data)
			}
			batch, err := exitline.FromLogsEvent(ev, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			if len(batch.Lines) != want.lines || len(batch.Rejected) != want.rejected || batch.Control != want.control {
				t.Fatalf("batch: %d lines, %d rejected, control %v; want %d, %d, %v",
					len(batch.Lines), len(batch.Rejected), batch.Control, want.lines, want.rejected, want.control)
			}
			if !want.control && batch.InstanceID != instanceID {
				t.Fatalf("instance %q", batch.InstanceID)
			}
			for _, l := range batch.Lines {
				if l.PodNamespace != namespace || l.PodName != podName || l.PodUID != podUID {
					t.Fatalf("line names Pod %s/%s %s", l.PodNamespace, l.PodName, l.PodUID)
				}
			}
		})
	}
}

func TestCloudWatchEvents(t *testing.T) {
	for name, want := range cloudWatchSamples {
		t.Run(name, func(t *testing.T) {
			var ev events.CloudWatchEvent
			decodeStrict(t, name, &ev)
			if !reflect.DeepEqual(normalize(t, ev), normalize(t, want)) {
				t.Fatalf("event differs from its definition (run go test ./events -update):\n got %+v\nwant %+v", ev, want)
			}
			if strings.HasPrefix(name, "statechange/") {
				var detail struct {
					InstanceID string `json:"instance-id"`
					State      string `json:"state"`
				}
				if err := json.Unmarshal(ev.Detail, &detail); err != nil {
					t.Fatal(err)
				}
				if detail.InstanceID != instanceID || detail.State+".json" != filepath.Base(name) {
					t.Fatalf("detail %+v", detail)
				}
			}
		})
	}
}

func TestQueueEvents(t *testing.T) {
	for name, msgs := range queueSamples {
		t.Run(name, func(t *testing.T) {
			var ev events.SQSEvent
			decodeStrict(t, name, &ev)
			if want := queueEvent(msgs...); !reflect.DeepEqual(ev, want) {
				t.Fatalf("event differs from its definition (run go test ./events -update):\n got %+v\nwant %+v", ev, want)
			}
			pods := map[string]model.PodRef{
				instanceID:       {Namespace: namespace, Name: podName, UID: podUID},
				secondInstanceID: {Namespace: namespace, Name: secondPodName, UID: secondPodUID},
			}
			for i, rec := range ev.Records {
				if sum := fmt.Sprintf("%x", md5.Sum([]byte(rec.Body))); rec.Md5OfBody != sum {
					t.Errorf("record %d: md5OfBody %s, body's is %s", i, rec.Md5OfBody, sum)
				}
				it, err := workqueue.Parse(rec)
				if err != nil {
					t.Fatalf("record %d: %v", i, err)
				}
				if it.Kind != msgs[i].Kind || it.InstanceID != msgs[i].InstanceID || it.ReceiveCount != 1 || !it.SentAt.Equal(it.QueuedAt) {
					t.Errorf("record %d: %+v, want a first delivery of %s %s sent when queued", i, it, msgs[i].Kind, msgs[i].InstanceID)
				}
				pod, ok := pods[it.InstanceID]
				if !ok {
					t.Errorf("record %d: instance %s is not in the sample world", i, it.InstanceID)
				}
				if it.Kind == workqueue.KindExit && *it.Pod != pod {
					t.Errorf("record %d: claim for Pod %+v on %s, want %+v", i, *it.Pod, it.InstanceID, pod)
				}
			}
		})
	}
}

// normalize compacts Detail, which the files carry indented.
func normalize(t *testing.T, ev events.CloudWatchEvent) events.CloudWatchEvent {
	var buf bytes.Buffer
	if err := json.Compact(&buf, ev.Detail); err != nil {
		t.Fatal(err)
	}
	ev.Detail = buf.Bytes()
	return ev
}

// TestEveryFileIsKnownAndListed keeps the directory, the definitions and
// the README in step.
func TestEveryFileIsKnownAndListed(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	err = filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".json") {
			files = append(files, filepath.ToSlash(path))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var defined []string
	for name := range exitSamples {
		defined = append(defined, name)
	}
	for name := range cloudWatchSamples {
		defined = append(defined, name)
	}
	for name := range queueSamples {
		defined = append(defined, name)
	}
	slices.Sort(defined)
	if !slices.Equal(files, defined) {
		t.Errorf("files %v\ndefined %v (run go test ./events -update)", files, defined)
	}
	for _, name := range defined {
		if !bytes.Contains(readme, []byte("`"+name+"`")) {
			t.Errorf("README.md does not list %s", name)
		}
	}
}
