package ledger

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/reaper-k8s/reaper/internal/labstack"
	"github.com/reaper-k8s/reaper/pkg/model"
)

// The Go form of the write rules (WithExit, WithState, WithDone) and the
// table's condition and update expressions must answer alike: random write
// sequences go to dynalite and through the rules, and after every write the
// two records must be the same, field for field. Writes carry an
// exit-token hash or none, and now and then another one: a record keeps
// the first it is given.
func TestRulesMatchTable(t *testing.T) {
	ctx := t.Context()
	table := startTable(t, "rules")
	clock := time.Date(2026, 12, 1, 12, 0, 0, 123456789, time.UTC)
	table.now = func() time.Time { return clock }

	rng := rand.New(rand.NewPCG(14, 2026))
	pods := []model.PodRef{
		{Namespace: "jobs", Name: "train", UID: "00000000-0000-0000-0000-00000000000a"},
		{Namespace: "jobs", Name: "train", UID: "00000000-0000-0000-0000-00000000000b"},
	}
	hashes := []string{"", "", model.ExitTokenHash("the-launch's-exit-token-0123456789abcdef"), model.ExitTokenHash("another-exit-token-0123456789abcdef")}
	states := []string{model.StatePending, model.StateRunning, model.StateStopping, model.StateStopped, model.StateShuttingDown, model.StateTerminated}
	applied := map[string]int{}
	for n := range 200 {
		id := fmt.Sprintf("i-%017x", n+1)
		var want Record
		// Every fourth record starts as an older version left it: one exit
		// in the attribute "exit" (LegacyExit), often with a restart count
		// above any the sequence writes.
		if n%4 == 0 {
			want = putLegacy(t, table, id, pods[rng.IntN(len(pods))], int32(rng.IntN(5)))
		}
		for step := range 8 {
			clock = clock.Add(time.Second)
			hash := hashes[rng.IntN(len(hashes))]
			var (
				got  Record
				op   string
				ok   bool
				werr error
			)
			switch rng.IntN(3) {
			case 0:
				pod := pods[rng.IntN(len(pods))]
				// Two containers: each one's exits follow the rules on
				// their own, and never touch the other's.
				exit := model.Exit{Container: []string{"main", "main", "side"}[rng.IntN(3)], ExitCode: rng.IntN(2), RestartCount: int32(rng.IntN(3)), WillRestart: rng.IntN(3) == 0,
					FinishedAt: clock.Add(-time.Minute)}
				op = fmt.Sprintf("exit %s %s rc=%d", pod.UID[len(pod.UID)-1:], exit.Container, exit.RestartCount)
				if prev, ok := want.ExitOf(exit.Container); ok && want.LegacyExit != nil && *want.LegacyExit == prev && prev.RestartCount > exit.RestartCount {
					op += " over a later exit of the older form"
				}
				got, werr = table.RecordExit(ctx, id, pod, hash, exit)
				want, ok = WithExit(want, id, pod, hash, exit, clock)
			case 1:
				state := states[rng.IntN(len(states))]
				// Few distinct times, so that equal times (ordered by
				// rank) come up.
				at := time.Date(2026, 12, 1, 11, 0, rng.IntN(3), 0, time.UTC)
				sc := StateChange{State: state, At: at, AddsNoWork: rng.IntN(4) == 0}
				var pod model.PodRef
				if rng.IntN(2) == 0 {
					pod = pods[rng.IntN(len(pods))]
				}
				op = fmt.Sprintf("state %s at %ds (adds no work: %v)", state, at.Second(), sc.AddsNoWork)
				got, werr = table.RecordState(ctx, id, pod, hash, sc)
				want, ok = WithState(want, id, pod, hash, sc, clock)
			default:
				d := Done{PodSynced: []string{"", "exit/0", model.OutcomeLost}[rng.IntN(3)], Terminated: rng.IntN(2) == 0,
					PodEnded: rng.IntN(2) == 0, PodEndedAt: clock.Add(-time.Duration(rng.IntN(3)) * time.Second),
					Refused: []string{"", "", "OperationNotPermitted"}[rng.IntN(3)],
					Settled: rng.IntN(2) == 0, Version: want.Version - int64(rng.IntN(2))}
				if rng.IntN(3) == 0 {
					d.Pod, d.ExitTokenHash = pods[rng.IntN(len(pods))], hash
				}
				op = fmt.Sprintf("done %+v", d)
				if werr = table.MarkDone(ctx, id, d); werr == nil {
					got, _, werr = table.Get(ctx, id)
				}
				want, ok = WithDone(want, id, d, clock), true
			}
			if werr != nil {
				t.Fatalf("%s step %d %s: %v", id, step, op, werr)
			}
			if hash != "" && ok {
				switch got.ExitTokenHash {
				case hash:
					applied["hash kept"]++
				default:
					applied["hash not replaced"]++
				}
			}
			if g, w := encode(t, got), encode(t, want); g != w {
				t.Fatalf("%s step %d %s: the table and the rules disagree\ntable %s\nrules %s", id, step, op, g, w)
			}
			applied[fmt.Sprint(op[:4], " ", ok)]++
			if strings.HasSuffix(op, "of the older form") {
				applied[fmt.Sprint("exit over the older form ", ok)]++
			}
		}
	}
	// Every kind of write both applied and not, or the comparison proved
	// little.
	for _, k := range []string{"exit true", "exit false", "exit over the older form true", "stat true", "stat false", "done true", "hash kept", "hash not replaced"} {
		if applied[k] < 5 {
			t.Errorf("only %d writes of kind %q: %v", applied[k], k, applied)
		}
	}
}

