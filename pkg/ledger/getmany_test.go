package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// A read the table refuses in part is asked again after a wait that
// doubles, and only for the keys left unprocessed, until every record is
// read.
func TestGetManyBacksOffOnUnprocessedKeys(t *testing.T) {
	srv := startBatchGetServer(t, 3)
	ids := []string{"i-1", "i-2", "i-3", "i-4", "i-5"}
	got := srv.table.GetMany(t.Context(), ids)
	if len(got.Left) != 0 {
		t.Fatalf("left %v", got.Left)
	}
	for _, id := range ids {
		if got.Found[id].InstanceID != id {
			t.Errorf("%s: not read: %v", id, got.Found)
		}
	}

	srv.mu.Lock()
	defer srv.mu.Unlock()
	want := [][]string{ids, ids[1:], ids[2:], ids[3:]}
	if fmt.Sprint(srv.asked) != fmt.Sprint(want) {
		t.Fatalf("requests asked for %v, want %v", srv.asked, want)
	}
	// Each wait is jittered within [w/2, w), w doubling from
	// unprocessedFirstWait.
	wait := unprocessedFirstWait
	for i := 1; i < len(srv.arrivals); i++ {
		if gap := srv.arrivals[i].Sub(srv.arrivals[i-1]); gap < wait/2 {
			t.Errorf("request %d came %v after the one before, want at least %v", i+1, gap, wait/2)
		}
		wait *= 2
	}
}

// Keys the table keeps refusing are asked for only a few times before the
// context ends, and are Left with the context's error.
func TestGetManyUnprocessedUntilDeadline(t *testing.T) {
	srv := startBatchGetServer(t, -1)
	const deadline = 300 * time.Millisecond
	ctx, cancel := context.WithTimeout(t.Context(), deadline)
	defer cancel()
	start := time.Now()
	got := srv.table.GetMany(ctx, []string{"i-1", "i-2"})
	if len(got.Found) != 0 || len(got.Left) != 2 {
		t.Errorf("GetMany: %d found, %d left, want both left", len(got.Found), len(got.Left))
	}
	for id, err := range got.Left {
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s left with %v, want the deadline's error", id, err)
		}
	}
	if took := time.Since(start); took > deadline+200*time.Millisecond {
		t.Errorf("GetMany returned %v after its deadline of %v", took, deadline)
	}
	// The shortest waits (25, 50, 100, 200 ms) leave time for at most 4
	// requests in 300 ms.
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if n := len(srv.arrivals); n > 4 || n < 2 {
		t.Errorf("%d requests before the deadline, want 2 to 4", n)
	}
}

// One BatchGetItem chunk that fails (the SDK's retries spent) among fifty
// costs the 100 ids of that chunk only: the other 4,900 records are read,
// and the chunk's ids are Left with its error.
func TestGetManyFailedChunkCostsItsOwnIDs(t *testing.T) {
	const n = 5000
	// Three attempts: the failing chunk spends them all, and a request
	// the machine drops under load is retried, as in production.
	srv := startBatchGetServer(t, 0, func(o *dynamodb.Options) { o.RetryMaxAttempts = 3 })
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("i-%017x", i)
	}
	failed := ids[2300:2400]
	srv.mu.Lock()
	srv.failKey = ids[2345]
	srv.mu.Unlock()

	got := srv.table.GetMany(t.Context(), ids)
	if len(got.Found) != n-len(failed) || len(got.Left) != len(failed) {
		for id, err := range got.Left {
			if !slices.Contains(failed, id) {
				t.Logf("%s left with %v", id, err)
				break
			}
		}
		t.Fatalf("%d found, %d left: want %d found, the failed chunk's %d left", len(got.Found), len(got.Left), n-len(failed), len(failed))
	}
	for _, id := range failed {
		var throttled *types.ProvisionedThroughputExceededException
		if err := got.Left[id]; !errors.As(err, &throttled) {
			t.Fatalf("%s left with %v, want its chunk's error", id, err)
		}
	}
	for _, id := range slices.Concat(ids[:2300], ids[2400:]) {
		if got.Found[id].InstanceID != id {
			t.Fatalf("%s not read", id)
		}
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	failedAsks := 0
	for _, asked := range srv.asked {
		if slices.Contains(asked, srv.failKey) {
			failedAsks++
		}
	}
	if failedAsks != 3 || len(srv.asked)-failedAsks < n/batchGetLimit-1 {
		t.Fatalf("%d requests, %d of the failing chunk: want its 3 attempts and the other %d chunks", len(srv.asked), failedAsks, n/batchGetLimit-1)
	}
}

// batchGetServer answers BatchGetItem in DynamoDB's JSON protocol, to the
// SDK's client: a record for the first key it is asked for and every other
// key as unprocessed, for its first holdBack answers, then a record for
// every key. With a negative holdBack every key stays unprocessed. A
// request naming failKey is refused whole with
// ProvisionedThroughputExceededException.
type batchGetServer struct {
	table *Table

	mu       sync.Mutex
	holdBack int
	failKey  string
	arrivals []time.Time
	asked    [][]string
}

// keysAndAttributes is BatchGetItem's KeysAndAttributes, for string keys.
type keysAndAttributes struct {
	Keys           []map[string]map[string]string
	ConsistentRead bool
}

func startBatchGetServer(t *testing.T, holdBack int, optFns ...func(*dynamodb.Options)) *batchGetServer {
	t.Helper()
	s := &batchGetServer{holdBack: holdBack}
	ts := httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(ts.Close)
	client := dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider("AKIDTEST", "secret", ""),
		BaseEndpoint: aws.String(ts.URL),
	}, optFns...)
	s.table = New(client, "ledger")
	return s
}

func (s *batchGetServer) serve(w http.ResponseWriter, r *http.Request) {
	var in struct{ RequestItems map[string]keysAndAttributes }
	if target := r.Header.Get("X-Amz-Target"); target != "DynamoDB_20120810.BatchGetItem" {
		http.Error(w, "unexpected "+target, http.StatusBadRequest)
		return
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	req, ok := in.RequestItems["ledger"]
	if !ok || len(in.RequestItems) != 1 || !req.ConsistentRead || len(req.Keys) == 0 {
		http.Error(w, fmt.Sprintf("unexpected request %+v", in), http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	s.arrivals = append(s.arrivals, time.Now())
	var ids []string
	for _, k := range req.Keys {
		ids = append(ids, k[KeyAttribute]["S"])
	}
	s.asked = append(s.asked, ids)
	if slices.Contains(ids, s.failKey) {
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		w.WriteHeader(http.StatusBadRequest)
		w.Write([]byte(`{"__type":"com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException","message":"The level of configured provisioned throughput for the table was exceeded."}`))
		return
	}
	answer, unprocessed := req.Keys, []map[string]map[string]string(nil)
	switch {
	case s.holdBack < 0:
		answer, unprocessed = nil, req.Keys
	case s.holdBack > 0:
		answer, unprocessed = req.Keys[:1], req.Keys[1:]
		s.holdBack--
	}
	s.mu.Unlock()

	out := map[string]any{"Responses": map[string]any{"ledger": answer}}
	if len(unprocessed) > 0 {
		out["UnprocessedKeys"] = map[string]keysAndAttributes{"ledger": {Keys: unprocessed, ConsistentRead: true}}
	}
	body, err := json.Marshal(out)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/x-amz-json-1.0")
	w.Write(body)
}
