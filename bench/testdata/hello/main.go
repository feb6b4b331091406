// Command hello is the smallest aws-lambda-go function: the baseline the
// functions' init times are compared with (BenchmarkInit).
package main

import (
	"context"
	"encoding/json"

	"github.com/aws/aws-lambda-go/lambda"
)

func main() {
	lambda.Start(func(ctx context.Context, ev json.RawMessage) (string, error) {
		return "hello", nil
	})
}
