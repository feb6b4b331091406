// Command exitrecorder is the Lambda behind the exit-line log group's
// subscription filter: it queues the latest exit line of each container
// of each Pod the lines name as a claim for the reconciler, which checks
// the claim against the instance's tags, records it in the ledger, makes
// the Pod's status say so and terminates the instance. The exitrecorder
// itself writes no ledger.
package main

import (
	"context"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/reaper-k8s/reaper/pkg/app"
	"github.com/reaper-k8s/reaper/pkg/metrics"
)

func main() {
	s, err := app.Load(context.Background(), metrics.FunctionExitRecorder)
	if err != nil {
		app.Fatal(err)
	}
	lambda.Start(app.NewIntake(s, app.Clients{}).HandleLogsEvent)
}
