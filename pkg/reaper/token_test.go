package reaper

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/reaper-k8s/reaper/internal/fakes"
	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/model"
	"github.com/reaper-k8s/reaper/pkg/workqueue"
)

// The token holds after EC2 forgets the instance: the first write that
// records the instance with EC2's description at hand (the sweep's
// adoption, a state change, a restart line) keeps the hash of its
// exit-token tag on the record, and once EC2 no longer describes the
// instance a claim is checked against the record's hash: a line without
// the token, naming the record's Pod, is refused (token-mismatch) and
// writes nothing; the line with the token still ends the Pod.
func TestExitTokenAfterEC2Forgot(t *testing.T) {
	const token = "a-token-only-the-instances-own-host-knows-0123456789"
	hash := model.ExitTokenHash(token)
	id := instanceOf(1)
	withToken := func(m workqueue.Message) workqueue.Message {
		m.TokenHash = hash
		return m
	}
	restart := withToken(exitMsg(1, 1))
	restart.Exit.WillRestart = true
	for _, tc := range []struct {
		name   string
		record func(t *testing.T, core *Reaper)
	}{
		{name: "adopted by the sweep", record: func(t *testing.T, core *Reaper) {
			if _, err := core.Sweep(t.Context(), 15*time.Minute); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "a state change", record: func(t *testing.T, core *Reaper) {
			if _, err := core.HandleQueueEvent(t.Context(), batch(t, workqueue.State(id, model.StateRunning, testNow().Add(-time.Minute)))); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "a restart line", record: func(t *testing.T, core *Reaper) {
			if _, err := core.HandleQueueEvent(t.Context(), batch(t, restart)); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inst := owned(id, podOf(1))
			inst.ExitTokenHash, inst.LaunchTime = hash, testNow().Add(-time.Hour)
			w := fakes.NewWorld(inst)
			w.Pods[podOf(1)] = true
			core, l, _ := newBatchCore(w)
			var emf bytes.Buffer
			core.Metrics = metrics.New(slog.New(slog.NewJSONHandler(&emf, nil)), "Reaper", metrics.FunctionReconciler)
			tc.record(t, core)
			if rec := l.Recs[id]; rec.Pod != podOf(1) || rec.ExitTokenHash != hash {
				t.Fatalf("record %+v, want the Pod and the exit-token hash of the tags", rec)
			}

			delete(w.Instances, id) // EC2 forgot it
			w.Log = nil
			forged := exitMsg(1, 1)
			forged.Exit.RestartCount = 1
			if _, err := core.HandleQueueEvent(t.Context(), batch(t, forged)); err != nil {
				t.Fatal(err)
			}
			rec := l.Recs[id]
			if main, _ := rec.ExitOf("main"); countOf(t, emf.String(), metrics.LinesRejected, model.ReasonTokenMismatch) != 1 ||
				slices.ContainsFunc(w.Log, func(s string) bool { return strings.HasPrefix(s, "pod ") }) || main.RestartCount == 1 {
				t.Fatalf("the forged line: steps %q, record %+v, metrics %s: want it refused for its token, nothing written", w.Log, rec, emf.String())
			}
			if rec.ExitTokenHash != hash {
				t.Fatalf("record %+v lost its exit-token hash", rec)
			}

			real := withToken(exitMsg(1, 0))
			real.Exit.RestartCount = 1
			if _, err := core.HandleQueueEvent(t.Context(), batch(t, real)); err != nil {
				t.Fatal(err)
			}
			if main, _ := l.Recs[id].ExitOf("main"); !slices.Contains(w.Log, "pod jobs/job-1 exit/1") || main.RestartCount != 1 || main.ExitCode != 0 {
				t.Fatalf("steps %q, record %+v: want the Pod written from the line with the token", w.Log, l.Recs[id])
			}
		})
	}
}

// A line that carries an exit token for an instance EC2 describes without
// the exit-token tag (the provider wrote the hash under another key than
// the deployment reads) is believed, as for an instance launched without
// a token, and counted (ExitTokensUnexpected), once per claim; a line
// without a token for such an instance, and one with the token for an
// instance with the tag, are not.
func TestExitTokenUnexpected(t *testing.T) {
	const token = "a-token-only-the-instances-own-host-knows-0123456789"
	tagged := owned(instanceOf(2), podOf(2))
	tagged.ExitTokenHash = model.ExitTokenHash(token)
	w := fakes.NewWorld(owned(instanceOf(1), podOf(1)), tagged, owned(instanceOf(3), podOf(3)))
	w.Pods[podOf(1)], w.Pods[podOf(2)], w.Pods[podOf(3)] = true, true, true
	core, _, _ := newBatchCore(w)
	var emf, logs bytes.Buffer
	core.Metrics = metrics.New(slog.New(slog.NewJSONHandler(&emf, nil)), "Reaper", metrics.FunctionReconciler)
	core.Log = slog.New(slog.NewJSONHandler(&logs, nil))
	msgs := []workqueue.Message{exitMsg(1, 0), exitMsg(2, 0), exitMsg(3, 0)}
	for i := range msgs[:2] {
		msgs[i].TokenHash = model.ExitTokenHash(token)
	}
	if _, err := core.HandleQueueEvent(t.Context(), batch(t, msgs...)); err != nil {
		t.Fatal(err)
	}
	n := 0
	for line := range strings.Lines(emf.String()) {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatal(err)
		}
		if v, ok := m[metrics.ExitTokensUnexpected].(float64); ok {
			n += int(v)
		}
	}
	got := slices.Clone(w.Log[:3])
	slices.Sort(got)
	if want := []string{"pod jobs/job-1 exit/0", "pod jobs/job-2 exit/0", "pod jobs/job-3 exit/0"}; n != 1 || !slices.Equal(got, want) {
		t.Fatalf("%s %d, steps %q: want 1, every Pod written", metrics.ExitTokensUnexpected, n, w.Log)
	}
	if warned := strings.Count(logs.String(), `"msg":"exit token without an exit-token tag","instance":"`+instanceOf(1)+`"`); warned != 1 || !strings.Contains(logs.String(), `"level":"WARN","msg":"exit token without`) {
		t.Fatalf("logged %d warnings for %s, want 1:\n%s", warned, instanceOf(1), logs.String())
	}
}
