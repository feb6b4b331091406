package replay

import (
	"bytes"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"
)

// OperationCounter is a reverse proxy in front of an AWS JSON-protocol
// endpoint (dynalite) that counts the requests by operation, the action of
// their X-Amz-Target header ("DynamoDB_20120810.UpdateItem" counts as
// UpdateItem). Point a client's endpoint at URL.
type OperationCounter struct {
	srv    *httptest.Server
	mu     sync.Mutex
	counts map[string]int
}

// NewOperationCounter starts a counting proxy for target.
func NewOperationCounter(target string) (*OperationCounter, error) {
	u, err := url.Parse(target)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("proxy target %q: not a URL", target)
	}
	c := &OperationCounter{counts: map[string]int{}}
	proxy := httputil.NewSingleHostReverseProxy(u)
	// Enough idle connections for every client at once: the default two
	// would open and close a connection for most requests.
	proxy.Transport = &http.Transport{MaxIdleConnsPerHost: 256, IdleConnTimeout: time.Minute}
	c.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		target := r.Header.Get("X-Amz-Target")
		c.mu.Lock()
		c.counts[target[strings.LastIndexByte(target, '.')+1:]]++
		c.mu.Unlock()
		proxy.ServeHTTP(w, r)
	}))
	return c, nil
}

// URL is the proxy's endpoint.
func (c *OperationCounter) URL() string { return c.srv.URL }

// Counts returns the requests by operation since the start or Reset.
func (c *OperationCounter) Counts() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.counts)
}

// Reset forgets the counts.
func (c *OperationCounter) Reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.counts)
}

// Close stops the proxy.
func (c *OperationCounter) Close() { c.srv.Close() }

// ec2Recorder is a reverse proxy in front of the EC2 test server that notes
// each request's SDK invocation id (amz-sdk-invocation-id), which the SDK
// gives an operation and keeps across its retries. The test server's log
// counts attempts; the recorder tells operations apart: against a server
// this fast the SDK now and then loses an answer that was sent (see
// sqsserver.BufferedBodies) and retries an operation that had succeeded.
type ec2Recorder struct {
	srv *httptest.Server
	mu  sync.Mutex
	ops []ec2Request
}

// ec2Request is one request as the recorder saw it.
type ec2Request struct {
	action, invocation string
	instances          []string
	status             int
	// code is the answer's error code, "" on success.
	code string
}

func newEC2Recorder(target string) *ec2Recorder {
	u, _ := url.Parse(target)
	proxy := httputil.NewSingleHostReverseProxy(u)
	proxy.Transport = &http.Transport{MaxIdleConnsPerHost: 256, IdleConnTimeout: time.Minute}
	rec := &ec2Recorder{}
	rec.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		form, _ := url.ParseQuery(string(body))
		req := ec2Request{action: form.Get("Action"), invocation: r.Header.Get("Amz-Sdk-Invocation-Id")}
		for k, v := range form {
			if strings.HasPrefix(k, "InstanceId.") {
				req.instances = append(req.instances, v...)
			}
		}
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		proxy.ServeHTTP(sw, r)
		req.status, req.code = sw.status, errorCode(sw.errorBody)
		rec.mu.Lock()
		rec.ops = append(rec.ops, req)
		rec.mu.Unlock()
	}))
	return rec
}

func (r *ec2Recorder) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops = nil
}

// requests returns, since the last reset, the requests by action and
// those answered RequestLimitExceeded.
func (r *ec2Recorder) requests() (requests, refused map[string]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	requests, refused = map[string]int{}, map[string]int{}
	for _, op := range r.ops {
		requests[op.action]++
		if op.code == "RequestLimitExceeded" {
			refused[op.action]++
		}
	}
	return requests, refused
}

// operations returns, since the last reset, the requests by action that
// retried an operation already seen, and per instance the successful
// TerminateInstances operations that named it.
func (r *ec2Recorder) operations() (retried, terminates map[string]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	retried = map[string]int{}
	seen := map[string]bool{}
	for _, op := range r.ops {
		if op.invocation != "" && seen[op.invocation] {
			retried[op.action]++
		}
		seen[op.invocation] = true
	}
	return retried, r.terminatesAnswered(http.StatusOK)
}

// terminates counts, since the last reset, per instance the
// TerminateInstances operations naming it that were answered status at
// least once: the SDK's retries of an operation (one invocation id) are
// one operation.
func (r *ec2Recorder) terminates(status int) map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.terminatesAnswered(status)
}

// terminateNamed is, since the last reset, the instances named in a
// TerminateInstances request, whatever its answer.
func (r *ec2Recorder) terminateNamed() map[string]bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]bool{}
	for _, op := range r.ops {
		if op.action == "TerminateInstances" {
			for _, id := range op.instances {
				out[id] = true
			}
		}
	}
	return out
}

func (r *ec2Recorder) terminatesAnswered(status int) map[string]int {
	out := map[string]int{}
	counted := map[[2]string]bool{}
	for _, op := range r.ops {
		if op.action != "TerminateInstances" || op.status != status {
			continue
		}
		for _, id := range op.instances {
			if k := [2]string{op.invocation, id}; !counted[k] {
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
