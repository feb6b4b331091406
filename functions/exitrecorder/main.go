// Command exitrecorder is the Lambda behind the exit-line log group's
// subscription filter: it records each container exit in the ledger and
// hands the instance to the reconciler, which checks the line against the
// instance's tags, makes the Pod's status say so and terminates it.
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
