// Command statechange is the Lambda behind the EventBridge rule on EC2
// instance state changes: it hands each change to the reconciler, which,
// when one of this deployment's instances stops or terminates for any
// reason, makes sure the Pod ends with the truth.
package main

import (
	"context"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/reaper-k8s/reaper/pkg/app"
	"github.com/reaper-k8s/reaper/pkg/metrics"
)

func main() {
	s, err := app.Load(context.Background(), metrics.FunctionStateChange)
	if err != nil {
		app.Fatal(err)
	}
	lambda.Start(app.NewIntake(s, app.Clients{}).HandleEC2Event)
}
