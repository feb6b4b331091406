// Command awsall is the hello-world bootstrap linking every AWS SDK package
// the exitrecorder links: config, DynamoDB and EC2, and the EKS, STS and
// Secrets Manager clients its Kubernetes access modes need
// (BenchmarkInitParts).
package main

import (
	"context"
	"encoding/json"

	"github.com/aws/aws-lambda-go/lambda"
	_ "github.com/aws/aws-sdk-go-v2/config"
	_ "github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	_ "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	_ "github.com/aws/aws-sdk-go-v2/service/ec2"
	_ "github.com/aws/aws-sdk-go-v2/service/eks"
	_ "github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	_ "github.com/aws/aws-sdk-go-v2/service/sts"
)

func main() {
	lambda.Start(func(ctx context.Context, ev json.RawMessage) (string, error) {
		return "hello", nil
	})
}
