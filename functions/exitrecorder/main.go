// Command exitrecorder is the Lambda behind the exit-line log group's
// subscription filter: it records each container exit in the ledger, makes
// the Pod's status say so and terminates the instance it ran on.
package main

import (
	"context"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambda"

	"github.com/reaper-k8s/reaper/pkg/app"
	"github.com/reaper-k8s/reaper/pkg/exitline"
	"github.com/reaper-k8s/reaper/pkg/reaper"
)

func main() {
	r, _, err := app.New(context.Background())
	if err != nil {
		app.Fatal(err)
	}
	lambda.Start(func(ctx context.Context, ev events.CloudwatchLogsEvent) (reaper.ExitSummary, error) {
		batch, err := exitline.FromLogsEvent(ev)
		if err != nil {
			// A payload that cannot be decoded or attributed will not decode
			// better on a retry: log it and count it, do not fail.
			r.Log.ErrorContext(ctx, "payload rejected", "error", err)
			return reaper.ExitSummary{Rejected: 1}, nil
		}
		if batch.Control {
			return reaper.ExitSummary{}, nil
		}
		return r.HandleExits(ctx, batch)
	})
}
