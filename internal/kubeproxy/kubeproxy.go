// Package kubeproxy is a reverse proxy for a test apiserver: it notes every
// request as a callrecord call, so that tests count Reaper's Kubernetes
// requests by verb and resource the way they count its EC2 and SQS
// requests, and it can slow every request down or answer some with an
// error, to play a slow or failing apiserver.
package kubeproxy

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/reaper-k8s/reaper/internal/callrecord"
)

// Call is one request the proxy was sent. Its Action is
// "VERB resource[/subresource]" with the verbs of the apiserver's
// apiserver_request_total ("LIST pods", "GET pods", "PATCH pods/status",
// "POST events"); a request outside the API (/healthz) is "VERB -". Its
// ErrorCode is the reason of an error answer ("Conflict", "Forbidden").
type Call struct {
	callrecord.Call
	Namespace, Name string
	// Status is the HTTP status of the answer.
	Status int
}

// Proxy forwards to an apiserver the requests of clients whose
// configuration Config made.
type Proxy struct {
	// Calls are the requests the proxy answered, injected faults
	// included, in the order it answered them.
	Calls callrecord.Record[Call]

	srv   *httptest.Server
	delay atomic.Int64 // time.Duration added before each request

	mu    sync.Mutex
	fault func(Call) int
}

// Start starts a proxy in front of the apiserver target reaches. The
// proxy's own connection to it trusts target's CA and carries no
// credentials: each request keeps those of the client that sent it.
func Start(target *rest.Config) (*Proxy, error) {
	u, err := url.Parse(target.Host)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("kubeproxy: apiserver host %q: not a URL", target.Host)
	}
	transport, err := rest.TransportFor(rest.AnonymousClientConfig(target))
	if err != nil {
		return nil, fmt.Errorf("kubeproxy: transport: %w", err)
	}
	p := &Proxy{}
	forward := &httputil.ReverseProxy{
		Rewrite:   func(r *httputil.ProxyRequest) { r.SetURL(u) },
		Transport: transport,
		// Watches stream: pass each event on as it comes.
		FlushInterval: -1,
		ModifyResponse: func(resp *http.Response) error {
			call := resp.Request.Context().Value(callKey{}).(*Call)
			call.Status = resp.StatusCode
			if resp.StatusCode >= http.StatusBadRequest {
				body, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				resp.Body = io.NopCloser(bytes.NewReader(body))
				if err != nil {
					return err
				}
				call.ErrorCode = reason(resp.StatusCode, body)
			}
			p.Calls.Add(*call)
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			call := r.Context().Value(callKey{}).(*Call)
			call.Status, call.ErrorCode = http.StatusBadGateway, string(metav1.StatusReasonServiceUnavailable)
			p.Calls.Add(*call)
			http.Error(w, err.Error(), http.StatusBadGateway)
		},
	}
	// Each call is noted before its answer goes out, so that a client that
	// has its answer finds its call in Calls.
	p.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		call := classify(r)
		call.Time = time.Now()
		if d := time.Duration(p.delay.Load()); d > 0 {
			select {
			case <-time.After(d):
			case <-r.Context().Done():
				call.ErrorCode = "Canceled"
				p.Calls.Add(*call)
				return
			}
		}
		p.mu.Lock()
		fault := p.fault
		p.mu.Unlock()
		if fault != nil {
			if status := fault(*call); status != 0 {
				call.Injected = true
				p.answer(w, call, status)
				return
			}
		}
		forward.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), callKey{}, call)))
	}))
	return p, nil
}

// callKey carries a request's *Call to the forwarding proxy's hooks.
type callKey struct{}

// Config returns user's configuration (its credentials) sent through the
// proxy, over TLS to the proxy's own certificate; the proxy forwards over
// TLS to the apiserver.
func (p *Proxy) Config(user *rest.Config) *rest.Config {
	c := rest.CopyConfig(user)
	c.Host = p.srv.URL
	c.TLSClientConfig = rest.TLSClientConfig{CAData: p.caPEM()}
	return c
}

