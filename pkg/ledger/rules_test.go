package ledger

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/reaper-k8s/reaper/internal/localstack"
	"github.com/reaper-k8s/reaper/pkg/model"
)

// The Go form of the write rules (WithExit, WithState, WithDone) and the
// table's condition and update expressions must answer alike: random write
// sequences go to dynalite and through the rules, and after every write the
// two records must be the same, field for field.
func TestRulesMatchTable(t *testing.T) {
	ctx := t.Context()
	stack, err := localstack.Start(ctx, localstack.Options{Parts: localstack.Dynamo})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stack.Stop)
	db := dynamodb.NewFromConfig(stack.AWSConfig(ctx))
	if err := CreateTable(ctx, db, "rules"); err != nil {
		t.Fatal(err)
	}
	table := New(db, "rules")
	clock := time.Date(2026, 12, 1, 12, 0, 0, 123456789, time.UTC)
	table.now = func() time.Time { return clock }

	rng := rand.New(rand.NewPCG(14, 2026))
	pods := []model.PodRef{
		{Namespace: "jobs", Name: "train", UID: "00000000-0000-0000-0000-00000000000a"},
		{Namespace: "jobs", Name: "train", UID: "00000000-0000-0000-0000-00000000000b"},
	}
	states := []string{model.StatePending, model.StateRunning, model.StateStopping, model.StateStopped, model.StateShuttingDown, model.StateTerminated}
	applied := map[string]int{}
	for n := range 120 {
		id := fmt.Sprintf("i-%017x", n+1)
		var want Record
		for step := range 8 {
			clock = clock.Add(time.Second)
			var (
				got  Record
				op   string
				ok   bool
				werr error
			)
			switch rng.IntN(3) {
			case 0:
				pod := pods[rng.IntN(len(pods))]
				exit := model.Exit{Container: "main", ExitCode: rng.IntN(2), RestartCount: int32(rng.IntN(3)), WillRestart: rng.IntN(3) == 0,
					FinishedAt: clock.Add(-time.Minute)}
				verified := rng.IntN(2) == 0
				op = fmt.Sprintf("exit %s rc=%d verified=%v", pod.UID[len(pod.UID)-1:], exit.RestartCount, verified)
				got, werr = table.RecordExit(ctx, id, pod, exit, verified)
				want, ok = WithExit(want, id, pod, exit, verified, clock)
			case 1:
				state := states[rng.IntN(len(states))]
				// Few distinct times, so that equal times (ordered by
				// rank) come up.
				at := time.Date(2026, 12, 1, 11, 0, rng.IntN(3), 0, time.UTC)
				sc := StateChange{State: state, At: at, Rank: model.StateRank(state), Gone: model.IsGone(state)}
				var pod model.PodRef
				if rng.IntN(2) == 0 {
					pod = pods[rng.IntN(len(pods))]
				}
				op = fmt.Sprintf("state %s at %ds", state, at.Second())
				got, werr = table.RecordState(ctx, id, pod, sc)
				want, ok = WithState(want, id, pod, sc, clock)
			default:
				d := Done{PodSynced: []string{"", "exit/0", model.OutcomeLost}[rng.IntN(3)], Terminated: rng.IntN(2) == 0,
					Settled: rng.IntN(2) == 0, Version: want.Version - int64(rng.IntN(2))}
				if rng.IntN(3) == 0 {
					d.Pod = pods[rng.IntN(len(pods))]
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
			if g, w := encode(t, got), encode(t, want); g != w {
				t.Fatalf("%s step %d %s: the table and the rules disagree\ntable %s\nrules %s", id, step, op, g, w)
			}
			applied[fmt.Sprint(op[:4], " ", ok)]++
		}
	}
	// Every kind of write both applied and not, or the comparison proved
	// little.
	for _, k := range []string{"exit true", "exit false", "stat true", "stat false", "done true"} {
		if applied[k] < 5 {
			t.Errorf("only %d writes of kind %q: %v", applied[k], k, applied)
		}
	}
}

func encode(t *testing.T, r Record) string {
	t.Helper()
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
