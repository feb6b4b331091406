package bench

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	awsmw "github.com/aws/aws-sdk-go-v2/aws/middleware"
	smithymw "github.com/aws/smithy-go/middleware"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/reaper-k8s/reaper/pkg/exitline"
)

var metaGet = metav1.GetOptions{}

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

// exitState is carried in the context of one exit, for the variants that
// move apiserver calls around.
type exitState struct {
	// events are requests the variants left in flight (the early Pod
	// GET, Event posts); the exit is done when they are.
	events sync.WaitGroup
	mu     sync.Mutex
	errs   []error
	// pod is the Pod GET issued early (prefetchGet).
	pod *prefetch
	// line is the exit being handled; event is its Event, posted as the
	// status patch goes out (eventWithPatch).
	line  exitline.Line
	event *prefetch
}

type prefetch struct {
	path string
	done chan struct{}
	used bool
	resp *http.Response // body already read into body
	body []byte
	err  error
}

type ctxKey int

const (
	exitKey ctxKey = iota
	prefetchKey
)

func withExit(ctx context.Context, st *exitState) context.Context {
	return context.WithValue(ctx, exitKey, st)
}

// wait joins what the exit left in flight and returns its errors.
func (st *exitState) wait() error {
	st.events.Wait()
	st.mu.Lock()
	defer st.mu.Unlock()
	return errors.Join(st.errs...)
}

// kubeTransport counts apiserver requests by verb and resource, adds the
// variant's RTT, and carries out the variants that move calls around.
type kubeTransport struct {
	next http.RoundTripper
	v    variant
}

