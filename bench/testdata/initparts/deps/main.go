// Command deps is the hello-world bootstrap linking every package the
// functions link, without calling the wiring (app.Load, reaperapp.New): a
// function's init less this one's is the wiring's share
// (BenchmarkInitParts).
package main

import (
	"context"
	"encoding/json"

	"github.com/aws/aws-lambda-go/lambda"

	_ "github.com/reaper-k8s/reaper/pkg/app/reaperapp"
	_ "github.com/reaper-k8s/reaper/pkg/exitline"
	_ "github.com/reaper-k8s/reaper/pkg/reaper"
)

func main() {
	lambda.Start(func(ctx context.Context, ev json.RawMessage) (string, error) {
		return "hello", nil
	})
}
