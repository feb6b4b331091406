//go:build reconcilersdk

// With reconcilersdk, hello links the AWS SDK clients the reconciler uses:
// config, DynamoDB, SQS and EC2, and the EKS, STS and Secrets Manager
// clients its Kubernetes access modes need (BenchmarkInit's guard for the
// reconciler).

package main

import (
	_ "github.com/aws/aws-sdk-go-v2/config"
	_ "github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	_ "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	_ "github.com/aws/aws-sdk-go-v2/service/ec2"
	_ "github.com/aws/aws-sdk-go-v2/service/eks"
	_ "github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	_ "github.com/aws/aws-sdk-go-v2/service/sqs"
	_ "github.com/aws/aws-sdk-go-v2/service/sts"
)
