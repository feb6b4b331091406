// Command clientset is the hello-world bootstrap linking client-go's typed
// clientset, every API group's client and scheme: what the exitrecorder
// would link instead of its core/v1 REST client (BenchmarkInitParts).
package main

import (
	"context"
	"encoding/json"

	"github.com/aws/aws-lambda-go/lambda"
	_ "k8s.io/client-go/kubernetes"
)

func main() {
	lambda.Start(func(ctx context.Context, ev json.RawMessage) (string, error) {
		return "hello", nil
	})
}
