package ledger

import (
	"errors"
	"fmt"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/reaper-k8s/reaper/pkg/model"
)

// The pending index spreads records over its shards, and Pending reads
// them all: every pending record once, and no settled one.
func TestPendingShards(t *testing.T) {
	ctx := t.Context()
	table := startTable(t, "pending")
	db := table.client

	pod := model.PodRef{Namespace: "jobs", Name: "train", UID: "00000000-0000-0000-0000-00000000000a"}
	want := map[string]bool{}
	for n := range 200 {
		id := fmt.Sprintf("i-%017x", n+1)
		rec, err := table.RecordExit(ctx, id, pod, "", model.Exit{Container: "main"})
		if err != nil {
			t.Fatal(err)
		}
		if rec.Pending != pendingValue(id) {
			t.Fatalf("%s: pending %q, want its shard %q", id, rec.Pending, pendingValue(id))
		}
		// Every fourth record is settled, every other one only marked.
		switch n % 4 {
		case 0:
			err = table.MarkDone(ctx, id, Done{PodSynced: "exit/0", Terminated: true, Settled: true, Version: rec.Version})
		case 1:
			err = table.MarkDone(ctx, id, Done{PodSynced: "exit/0"})
			want[id] = true
		default:
			want[id] = true
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	out, err := db.Scan(ctx, &dynamodb.ScanInput{TableName: aws.String("pending"), IndexName: aws.String(PendingIndex)})
	if err != nil {
		t.Fatal(err)
	}
	shards := map[string]int{}
	for _, item := range out.Items {
		shards[item[PendingAttribute].(*types.AttributeValueMemberS).Value]++
	}
	if len(shards) != pendingShards {
		t.Errorf("%d pending records on %d shards, want all %d: %v", len(want), len(shards), pendingShards, shards)
	}

	seen := map[string]int{}
	if err := table.Pending(ctx, func(rec Record) error {
		seen[rec.InstanceID]++
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for id := range want {
		if seen[id] != 1 {
			t.Errorf("%s: passed %d times, want once", id, seen[id])
		}
	}
	for id, n := range seen {
		if !want[id] {
			t.Errorf("%s: settled, passed %d times", id, n)
		}
	}

	// fn's error ends Pending and is its answer.
	stop := errors.New("stop")
	calls := 0
	if err := table.Pending(ctx, func(Record) error {
		calls++
		return stop
	}); !errors.Is(err, stop) || calls != 1 {
		t.Errorf("Pending with a failing fn: %v after %d calls, want %v after 1", err, calls, stop)
	}
}
