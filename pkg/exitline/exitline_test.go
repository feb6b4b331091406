package exitline

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/reaper-k8s/reaper/pkg/model"
)

const good = `{"reaper":"container-exit","v":1,"instanceId":"i-0123456789abcdef0","podNamespace":"ml","podName":"train-0","podUID":"6b9a1c2e-0000-4000-8000-000000000001","container":"main","containerId":"3f2a","exitCode":0,"oomKilled":false,"startedAt":"2026-11-30T06:00:00.123456789Z","finishedAt":"2026-11-30T07:00:00.5Z","restartCount":0}`

// token is an exit token as userdata.NewExitToken draws them.
const token = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0"

func TestParse(t *testing.T) {
	l, err := Parse([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if l.InstanceID != "i-0123456789abcdef0" || l.PodName != "train-0" || l.ExitCode != 0 || l.FinishedAt.Nanosecond() != 500000000 {
		t.Fatalf("parsed %+v", l)
	}
	withToken := strings.Replace(good, `"restartCount":0`, `"restartCount":0,"token":"`+token+`"`, 1)
	if l, err = Parse([]byte(withToken)); err != nil || l.Token != token || l.TokenHash() != model.ExitTokenHash(token) {
		t.Fatalf("token: %+v %v", l, err)
	}
	if l, _ := Parse([]byte(good)); l.TokenHash() != "" {
		t.Fatalf("a line without a token has the token hash %q", l.TokenHash())
	}
	withExtra := strings.Replace(good, `"restartCount":0`, `"restartCount":2,"willRestart":true,"backoffSeconds":20,"futureField":"x"`, 1)
	if l, err = Parse([]byte(withExtra)); err != nil || !l.WillRestart || l.RestartCount != 2 || l.BackoffSeconds != 20 {
		t.Fatalf("optional fields: %+v %v", l, err)
	}
}

func TestParseRejects(t *testing.T) {
	for name, tc := range map[string]struct{ line, want string }{
		"not json":           {`exit 0`, "not an exit line"},
		"other kind":         {strings.Replace(good, `"container-exit"`, `"heartbeat"`, 1), `reaper is "heartbeat"`},
		"version 2":          {strings.Replace(good, `"v":1`, `"v":2`, 1), "unsupported version v=2"},
		"bad instance":       {strings.Replace(good, `i-0123456789abcdef0`, `host-7`, 1), `instanceId "host-7"`},
		"ten-digit instance": {strings.Replace(good, `i-0123456789abcdef0`, `i-0123456789`, 1), `instanceId "i-0123456789"`},
		"no pod uid":         {strings.Replace(good, `"podUID":"6b9a1c2e-0000-4000-8000-000000000001"`, `"podUID":""`, 1), "podUID is missing"},
		"exit code range":    {strings.Replace(good, `"exitCode":0`, `"exitCode":300`, 1), "out of range"},
		"unknown no why":     {strings.Replace(good, `"exitCode":0`, `"exitCode":-1`, 1), "needs an error"},
		"no finish":          {strings.Replace(good, `"finishedAt":"2026-11-30T07:00:00.5Z",`, ``, 1), "finishedAt is missing"},
		"time travel":        {strings.Replace(good, `07:00:00.5Z`, `05:00:00Z`, 1), "before startedAt"},
		"namespace shape":    {strings.Replace(good, `"podNamespace":"ml"`, `"podNamespace":"ML/../x"`, 1), `podNamespace "ML/../x"`},
		"name shape":         {strings.Replace(good, `"podName":"train-0"`, `"podName":"`+strings.Repeat("a", 254)+`"`, 1), "podName"},
		"uid shape":          {strings.Replace(good, `6b9a1c2e-0000-4000-8000-000000000001`, `6b9a1c2e`, 1), "not a UUID"},
		"container shape":    {strings.Replace(good, `"container":"main"`, `"container":"Main_1"`, 1), `container "Main_1"`},
		"restart count":      {strings.Replace(good, `"restartCount":0`, `"restartCount":1000001`, 1), "restartCount 1000001 is out of range"},
		"backoff":            {strings.Replace(good, `"restartCount":0`, `"restartCount":0,"backoffSeconds":301`, 1), "backoffSeconds 301 is out of range"},
		"long error":         {strings.Replace(good, `"restartCount":0`, `"restartCount":0,"error":"`+strings.Repeat("x", 4097)+`"`, 1), "error is 4097 bytes"},
		"long container id":  {strings.Replace(good, `"containerId":"3f2a"`, `"containerId":"`+strings.Repeat("f", 1<<20)+`"`, 1), "containerId is 1048576 bytes"},
		"container id shape": {strings.Replace(good, `"containerId":"3f2a"`, `"containerId":"3f2a\n<b>"`, 1), "containerId"},
		"long signal":        {strings.Replace(good, `"restartCount":0`, `"restartCount":0,"signal":"`+strings.Repeat("K", 17)+`"`, 1), "signal is 17 bytes"},
		"signal shape":       {strings.Replace(good, `"restartCount":0`, `"restartCount":0,"signal":"kill -9"`, 1), "signal"},
		"token type":         {strings.Replace(good, `"restartCount":0`, `"restartCount":0,"token":7`, 1), "not an exit line"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Parse([]byte(tc.line))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to mention %q", err, tc.want)
			}
		})
	}
}

