package kube

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/reaper-k8s/reaper/pkg/config"
)

// testAWSConfig is a configuration with static credentials that sends every
// service to endpoint ("" = the real AWS endpoints, for presigning only).
func testAWSConfig(endpoint string) aws.Config {
	cfg := aws.Config{
		Region:      "eu-west-1",
		Credentials: credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", ""),
		Retryer:     func() aws.Retryer { return aws.NopRetryer{} },
	}
	if endpoint != "" {
		cfg.BaseEndpoint = aws.String(endpoint)
	}
	return cfg
}

func TestEKSTokenShape(t *testing.T) {
	presign := presigner(sts.NewPresignClient(sts.NewFromConfig(testAWSConfig(""))), "demo")
	token, err := newTokenSource(presign, time.Now).Token(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(token, tokenPrefix) {
		t.Fatalf("token %q lacks prefix %q", token, tokenPrefix)
	}
	raw, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(token, tokenPrefix))
	if err != nil {
		t.Fatalf("token is not unpadded base64url: %v", err)
	}
	u, err := url.Parse(string(raw))
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	for _, c := range []struct{ what, got, want string }{
		{"scheme", u.Scheme, "https"},
		{"host", u.Host, "sts.eu-west-1.amazonaws.com"},
		{"Action", q.Get("Action"), "GetCallerIdentity"},
		{"Version", q.Get("Version"), "2011-06-15"},
		{"X-Amz-Expires", q.Get("X-Amz-Expires"), "60"},
		{"X-Amz-Algorithm", q.Get("X-Amz-Algorithm"), "AWS4-HMAC-SHA256"},
	} {
		if c.got != c.want {
			t.Errorf("%s = %q, want %q (url %s)", c.what, c.got, c.want, u)
		}
	}
	signed := strings.Split(q.Get("X-Amz-SignedHeaders"), ";")
	if !contains(signed, "host") || !contains(signed, clusterIDHeader) {
		t.Errorf("signed headers %v, want host and %s", signed, clusterIDHeader)
	}
	if cred := q.Get("X-Amz-Credential"); !strings.HasSuffix(cred, "/eu-west-1/sts/aws4_request") {
		t.Errorf("credential scope %q", cred)
	}
	if q.Get("X-Amz-Signature") == "" {
		t.Error("no signature")
	}
	if strings.ContainsAny(token, "=+/") {
		t.Errorf("token %q is not URL-safe without padding", token)
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func TestTokenCacheAndRefresh(t *testing.T) {
	now := time.Date(2026, 11, 30, 7, 0, 0, 0, time.UTC)
	var calls int
	src := newTokenSource(func(context.Context) (string, error) {
		calls++
		return fmt.Sprintf("https://sts.eu-west-1.amazonaws.com/?n=%d", calls), nil
	}, func() time.Time { return now })
	ctx := context.Background()
	token := func() string {
		t.Helper()
		tok, err := src.Token(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}

	first := token()
	now = now.Add(tokenRefresh - time.Second)
	if token() != first || calls != 1 {
		t.Fatalf("token not reused within %s (%d presigns)", tokenRefresh, calls)
	}
	now = now.Add(time.Second)
	second := token()
	if second == first || calls != 2 {
		t.Fatalf("token not refreshed at %s (%d presigns)", tokenRefresh, calls)
	}
	if tokenRefresh >= tokenLifetime {
		t.Fatalf("refresh %s must come before the %s lifetime", tokenRefresh, tokenLifetime)
	}

	src.Invalidate(first) // an older token: keeps the current one
	if token() != second {
		t.Fatal("invalidating a stale token dropped the current one")
	}
	src.Invalidate(second)
	if token() == second || calls != 3 {
		t.Fatalf("invalidated token reused (%d presigns)", calls)
	}

	failing := newTokenSource(func(context.Context) (string, error) { return "", errors.New("no credentials") }, time.Now)
	if _, err := failing.Token(ctx); err == nil {
		t.Fatal("presign error swallowed")
	}
}

// TestEKSRESTConfig runs the whole EKS path: DescribeCluster against a local
// EKS endpoint, then a Pod read from a local TLS "apiserver" that must see
// the cluster's CA and an IAM bearer token.
func TestEKSRESTConfig(t *testing.T) {
	var authHeaders []string
	apiserver := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		authHeaders = append(authHeaders, r.Header.Get("Authorization"))
		if r.URL.Path != "/api/v1/namespaces/default/pods/sample-job" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"apiVersion":"v1","kind":"Pod","metadata":{"namespace":"default","name":"sample-job","uid":"5f0c8e1a-7b5d-4c3e-9a41-2d6f0b8c1e11"}}`)
	}))
	defer apiserver.Close()
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: apiserver.Certificate().Raw})

	eksAPI := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || r.URL.Path != "/clusters/demo" {
			w.Header().Set("X-Amzn-ErrorType", "ResourceNotFoundException")
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprintf(w, `{"message":"No cluster found for name: %s."}`, strings.TrimPrefix(r.URL.Path, "/clusters/"))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"cluster": map[string]any{
			"name": "demo", "status": "ACTIVE", "endpoint": apiserver.URL,
			"certificateAuthority": map[string]string{"data": base64.StdEncoding.EncodeToString(caPEM)},
		}})
	}))
	defer eksAPI.Close()

	ctx := context.Background()
	cfg, err := RESTConfig(ctx, config.KubeAccess{EKSCluster: "demo"}, testAWSConfig(eksAPI.URL))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host != apiserver.URL || cfg.BearerToken != "" || cfg.Timeout != requestTimeout {
		t.Fatalf("config host=%s bearer=%q timeout=%s", cfg.Host, cfg.BearerToken, cfg.Timeout)
	}
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		pod, err := kc.CoreV1().Pods("default").Get(ctx, "sample-job", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if pod.UID != "5f0c8e1a-7b5d-4c3e-9a41-2d6f0b8c1e11" {
			t.Fatalf("pod %+v", pod.ObjectMeta)
		}
	}
	if len(authHeaders) != 2 || !strings.HasPrefix(authHeaders[0], "Bearer "+tokenPrefix) || authHeaders[1] != authHeaders[0] {
		t.Fatalf("authorization headers %q: want the same cached IAM token twice", authHeaders)
	}

	_, err = RESTConfig(ctx, config.KubeAccess{EKSCluster: "other"}, testAWSConfig(eksAPI.URL))
	if err == nil || !strings.Contains(err.Error(), "eks cluster other") || !strings.Contains(err.Error(), "ResourceNotFoundException") {
		t.Fatalf("missing cluster: %v", err)
	}
}

const kubeconfig = `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: https://kube.example.com:6443
    insecure-skip-tls-verify: true
users:
- name: u
  user:
    token: sekret-token
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
`

const execKubeconfig = `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://kube.example.com:6443"}
users:
- name: u
  user:
    exec:
      apiVersion: client.authentication.k8s.io/v1beta1
      command: aws
      args: [eks, get-token, --cluster-name, demo]
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
`

// secretsManager is a Secrets Manager endpoint (JSON 1.1 protocol) holding
// secrets by id; string values are SecretString, []byte are SecretBinary.
func secretsManager(t *testing.T, secrets map[string]any) (*httptest.Server, *atomic.Int32) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		body, _ := io.ReadAll(r.Body)
		var in struct{ SecretId string }
		if r.Method != http.MethodPost || r.Header.Get("X-Amz-Target") != "secretsmanager.GetSecretValue" ||
			!strings.HasPrefix(r.Header.Get("Content-Type"), "application/x-amz-json-1.1") || json.Unmarshal(body, &in) != nil {
			t.Errorf("unexpected request %s %s %v %s", r.Method, r.URL, r.Header, body)
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		if !strings.Contains(r.Header.Get("Authorization"), "/secretsmanager/aws4_request") {
			t.Errorf("request not signed for secretsmanager: %q", r.Header.Get("Authorization"))
		}
		w.Header().Set("Content-Type", "application/x-amz-json-1.1")
		out := map[string]any{"ARN": "arn:aws:secretsmanager:eu-west-1:123456789012:secret:" + in.SecretId + "-AbCdEf", "Name": in.SecretId}
		switch v := secrets[in.SecretId].(type) {
		case string:
			out["SecretString"] = v
		case []byte:
			out["SecretBinary"] = v // encoding/json writes base64, as the protocol does
		default:
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, `{"__type":"com.amazonaws.secretsmanager#ResourceNotFoundException","message":"Secrets Manager can't find the specified secret."}`)
			return
		}
		json.NewEncoder(w).Encode(out)
	}))
	t.Cleanup(srv.Close)
	return srv, &calls
}

func TestSecretRESTConfig(t *testing.T) {
	srv, calls := secretsManager(t, map[string]any{
		"reaper/kubeconfig": kubeconfig,
		"reaper/binary":     []byte(kubeconfig),
		"reaper/exec":       execKubeconfig,
		"reaper/garbage":    "{not yaml",
	})
	ctx := context.Background()
	for _, id := range []string{"reaper/kubeconfig", "reaper/binary"} {
		cfg, err := RESTConfig(ctx, config.KubeAccess{KubeconfigSecret: id}, testAWSConfig(srv.URL))
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		if cfg.Host != "https://kube.example.com:6443" || cfg.BearerToken != "sekret-token" || cfg.UserAgent != "reaper" {
			t.Fatalf("%s: host=%s token=%q agent=%q", id, cfg.Host, cfg.BearerToken, cfg.UserAgent)
		}
	}
	for id, want := range map[string]string{
		"reaper/exec":    "cannot run in Lambda",
		"reaper/garbage": "kubeconfig secret reaper/garbage",
		"reaper/missing": "ResourceNotFoundException",
	} {
		_, err := RESTConfig(ctx, config.KubeAccess{KubeconfigSecret: id}, testAWSConfig(srv.URL))
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), id) {
			t.Errorf("%s: error %v, want it to name the secret and mention %q", id, err, want)
		}
		if err != nil && strings.Contains(err.Error(), "sekret") {
			t.Errorf("%s: error leaks the secret: %v", id, err)
		}
	}
	if calls.Load() != 5 {
		t.Errorf("%d GetSecretValue calls, want 5", calls.Load())
	}
}
