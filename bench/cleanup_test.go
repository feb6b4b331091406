package bench

import (
	"errors"
	"net/url"
	"testing"

	"golang.org/x/net/http2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// A delete the apiserver cut short, by its timeout or by resetting the
// HTTP/2 stream, is made again; any other error ends it.
func TestUntilDone(t *testing.T) {
	reset := &url.Error{Op: "Delete", URL: "https://apiserver/api/v1/namespaces/burst-1/events",
		Err: http2.StreamError{StreamID: 1, Code: http2.ErrCodeInternal}}
	timeout := apierrors.NewTimeoutError("deletecollection", 1)
	denied := apierrors.NewForbidden(schema.GroupResource{Resource: "events"}, "", errors.New("no"))
	for _, tc := range []struct {
		name  string
		errs  []error // one per call, then nil
		calls int
		fails bool
	}{
		{"done at once", nil, 1, false},
		{"stream reset, then done", []error{reset}, 2, false},
		{"timeouts, then done", []error{timeout, timeout}, 3, false},
		{"forbidden", []error{denied}, 1, true},
	} {
		calls := 0
		err := untilDone(func() error {
			calls++
			if calls <= len(tc.errs) {
				return tc.errs[calls-1]
			}
			return nil
		})
		if calls != tc.calls || (err != nil) != tc.fails {
			t.Errorf("%s: %d calls, %v; want %d calls, failing %v", tc.name, calls, err, tc.calls, tc.fails)
		}
	}
}
