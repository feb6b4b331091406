// Command aws is the hello-world bootstrap linking the AWS SDK packages the
// exitrecorder uses: config, DynamoDB and EC2 (BenchmarkInitParts).
package main

import (
	"context"
	"encoding/json"

	"github.com/aws/aws-lambda-go/lambda"
	_ "github.com/aws/aws-sdk-go-v2/config"
	_ "github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	_ "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	_ "github.com/aws/aws-sdk-go-v2/service/ec2"
)

func main() {
	lambda.Start(func(ctx context.Context, ev json.RawMessage) (string, error) {
		return "hello", nil
	})
}