// A record as an older version left it, its one exit in the attribute
// "exit" (LegacyExit), loses no exit: the exit is read as its container's
// (Runs, ExitOf, Latest) beside the new form's, and, terminal, it is final
// for its Pod (FinalExit, the reconciler's check before a write). The
// write rules weigh the new form alone: an exit of the container written
// over it is its latest, whatever the restart counts, and the table and
// the rules agree.
func TestLegacyExit(t *testing.T) {
	ctx := t.Context()
	table := startTable(t, "legacy")
	clock := time.Date(2026, 12, 1, 12, 0, 0, 123456789, time.UTC)
	table.now = func() time.Time { return clock }
	podA := model.PodRef{Namespace: "jobs", Name: "train", UID: "00000000-0000-0000-0000-00000000000a"}
	podB := model.PodRef{Namespace: "jobs", Name: "train", UID: "00000000-0000-0000-0000-00000000000b"}

	// Pod A's main container ended at restart count 3 (exit code 1,
	// terminal), as an older version recorded it.
	before := putLegacy(t, table, "i-legacy", podA, 3)
	if main, ok := before.ExitOf("main"); !ok || main.RestartCount != 3 || len(before.Runs()) != 1 || before.Latest() == nil || *before.Latest() != main {
		t.Fatalf("record %+v: want its exit of the older form read as main's", before)
	}
	if !FinalExit(before, podA, "main") || FinalExit(before, podB, "main") || FinalExit(before, podA, "side") {
		t.Errorf("FinalExit of %+v: want final for Pod A's main container alone", before.LegacyExit)
	}

	for _, tc := range []struct {
		name string
		exit model.Exit
		runs []string // container and restart count of each run, in order
	}{
		{name: "same-container", exit: model.Exit{Container: "main", RestartCount: 0}, runs: []string{"main/0"}},
		{name: "other-container", exit: model.Exit{Container: "a-side", RestartCount: 0}, runs: []string{"a-side/0", "main/3"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := "i-legacy-" + tc.name
			before := putLegacy(t, table, id, podA, 3)
			got, err := table.RecordExit(ctx, id, podA, "", tc.exit)
			if err != nil {
				t.Fatal(err)
			}
			rules, applied := WithExit(before, id, podA, "", tc.exit, table.now())
			if !applied {
				t.Errorf("rules: the write does not apply")
			}
			for form, rec := range map[string]Record{"table": got, "rules": rules} {
				var runs []string
				for _, e := range rec.Runs() {
					runs = append(runs, fmt.Sprintf("%s/%d", e.Container, e.RestartCount))
				}
				if strings.Join(runs, " ") != strings.Join(tc.runs, " ") {
					t.Errorf("%s: runs %v, want %v", form, runs, tc.runs)
				}
			}
			if g, w := encode(t, got), encode(t, rules); g != w {
				t.Errorf("the table and the rules disagree\ntable %s\nrules %s", g, w)
			}
		})
	}
}

