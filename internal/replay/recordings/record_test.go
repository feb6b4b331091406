// Package recordings holds the scenario definitions behind testdata/replay and
// checks the committed recordings against them (-record rewrites them).
package recordings

import (
	"crypto/sha256"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/reaper-k8s/reaper/internal/replay"
	"github.com/reaper-k8s/reaper/pkg/exitline"
)

var rerecord = flag.Bool("record", false, "rewrite the payload recordings in testdata/replay")

// recordingsDir is where the scenario payloads live, relative to this package.
const recordingsDir = "../../../testdata/replay"

// step is one event of a scenario: a CloudWatch Logs payload for
// exitrecorder, an EventBridge event for statechange and sweeper.
type step struct {
	function string
	logs     *events.CloudwatchLogsData
	event    *events.CloudWatchEvent
}

type scenario struct {
	steps []step
	// subjects are the Pods no exit line names.
	subjects []replay.Subject
}

// TestRecordings checks that the committed recordings are what the scenarios
// below describe, and rewrites them with -record. The recordings, not this
// code, are what the replay tests feed the functions.
func TestRecordings(t *testing.T) {
	for name, sc := range scenarios() {
		dir := filepath.Join(recordingsDir, name)
		if *rerecord {
			writeScenario(t, dir, sc)
		}
		rec, err := replay.Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		if len(rec.Steps) != len(sc.steps) {
			t.Fatalf("%s: %d recorded steps, scenario has %d (run with -record)", name, len(rec.Steps), len(sc.steps))
		}
		for i, st := range rec.Steps {
			want, got := sc.steps[i].encode(t), st.Event
			if st.Logs != nil {
				want, _ = json.Marshal(sc.steps[i].logs)
				got, _ = json.Marshal(st.Logs)
			}
			if st.Function != sc.steps[i].function || string(want) != string(got) {
				t.Fatalf("%s: stale (run with -record)", st.Path)
			}
		}
	}
}

