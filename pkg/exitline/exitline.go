// Package exitline parses exit line v1: the one JSON line the host-side wrapper
// writes when a workload container exits, as it reaches Reaper inside a
// CloudWatch Logs subscription payload.
package exitline

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"time"

	"github.com/aws/aws-lambda-go/events"
)

// Kind and Version identify exit line v1; the subscription filter selects
// lines by Kind, so anything else reaching the parser is a misconfiguration.
const (
	Kind    = "container-exit"
	Version = 1
)

// Line is exit line v1. Fields after RestartCount are optional additions the
// wrapper may send; unknown fields are ignored so the format can grow.
type Line struct {
	Reaper       string    `json:"reaper"`
	V            int       `json:"v"`
	InstanceID   string    `json:"instanceId"`
	PodNamespace string    `json:"podNamespace"`
	PodName      string    `json:"podName"`
	PodUID       string    `json:"podUID"`
	Container    string    `json:"container"`
	ContainerID  string    `json:"containerId"`
	ExitCode     int       `json:"exitCode"`
	OOMKilled    bool      `json:"oomKilled"`
	StartedAt    time.Time `json:"startedAt"`
	FinishedAt   time.Time `json:"finishedAt"`
	RestartCount int32     `json:"restartCount"`

	// Signal names the signal that ended the container, when known.
	Signal string `json:"signal,omitempty"`
	// Error explains why the wrapper could not learn the real outcome.
	Error string `json:"error,omitempty"`
	// RuntimeRestarted says the container runtime restarted under the
	// workload and the line still carries the workload's own outcome.
	RuntimeRestarted bool `json:"runtimeRestarted,omitempty"`
	// WillRestart says the host supervisor restarts the container in place:
	// the Pod stays Running and the instance is kept.
	WillRestart bool `json:"willRestart,omitempty"`
	// BackoffSeconds is how long the supervisor waits before that restart.
	BackoffSeconds int `json:"backoffSeconds,omitempty"`
}

var instanceIDPattern = regexp.MustCompile(`^i-[0-9a-f]{8,17}$`)

// ValidInstanceID reports whether id has the shape of an EC2 instance id.
func ValidInstanceID(id string) bool { return instanceIDPattern.MatchString(id) }

// Parse decodes and validates one exit line.
func Parse(message []byte) (Line, error) {
	var l Line
	if err := json.Unmarshal(message, &l); err != nil {
		return Line{}, fmt.Errorf("not an exit line: %w", err)
	}
	if err := l.Validate(); err != nil {
		return Line{}, err
	}
	return l, nil
}

// Validate checks the fields Reaper relies on.
func (l Line) Validate() error {
	var errs []error
	if l.Reaper != Kind {
		errs = append(errs, fmt.Errorf("reaper is %q, want %q", l.Reaper, Kind))
	}
	if l.V != Version {
		errs = append(errs, fmt.Errorf("unsupported version v=%d, want %d", l.V, Version))
	}
	if !ValidInstanceID(l.InstanceID) {
		errs = append(errs, fmt.Errorf("instanceId %q is not an EC2 instance id", l.InstanceID))
	}
	for _, f := range []struct{ name, value string }{
		{"podNamespace", l.PodNamespace}, {"podName", l.PodName}, {"podUID", l.PodUID}, {"container", l.Container},
	} {
		if f.value == "" {
			errs = append(errs, fmt.Errorf("%s is missing", f.name))
		}
	}
	if l.ExitCode < -1 || l.ExitCode > 255 {
		errs = append(errs, fmt.Errorf("exitCode %d is out of range -1..255", l.ExitCode))
	}
	if l.ExitCode == -1 && l.Error == "" {
		errs = append(errs, errors.New("exitCode -1 (unknown) needs an error"))
	}
	if l.RestartCount < 0 {
		errs = append(errs, fmt.Errorf("restartCount %d is negative", l.RestartCount))
	}
	if l.FinishedAt.IsZero() {
		errs = append(errs, errors.New("finishedAt is missing"))
	} else if !l.StartedAt.IsZero() && l.FinishedAt.Before(l.StartedAt) {
		errs = append(errs, errors.New("finishedAt is before startedAt"))
	}
	if len(errs) > 0 {
		return fmt.Errorf("invalid exit line: %w", errors.Join(errs...))
	}
	return nil
}

// Rejection is a log event that did not yield a usable exit line.
type Rejection struct {
	EventID string
	Err     error
}

// Batch is what one subscription payload carries. CloudWatch Logs delivers
// one log stream per payload and the stream is named after the instance, so
// every line in a batch belongs to InstanceID.
type Batch struct {
	InstanceID string
	LogGroup   string
	// Lines are the valid lines, ordered by RestartCount with duplicates
	// (redelivered or repeated by the agent) removed.
	Lines    []Line
	Rejected []Rejection
	// Control is true for the CONTROL_MESSAGE CloudWatch Logs sends to test
	// a new subscription; it carries no lines.
	Control bool
}

// ErrBadStream is returned when the payload's log stream is not an instance
// id: no line in it can be attributed to an instance.
var ErrBadStream = errors.New("log stream is not an EC2 instance id")

// FromLogsEvent decodes a CloudWatch Logs subscription event. A line whose
// instanceId differs from the log stream is rejected: the stream name is set
// by the CloudWatch agent from the instance's own metadata, the body is not.
func FromLogsEvent(ev events.CloudwatchLogsEvent) (Batch, error) {
	data, err := ev.AWSLogs.Parse()
	if err != nil {
		return Batch{}, fmt.Errorf("decode subscription payload: %w", err)
	}
	b := Batch{InstanceID: data.LogStream, LogGroup: data.LogGroup}
	if data.MessageType == "CONTROL_MESSAGE" {
		b.Control = true
		return b, nil
	}
	if !ValidInstanceID(data.LogStream) {
		return b, fmt.Errorf("%w: %q", ErrBadStream, data.LogStream)
	}
	seen := make(map[int32]bool, len(data.LogEvents))
	for _, e := range data.LogEvents {
		l, err := Parse([]byte(e.Message))
		if err == nil && l.InstanceID != data.LogStream {
			err = fmt.Errorf("instanceId %s does not match log stream %s", l.InstanceID, data.LogStream)
		}
		if err != nil {
			b.Rejected = append(b.Rejected, Rejection{EventID: e.ID, Err: err})
			continue
		}
		if seen[l.RestartCount] {
			continue
		}
		seen[l.RestartCount] = true
		b.Lines = append(b.Lines, l)
	}
	sort.SliceStable(b.Lines, func(i, j int) bool { return b.Lines[i].RestartCount < b.Lines[j].RestartCount })
	return b, nil
}

// Encode renders a payload the way CloudWatch Logs delivers it: gzip, then
// base64. Tests, replays and sample events use it to build real payloads.
func Encode(data events.CloudwatchLogsData) (events.CloudwatchLogsEvent, error) {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if err := json.NewEncoder(zw).Encode(data); err != nil {
		return events.CloudwatchLogsEvent{}, err
	}
	if err := zw.Close(); err != nil {
		return events.CloudwatchLogsEvent{}, err
	}
	return events.CloudwatchLogsEvent{AWSLogs: events.CloudwatchLogsRawData{Data: base64.StdEncoding.EncodeToString(buf.Bytes())}}, nil
}