// startTable starts dynalite and creates the named ledger table in it.
func startTable(t *testing.T, name string) *Table {
	t.Helper()
	ctx := t.Context()
	stack, err := labstack.Start(ctx, labstack.Options{Parts: labstack.Dynamo})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stack.Stop)
	db := dynamodb.NewFromConfig(stack.AWSConfig(ctx))
	if err := CreateTable(ctx, db, name); err != nil {
		t.Fatal(err)
	}
	return New(db, name)
}

// putLegacy writes the record an older version left for an exit of pod's
// container "main" (exit code 1, terminal): the exit in the single
// attribute "exit", and returns it as the table reads it back.
func putLegacy(t *testing.T, table *Table, id string, pod model.PodRef, restartCount int32) Record {
	t.Helper()
	now := table.now().UTC()
	exit := model.Exit{Container: "main", ExitCode: 1, RestartCount: restartCount, FinishedAt: now.Add(-time.Minute), ReceivedAt: now}
	exitAV, err := attributevalue.Marshal(exit)
	if err != nil {
		t.Fatal(err)
	}
	podAV, err := attributevalue.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	item := map[string]types.AttributeValue{
		KeyAttribute:     &types.AttributeValueMemberS{Value: id},
		"exit":           exitAV,
		"pod":            podAV,
		"updatedAt":      timeAV(now),
		TTLAttribute:     expiry(now),
		PendingAttribute: &types.AttributeValueMemberS{Value: pendingValue(id)},
		"version":        &types.AttributeValueMemberN{Value: "1"},
	}
	if _, err := table.client.PutItem(t.Context(), &dynamodb.PutItemInput{TableName: &table.name, Item: item}); err != nil {
		t.Fatal(err)
	}
	rec, ok, err := table.Get(t.Context(), id)
	if err != nil || !ok || rec.LegacyExit == nil || *rec.LegacyExit != exit {
		t.Fatalf("%s: read back %+v, %v, %v", id, rec, ok, err)
	}
	return rec
}

func encode(t *testing.T, r Record) string {
	t.Helper()
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Adopt creates a record holding the Pod and the exit-token hash alone,
// and leaves one that exists as it is; the table and the rules agree.
func TestAdopt(t *testing.T) {
	ctx := t.Context()
	table := startTable(t, "adopt")
	clock := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	table.now = func() time.Time { return clock }
	pod := model.PodRef{Namespace: "jobs", Name: "train", UID: "00000000-0000-0000-0000-00000000000a"}
	hash := model.ExitTokenHash("the-launch's-exit-token-0123456789abcdef")
	got, err := table.Adopt(ctx, "i-00000000000000001", pod, hash)
	if err != nil {
		t.Fatal(err)
	}
	rules, applied := WithAdopt(Record{}, "i-00000000000000001", pod, hash, table.now())
	if g, w := encode(t, got), encode(t, rules); g != w || !applied || got.Pod != pod || got.ExitTokenHash != hash || got.Pending != "" || got.LastState != "" {
		t.Fatalf("new record: table %s, rules %s", g, w)
	}
	exited, err := table.RecordExit(ctx, "i-00000000000000002", pod, hash, model.Exit{Container: "main", ExitCode: 1})
	if err != nil {
		t.Fatal(err)
	}
	other := model.PodRef{Namespace: "jobs", Name: "other", UID: "00000000-0000-0000-0000-00000000000b"}
	got, err = table.Adopt(ctx, "i-00000000000000002", other, model.ExitTokenHash("another-exit-token-0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	if rules, applied := WithAdopt(exited, "i-00000000000000002", other, "", table.now()); applied || encode(t, got) != encode(t, exited) || encode(t, rules) != encode(t, exited) {
		t.Fatalf("existing record changed: %+v", got)
	}
}
