package kube

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/eks"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	smithyhttp "github.com/aws/smithy-go/transport/http"
	"k8s.io/client-go/rest"
)

// EKS IAM authentication: the bearer token is a presigned STS
// GetCallerIdentity URL that names the cluster in a signed header; the
// apiserver's authenticator replays it to STS to learn the caller's role.
const (
	tokenPrefix     = "k8s-aws-v1."
	clusterIDHeader = "x-k8s-aws-id"
	// presignExpires is what the authenticator expects in X-Amz-Expires; it
	// accepts the token for tokenLifetime after signing regardless.
	presignExpires = "60"
	tokenLifetime  = 15 * time.Minute
	// tokenRefresh leaves a minute's margin for clock skew and for a
	// request that is still in flight when the token ages out.
	tokenRefresh = tokenLifetime - time.Minute
)

// eksConfig reads the cluster's endpoint and CA from DescribeCluster and
// authenticates every request with a cached IAM token.
func eksConfig(ctx context.Context, cluster string, awsCfg aws.Config) (*rest.Config, error) {
	out, err := eks.NewFromConfig(awsCfg).DescribeCluster(ctx, &eks.DescribeClusterInput{Name: &cluster})
	if err != nil {
		return nil, fmt.Errorf("eks cluster %s: %w", cluster, err)
	}
	c := out.Cluster
	if c == nil || aws.ToString(c.Endpoint) == "" || c.CertificateAuthority == nil || aws.ToString(c.CertificateAuthority.Data) == "" {
		status := "unknown"
		if c != nil {
			status = string(c.Status)
		}
		return nil, fmt.Errorf("eks cluster %s: no endpoint or certificate authority yet (status %s)", cluster, status)
	}
	ca, err := base64.StdEncoding.DecodeString(aws.ToString(c.CertificateAuthority.Data))
	if err != nil {
		return nil, fmt.Errorf("eks cluster %s: certificate authority: %w", cluster, err)
	}
	tokens := newTokenSource(presigner(sts.NewPresignClient(sts.NewFromConfig(awsCfg)), cluster), time.Now)
	cfg := &rest.Config{
		Host:            aws.ToString(c.Endpoint),
		TLSClientConfig: rest.TLSClientConfig{CAData: ca},
	}
	cfg.Wrap(func(next http.RoundTripper) http.RoundTripper { return &bearerTransport{tokens: tokens, next: next} })
	return cfg, nil
}

// presigner returns a function that presigns GetCallerIdentity for the
// cluster and returns the URL.
func presigner(client *sts.PresignClient, cluster string) func(context.Context) (string, error) {
	return func(ctx context.Context) (string, error) {
		req, err := client.PresignGetCallerIdentity(ctx, &sts.GetCallerIdentityInput{}, func(o *sts.PresignOptions) {
			o.ClientOptions = append(o.ClientOptions, func(o *sts.Options) {
				// The cluster header stays a signed header; X-Amz-* headers
				// are hoisted into the query string by the presigner.
				o.APIOptions = append(o.APIOptions,
					smithyhttp.SetHeaderValue(clusterIDHeader, cluster),
					smithyhttp.SetHeaderValue("X-Amz-Expires", presignExpires))
			})
		})
		if err != nil {
			return "", fmt.Errorf("presign sts GetCallerIdentity: %w", err)
		}
		return req.URL, nil
	}
}

// tokenSource hands out the cached token until tokenRefresh after it was
// made; a warm Lambda lives much longer than a token.
type tokenSource struct {
	presign func(context.Context) (string, error)
	now     func() time.Time

	mu        sync.Mutex
	token     string
	refreshAt time.Time
}

func newTokenSource(presign func(context.Context) (string, error), now func() time.Time) *tokenSource {
	return &tokenSource{presign: presign, now: now}
}

// Token returns a valid token, making a new one when the cached one is due.
func (s *tokenSource) Token(ctx context.Context) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	start := s.now()
	if s.token != "" && start.Before(s.refreshAt) {
		return s.token, nil
	}
	url, err := s.presign(ctx)
	if err != nil {
		return "", err
	}
	s.token = tokenPrefix + base64.RawURLEncoding.EncodeToString([]byte(url))
	s.refreshAt = start.Add(tokenRefresh)
	return s.token, nil
}

// Invalidate drops the token if it is still the cached one, so the next
// request makes a fresh one.
func (s *tokenSource) Invalidate(token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.token == token {
		s.token = ""
	}
}

// bearerTransport sets the Authorization header from the token source.
type bearerTransport struct {
	tokens *tokenSource
	next   http.RoundTripper
}

func (t *bearerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	token, err := t.tokens.Token(req.Context())
	if err != nil {
		return nil, fmt.Errorf("eks token: %w", err)
	}
	// A RoundTripper must not modify the caller's request.
	req = req.Clone(req.Context())
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := t.next.RoundTrip(req)
	if err == nil && resp.StatusCode == http.StatusUnauthorized {
		// A token rejected before its time (clock skew, expired session
		// credentials) is not reused: the next request makes a new one.
		t.tokens.Invalidate(token)
	}
	return resp, err
}

// WrappedRoundTripper lets client-go reach the inner transport (request
// cancellation, connection management).
func (t *bearerTransport) WrappedRoundTripper() http.RoundTripper { return t.next }
