package kubeproxy

import (
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// TestProxy runs requests through the proxy to a TLS "apiserver" that
// answers a 409 Status for a path naming "conflict" and 200 otherwise.
func TestProxy(t *testing.T) {
	var auth []string
	apiserver := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth = append(auth, r.Header.Get("Authorization"))
		w.Header().Set("Content-Type", "application/json")
		if strings.Contains(r.URL.Path, "/conflict") {
			w.WriteHeader(http.StatusConflict)
			fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Conflict","code":409}`)
			return
		}
		fmt.Fprint(w, `{}`)
	}))
	defer apiserver.Close()
	target := &rest.Config{Host: apiserver.URL, BearerToken: "admin-token", TLSClientConfig: rest.TLSClientConfig{
		CAData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: apiserver.Certificate().Raw}),
	}}
	p, err := Start(target)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	user := p.Config(&rest.Config{Host: apiserver.URL, BearerToken: "user-token"})
	// A plain client that trusts the proxy's certificate, and sets the
	// Authorization header itself.
	tr, err := rest.TransportFor(rest.AnonymousClientConfig(user))
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: tr}

	send := func(method, path string) int {
		t.Helper()
		req, _ := http.NewRequest(method, user.Host+path, nil)
		req.Header.Set("Authorization", "Bearer "+user.BearerToken)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, c := range []struct{ method, path, action, ns, name string }{
		{"GET", "/api/v1/namespaces/ns1/pods", "LIST pods", "ns1", ""},
		{"GET", "/api/v1/namespaces/ns1/pods?watch=true", "WATCH pods", "ns1", ""},
		{"GET", "/api/v1/namespaces/ns1/pods/p", "GET pods", "ns1", "p"},
		{"PATCH", "/api/v1/namespaces/ns1/pods/p/status", "PATCH pods/status", "ns1", "p"},
		{"POST", "/api/v1/namespaces/ns1/events", "POST events", "ns1", ""},
		{"GET", "/api/v1/pods", "LIST pods", "", ""},
		{"GET", "/api/v1/namespaces/ns1", "GET namespaces", "", "ns1"},
		{"POST", "/apis/rbac.authorization.k8s.io/v1/namespaces/ns1/rolebindings", "POST rolebindings", "ns1", ""},
		{"GET", "/readyz", "GET -", "", ""},
	} {
		p.Calls.Reset()
		send(c.method, c.path)
		calls := p.Calls.Calls()
		if len(calls) != 1 || calls[0].Action != c.action || calls[0].Namespace != c.ns || calls[0].Name != c.name || calls[0].Status != http.StatusOK {
			t.Errorf("%s %s: calls %+v, want one %q in %q named %q, answered 200", c.method, c.path, calls, c.action, c.ns, c.name)
		}
	}
	if auth[0] != "Bearer user-token" {
		t.Errorf("apiserver saw Authorization %q, want the client's own", auth[0])
	}

	p.Calls.Reset()
	send("PATCH", "/api/v1/namespaces/ns1/pods/conflict/status")
	if calls := p.Calls.Calls(); calls[0].ErrorCode != "Conflict" || calls[0].Status != http.StatusConflict || calls[0].Injected {
		t.Errorf("conflict noted as %+v", calls[0])
	}

	forwarded := len(auth)
	p.Fail(func(c Call) int {
		if c.Action == "POST events" {
			return http.StatusInternalServerError
		}
		return 0
	})
	p.Calls.Reset()
	if status := send("POST", "/api/v1/namespaces/ns1/events"); status != http.StatusInternalServerError {
		t.Errorf("failed POST answered %d", status)
	}
	send("GET", "/api/v1/namespaces/ns1/pods/p")
	calls := p.Calls.Calls()
	if len(auth) != forwarded+1 || !calls[0].Injected || calls[0].ErrorCode != "InternalError" || calls[1].Injected {
		t.Errorf("with POST events failing: calls %+v, %d forwarded; want the POST answered by the proxy, the GET forwarded", calls, len(auth)-forwarded)
	}
	p.Fail(nil)

	const delay = 50 * time.Millisecond
	p.SetDelay(delay)
	start := time.Now()
	send("GET", "/api/v1/namespaces/ns1/pods/p")
	if waited := time.Since(start); waited < delay {
		t.Errorf("request answered after %s with a delay of %s", waited, delay)
	}
	p.SetDelay(0)
}
