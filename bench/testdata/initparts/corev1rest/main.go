// Command corev1rest is the hello-world bootstrap linking only what a
// core/v1-only client needs: the core/v1 types and client-go's REST client
// (BenchmarkInitParts).
package main

import (
	"context"
	"encoding/json"

	"github.com/aws/aws-lambda-go/lambda"
	_ "k8s.io/api/core/v1"
	_ "k8s.io/client-go/rest"
	_ "k8s.io/client-go/tools/clientcmd"
)

func main() {
	lambda.Start(func(ctx context.Context, ev json.RawMessage) (string, error) {
		return "hello", nil
	})
}
