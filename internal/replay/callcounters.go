package replay

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/reaper-k8s/reaper/internal/callrecord"
)

// OperationCounter is a reverse proxy in front of an AWS JSON-protocol
// endpoint (dynalite) that counts the requests by operation, the action of
// their X-Amz-Target header ("DynamoDB_20120810.UpdateItem" counts as
// UpdateItem). Point a client's endpoint at URL.
type OperationCounter struct {
	srv *httptest.Server
	// calls notes each request as it arrives, before it is forwarded: its
	// operation and time, not its answer.
	calls callrecord.Record[callrecord.Call]
}

// NewOperationCounter starts a counting proxy for target.
func NewOperationCounter(target string) (*OperationCounter, error) {
	u, err := url.Parse(target)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("proxy target %q: not a URL", target)
	}
	c := &OperationCounter{}
	proxy := forwardTo(u)
	c.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		target := r.Header.Get("X-Amz-Target")
		c.calls.Add(callrecord.Call{Action: target[strings.LastIndexByte(target, '.')+1:], Time: time.Now()})
		proxy.ServeHTTP(w, r)
	}))
	return c, nil
}

// forwardTo is a reverse proxy to u with enough idle connections for every
// client at once: the default two would open and close a connection for
// most requests.
func forwardTo(u *url.URL) *httputil.ReverseProxy {
	proxy := httputil.NewSingleHostReverseProxy(u)
	proxy.Transport = &http.Transport{MaxIdleConnsPerHost: 256, IdleConnTimeout: time.Minute}
	return proxy
}

// URL is the proxy's endpoint.
func (c *OperationCounter) URL() string { return c.srv.URL }

// Counts returns the requests by operation since the start or Reset.
func (c *OperationCounter) Counts() map[string]int { return c.calls.Counts() }

// Reset forgets the counts.
func (c *OperationCounter) Reset() { c.calls.Reset() }

// Close stops the proxy.
func (c *OperationCounter) Close() { c.srv.Close() }

// ec2Recorder is a reverse proxy in front of the EC2 test server that notes
// each request's SDK invocation id (amz-sdk-invocation-id), which the SDK
// gives an operation and keeps across its retries. The test server's log
// counts attempts; the recorder tells operations apart: against a server
// this fast the SDK now and then loses an answer that was sent (see
// sqsserver.BufferedBodies) and retries an operation that had succeeded.
type ec2Recorder struct {
	srv   *httptest.Server
	calls callrecord.Record[ec2Call]
}

// ec2Call is one request as the recorder saw it, noted once answered.
type ec2Call struct {
	callrecord.Call
	invocation string
	instances  []string
	status     int
}

// throttled says EC2 refused the call for the rate of requests (the EC2
// test server's buckets).
func throttled(c callrecord.Call) bool { return c.ErrorCode == "RequestLimitExceeded" }

func newEC2Recorder(target string) *ec2Recorder {
	u, _ := url.Parse(target)
	proxy := forwardTo(u)
	rec := &ec2Recorder{}
	rec.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived := time.Now()
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		form, _ := url.ParseQuery(string(body))
		call := ec2Call{Call: callrecord.Call{Action: form.Get("Action"), Time: arrived}, invocation: r.Header.Get("Amz-Sdk-Invocation-Id")}
		for k, v := range form {
			if strings.HasPrefix(k, "InstanceId.") {
				call.instances = append(call.instances, v...)
			}
		}
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		proxy.ServeHTTP(sw, r)
		call.status, call.ErrorCode = sw.status, errorCode(sw.errorBody)
		rec.calls.Add(call)
	}))
	return rec
}

func (r *ec2Recorder) reset() { r.calls.Reset() }

// requests returns, since the last reset, the requests by action and
// those answered RequestLimitExceeded.
func (r *ec2Recorder) requests() (requests, refused map[string]int) {
	return r.calls.Counts(), r.calls.CountsFunc(func(c ec2Call) bool { return throttled(c.Call) })
}

// operations returns, since the last reset, the requests by action that
// retried an operation already seen, and per instance the successful
// TerminateInstances operations that named it.
func (r *ec2Recorder) operations() (retried, terminates map[string]int) {
	calls := r.calls.Calls()
	retried = map[string]int{}
	seen := map[string]bool{}
	for _, c := range calls {
		if c.invocation != "" && seen[c.invocation] {
			retried[c.Action]++
		}
		seen[c.invocation] = true
	}
	return retried, terminatesAnswered(calls, http.StatusOK)
}

// terminates counts, since the last reset, per instance the
// TerminateInstances operations naming it that were answered status at
// least once: the SDK's retries of an operation (one invocation id) are
// one operation.
func (r *ec2Recorder) terminates(status int) map[string]int {
	return terminatesAnswered(r.calls.Calls(), status)
}

// terminateNamed is, since the last reset, the instances named in a
// TerminateInstances request, whatever its answer.
func (r *ec2Recorder) terminateNamed() map[string]bool {
	out := map[string]bool{}
	for _, c := range r.calls.Calls() {
		if c.Action == "TerminateInstances" {
			for _, id := range c.instances {
				out[id] = true
			}
		}
	}
	return out
}

func terminatesAnswered(calls []ec2Call, status int) map[string]int {
	out := map[string]int{}
	counted := map[[2]string]bool{}
	for _, c := range calls {
		if c.Action != "TerminateInstances" || c.status != status {
			continue
		}
		for _, id := range c.instances {
			if k := [2]string{c.invocation, id}; !counted[k] {
				counted[k] = true
				out[id]++
			}
		}
	}
	return out
}

// statusWriter keeps the status code of the response it writes, and the
// body of an error.
type statusWriter struct {
	http.ResponseWriter
	status    int
	errorBody []byte
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

// maxErrorBody bounds what statusWriter keeps of an error's body: EC2's
// error responses are a few hundred bytes.
const maxErrorBody = 4096

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status >= 400 && len(w.errorBody) < maxErrorBody {
		w.errorBody = append(w.errorBody, p[:min(len(p), maxErrorBody-len(w.errorBody))]...)
	}
	return w.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// requestCounter is an http.RoundTripper that counts AWS query-protocol
// requests (EC2's) by action, and those answered RequestLimitExceeded, on
// the client's side: only the requests that got an answer count.
type requestCounter struct {
	next  http.RoundTripper
	calls callrecord.Record[callrecord.Call]
}

func (c *requestCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	call := callrecord.Call{Time: time.Now()}
	if r.Body != nil {
		body, err := io.ReadAll(r.Body)
		r.Body.Close()
		if err != nil {
			return nil, err
		}
		form, _ := url.ParseQuery(string(body))
		call.Action = form.Get("Action")
		r = r.Clone(r.Context())
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	resp, err := c.next.RoundTrip(r)
	if err != nil {
		return resp, err
	}
	if resp.StatusCode >= 400 {
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(body))
		if err != nil {
			return resp, err
		}
		call.ErrorCode = errorCode(body)
	}
	c.calls.Add(call)
	return resp, nil
}

func (c *requestCounter) reset() { c.calls.Reset() }

// counts returns the requests and the refused ones by action since the
// last reset.
func (c *requestCounter) counts() (requests, refused map[string]int) {
	return c.calls.Counts(), c.calls.CountsFunc(throttled)
}

var errorCodeRE = regexp.MustCompile(`<Code>([^<]*)</Code>`)

// errorCode is the first error code of an EC2 error response.
func errorCode(body []byte) string {
	if m := errorCodeRE.FindSubmatch(body); m != nil {
		return string(m[1])
	}
	return ""
}
