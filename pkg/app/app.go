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
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/reaper-k8s/reaper/pkg/config"
	"github.com/reaper-k8s/reaper/pkg/instances"
	"github.com/reaper-k8s/reaper/pkg/kube"
	"github.com/reaper-k8s/reaper/pkg/ledger"
	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/reaper"
	"github.com/reaper-k8s/reaper/pkg/workqueue"
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

// needs are what each function reaches besides the work queue: the
// exitrecorder writes the ledger only; statechange only enqueues; the
// sweeper reads Pods but changes none; only the reconciler terminates.
var needs = map[string]config.Needs{
	metrics.FunctionExitRecorder: {Ledger: true},
	metrics.FunctionStateChange:  {},
	metrics.FunctionSweeper:      {Ledger: true, Kube: true},
	metrics.FunctionReconciler:   {Ledger: true, Kube: true},
}

// New builds the Reaper of the named function from the environment, with
// the clients that function uses and no others.
func New(ctx context.Context, function string) (*reaper.Reaper, config.Config, error) {
	need, ok := needs[function]
	if !ok {
		return nil, config.Config{}, fmt.Errorf("unknown function %q", function)
	}
	cfg, err := config.Read(os.Getenv, need)
	if err != nil {
		return nil, cfg, err
	}
	awsCfg, err := AWSConfig(ctx)
	if err != nil {
		return nil, cfg, fmt.Errorf("aws configuration: %w", err)
	}
	log := Logger(cfg.LogLevel)
	r := &reaper.Reaper{
		Queue:   workqueue.New(sqs.NewFromConfig(awsCfg), cfg.QueueURL),
		Policy:  reaper.Policy{ExitWait: cfg.ExitWait, TerminateStopped: cfg.TerminateStopped},
		DryRun:  cfg.DryRun,
		Log:     log,
		Metrics: metrics.New(log, cfg.MetricsNamespace, function),
		Now:     time.Now,
	}
	if need.Ledger {
		r.Ledger = ledger.New(dynamodb.NewFromConfig(awsCfg), cfg.Table)
	}
	if need.Kube {
		rest, err := kube.RESTConfig(ctx, cfg.Kube, awsCfg)
		if err != nil {
			return nil, cfg, err
		}
		kc, err := kube.NewClient(rest)
		if err != nil {
			return nil, cfg, fmt.Errorf("kubernetes client: %w", err)
		}
		r.Pods = kube.NewStatusWriter(kc, cfg.DryRun)
		fleet := instances.NewFleet(ec2.NewFromConfig(awsCfg), cfg.Tags, cfg.Cluster, cfg.DryRun)
		if function == metrics.FunctionReconciler {
			// The reconciler makes the calls that grow with the number of
			// exits: it paces them below its share of the account's buckets.
			fleet.Pace(cfg.ReconcilerBudget(), func(d time.Duration) { r.Metrics.Observe(metrics.EC2PacingWait, d) })
		}
		r.Fleet = fleet
	}
	return r, cfg, nil
}

// Fatal reports an init failure as one clear line and exits; Lambda then
// shows it as the init error.
func Fatal(err error) {
	fmt.Fprintf(os.Stderr, "reaper: %v\n", err)
	os.Exit(1)
}
