//go:build recordersdk

// With recordersdk, hello links the AWS SDK clients the exitrecorder uses:
// config, DynamoDB and SQS (BenchmarkInit's guard for the exitrecorder).

package main

import (
	_ "github.com/aws/aws-sdk-go-v2/config"
	_ "github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	_ "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	_ "github.com/aws/aws-sdk-go-v2/service/sqs"
)
