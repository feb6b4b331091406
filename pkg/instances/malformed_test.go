package instances_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"

	"github.com/reaper-k8s/reaper/internal/ec2server"
	"github.com/reaper-k8s/reaper/internal/sqsserver"
	"github.com/reaper-k8s/reaper/pkg/instances"
	"github.com/reaper-k8s/reaper/pkg/model"
)

// malformedIDs are ids EC2 would not take: "i-" and 10 and 16 hex digits
// (it takes 8 or 17).
var malformedIDs = []string{"i-0123456789", "i-0123456789abcdef"}

// lateFleet is a Fleet of n owned instances on a fresh EC2 test server,
// reached through a front server that leaves the instance late out of
// every filtered DescribeInstances answer, as EC2's eventually consistent
// answers do for a new instance. With unnamed, the front server also takes
// the id out of every InvalidInstanceID.Malformed message.
func lateFleet(t *testing.T, n int, unnamed bool) (fleet *instances.Fleet, srv *ec2server.Server, ids []string, late string) {
	t.Helper()
	srv = ec2server.New()
	t.Cleanup(srv.Close)
	keys := model.DefaultTagKeys()
	for range n {
		ids = append(ids, srv.AddInstance(ec2server.Instance{Tags: map[string]string{keys.Managed: "true", keys.Cluster: cluster}}).ID)
	}
	late = ids[n/2]
	quoted := regexp.MustCompile(`Invalid id: [^<]*`)
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
		for k, vs := range form {
			if strings.HasPrefix(k, "Filter.1.Value.") && vs[0] == late {
				form[k] = []string{"i-00000000000000000"}
			}
		}
		resp, err := http.Post(srv.URL(), "application/x-www-form-urlencoded; charset=utf-8", strings.NewReader(form.Encode()))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		out, err := io.ReadAll(resp.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		if unnamed {
			out = quoted.ReplaceAll(out, []byte("Invalid id."))
		}
		w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(out)
	}))
	t.Cleanup(front.Close)
	client := ec2.New(ec2.Options{
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider("AKIDTEST", "secret", ""),
		BaseEndpoint: aws.String(front.URL),
		HTTPClient:   &http.Client{Transport: sqsserver.BufferedBodies{}},
		Retryer:      retry.NewStandard(func(o *retry.StandardOptions) { o.MaxAttempts = 1 }),
	})
	return instances.NewFleet(client, keys, cluster), srv, ids, late
}

// byID are the ids of the by-id DescribeInstances calls srv answered, in
// order, with the error code of each ("" for an answer).
func byID(srv *ec2server.Server) (calls [][]string, codes []string) {
	for _, c := range srv.Calls() {
		if c.Action == "DescribeInstances" && len(c.InstanceIDs) > 0 {
			calls, codes = append(calls, c.InstanceIDs), append(codes, c.ErrorCode)
		}
	}
	return calls, codes
}

// wantConfirmed checks that every id of a Describe got its answer despite
// the malformed ids among them: the instances described, late one
// included, found; gone and the malformed ids answered unknown; none Left.
func wantConfirmed(t *testing.T, d instances.Described, ids []string, gone string) {
	t.Helper()
	if len(d.Left) != 0 {
		t.Fatalf("left %v, want every id answered", d.Left)
	}
	for _, id := range ids {
		_, found := d.Found[id]
		if want := id != gone; found != want || !answered(d, id) {
			t.Fatalf("%s: found %v, answered %v, want found %v and answered", id, found, answered(d, id), want)
		}
	}
	for _, id := range append([]string{gone}, malformedIDs...) {
		if _, found := d.Found[id]; found || !answered(d, id) {
			t.Fatalf("%s: found %v, answered %v, want it answered unknown", id, found, answered(d, id))
		}
	}
}

// EC2 answers InvalidInstanceID.Malformed for a whole by-id
// DescribeInstances naming one id it would not take, where an instance-id
// filter simply does not match it. Such an id among the ids a filtered
// answer left out costs itself only: the ids EC2's message names are
// answered unknown and the others asked again, so the instance EC2 did not
// list yet is still found, and the one it does not know still confirmed
// unknown.
func TestConfirmSplitsOffMalformedIDs(t *testing.T) {
	fleet, srv, ids, late := lateFleet(t, 10, false)
	gone := ids[7]
	srv.RemoveInstance(gone)
	d := fleet.Describe(t.Context(), slices.Concat(ids, malformedIDs))
	wantConfirmed(t, d, ids, gone)
	calls, codes := byID(srv)
	want := [][]string{
		{late, gone, malformedIDs[0], malformedIDs[1]},
		{late, gone, malformedIDs[1]},
		{late, gone},
		{late},
	}
	wantCodes := []string{"InvalidInstanceID.Malformed", "InvalidInstanceID.Malformed", "InvalidInstanceID.NotFound", ""}
	if !slices.EqualFunc(calls, want, slices.Equal) || !slices.Equal(codes, wantCodes) {
		t.Fatalf("by-id calls %v answered %q, want %v answered %q: each malformed id named by EC2 dropped", calls, codes, want, wantCodes)
	}
}

// An InvalidInstanceID.Malformed whose message names none of the call's
// ids splits the call in halves until each malformed id is asked alone:
// every other id still gets its answer.
func TestConfirmBisectsAnUnnamedMalformedID(t *testing.T) {
	fleet, srv, ids, late := lateFleet(t, 10, true)
	gone := ids[7]
	srv.RemoveInstance(gone)
	d := fleet.Describe(t.Context(), slices.Concat(ids, malformedIDs))
	wantConfirmed(t, d, ids, gone)
	calls, codes := byID(srv)
	for _, id := range append([]string{late}, malformedIDs...) {
		alone := slices.IndexFunc(calls, func(c []string) bool { return slices.Equal(c, []string{id}) })
		if alone < 0 {
			t.Fatalf("by-id calls %v: %s never asked alone", calls, id)
		}
		if wantCode := map[bool]string{true: "InvalidInstanceID.Malformed", false: ""}[id != late]; codes[alone] != wantCode {
			t.Fatalf("%s asked alone: answered %q, want %q", id, codes[alone], wantCode)
		}
	}
	if len(calls) > 8 {
		t.Fatalf("%d by-id calls for 4 ids: %v", len(calls), calls)
	}
}

// answered says whether EC2 answered for id, one of the ids the Describe
// was given: described it, or described its chunk without it (EC2 does
// not know it). Every one of those is either answered or Left.
func answered(d instances.Described, id string) bool {
	_, left := d.Left[id]
	return !left
}
