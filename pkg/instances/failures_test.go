package instances_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/smithy-go"

	"github.com/reaper-k8s/reaper/internal/ec2server"
	"github.com/reaper-k8s/reaper/pkg/instances"
	"github.com/reaper-k8s/reaper/pkg/model"
)

// verdict is what a front server does with one request.
type verdict int

const (
	// pass: the EC2 test server answers it.
	pass verdict = iota
	// fail: the EC2 test server answers it with an InternalError (500).
	fail
	// hold: no answer until the client gives up on it.
	hold
	// edited: the test server answers the form as decide left it.
	edited
)

// startFront starts an HTTP server in front of srv, on the wire between
// the SDK's client and the EC2 test server, and returns its URL. decide,
// shown the form of each request, says what becomes of it.
func startFront(t *testing.T, srv *ec2server.Server, decide func(url.Values) verdict) string {
	t.Helper()
	target, err := url.Parse(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		form, err := url.ParseQuery(string(body))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		switch decide(form) {
		case hold:
			select {
			case <-r.Context().Done():
			case <-time.After(time.Minute):
			}
			return
		case fail:
			// The client's calls are made one at a time: the fault
			// answers this very request.
			srv.FailNext(form.Get("Action"), 1, "InternalError", http.StatusInternalServerError)
		case edited:
			body = []byte(form.Encode())
			r.ContentLength = int64(len(body))
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	return front.URL
}

// names says whether a request's form names id (as an instance id or a
// filter value).
func names(form url.Values, id string) bool {
	for _, vs := range form {
		if slices.Contains(vs, id) {
			return true
		}
	}
	return false
}

// A DescribeInstances that fails costs its own chunk only: the chunks
// before and after it are described, and only the failed chunk's ids are
// Left, with its error. An instance EC2 no longer knows, in a chunk it
// answered, is answered and not Left.
func TestDescribeKeepsTheOtherChunks(t *testing.T) {
	const n, chunk = 1000, 200
	for _, failed := range []int{n/chunk - 1, 1} { // the last chunk, a middle one
		var failing atomic.Value // the id whose chunk fails
		fleet, srv, ids := newFleetBehind(t, 1, n, func(form url.Values) verdict {
			if id, _ := failing.Load().(string); form.Get("Action") == "DescribeInstances" && names(form, id) {
				return fail
			}
			return pass
		})
		fleet.Pace(model.PublishedBudget().Share(0.5), nil)
		failing.Store(ids[failed*chunk+chunk/2])
		gone := ids[(failed+1)%(n/chunk)*chunk] // in a chunk that is answered
		srv.RemoveInstance(gone)

		d := fleet.Describe(t.Context(), ids)
		lost := ids[failed*chunk : (failed+1)*chunk]
		if len(d.Left) != chunk {
			t.Fatalf("chunk %d failing: %d left, want its %d", failed, len(d.Left), chunk)
		}
		for _, id := range lost {
			var ae smithy.APIError
			if err := d.Left[id]; !errors.As(err, &ae) || ae.ErrorCode() != "InternalError" || errors.Is(err, instances.ErrNoTokens) {
				t.Fatalf("%s left with %v, want its chunk's InternalError", id, err)
			}
			if answered(d, id) {
				t.Fatalf("%s answered", id)
			}
		}
		for _, id := range ids {
			if slices.Contains(lost, id) || id == gone {
				continue
			}
			if !d.Found[id].Owned || !answered(d, id) {
				t.Fatalf("chunk %d failing: %s not found", failed, id)
			}
		}
		if _, found := d.Found[gone]; found || !answered(d, gone) {
			t.Fatalf("%s, which EC2 no longer knows: found %v, answered %v", gone, found, answered(d, gone))
		}
		// One a chunk, and one that asks for the gone instance by id.
		if c := srv.CallCount("DescribeInstances"); c != n/chunk+1 {
			t.Fatalf("%d DescribeInstances requests, want one a chunk (%d) and one by id", c, n/chunk)
		}
	}
}

// A TerminateInstances that fails for a reason that is not about its
// instances (an outage) leaves its ids and those after it Left with its
// error; what was decided before stays decided.
func TestTerminateKeepsWhatItDecided(t *testing.T) {
	const n = 1500
	var failing atomic.Value // the id whose call fails
	fleet, srv, ids := newFleetBehind(t, 100, n, func(form url.Values) verdict {
		if id, _ := failing.Load().(string); form.Get("Action") == "TerminateInstances" && names(form, id) {
			return fail
		}
		return pass
	})
	fleet.Pace(scaled(100).Share(0.5), nil) // calls of 500
	known := describeAll(t, fleet, ids)
	failing.Store(ids[700]) // in the second call
	protected := ids[10]
	srv.RemoveInstance(protected)
	srv.AddInstance(ec2server.Instance{ID: protected, DisableAPITermination: true, Tags: map[string]string{model.DefaultTagKeys().Managed: "true", model.DefaultTagKeys().Cluster: cluster}})
	foreign := ids[1200]
	i := known[foreign]
	i.Owned = false
	known[foreign] = i

	res := fleet.Terminate(t.Context(), ids, known)
	for _, id := range ids[:500] {
		want := instances.Terminating
		if id == protected {
			want = instances.Refused
		}
		if res.Outcome[id] != want {
			t.Fatalf("%s: %q, want %q", id, res.Outcome[id], want)
		}
	}
	if res.Refusals[protected] != "OperationNotPermitted" {
		t.Fatalf("refusals %v", res.Refusals)
	}
	if res.Outcome[foreign] != instances.NotOwned {
		t.Fatalf("%s of another cluster: %q", foreign, res.Outcome[foreign])
	}
	var rest []string
	for _, id := range ids[500:] {
		if id != foreign {
			rest = append(rest, id)
		}
	}
	if len(res.Left) != len(rest) {
		t.Fatalf("%d left, want the %d of the failed call and after", len(res.Left), len(rest))
	}
	for _, id := range rest {
		var ae smithy.APIError
		if err := res.Left[id]; !errors.As(err, &ae) || ae.ErrorCode() != "InternalError" || errors.Is(err, instances.ErrNoTokens) {
			t.Fatalf("%s left with %v, want the call's InternalError", id, err)
		}
	}
	wantRunning(t, srv, true, rest)
}

// A call the context's deadline cuts is not EC2 refusing it, whether the
// deadline comes while EC2 has yet to answer or while the SDK waits to
// retry a failed attempt: the pacer keeps its tokens (the next call
// starts at once, where after a refusal it would wait for a refill), and
// the ids are Left with an error wrapping context.DeadlineExceeded, not
// ErrNoTokens.
func TestDeadlineIsNotThrottling(t *testing.T) {
	const n = 100
	// The SDK waits longer to retry than any deadline here.
	slowRetries := func(o *ec2.Options) {
		o.Retryer = retry.NewStandard(func(o *retry.StandardOptions) {
			o.MaxAttempts = 2
			o.Backoff = retry.BackoffDelayerFunc(func(int, error) (time.Duration, error) { return time.Minute, nil })
		})
	}
	cuts := []struct {
		name string
		// what the front server does with the calls the deadline cuts
		verdict verdict
	}{{"in flight", hold}, {"waiting to retry", fail}}
	for _, action := range []string{"DescribeInstances", "TerminateInstances"} {
		for _, cut := range cuts {
			t.Run(action+" "+cut.name, func(t *testing.T) {
				var cutting atomic.Bool
				fleet, srv, ids := newFleetBehind(t, 1, n, func(form url.Values) verdict {
					if cutting.Load() && form.Get("Action") == action {
						return cut.verdict
					}
					return pass
				}, slowRetries)
				// After a refusal the next token of either request
				// bucket is two seconds away: a call due within a second
				// would not be made.
				budget := model.PublishedBudget()
				budget.Describe = model.Bucket{Capacity: 5, Refill: 0.5}
				budget.Terminate = model.Bucket{Capacity: 5, Refill: 0.5}
				fleet.Pace(budget, nil)
				known := describeAll(t, fleet, ids)
				call := func(ctx context.Context) map[string]error {
					if action == "DescribeInstances" {
						return fleet.Describe(ctx, ids).Left
					}
					return fleet.Terminate(ctx, ids, known).Left
				}

				cutting.Store(true)
				ctx, cancel := context.WithTimeout(t.Context(), 1500*time.Millisecond)
				left := call(ctx)
				cancel()
				wantLeft(t, left, ids, context.DeadlineExceeded)
				for id, err := range left {
					if errors.Is(err, instances.ErrNoTokens) {
						t.Fatalf("%s left with %v: a deadline taken for no tokens", id, err)
					}
				}
				wantRunning(t, srv, true, ids)

				cutting.Store(false)
				ctx, cancel = context.WithTimeout(t.Context(), 1200*time.Millisecond)
				defer cancel()
				if left := call(ctx); len(left) != 0 {
					t.Fatalf("the call after the deadline: %d left (%v), want none: the pacer was drained", len(left), firstLeft(left))
				}
				if action == "TerminateInstances" {
					wantRunning(t, srv, false, ids)
				}
			})
		}
	}
}

// EC2's filtered answers are eventually consistent: a running instance
// left out of one is asked for by id and found, not taken for unknown;
// one EC2 does not know is confirmed unknown by the same call.
func TestDescribeConfirmsByID(t *testing.T) {
	var late atomic.Value // the id the filtered answer leaves out
	fleet, srv, ids := newFleetBehind(t, 1, 10, func(form url.Values) verdict {
		id, _ := late.Load().(string)
		if form.Get("Action") != "DescribeInstances" || form.Get("Filter.1.Name") != "instance-id" || !names(form, id) {
			return pass
		}
		for k, vs := range form {
			if strings.HasPrefix(k, "Filter.1.Value.") && vs[0] == id {
				form[k] = []string{"i-00000000000000000"}
			}
		}
		return edited
	})
	late.Store(ids[3])
	gone := ids[7]
	srv.RemoveInstance(gone)
	d := fleet.Describe(t.Context(), ids)
	if inst, ok := d.Found[ids[3]]; !ok || !inst.Owned {
		t.Fatalf("%s, left out of the filtered answer: found %v, want it found by id", ids[3], ok)
	}
	if _, found := d.Found[gone]; found || !answered(d, gone) || len(d.Left) != 0 {
		t.Fatalf("%s: found %v, answered %v, left %v: want it confirmed unknown", gone, found, answered(d, gone), d.Left)
	}
	if c := srv.CallCount("DescribeInstances"); c != 3 {
		t.Fatalf("%d DescribeInstances requests, want 3: the filtered one, by id, by id without the unknown one", c)
	}
}
