package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
)

// A read the table refuses in part is asked again after a wait that
// doubles, and only for the keys left unprocessed, until every record is
// read.
func TestGetManyBacksOffOnUnprocessedKeys(t *testing.T) {
	srv := startBatchGetServer(t, 3)
	ids := []string{"i-1", "i-2", "i-3", "i-4", "i-5"}
	got, err := srv.table.GetMany(t.Context(), ids)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if got[id].InstanceID != id {
			t.Errorf("%s: not read: %v", id, got)
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
// context ends, and the context's error is GetMany's answer.
func TestGetManyUnprocessedUntilDeadline(t *testing.T) {
	srv := startBatchGetServer(t, -1)
	const deadline = 300 * time.Millisecond
	ctx, cancel := context.WithTimeout(t.Context(), deadline)
	defer cancel()
	start := time.Now()
	_, err := srv.table.GetMany(ctx, []string{"i-1", "i-2"})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("GetMany: %v, want the deadline's error", err)
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

// batchGetServer answers BatchGetItem in DynamoDB's JSON protocol, to the
// SDK's client: a record for the first key it is asked for and every other
// key as unprocessed, for its first holdBack answers, then a record for
// every key. With a negative holdBack every key stays unprocessed.
type batchGetServer struct {
	table *Table

	mu       sync.Mutex
	holdBack int
	arrivals []time.Time
	asked    [][]string
}

// keysAndAttributes is BatchGetItem's KeysAndAttributes, for string keys.
type keysAndAttributes struct {
	Keys           []map[string]map[string]string
	ConsistentRead bool
}

func startBatchGetServer(t *testing.T, holdBack int) *batchGetServer {
	t.Helper()
	s := &batchGetServer{holdBack: holdBack}
	ts := httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(ts.Close)
	client := dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider("AKIDTEST", "secret", ""),
		BaseEndpoint: aws.String(ts.URL),
	})
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
