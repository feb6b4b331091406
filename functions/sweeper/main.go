// Command sweeper is the scheduled Lambda that compares the ledger, the
// managed instances and their Pods: it records in the ledger the gone
// states events missed and the running instances it has no record of, and
// hands the rest of what events missed to the reconciler.
package main

import (
	"context"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambda"

	"github.com/reaper-k8s/reaper/pkg/app"
	"github.com/reaper-k8s/reaper/pkg/app/reaperapp"
	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/reaper"
)

func main() {
	ctx := context.Background()
	s, err := app.Load(ctx, metrics.FunctionSweeper)
	if err != nil {
		app.Fatal(err)
	}
	r, err := reaperapp.New(ctx, s, reaperapp.Clients{})
	if err != nil {
		app.Fatal(err)
	}
	lambda.Start(func(ctx context.Context, _ events.CloudWatchEvent) (reaper.SweepSummary, error) {
		return r.Sweep(ctx, s.Config.OrphanGrace)
	})
}
