package bench

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	awsmw "github.com/aws/aws-sdk-go-v2/aws/middleware"
	smithymw "github.com/aws/smithy-go/middleware"
)

// calls counts every outside request the sandboxes send, by kind
// ("DynamoDB UpdateItem", "kube PATCH pods/status", ...), with the time it
// took. Requests answered inside the process (the variants' stand-ins) are
// not calls and are not counted.
var calls = &callStats{m: map[string]*callStat{}}

type callStat struct {
	N     int
	Total time.Duration
}

type callStats struct {
	mu sync.Mutex
	m  map[string]*callStat
}

func (c *callStats) add(kind string, d time.Duration) {
	c.mu.Lock()
	s := c.m[kind]
	if s == nil {
		s = &callStat{}
		c.m[kind] = s
	}
	s.N++
	s.Total += d
	c.mu.Unlock()
}

func (c *callStats) reset() {
	c.mu.Lock()
	c.m = map[string]*callStat{}
	c.mu.Unlock()
}

func (c *callStats) snapshot() map[string]callStat {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]callStat, len(c.m))
	for k, v := range c.m {
		out[k] = *v
	}
	return out
}

// countAWS counts every attempt an AWS client sends (the middleware sits
// after the retry and signing middleware) and adds the variant's RTT.
func countAWS(v variant) func(*smithymw.Stack) error {
	return func(s *smithymw.Stack) error {
		return s.Finalize.Add(smithymw.FinalizeMiddlewareFunc("benchCountCalls",
			func(ctx context.Context, in smithymw.FinalizeInput, next smithymw.FinalizeHandler) (smithymw.FinalizeOutput, smithymw.Metadata, error) {
				if v.rtt > 0 {
					time.Sleep(v.rtt)
				}
				start := time.Now()
				out, md, err := next.HandleFinalize(ctx, in)
				calls.add(awsmw.GetServiceID(ctx)+" "+awsmw.GetOperationName(ctx), time.Since(start))
				return out, md, err
			}), smithymw.After)
	}
}

// kubeTransport counts apiserver requests by verb and resource, adds the
// variant's RTT and answers the Event posts of the no-event variant.
type kubeTransport struct {
	next http.RoundTripper
	v    variant
}

func (t *kubeTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	kind := kubeKind(req)
	if t.v.noEvent && kind == "POST events" {
		return created(req)
	}
	return t.send(req, kind)
}

func (t *kubeTransport) send(req *http.Request, kind string) (*http.Response, error) {
	if t.v.rtt > 0 {
		time.Sleep(t.v.rtt)
	}
	start := time.Now()
	resp, err := t.next.RoundTrip(req)
	calls.add("kube "+kind, time.Since(start))
	return resp, err
}

// created answers a create request inside the process: 201 with the object
// sent, as the apiserver would (less the fields it fills in).
func created(req *http.Request) (*http.Response, error) {
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return nil, err
	}
	req.Body.Close()
	return &http.Response{
		Status: "201 Created", StatusCode: http.StatusCreated, Proto: "HTTP/2.0", ProtoMajor: 2,
		Header:        http.Header{"Content-Type": {req.Header.Get("Content-Type")}},
		Body:          io.NopCloser(bytes.NewReader(body)),
		ContentLength: int64(len(body)),
		Request:       req,
	}, nil
}

// kubeKind is "<verb> <resource>[/<subresource>]" of an apiserver request.
func kubeKind(req *http.Request) string {
	parts := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
	// /api/v1/... or /apis/<group>/<version>/...
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		parts = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		parts = parts[3:]
	default:
		return req.Method + " " + req.URL.Path
	}
	if len(parts) >= 3 && parts[0] == "namespaces" {
		parts = parts[2:]
	}
	switch len(parts) {
	case 0:
		return req.Method + " namespaces"
	case 1, 2:
		return req.Method + " " + parts[0]
	default:
		return req.Method + " " + parts[0] + "/" + parts[2]
	}
}

// kindOrder lists the call kinds of the exit path in the order the report
// shows them; kinds seen besides these are appended.
var kindOrder = []string{
	"DynamoDB UpdateItem",
	"DynamoDB GetItem",
	"kube GET pods",
	"kube PATCH pods/status",
	"kube POST events",
	"EC2 DescribeInstances",
	"EC2 TerminateInstances",
}

func kinds(seen map[string]callStat) []string {
	out := slices.Clone(kindOrder)
	var extra []string
	for k := range seen {
		if !slices.Contains(out, k) {
			extra = append(extra, k)
		}
	}
	slices.Sort(extra)
	return append(out, extra...)
}

// metricName turns a kind into a benchmark unit: "kube PATCH pods/status"
// becomes "kube-PATCH-pods.status/exit".
func metricName(kind string) string {
	r := strings.NewReplacer(" ", "-", "/", ".", "DynamoDB", "ddb", "EC2", "ec2")
	return r.Replace(kind) + "/exit"
}
