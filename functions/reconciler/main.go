// Command reconciler is the Lambda behind the work queue's event source
// mapping: for a batch of instances it checks exit lines against launch
// tags, writes the Pods' statuses and then terminates the instances, in as
// few EC2 calls as the API allows and paced below the account's token
// buckets.
package main

import (
	"context"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/reaper-k8s/reaper/pkg/app"
	"github.com/reaper-k8s/reaper/pkg/app/reaperapp"
	"github.com/reaper-k8s/reaper/pkg/metrics"
)

func main() {
	ctx := context.Background()
	s, err := app.Load(ctx, metrics.FunctionReconciler)
	if err != nil {
		app.Fatal(err)
	}
	r, err := reaperapp.New(ctx, s, reaperapp.Clients{})
	if err != nil {
		app.Fatal(err)
	}
	lambda.Start(r.HandleQueueEvent)
}
