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
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/reaper-k8s/reaper/pkg/model"
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
	// Message is the container's termination message (model.Exit.Message),
	// at most MaxMessageBytes.
	Message string `json:"message,omitempty"`
	// OthersRunning says other containers of the Pod still run or are
	// still to start after this run (model.Exit.OthersRunning).
	OthersRunning bool `json:"othersRunning,omitempty"`
	// Token is the launch's exit token (model.ValidExitToken), from the
	// host's configuration: it proves the line comes from the host of an
	// instance whose exit-token tag is its hash. A secret: it goes no
	// further than the exitrecorder, which passes on TokenHash.
	Token string `json:"token,omitempty"`
}

// TokenHash is the hash of the line's token (model.ExitTokenHash), "" when
// it carries none.
func (l Line) TokenHash() string {
	if l.Token == "" {
		return ""
	}
	return model.ExitTokenHash(l.Token)
}

var (
	// containerIDPattern: a runtime's id with an optional scheme
	// ("docker://" and 64 hex digits), in MaxContainerIDBytes.
	containerIDPattern = regexp.MustCompile(`^[A-Za-z0-9._:/-]*$`)
	// signalPattern: a signal's name ("SIGKILL", "SIGRTMIN+3") or number.
	signalPattern = regexp.MustCompile(`^[A-Z0-9+-]*$`)
)

// Input limits. A host writes the line, so every field Reaper stores or
// writes into a Pod is bounded: a line outside them is rejected, never
// truncated.
const (
	// MaxRestartCount bounds restartCount; a counter this high is a bug or
	// a forgery, and a forged one would shadow every later real exit.
	MaxRestartCount = 1_000_000
	// MaxBackoffSeconds is the supervisor's backoff cap (the kubelet's).
	MaxBackoffSeconds = 300
	// MaxErrorBytes bounds the free-text error.
	MaxErrorBytes = 4 << 10
	// MaxContainerIDBytes bounds containerId: a runtime scheme and a
	// 64-digit id fit with room to spare.
	MaxContainerIDBytes = 128
	// MaxSignalBytes bounds signal.
	MaxSignalBytes = 16
	// MaxMessageBytes bounds a container's termination message: the
	// kubelet's bound for one container (podstatus.MaxPodMessageBytes
	// bounds a Pod's).
	MaxMessageBytes = 4 << 10
	// MaxClockSkew is how far in the future finishedAt may lie: the host's
	// clock may run a little ahead, not hours.
	MaxClockSkew = 5 * time.Minute
)

// Claim is what the line says, in Reaper's terms: the Pod it names and
// the exit it reports. It is a claim until the reconciler has checked it
// against the instance's launch tags.
func (l Line) Claim() (model.PodRef, model.Exit) {
	return model.PodRef{Namespace: l.PodNamespace, Name: l.PodName, UID: l.PodUID},
		model.Exit{
			Container:        l.Container,
			ContainerID:      l.ContainerID,
			ExitCode:         l.ExitCode,
			OOMKilled:        l.OOMKilled,
			Signal:           l.Signal,
			Error:            l.Error,
			StartedAt:        l.StartedAt,
			FinishedAt:       l.FinishedAt,
			RestartCount:     l.RestartCount,
			RuntimeRestarted: l.RuntimeRestarted,
			WillRestart:      l.WillRestart,
			BackoffSeconds:   l.BackoffSeconds,
			Message:          l.Message,
			OthersRunning:    l.OthersRunning,
		}
}

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

// ErrInvalidToken is the error of a line whose exit token is outside its
// bounds (model.ValidExitToken). The error never quotes the token: it is a
// secret, and errors are logged.
var ErrInvalidToken = errors.New("token is not 32 to 128 letters, digits, - or _")

// Validate checks the fields Reaper relies on.
func (l Line) Validate() error {
	var errs []error
	if l.Reaper != Kind {
		errs = append(errs, fmt.Errorf("reaper is %q, want %q", l.Reaper, Kind))
	}
	if l.V != Version {
		errs = append(errs, fmt.Errorf("unsupported version v=%d, want %d", l.V, Version))
	}
	if !model.ValidInstanceID(l.InstanceID) {
		errs = append(errs, fmt.Errorf("instanceId %q is not an EC2 instance id", l.InstanceID))
	}
	if l.Token != "" && !model.ValidExitToken(l.Token) {
		errs = append(errs, ErrInvalidToken)
	}
	if err := ValidateClaim(l.Claim()); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("invalid exit line: %w", errors.Join(errs...))
	}
	return nil
}