// WriteKubeconfig writes to path a kubeconfig for user's bearer token
// through the proxy, for clients in other processes (Reaper's functions).
// The proxy serves TLS because client-go takes a kubeconfig's credentials
// only for a TLS server: over plain HTTP its requests would be anonymous.
func (p *Proxy) WriteKubeconfig(path string, user *rest.Config) error {
	if user.BearerToken == "" {
		return fmt.Errorf("kubeproxy: kubeconfig for %s: only bearer token users can be written", user.Host)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["proxy"] = &clientcmdapi.Cluster{Server: p.srv.URL, CertificateAuthorityData: p.caPEM()}
	cfg.AuthInfos["user"] = &clientcmdapi.AuthInfo{Token: user.BearerToken}
	cfg.Contexts["proxy"] = &clientcmdapi.Context{Cluster: "proxy", AuthInfo: "user", Namespace: "default"}
	cfg.CurrentContext = "proxy"
	return clientcmd.WriteToFile(*cfg, path)
}

// caPEM is the proxy's certificate, which clients trust.
func (p *Proxy) caPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.srv.Certificate().Raw})
}

// SetDelay makes every request from now on wait d before it is forwarded
// (0: none).
func (p *Proxy) SetDelay(d time.Duration) { p.delay.Store(int64(d)) }

// Fail answers, from now on, each request for which fn returns an HTTP
// status with that status (an apiserver error of the matching reason)
// instead of forwarding it; fn returns 0 to forward. nil forwards every
// request.
func (p *Proxy) Fail(fn func(Call) int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fault = fn
}

// URL is the proxy's endpoint.
func (p *Proxy) URL() string { return p.srv.URL }

// Close stops the proxy.
func (p *Proxy) Close() { p.srv.Close() }

// classify names the request's verb, resource, namespace and name from its
// method and path (/api/v1/..., /apis/<group>/<version>/...).
func classify(r *http.Request) *Call {
	call := &Call{}
	var segs []string
	switch parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/"); {
	case len(parts) >= 2 && parts[0] == "api":
		segs = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		segs = parts[3:]
	default:
		call.Action = r.Method + " -"
		return call
	}
	if len(segs) >= 3 && segs[0] == "namespaces" {
		call.Namespace, segs = segs[1], segs[2:]
	}
	resource := "-"
	if len(segs) > 0 {
		resource = segs[0]
	}
	if len(segs) > 1 {
		call.Name = segs[1]
	}
	if len(segs) > 2 {
		resource += "/" + segs[2]
	}
	verb := r.Method
	if verb == http.MethodGet && call.Name == "" {
		verb = "LIST"
		if w := r.URL.Query().Get("watch"); w == "true" || w == "1" {
			verb = "WATCH"
		}
	}
	call.Action = verb + " " + resource
	return call
}

// reason is the reason of the metav1.Status an error answer carries, or
// the one its HTTP status stands for.
func reason(status int, body []byte) string {
	var s metav1.Status
	if json.Unmarshal(body, &s) == nil && s.Reason != "" {
		return string(s.Reason)
	}
	return string(apierrors.NewGenericServerResponse(status, "", schema.GroupResource{}, "", "", 0, false).ErrStatus.Reason)
}

// answer notes call and writes the apiserver's error answer for status.
func (p *Proxy) answer(w http.ResponseWriter, call *Call, status int) {
	verb, resource, _ := strings.Cut(call.Action, " ")
	resource, _, _ = strings.Cut(resource, "/")
	s := apierrors.NewGenericServerResponse(status, strings.ToLower(verb), schema.GroupResource{Resource: resource}, call.Name,
		"injected by kubeproxy", 0, true).ErrStatus
	s.Kind, s.APIVersion = "Status", "v1"
	call.Status, call.ErrorCode = status, string(s.Reason)
	p.Calls.Add(*call)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(s)
}