func (t *kubeTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	kind := kubeKind(req)
	st, _ := req.Context().Value(exitKey).(*exitState)
	if st != nil && t.v.prefetchGet && kind == "GET pods" {
		if req.Context().Value(prefetchKey) != nil {
			return t.fetchEarly(req, kind, st.pod)
		}
		st.mu.Lock()
		p := st.pod
		served := p != nil && !p.used && p.path == req.URL.Path
		if served {
			p.used = true
		}
		st.mu.Unlock()
		if served {
			<-p.done
			if p.err != nil {
				return nil, p.err
			}
			return replay200(req, p.resp, p.body), nil
		}
	}
	if st != nil && t.v.eventWithPatch && kind == "PATCH pods/status" {
		if err := t.postWithPatch(req, st); err != nil {
			return nil, err
		}
	}
	if st != nil && t.v.eventWithPatch && kind == "POST events" && st.event != nil {
		<-st.event.done
		if st.event.err != nil {
			return nil, st.event.err
		}
		return replay200(req, st.event.resp, st.event.body), nil
	}
	if st != nil && t.v.asyncEvent && kind == "POST events" {
		return t.postLater(req, kind, st)
	}
	if st != nil && t.v.noEvent && kind == "POST events" {
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

// fetchEarly sends the early Pod GET and keeps its answer for the GET the
// status writer will make.
func (t *kubeTransport) fetchEarly(req *http.Request, kind string, p *prefetch) (*http.Response, error) {
	defer close(p.done)
	resp, err := t.send(req, kind)
	if err != nil {
		p.err = err
		return nil, err
	}
	p.body, p.err = io.ReadAll(resp.Body)
	resp.Body.Close()
	if p.err != nil {
		return nil, p.err
	}
	p.resp = resp
	return replay200(req, resp, p.body), nil
}

// postLater answers an Event post at once and sends it in the background;
// the exit waits for it before it returns (exitState.wait), as a handler
// must before Lambda freezes it.
func (t *kubeTransport) postLater(req *http.Request, kind string, st *exitState) (*http.Response, error) {
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return nil, err
	}
	req.Body.Close()
	later := req.Clone(context.WithoutCancel(req.Context()))
	later.Body = io.NopCloser(bytes.NewReader(body))
	later.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	st.events.Go(func() {
		resp, err := t.send(later, kind)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusConflict {
				err = fmt.Errorf("post event: HTTP %d", resp.StatusCode)
			}
		}
		if err != nil {
			st.mu.Lock()
			st.errs = append(st.errs, err)
			st.mu.Unlock()
		}
	})
	req.Body = io.NopCloser(bytes.NewReader(body))
	return created(req)
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

// postWithPatch posts the exit's Event as the status patch goes out, built
// the way the status writer builds it (name, involved object, reason,
// message) from the patch's preconditions and status; the writer's own post
// that follows the patch then gets this one's answer.
func (t *kubeTransport) postWithPatch(patch *http.Request, st *exitState) error {
	body, err := io.ReadAll(patch.Body)
	if err != nil {
		return err
	}
	patch.Body.Close()
	patch.Body = io.NopCloser(bytes.NewReader(body))
	var sent struct {
		Metadata struct {
			UID             types.UID `json:"uid"`
			ResourceVersion string    `json:"resourceVersion"`
		} `json:"metadata"`
		Status struct {
			Phase corev1.PodPhase `json:"phase"`
		} `json:"status"`
	}
	if err := json.Unmarshal(body, &sent); err != nil {
		return err
	}
	l := st.line
	sum := sha256.Sum256([]byte(string(sent.Metadata.UID) + "/" + fmt.Sprintf("exit/%d", l.RestartCount)))
	now := metav1.NewTime(time.Now())
	kind := corev1.EventTypeNormal
	if l.ExitCode != 0 || l.OOMKilled {
		kind = corev1.EventTypeWarning
	}
	ev, err := json.Marshal(&corev1.Event{
		TypeMeta:   metav1.TypeMeta{Kind: "Event", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Name: l.PodName + "." + hex.EncodeToString(sum[:8]), Namespace: l.PodNamespace},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: l.PodNamespace, Name: l.PodName,
			UID: sent.Metadata.UID, ResourceVersion: sent.Metadata.ResourceVersion},
		Reason: "ContainerExited",
		Message: fmt.Sprintf("container %s exited with code %d on instance %s; pod is %s",
			l.Container, l.ExitCode, l.InstanceID, sent.Status.Phase),
		Type:                kind,
		Source:              corev1.EventSource{Component: "reaper"},
		ReportingController: "reaper.io/reaper",
		ReportingInstance:   l.InstanceID,
		FirstTimestamp:      now,
		LastTimestamp:       now,
		Count:               1,
	})
	if err != nil {
		return err
	}
	u := *patch.URL
	u.Path = "/api/v1/namespaces/" + l.PodNamespace + "/events"
	post, err := http.NewRequestWithContext(context.WithoutCancel(patch.Context()), http.MethodPost, u.String(), bytes.NewReader(ev))
	if err != nil {
		return err
	}
	post.Header = patch.Header.Clone()
	post.Header.Set("Content-Type", "application/json")
	p := &prefetch{done: make(chan struct{})}
	st.event = p
	st.events.Go(func() {
		defer close(p.done)
		resp, err := t.send(post, "POST events")
		if err != nil {
			p.err = err
			return
		}
		p.body, p.err = io.ReadAll(resp.Body)
		resp.Body.Close()
		p.resp = resp
		if p.err == nil && resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusConflict {
			p.err = fmt.Errorf("post event: HTTP %d: %s", resp.StatusCode, p.body)
		}
	})
	return nil
}

func replay200(req *http.Request, resp *http.Response, body []byte) *http.Response {
	return &http.Response{
		Status: resp.Status, StatusCode: resp.StatusCode, Proto: resp.Proto, ProtoMajor: resp.ProtoMajor, ProtoMinor: resp.ProtoMinor,
		Header:        resp.Header.Clone(),
		Body:          io.NopCloser(bytes.NewReader(body)),
		ContentLength: int64(len(body)),
		Request:       req,
	}
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
