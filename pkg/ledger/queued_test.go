package ledger

import (
	"testing"
	"time"

	"github.com/reaper-k8s/reaper/pkg/model"
)

// ExitQueued makes the record of an instance the ledger did not know with
// the queued claim's time alone, keeps the later of two times, and leaves
// what the record knows as it is; the table and WithExitQueued agree.
func TestExitQueued(t *testing.T) {
	table := startTable(t, "reaper-exit-queued")
	ctx := t.Context()
	const id = "i-0000000000000e001"
	at := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	var want Record
	for _, until := range []time.Time{at.Add(2 * time.Minute), at.Add(time.Minute), at.Add(5 * time.Minute)} {
		if err := table.ExitQueued(ctx, id, until); err != nil {
			t.Fatal(err)
		}
		want, _ = WithExitQueued(want, id, until, at)
		got, ok, err := table.Get(ctx, id)
		if err != nil || !ok {
			t.Fatalf("get: %v, %v", ok, err)
		}
		if !got.ExitQueuedUntil.Equal(want.ExitQueuedUntil) || got.Pod != (model.PodRef{}) || got.Pending != "" || len(got.Runs()) > 0 {
			t.Fatalf("after ExitQueued(%v): %+v, want the later time %v and nothing else", until, got, want.ExitQueuedUntil)
		}
	}
	if err := (ReadOnly{Table: table}).ExitQueued(ctx, "i-0000000000000e002", at); err != nil {
		t.Fatal(err)
	}
	if rec, ok, err := table.Get(ctx, "i-0000000000000e002"); ok || err != nil {
		t.Fatalf("a dry run wrote %+v (%v)", rec, err)
	}
	pod := model.PodRef{Namespace: "jobs", Name: "job-1", UID: "uid-1"}
	if _, err := table.RecordExit(ctx, id, pod, "", model.Exit{Container: "main", ExitCode: 3, FinishedAt: at}); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := table.Get(ctx, id); got.Latest() == nil || got.Latest().ExitCode != 3 || got.Pod != pod || !got.ExitQueuedUntil.Equal(want.ExitQueuedUntil) {
		t.Fatalf("after the claim's exit: %+v", got)
	}
}