func (s step) encode(t *testing.T) []byte {
	var v any = s.event
	if s.logs != nil {
		ev, err := exitline.Encode(*s.logs)
		if err != nil {
			t.Fatal(err)
		}
		v = ev
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return append(b, '\n')
}

func writeScenario(t *testing.T, dir string, sc scenario) {
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for i, st := range sc.steps {
		what := "scheduled"
		switch {
		case st.logs != nil:
			what = st.logs.LogStream
		case st.function == "statechange":
			var d map[string]string
			_ = json.Unmarshal(st.event.Detail, &d)
			what = d["instance-id"] + "-" + d["state"]
		}
		path := filepath.Join(dir, fmt.Sprintf("%03d-%s-%s.json", i+1, st.function, what))
		if err := os.WriteFile(path, st.encode(t), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if len(sc.subjects) > 0 {
		b, _ := json.MarshalIndent(sc.subjects, "", "  ")
		if err := os.WriteFile(filepath.Join(dir, "subjects.json"), append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

var recordedAt = time.Date(2026, 11, 28, 14, 0, 0, 0, time.UTC)

func instanceID(n int) string { return fmt.Sprintf("i-%017x", 0x0a11ce0000000000+n) }
func recordedUID(n int) string {
	return fmt.Sprintf("00000000-0000-4000-8000-%012d", n)
}

func line(id string, ns, name string, uid int, code int, mutate ...func(*exitline.Line)) string {
	l := exitline.Line{
		Reaper: exitline.Kind, V: exitline.Version, InstanceID: id,
		PodNamespace: ns, PodName: name, PodUID: recordedUID(uid),
		Container: "main", ContainerID: fmt.Sprintf("%064x", uid),
		ExitCode: code, StartedAt: recordedAt.Add(-time.Hour), FinishedAt: recordedAt.Add(time.Duration(uid) * time.Millisecond),
	}
	for _, m := range mutate {
		m(&l)
	}
	b, _ := json.Marshal(l)
	return string(b)
}

func payload(stream string, messages ...string) events.CloudwatchLogsData {
	d := events.CloudwatchLogsData{
		Owner: "123456789012", LogGroup: "/reaper/exits", LogStream: stream,
		SubscriptionFilters: []string{"reaper-exits"}, MessageType: "DATA_MESSAGE",
	}
	for i, m := range messages {
		d.LogEvents = append(d.LogEvents, events.CloudwatchLogsLogEvent{
			ID:        fmt.Sprintf("3808%032d", i),
			Timestamp: recordedAt.Add(time.Duration(i) * time.Millisecond).UnixMilli(),
			Message:   m,
		})
	}
	return d
}

// scenarioPayloads describes the recorded scenarios. Each scenario uses its
// own namespace and instance ids so that they can share one stack.
func scenarios() map[string]scenario {
	s := map[string]scenario{}
	exit := func(d events.CloudwatchLogsData) step { return step{function: "exitrecorder", logs: &d} }

	// 30 replicas of a GPU sample whose command ends after `sleep 3600`.
	for i := range 30 {
		id := instanceID(100 + i)
		sc := s["replicas30"]
		sc.steps = append(sc.steps, exit(payload(id, line(id, "gpu-sample", fmt.Sprintf("gpu-sample-%02d", i), 100+i, 0))))
		s["replicas30"] = sc
	}
	one := func(name string, n int, ns, pod string, code int, mutate ...func(*exitline.Line)) {
		id := instanceID(n)
		s[name] = scenario{steps: []step{exit(payload(id, line(id, ns, pod, n, code, mutate...)))}}
	}
	one("job-succeeded", 1, "jobs", "job-succeeded", 0)
	one("job-failed", 2, "jobs", "job-failed", 1)
	one("oom", 3, "jobs", "job-oom", 137, func(l *exitline.Line) { l.OOMKilled, l.Signal = true, "SIGKILL" })
	one("duplicate", 4, "jobs", "job-duplicate", 0)
	one("pod-deleted", 5, "jobs", "job-deleted", 0)
	one("pod-replaced", 6, "jobs", "job-replaced", 0)
	one("unmanaged", 7, "jobs", "job-unmanaged", 0)
	one("api-down", 8, "jobs", "job-api-down", 0)
	one("job-throttled", 15, "jobs", "job-throttled", 0)
	one("lookup-fails", 39, "jobs", "job-lookup-fails", 0)
	// The installer restarted the container runtime under itself; the
	// wrapper still reports the workload's own exit.
	one("installer", 9, "jobs", "installer", 0, func(l *exitline.Line) { l.RuntimeRestarted = true })

	// A line that claims another instance than its log stream.
	id := instanceID(10)
	s["foreign-line"] = scenario{steps: []step{exit(payload(id, line(instanceID(11), "jobs", "job-foreign", 10, 0)))}}

	// A good batch with a malformed line and a foreign line inside.
	id = instanceID(12)
	s["malformed-in-batch"] = scenario{steps: []step{exit(payload(id,
		line(id, "jobs", "job-batch", 12, 1, func(l *exitline.Line) { l.WillRestart, l.BackoffSeconds = true, 10 }),
		`{"reaper":"container-exit","v":1,"instanceId":`,
		line(instanceID(13), "jobs", "job-batch", 12, 0),
		line(id, "jobs", "job-batch", 12, 0, func(l *exitline.Line) { l.RestartCount = 1 }),
	))}}

	// A crash-looping container under restartPolicy Always: two exits, each
	// followed by a restart on the same instance.
	id = instanceID(14)
	var restarts scenario
	for rc := range 2 {
		restarts.steps = append(restarts.steps, exit(payload(id, line(id, "services", "web", 14, 1, func(l *exitline.Line) {
			l.RestartCount, l.WillRestart, l.BackoffSeconds = int32(rc), true, 10<<rc
		}))))
	}
	s["restarts"] = restarts

	// Spot reclaims an instance; no exit line ever comes.
	id = instanceID(20)
	s["spot-no-exit"] = scenario{
		subjects: []replay.Subject{{InstanceID: id, Namespace: "spot", Name: "train-spot", RecordedUID: recordedUID(20)}},
		steps:    []step{state(id, "shutting-down", 0), state(id, "terminated", time.Second), sweep(2 * time.Minute)},
	}
	// The terminated event overtakes the exit line.
	id = instanceID(21)
	s["terminated-before-exit"] = scenario{steps: []step{
		state(id, "shutting-down", 0), state(id, "terminated", time.Second),
		exit(payload(id, line(id, "spot", "train-late-line", 21, 0))),
	}}
	// Somebody stops the instance by hand.
	id = instanceID(22)
	s["manual-stop"] = scenario{
		subjects: []replay.Subject{{InstanceID: id, Namespace: "ops", Name: "stopped-by-hand", RecordedUID: recordedUID(22)}},
		steps:    []step{state(id, "stopping", 0), state(id, "stopped", time.Second), sweep(time.Minute)},
	}
	// The same, for a deployment that keeps stopped instances.
	id = instanceID(26)
	s["manual-stop-kept"] = scenario{
		subjects: []replay.Subject{{InstanceID: id, Namespace: "ops", Name: "stopped-and-kept", RecordedUID: recordedUID(26)}},
		steps:    []step{state(id, "stopping", 0), state(id, "stopped", time.Second), sweep(time.Minute)},
	}
	// A managed instance whose Pod is gone, and an unmanaged one likewise.
	s["orphans"] = scenario{
		subjects: []replay.Subject{
			{InstanceID: instanceID(23), Namespace: "ops", Name: "orphan-managed", RecordedUID: recordedUID(23)},
			{InstanceID: instanceID(24), Namespace: "ops", Name: "orphan-unmanaged", RecordedUID: recordedUID(24)},
		},
		steps: []step{sweep(0)},
	}
	// The apiserver goes away in the middle of a sweep's work.
	id = instanceID(25)
	s["sweep-api-down"] = scenario{
		subjects: []replay.Subject{{InstanceID: id, Namespace: "spot", Name: "train-sweep-outage", RecordedUID: recordedUID(25)}},
		steps:    []step{state(id, "terminated", 0), sweep(time.Minute), sweep(2 * time.Minute)},
	}
	// The second demo: spot reclaims 10 instances; 5 exit lines arrive late.
	var spot scenario
	for i := range 10 {
		id := instanceID(200 + i)
		spot.steps = append(spot.steps, state(id, "terminated", time.Duration(i)*100*time.Millisecond))
		if i%2 == 1 {
			spot.subjects = append(spot.subjects, replay.Subject{InstanceID: id, Namespace: "spot-fleet", Name: fmt.Sprintf("worker-%02d", i), RecordedUID: recordedUID(200 + i)})
		}
	}
	for i := 0; i < 10; i += 2 {
		id := instanceID(200 + i)
		spot.steps = append(spot.steps, exit(payload(id, line(id, "spot-fleet", fmt.Sprintf("worker-%02d", i), 200+i, []int{0, 1, 0, 137, 2}[i/2], func(l *exitline.Line) {
			l.OOMKilled = l.ExitCode == 137
		}))))
	}
	spot.steps = append(spot.steps, sweep(5*time.Minute))
	s["spot10"] = spot

	// Ownership: instances of another cluster in the same account. An
	// exit line from one, a spot reclaim of another and a sweep: nothing
	// of theirs is touched.
	id = instanceID(30)
	s["other-cluster"] = scenario{
		subjects: []replay.Subject{{InstanceID: instanceID(31), Namespace: "tenants", Name: "other-spot", RecordedUID: recordedUID(31)}},
		steps: []step{
			exit(payload(id, line(id, "tenants", "other-exit", 30, 0))),
			state(instanceID(31), "terminated", time.Second), sweep(2 * time.Minute),
		},
	}
	// Trust: lines written into instance 32's stream naming the Pod that
	// runs on instance 33, a terminal one and a restart; the tags of 32
	// name another Pod.
	victim := line(instanceID(32), "tenants", "victim", 33, 0)
	s["pod-mismatch"] = scenario{
		subjects: []replay.Subject{
			{InstanceID: instanceID(32), Namespace: "tenants", Name: "writer", RecordedUID: recordedUID(32)},
			{InstanceID: instanceID(33), Namespace: "tenants", Name: "victim", RecordedUID: recordedUID(33)},
		},
		steps: []step{
			exit(payload(instanceID(32), victim)),
			exit(payload(instanceID(32), line(instanceID(32), "tenants", "victim", 33, 1, func(l *exitline.Line) {
				l.RestartCount, l.WillRestart, l.BackoffSeconds = 1, true, 10
			}))),
		},
	}
	// The same forged line, delivered while EC2 cannot be asked: it waits
	// on the queue, unrecorded, and a later sweep must not act on it.
	s["unverified"] = scenario{
		subjects: []replay.Subject{
			{InstanceID: instanceID(34), Namespace: "tenants", Name: "unverified-writer", RecordedUID: recordedUID(34)},
			{InstanceID: instanceID(35), Namespace: "tenants", Name: "unverified-victim", RecordedUID: recordedUID(35)},
		},
		steps: []step{exit(payload(instanceID(34), line(instanceID(34), "tenants", "unverified-victim", 35, 0))), sweep(time.Minute)},
	}
	// A restart-pending exit, then spot takes the instance: the restart
	// never happens, and after the window the Pod is lost.
	id = instanceID(36)
	s["restart-then-spot"] = scenario{steps: []step{
		exit(payload(id, line(id, "services", "restart-spot", 36, 1, func(l *exitline.Line) { l.WillRestart, l.BackoffSeconds = true, 10 }))),
		state(id, "shutting-down", time.Second), state(id, "terminated", 2*time.Second), sweep(4 * time.Minute),
	}}
	// A restart-pending exit, then the Pod is deleted: the instance is an
	// orphan.
	id = instanceID(37)
	s["restart-orphan"] = scenario{steps: []step{
		exit(payload(id, line(id, "services", "restart-orphan", 37, 1, func(l *exitline.Line) { l.WillRestart, l.BackoffSeconds = true, 10 }))),
		sweep(20 * time.Minute),
	}}
	// One good line and one that is not an exit line: what the metrics of
	// an invocation say.
	id = instanceID(40)
	s["metrics"] = scenario{steps: []step{exit(payload(id, line(id, "jobs", "job-metrics", 40, 0), "not an exit line"))}}
	// Input limits: one good line among lines whose fields are out of
	// bounds. A forged restart count must not shadow the real exit.
	id = instanceID(38)
	bad := func(m func(*exitline.Line)) string { return line(id, "jobs", "job-limits", 38, 0, m) }
	s["input-limits"] = scenario{steps: []step{exit(payload(id,
		bad(func(l *exitline.Line) { l.RestartCount = 2_000_000 }),
		bad(func(l *exitline.Line) { l.RestartCount, l.FinishedAt = 3, recordedAt.AddDate(10, 0, 0) }),
		bad(func(l *exitline.Line) { l.RestartCount, l.PodUID = 4, "not-a-uid" }),
		bad(func(l *exitline.Line) { l.RestartCount, l.Error = 5, strings.Repeat("x", 5000) }),
		bad(func(l *exitline.Line) { l.RestartCount, l.WillRestart, l.BackoffSeconds = 6, true, 900 }),
		bad(func(l *exitline.Line) { l.RestartCount, l.PodNamespace = 7, "Jobs" }),
		line(id, "jobs", "job-limits", 38, 0, func(l *exitline.Line) { l.RestartCount = 1 }),
	))}}
	return s
}

// state is an EC2 state-change event as EventBridge delivers it, at an
// offset from the recording's start.
func state(id, st string, at time.Duration) step {
	ev := replay.StateChangeEvent(eventID(id, st, at), id, st, recordedAt.Add(at))
	return step{function: "statechange", event: &ev}
}

// sweep is the schedule's event.
func sweep(at time.Duration) step {
	return step{function: "sweeper", event: &events.CloudWatchEvent{
		Version: "0", ID: eventID("sweep", "", at), DetailType: "Scheduled Event",
		Source: "aws.events", AccountID: "123456789012", Time: recordedAt.Add(at), Region: "us-east-1",
		Resources: []string{"arn:aws:events:us-east-1:123456789012:rule/reaper-sweep"}, Detail: json.RawMessage("{}"),
	}}
}

// eventID is a stable UUID-shaped id, as EventBridge gives every event.
func eventID(parts ...any) string {
	sum := sha256.Sum256(fmt.Append(nil, parts...))
	return fmt.Sprintf("%x-%x-%x-%x-%x", sum[0:4], sum[4:6], sum[6:8], sum[8:10], sum[10:16])
}