func TestFromLogsEvent(t *testing.T) {
	mismatch := strings.Replace(good, `i-0123456789abcdef0`, `i-0aaaaaaaaaaaaaaaa`, 1)
	restart := strings.Replace(good, `"restartCount":0`, `"restartCount":1`, 1)
	ev, err := Encode(events.CloudwatchLogsData{
		MessageType: "DATA_MESSAGE", LogGroup: "/reaper/exits", LogStream: "i-0123456789abcdef0",
		LogEvents: []events.CloudwatchLogsLogEvent{
			{ID: "1", Message: restart}, {ID: "2", Message: good}, {ID: "3", Message: "garbage"},
			{ID: "4", Message: mismatch}, {ID: "5", Message: good},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	b, err := FromLogsEvent(ev, received)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Lines) != 2 || b.Lines[0].RestartCount != 0 || b.Lines[1].RestartCount != 1 {
		t.Fatalf("lines not deduplicated and ordered: %+v", b.Lines)
	}
	if len(b.Rejected) != 2 || b.Rejected[0].EventID != "3" || b.Rejected[0].Reason != model.ReasonInvalid ||
		b.Rejected[1].Reason != model.ReasonOtherInstance || !strings.Contains(b.Rejected[1].Err.Error(), "does not match log stream") {
		t.Fatalf("rejected: %+v", b.Rejected)
	}
}

// received is when the test payloads arrive: the good line finished a
// minute before.
var received = time.Date(2026, 11, 30, 7, 1, 0, 0, time.UTC)

// A line may finish a little after the receiver's clock (skew), not later.
func TestFromLogsEventFuture(t *testing.T) {
	ev, err := Encode(events.CloudwatchLogsData{MessageType: "DATA_MESSAGE", LogStream: "i-0123456789abcdef0",
		LogEvents: []events.CloudwatchLogsLogEvent{{ID: "1", Message: good}}})
	if err != nil {
		t.Fatal(err)
	}
	finished := time.Date(2026, 11, 30, 7, 0, 0, 5e8, time.UTC)
	for _, tc := range []struct {
		now  time.Time
		want int // lines kept
	}{
		{finished, 1},
		{finished.Add(-MaxClockSkew), 1},
		{finished.Add(-MaxClockSkew - time.Millisecond), 0},
	} {
		b, err := FromLogsEvent(ev, tc.now)
		if err != nil {
			t.Fatal(err)
		}
		if len(b.Lines) != tc.want || (tc.want == 0 && (len(b.Rejected) != 1 || b.Rejected[0].Reason != model.ReasonFinishedInFuture)) {
			t.Fatalf("now %s: lines %d rejected %+v", tc.now, len(b.Lines), b.Rejected)
		}
	}
}

// A line naming another Pod with the real line's restart count, ahead of
// it in the payload, hides nothing: lines are one per Pod and count. And a
// line of any size costs itself only.
func TestFromLogsEventForgedNeighbours(t *testing.T) {
	forged := strings.Replace(good, `6b9a1c2e-0000-4000-8000-000000000001`, `6b9a1c2e-0000-4000-8000-00000000ffff`, 1)
	forged = strings.Replace(forged, `"podName":"train-0"`, `"podName":"victim"`, 1)
	huge := strings.Replace(good, `"containerId":"3f2a"`, `"containerId":"`+strings.Repeat("f", 1<<20)+`"`, 1)
	ev, err := Encode(events.CloudwatchLogsData{MessageType: "DATA_MESSAGE", LogStream: "i-0123456789abcdef0",
		LogEvents: []events.CloudwatchLogsLogEvent{{ID: "1", Message: forged}, {ID: "2", Message: huge}, {ID: "3", Message: good}, {ID: "4", Message: good}}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := FromLogsEvent(ev, received)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Lines) != 2 || b.Lines[0].PodName != "victim" || b.Lines[1].PodName != "train-0" {
		t.Fatalf("lines %+v, want the forged line and the real one", b.Lines)
	}
	if len(b.Rejected) != 1 || b.Rejected[0].EventID != "2" || b.Rejected[0].Reason != model.ReasonInvalid {
		t.Fatalf("rejected %+v, want the huge line alone", b.Rejected)
	}
}

func TestFromLogsEventStreamAndControl(t *testing.T) {
	bad, _ := Encode(events.CloudwatchLogsData{MessageType: "DATA_MESSAGE", LogStream: "ip-10-0-0-1", LogEvents: []events.CloudwatchLogsLogEvent{{ID: "1", Message: good}}})
	if _, err := FromLogsEvent(bad, received); err == nil || !strings.Contains(err.Error(), "not an EC2 instance id") {
		t.Fatalf("bad stream: %v", err)
	}
	// EC2 takes 8 or 17 hex digits: a stream of 10 names no instance, even
	// when its line names the same.
	tenDigits := strings.Replace(good, `i-0123456789abcdef0`, `i-0123456789`, 1)
	short, _ := Encode(events.CloudwatchLogsData{MessageType: "DATA_MESSAGE", LogStream: "i-0123456789", LogEvents: []events.CloudwatchLogsLogEvent{{ID: "1", Message: tenDigits}}})
	if b, err := FromLogsEvent(short, received); !errors.Is(err, ErrBadStream) || len(b.Lines) != 0 || !strings.Contains(err.Error(), `"i-0123456789"`) {
		t.Fatalf("a stream of 10 hex digits: %+v, %v, want ErrBadStream naming it", b, err)
	}
	ctl, _ := Encode(events.CloudwatchLogsData{MessageType: "CONTROL_MESSAGE", LogStream: "test"})
	if b, err := FromLogsEvent(ctl, received); err != nil || !b.Control {
		t.Fatalf("control: %+v %v", b, err)
	}
	if _, err := FromLogsEvent(events.CloudwatchLogsEvent{AWSLogs: events.CloudwatchLogsRawData{Data: "!!"}}, received); err == nil {
		t.Fatal("undecodable payload accepted")
	}
}

// A token out of its bounds rejects the line, for ErrInvalidToken, and the
// error, which is logged, never quotes it.
func TestParseRejectsToken(t *testing.T) {
	for name, bad := range map[string]string{
		"short":      token[:31],
		"long":       strings.Repeat(token, 3),
		"quote":      token[:40] + `\"`,
		"space":      token[:40] + " x",
		"equals":     token[:40] + "==",
		"line break": token[:40] + `\n`,
	} {
		t.Run(name, func(t *testing.T) {
			line := strings.Replace(good, `"restartCount":0`, `"restartCount":0,"token":"`+bad+`"`, 1)
			_, err := Parse([]byte(line))
			if !errors.Is(err, ErrInvalidToken) {
				t.Fatalf("error %v, want ErrInvalidToken", err)
			}
			if strings.Contains(err.Error(), bad[:20]) {
				t.Fatalf("error %q quotes the token", err)
			}
		})
	}
}

// A line with a bad token is rejected for invalid-token; a line without
// the token, or with another, hides no line that carries it, whatever Pod
// and restart count it claims; the same line twice is kept once.
func TestFromLogsEventTokens(t *testing.T) {
	withToken := func(tok string) string {
		return strings.Replace(good, `"restartCount":0`, `"restartCount":0,"token":"`+tok+`"`, 1)
	}
	other := strings.Repeat("a", 64)
	ev, err := Encode(events.CloudwatchLogsData{MessageType: "DATA_MESSAGE", LogStream: "i-0123456789abcdef0",
		LogEvents: []events.CloudwatchLogsLogEvent{
			{ID: "1", Message: good}, {ID: "2", Message: withToken(other)}, {ID: "3", Message: withToken(token[:20])},
			{ID: "4", Message: withToken(token)}, {ID: "5", Message: withToken(token)},
		}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := FromLogsEvent(ev, received)
	if err != nil {
		t.Fatal(err)
	}
	var tokens []string
	for _, l := range b.Lines {
		tokens = append(tokens, l.Token)
	}
	if !slices.Equal(tokens, []string{"", other, token}) {
		t.Fatalf("lines carry tokens %q, want none, the other one and the instance's, once each", tokens)
	}
	if len(b.Rejected) != 1 || b.Rejected[0].EventID != "3" || b.Rejected[0].Reason != model.ReasonInvalidToken {
		t.Fatalf("rejected %+v, want line 3 for %s", b.Rejected, model.ReasonInvalidToken)
	}
}

// Whatever Parse accepts is a line that encodes and parses back to itself:
// what the ledger and the Pod get from it does not depend on how the host
// spelled it.
func FuzzParse(f *testing.F) {
	f.Add([]byte(good))
	f.Add([]byte(strings.Replace(good, `"restartCount":0`, `"restartCount":0,"token":"`+token+`"`, 1)))
	f.Add([]byte(strings.Replace(good, `"restartCount":0`, `"restartCount":3,"willRestart":true,"backoffSeconds":40,"signal":"SIGKILL"`, 1)))
	f.Fuzz(func(t *testing.T, b []byte) {
		l, err := Parse(b)
		if err != nil {
			return
		}
		again, err := json.Marshal(l)
		if err != nil {
			t.Fatal(err)
		}
		back, err := Parse(again)
		if err != nil {
			t.Fatalf("accepted %q, rejected its own encoding %s: %v", b, again, err)
		}
		if twice, _ := json.Marshal(back); string(twice) != string(again) {
			t.Fatalf("%q parses to %s, then to %s", b, again, twice)
		}
	})
}

// The lines of two containers of one Pod, each at restart count 0, in one
// payload are two claims: neither hides the other. The same container's
// line again is still one.
func TestFromLogsEventContainers(t *testing.T) {
	init := strings.Replace(good, `"container":"main"`, `"container":"setup","othersRunning":true`, 1)
	ev, err := Encode(events.CloudwatchLogsData{
		MessageType: "DATA_MESSAGE", LogGroup: "/reaper/exits", LogStream: "i-0123456789abcdef0",
		LogEvents: []events.CloudwatchLogsLogEvent{{ID: "1", Message: init}, {ID: "2", Message: good}, {ID: "3", Message: init}},
	})
	if err != nil {
		t.Fatal(err)
	}
	b, err := FromLogsEvent(ev, received)
	if err != nil {
		t.Fatal(err)
	}
	var containers []string
	for _, l := range b.Lines {
		containers = append(containers, l.Container)
	}
	if slices.Sort(containers); !slices.Equal(containers, []string{"main", "setup"}) {
		t.Fatalf("lines of containers %v, want main and setup once each", containers)
	}
	for _, l := range b.Lines {
		if _, exit := l.Claim(); exit.OthersRunning != (l.Container == "setup") {
			t.Fatalf("%s: othersRunning %v not carried", l.Container, exit.OthersRunning)
		}
	}
}

// A termination message is the workload's own text: any bytes up to the
// kubelet's bound for one container are carried as they are, and a longer
// one is refused, never cut, as every field a host writes.
func TestMessageBound(t *testing.T) {
	line := func(message string) string {
		b, _ := json.Marshal(message)
		return strings.Replace(good, `"restartCount":0`, `"restartCount":0,"message":`+string(b), 1)
	}
	atBound := strings.Repeat("é", MaxMessageBytes/2)
	l, err := Parse([]byte(line(atBound)))
	if _, exit := l.Claim(); err != nil || exit.Message != atBound {
		t.Fatalf("a message of %d bytes: %v", len(atBound), err)
	}
	if _, err := Parse([]byte(line(atBound + "x"))); err == nil || !strings.Contains(err.Error(), "message is") {
		t.Fatalf("a message of %d bytes: %v, want refused", len(atBound)+1, err)
	}
}
