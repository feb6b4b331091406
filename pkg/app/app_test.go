package app_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/reaper-k8s/reaper/pkg/app"
	"github.com/reaper-k8s/reaper/pkg/metrics"
)

// The intake's functions pay at every cold start for the package
// initialisation of everything they link: they must link neither the
// Kubernetes client and API types nor the EC2, EKS or DynamoDB clients,
// which only the sweeper and the reconciler use.
func TestIntakeFunctionsLinkNoClusterClients(t *testing.T) {
	forbidden := []string{"k8s.io/api/", "k8s.io/client-go/", "github.com/aws/aws-sdk-go-v2/service/ec2", "github.com/aws/aws-sdk-go-v2/service/eks", "github.com/aws/aws-sdk-go-v2/service/dynamodb"}
	for _, fn := range []string{"exitrecorder", "statechange"} {
		out, err := exec.Command("go", "list", "-deps", "github.com/reaper-k8s/reaper/functions/"+fn).Output()
		if err != nil {
			t.Fatalf("go list %s: %v", fn, err)
		}
		deps := strings.Fields(string(out))
		if len(deps) < 50 {
			t.Fatalf("%s: only %d dependencies listed", fn, len(deps))
		}
		for _, d := range deps {
			for _, f := range forbidden {
				if strings.HasPrefix(d, f) {
					t.Errorf("%s links %s", fn, d)
				}
			}
		}
	}
}

// The intake's functions need no ledger table: they only queue.
func TestIntakeNeedsNoTable(t *testing.T) {
	env := map[string]string{"REAPER_CLUSTER": "c", "REAPER_QUEUE_URL": "http://127.0.0.1:1/q"}
	for _, fn := range []string{metrics.FunctionExitRecorder, metrics.FunctionStateChange} {
		for k, v := range env {
			t.Setenv(k, v)
		}
		s, err := app.Load(t.Context(), fn)
		if err != nil {
			t.Fatalf("%s without REAPER_TABLE: %v", fn, err)
		}
		if in := app.NewIntake(s, app.Clients{}); in.Queue == nil {
			t.Errorf("%s: no queue wired", fn)
		}
	}
}
