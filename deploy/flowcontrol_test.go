package deploy_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/reaper-k8s/reaper/deploy"
	"github.com/reaper-k8s/reaper/internal/labstack"
)

// TestFlowControl applies the chart with its default values to a real
// kube-apiserver and checks that the requests of each identity it binds, the ones Reaper makes (read Pods, patch a Pod's status, read the
// cluster's identity), are classified into Reaper's FlowSchema and priority
// level: the apiserver names both in every response's headers.
func TestFlowControl(t *testing.T) {
	ctx := t.Context()
	stack := labstack.MustStart(t, labstack.Options{Parts: labstack.Kube})
	admin := stack.Kube
	applyChart(t, admin, deploy.Namespace, nil)
	schema, err := admin.FlowcontrolV1().FlowSchemas().Get(ctx, "reaper", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	level, err := admin.FlowcontrolV1().PriorityLevelConfigurations().Get(ctx, "reaper", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod := newPod(t, admin, "flow", fixture{node: virtualNode, phase: corev1.PodRunning})
	patch := []byte(fmt.Sprintf(`{"metadata":{"uid":%q},"status":{"message":"classified"}}`, pod.UID))

	for name, config := range map[string]*rest.Config{
		"group reaper":                        stack.ReaperRESTConfig(),
		"system:serviceaccount:reaper:reaper": serviceAccountConfig(t, stack, "reaper", "reaper"),
	} {
		t.Run(name, func(t *testing.T) {
			client, err := rest.HTTPClientFor(config)
			if err != nil {
				t.Fatal(err)
			}
			for _, req := range []struct{ method, path, contentType string }{
				{http.MethodGet, "/api/v1/namespaces/default/pods?limit=500", ""},
				{http.MethodPatch, "/api/v1/namespaces/default/pods/" + pod.Name + "/status", "application/strategic-merge-patch+json"},
				{http.MethodGet, "/api/v1/namespaces/kube-system", ""},
			} {
				// RBAC and flow control take the new objects a moment after
				// they are created.
				var got classified
				want := classified{status: http.StatusOK, schema: string(schema.UID), level: string(level.UID)}
				for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
					got = classify(t, ctx, client, config.Host, req.method, req.path, req.contentType, patch)
					if got == want || time.Now().After(deadline) {
						break
					}
				}
				if got != want {
					t.Errorf("%s %s: %+v, want %+v (Reaper's flow schema and priority level)", req.method, req.path, got, want)
				}
			}
		})
	}
	if schema.Spec.MatchingPrecedence >= mustGetPrecedence(t, admin.FlowcontrolV1().FlowSchemas().Get, "service-accounts") {
		t.Errorf("matchingPrecedence %d does not come before the service accounts' schema", schema.Spec.MatchingPrecedence)
	}
}

// classified is how the apiserver answered a request: its status, and the
// FlowSchema and priority level it classified the request into.
type classified struct {
	status        int
	schema, level string
}

// classify makes one request.
func classify(t *testing.T, ctx context.Context, client *http.Client, host, method, path, contentType string, body []byte) classified {
	t.Helper()
	var reader io.Reader
	if contentType != "" {
		reader = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, host+path, reader)
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	return classified{status: resp.StatusCode,
		schema: resp.Header.Get(flowcontrolv1.ResponseHeaderMatchedFlowSchemaUID),
		level:  resp.Header.Get(flowcontrolv1.ResponseHeaderMatchedPriorityLevelConfigurationUID)}
}

// mustGetPrecedence is the matchingPrecedence of a FlowSchema the
// apiserver suggests.
func mustGetPrecedence(t *testing.T, get func(context.Context, string, metav1.GetOptions) (*flowcontrolv1.FlowSchema, error), name string) int32 {
	t.Helper()
	fs, err := get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return fs.Spec.MatchingPrecedence
}