// ValidateClaim checks what a line claims, the Pod and its exit, within
// the line's limits: the exitrecorder checks every line with it, and the
// work queue every exit message, which anyone allowed to send to the
// queue could have written.
func ValidateClaim(pod model.PodRef, exit model.Exit) error {
	var errs []error
	for _, f := range []struct {
		name, value string
		check       func(string) []string
	}{
		{"podNamespace", pod.Namespace, validation.IsDNS1123Label},
		{"podName", pod.Name, validation.IsDNS1123Subdomain},
		{"podUID", pod.UID, isUID},
		{"container", exit.Container, validation.IsDNS1123Label},
	} {
		if f.value == "" {
			errs = append(errs, fmt.Errorf("%s is missing", f.name))
		} else if problems := f.check(f.value); len(problems) > 0 {
			errs = append(errs, fmt.Errorf("%s %.80q: %s", f.name, f.value, problems[0]))
		}
	}
	if exit.ExitCode < -1 || exit.ExitCode > 255 {
		errs = append(errs, fmt.Errorf("exitCode %d is out of range -1..255", exit.ExitCode))
	}
	if exit.ExitCode == -1 && exit.Error == "" {
		errs = append(errs, errors.New("exitCode -1 (unknown) needs an error"))
	}
	if exit.RestartCount < 0 || exit.RestartCount > MaxRestartCount {
		errs = append(errs, fmt.Errorf("restartCount %d is out of range 0..%d", exit.RestartCount, MaxRestartCount))
	}
	if exit.BackoffSeconds < 0 || exit.BackoffSeconds > MaxBackoffSeconds {
		errs = append(errs, fmt.Errorf("backoffSeconds %d is out of range 0..%d", exit.BackoffSeconds, MaxBackoffSeconds))
	}
	for _, f := range []struct {
		name, value string
		max         int
		pattern     *regexp.Regexp
	}{
		{"error", exit.Error, MaxErrorBytes, nil},
		{"message", exit.Message, MaxMessageBytes, nil},
		{"containerId", exit.ContainerID, MaxContainerIDBytes, containerIDPattern},
		{"signal", exit.Signal, MaxSignalBytes, signalPattern},
	} {
		switch {
		case len(f.value) > f.max:
			errs = append(errs, fmt.Errorf("%s is %d bytes, more than %d", f.name, len(f.value), f.max))
		case f.pattern != nil && !f.pattern.MatchString(f.value):
			errs = append(errs, fmt.Errorf("%s %.80q has characters outside %s", f.name, f.value, f.pattern))
		}
	}
	if exit.FinishedAt.IsZero() {
		errs = append(errs, errors.New("finishedAt is missing"))
	} else if !exit.StartedAt.IsZero() && exit.FinishedAt.Before(exit.StartedAt) {
		errs = append(errs, errors.New("finishedAt is before startedAt"))
	}
	return errors.Join(errs...)
}

func isUID(s string) []string {
	if !model.ValidUID(s) {
		return []string{"not a UUID"}
	}
	return nil
}

// Rejection is a log event that did not yield a usable exit line.
type Rejection struct {
	EventID string
	// Reason is one of the Reason constants (callers add their own).
	Reason string
	Err    error
}

// Batch is what one subscription payload carries. CloudWatch Logs delivers
// one log stream per payload and the stream is named after the instance, so
// every line in a batch belongs to InstanceID.
type Batch struct {
	InstanceID string
	// Lines are the valid lines, ordered by RestartCount with duplicates
	// (redelivered or repeated by the agent: the same Pod, container,
	// restart count and token) removed.
	Lines    []Line
	Rejected []Rejection
	// Control is true for the CONTROL_MESSAGE CloudWatch Logs sends to test
	// a new subscription; it carries no lines.
	Control bool
}

// ErrBadStream is returned when the payload's log stream is not an instance
// id: no line in it can be attributed to an instance.
var ErrBadStream = errors.New("log stream is not an EC2 instance id")

// FromLogsEvent decodes a CloudWatch Logs subscription event received at
// now. A line whose instanceId differs from the log stream is rejected: the
// stream name is set by the CloudWatch agent from the instance's own
// metadata, the body is not. A batch keeps one line per Pod, container,
// restart count and token: a line naming another Pod or container,
// whatever its count, or carrying another token, never hides one.
func FromLogsEvent(ev events.CloudwatchLogsEvent, now time.Time) (Batch, error) {
	data, err := ev.AWSLogs.Parse()
	if err != nil {
		return Batch{}, fmt.Errorf("decode subscription payload: %w", err)
	}
	b := Batch{InstanceID: data.LogStream}
	if data.MessageType == "CONTROL_MESSAGE" {
		b.Control = true
		return b, nil
	}
	if !model.ValidInstanceID(data.LogStream) {
		return b, fmt.Errorf("%w: %q", ErrBadStream, data.LogStream)
	}
	// A line is one per Pod, container, restart count and token: a line
	// without the instance's token (written by another host into this
	// stream) cannot hide the real one, whatever it claims, nor one
	// container's run another's.
	type restart struct {
		uid       string
		container string
		count     int32
		token     string
	}
	seen := make(map[restart]bool, len(data.LogEvents))
	for _, e := range data.LogEvents {
		l, err := Parse([]byte(e.Message))
		reason := model.ReasonInvalid
		switch {
		case errors.Is(err, ErrInvalidToken):
			reason = model.ReasonInvalidToken
		case err != nil:
		case l.InstanceID != data.LogStream:
			reason, err = model.ReasonOtherInstance, fmt.Errorf("instanceId %s does not match log stream %s", l.InstanceID, data.LogStream)
		case l.FinishedAt.After(now.Add(MaxClockSkew)):
			reason, err = model.ReasonFinishedInFuture, fmt.Errorf("finishedAt %s is more than %s after %s", l.FinishedAt.Format(time.RFC3339), MaxClockSkew, now.UTC().Format(time.RFC3339))
		}
		if err != nil {
			b.Rejected = append(b.Rejected, Rejection{EventID: e.ID, Reason: reason, Err: err})
			continue
		}
		key := restart{l.PodUID, l.Container, l.RestartCount, l.Token}
		if seen[key] {
			continue
		}
		seen[key] = true
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
