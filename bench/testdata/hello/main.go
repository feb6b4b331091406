// Command hello is the smallest aws-lambda-go function: the baseline the
// functions' init times are compared with (BenchmarkInit). Built with one of
// the tags recordersdk, reconcilersdk, corev1rest or deps it is the same
// function linking more packages (the link_*.go file of the tag), to
// attribute the functions' init to their dependencies.
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
