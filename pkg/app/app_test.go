package app_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/reaper-k8s/reaper/pkg/app"
	"github.com/reaper-k8s/reaper/pkg/config"
	"github.com/reaper-k8s/reaper/pkg/ledger"
	"github.com/reaper-k8s/reaper/pkg/metrics"
)

// The intake's functions pay at every cold start for the package
// initialisation of everything they link: they must link neither the
// Kubernetes client and API types nor the EC2 or EKS clients, which only
// the sweeper and the reconciler use.
func TestIntakeFunctionsLinkNoClusterClients(t *testing.T) {
	forbidden := []string{"k8s.io/api/", "k8s.io/client-go/", "github.com/aws/aws-sdk-go-v2/service/ec2", "github.com/aws/aws-sdk-go-v2/service/eks"}
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

// A dry run wires the ledger's read-only decorator, a real run the table.
func TestNewIntakeDryRun(t *testing.T) {
	for _, dry := range []bool{false, true} {
		s := app.Setup{Function: metrics.FunctionExitRecorder, Config: config.Config{Table: "t", QueueURL: "http://127.0.0.1:1/q", DryRun: dry},
			AWS: aws.Config{Region: "us-east-1"}}
		in := app.NewIntake(s, app.Clients{})
		_, readOnly := in.Ledger.(ledger.ReadOnly)
		_, table := in.Ledger.(*ledger.Table)
		if readOnly != dry || table == dry || in.Queue == nil {
			t.Errorf("dry run %v: ledger %T, queue %T", dry, in.Ledger, in.Queue)
		}
	}
	if in := app.NewIntake(app.Setup{Function: metrics.FunctionStateChange}, app.Clients{}); in.Ledger != nil {
		t.Errorf("statechange wired a ledger: %T", in.Ledger)
	}
}
