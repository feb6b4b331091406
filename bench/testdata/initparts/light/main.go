// Command light is the hello-world bootstrap linking every package the
// exitrecorder links except client-go's typed clientset (and so its scheme
// of every API group): what a core/v1-only Kubernetes client would leave
// (BenchmarkInitParts).
package main

import (
	"context"
	"encoding/json"

	"github.com/aws/aws-lambda-go/lambda"
	_ "github.com/aws/aws-sdk-go-v2/aws/retry"
	_ "github.com/aws/aws-sdk-go-v2/config"
	_ "k8s.io/apimachinery/pkg/api/errors"

	_ "github.com/reaper-k8s/reaper/pkg/config"
	_ "github.com/reaper-k8s/reaper/pkg/exitline"
	_ "github.com/reaper-k8s/reaper/pkg/instances"
	_ "github.com/reaper-k8s/reaper/pkg/kubeclient"
	_ "github.com/reaper-k8s/reaper/pkg/ledger"
	_ "github.com/reaper-k8s/reaper/pkg/podstatus"
)

func main() {
	lambda.Start(func(ctx context.Context, ev json.RawMessage) (string, error) {
		return "hello", nil
	})
}
