package reaperapp_test

import (
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"k8s.io/client-go/rest"

	"github.com/reaper-k8s/reaper/pkg/app"
	"github.com/reaper-k8s/reaper/pkg/app/reaperapp"
	"github.com/reaper-k8s/reaper/pkg/config"
	"github.com/reaper-k8s/reaper/pkg/instances"
	"github.com/reaper-k8s/reaper/pkg/kube"
	"github.com/reaper-k8s/reaper/pkg/ledger"
	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/model"
	"github.com/reaper-k8s/reaper/pkg/reaper"
)

// A dry run wraps each outside system in its read-only decorator; a real
// run wires the real ones. Nothing is called while wiring.
func TestNewDryRun(t *testing.T) {
	for _, dry := range []bool{false, true} {
		s := app.Setup{Function: metrics.FunctionReconciler,
			Config: config.Config{Table: "t", Cluster: "prod", QueueURL: "http://127.0.0.1:1/q", DryRun: dry, ExitWait: 5 * time.Minute, TerminateStopped: true,
				EC2Budget: model.PublishedBudget(), EC2Share: 0.5, ReconcilerConcurrency: 2},
			AWS: aws.Config{Region: "us-east-1"}}
		r, err := reaperapp.New(t.Context(), s, reaperapp.Clients{Kube: &rest.Config{Host: "https://127.0.0.1:1"}})
		if err != nil {
			t.Fatal(err)
		}
		_, roLedger := r.Ledger.(ledger.ReadOnly)
		_, roPods := r.Pods.(kube.ReadOnly)
		_, roFleet := r.Fleet.(instances.ReadOnly)
		_, table := r.Ledger.(*ledger.Table)
		_, writer := r.Pods.(*kube.StatusWriter)
		_, fleet := r.Fleet.(*instances.Fleet)
		if roLedger != dry || roPods != dry || roFleet != dry || table == dry || writer == dry || fleet == dry {
			t.Errorf("dry run %v: ledger %T, pods %T, fleet %T", dry, r.Ledger, r.Pods, r.Fleet)
		}
		if r.Queue == nil || r.Policy != (reaper.Policy{ExitWait: 5 * time.Minute, TerminateStopped: true, Reconcilers: 2}) {
			t.Errorf("queue %T, policy %+v", r.Queue, r.Policy)
		}
	}
}
