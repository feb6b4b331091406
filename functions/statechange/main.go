// Command statechange is the Lambda behind the EventBridge rule on EC2
// instance state changes: when a managed instance stops or terminates for any
// reason, it makes sure the Pod ends with the truth.
package main

import (
	"context"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambda"

	"github.com/reaper-k8s/reaper/pkg/app"
	"github.com/reaper-k8s/reaper/pkg/reaper"
	"github.com/reaper-k8s/reaper/pkg/statechange"
)

func main() {
	r, _, err := app.New(context.Background())
	if err != nil {
		app.Fatal(err)
	}
	lambda.Start(func(ctx context.Context, ev events.CloudWatchEvent) (reaper.StateSummary, error) {
		m, err := statechange.Parse(ev)
		if err != nil {
			// Retrying a malformed event cannot help: log it and count it.
			r.Log.ErrorContext(ctx, "event rejected", "id", ev.ID, "error", err)
			return reaper.StateSummary{Skipped: "rejected"}, nil
		}
		return r.HandleStateChange(ctx, m)
	})
}
