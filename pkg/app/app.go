// Package app wires a Reaper from the environment: configuration, AWS
// clients, the Kubernetes client and the logger. Each Lambda's main calls it
// once at init.
package app

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/ec2"

	"github.com/reaper-k8s/reaper/pkg/config"
	"github.com/reaper-k8s/reaper/pkg/instances"
	"github.com/reaper-k8s/reaper/pkg/kube"
	"github.com/reaper-k8s/reaper/pkg/kubeclient"
	"github.com/reaper-k8s/reaper/pkg/ledger"
	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/reaper"
)

// Retry tuning: EC2 throttles a busy account for seconds at a time
// (RequestLimitExceeded); a reaper that gives up after the SDK's default
// three attempts leaves the work to the next retry of the whole event. More
// attempts with a longer cap ride out a burst inside one invocation.
const (
	maxAttempts = 10
	maxBackoff  = 20 * time.Second
)

// Retryer is the SDK's standard retryer with Reaper's retry tuning.
func Retryer() aws.Retryer {
	return retry.NewStandard(func(o *retry.StandardOptions) {
		o.MaxAttempts = maxAttempts
		o.MaxBackoff = maxBackoff
	})
}

// AWSConfig loads the SDK configuration with Reaper's retry tuning.
// Endpoints come from the SDK's own AWS_ENDPOINT_URL_<SERVICE> variables.
func AWSConfig(ctx context.Context) (aws.Config, error) {
	return awsconfig.LoadDefaultConfig(ctx, awsconfig.WithRetryer(Retryer))
}

// Logger is the JSON logger handlers use; Lambda's JSON log format keeps
// each line as structured fields.
func Logger(level slog.Level) *slog.Logger {
	return slog.New(slog.NewJSONHandler(os.Stdout, &slog.HandlerOptions{Level: level}))
}

// New builds the Reaper of the named function from the environment.
func New(ctx context.Context, function string) (*reaper.Reaper, config.Config, error) {
	cfg, err := config.FromEnv(os.Getenv)
	if err != nil {
		return nil, cfg, err
	}
	awsCfg, err := AWSConfig(ctx)
	if err != nil {
		return nil, cfg, fmt.Errorf("aws configuration: %w", err)
	}
	rest, err := kubeclient.RESTConfig(ctx, cfg.Kube, awsCfg)
	if err != nil {
		return nil, cfg, err
	}
	kc, err := kube.NewClient(rest)
	if err != nil {
		return nil, cfg, fmt.Errorf("kubernetes client: %w", err)
	}
	log := Logger(cfg.LogLevel)
	return &reaper.Reaper{
		Ledger:  ledger.New(dynamodb.NewFromConfig(awsCfg), cfg.Table),
		Pods:    kube.NewStatusWriter(kc, cfg.DryRun),
		Fleet:   instances.NewFleet(ec2.NewFromConfig(awsCfg), cfg.Tags, cfg.Cluster, cfg.DryRun),
		Policy:  reaper.Policy{ExitWait: cfg.ExitWait, TerminateStopped: cfg.TerminateStopped},
		DryRun:  cfg.DryRun,
		Log:     log,
		Metrics: metrics.New(log, cfg.MetricsNamespace, function),
		Now:     time.Now,
	}, cfg, nil
}

// Fatal reports an init failure as one clear line and exits; Lambda then
// shows it as the init error.
func Fatal(err error) {
	fmt.Fprintf(os.Stderr, "reaper: %v\n", err)
	os.Exit(1)
}
