// Package app sets a function up in two steps: Load reads its environment
// once at init (configuration, AWS SDK configuration, logger), and a wiring
// step builds what the function runs from that setup. NewIntake wires the
// exitrecorder and statechange functions; package app/reaperapp wires the
// sweeper and the reconciler. The two are apart so that the intake's
// functions link neither client-go nor the EC2 client, whose package
// initialisation they would pay for at every cold start.
//
// In a dry run (REAPER_DRY_RUN) the wiring puts a read-only decorator
// around each outside system: the ledger, the Pods and the fleet read and
// decide by the same rules as the real ones and write nothing. The work
// queue stays real: it is Reaper's own, and the dry reconciler needs the
// work to decide on.
package app

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/reaper-k8s/reaper/pkg/config"
	"github.com/reaper-k8s/reaper/pkg/intake"
	"github.com/reaper-k8s/reaper/pkg/metrics"
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

// Retryer is the SDK's standard retryer with Reaper's retry tuning, for
// every client.
//
// It has no client-side retry quota (ratelimit.None). The SDK's quota
// holds 500 tokens per client, takes 5 for each throttled retry and gives
// them back only as calls succeed: after 100 throttled retries every call
// fails at once with "retry quota exceeded", which is what Karpenter's
// controllers hit while EC2 throttled them. Reaper paces its EC2 calls
// below its share of the account's buckets, so a throttle there means
// another tool holds a bucket empty: the retries' backoff rides that out
// where the quota would fail the batch. The quota goes off for every
// client, not the EC2 client only: each call is bounded by its batch and
// the invocation's deadline, and retried at most maxAttempts times with a
// backoff up to maxBackoff, so there is no retry storm for a quota to
// stop, while the quota of a warm process outlives its invocations.
func Retryer() aws.Retryer {
	return retry.NewStandard(func(o *retry.StandardOptions) {
		o.MaxAttempts = maxAttempts
		o.MaxBackoff = maxBackoff
		o.RateLimiter = ratelimit.None
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
// exitrecorder and statechange only enqueue; the sweeper reads Pods but
// changes none, and writes the ledger what EC2 lists (gone states events
// missed, adoptions of running instances); only the reconciler records
// exits, writes Pods and terminates.
var needs = map[string]config.Needs{
	metrics.FunctionExitRecorder: {},
	metrics.FunctionStateChange:  {},
	metrics.FunctionSweeper:      {Ledger: true, Kube: true},
	metrics.FunctionReconciler:   {Ledger: true, Kube: true},
}

// Setup is what a function's environment says, read once at init.
type Setup struct {
	// Function is the function's name (metrics.Function*).
	Function string
	Config   config.Config
	AWS      aws.Config
	// Log carries dryRun=true on every line of a dry run.
	Log *slog.Logger
	Now func() time.Time
}

// Load reads the named function's environment: its configuration (with
// the settings that function cannot run without), the AWS SDK
// configuration and the logger.
func Load(ctx context.Context, function string) (Setup, error) {
	s := Setup{Function: function, Now: time.Now}
	need, ok := needs[function]
	if !ok {
		return s, fmt.Errorf("unknown function %q", function)
	}
	var err error
	if s.Config, err = config.Read(os.Getenv, need); err != nil {
		return s, err
	}
	if s.AWS, err = AWSConfig(ctx); err != nil {
		return s, fmt.Errorf("aws configuration: %w", err)
	}
	s.Log = Logger(s.Config.LogLevel)
	if s.Config.DryRun {
		s.Log = s.Log.With(slog.Bool("dryRun", true))
	}
	return s, nil
}

// Metrics is the recorder of the setup's function.
func (s Setup) Metrics() *metrics.Recorder {
	return metrics.New(s.Log, s.Config.MetricsNamespace, s.Function)
}

// Clients are the clients of the outside systems a function is wired to.
// The wiring builds each one left nil from the setup: the functions leave
// them all nil, and a test sets those it points elsewhere or wraps.
type Clients struct {
	Queue intake.Queue
}

// WithDefaults is c with each client left nil built from the setup.
func (c Clients) WithDefaults(s Setup) Clients {
	if c.Queue == nil {
		c.Queue = workqueue.New(sqs.NewFromConfig(s.AWS), s.Config.QueueURL)
	}
	return c
}

// NewIntake wires the exitrecorder's and statechange's handlers.
func NewIntake(s Setup, c Clients) *intake.Intake {
	c = c.WithDefaults(s)
	return &intake.Intake{Queue: c.Queue, Log: s.Log, Metrics: s.Metrics(), Now: s.Now}
}

// Fatal reports an init failure as one clear line and exits; Lambda then
// shows it as the init error.
func Fatal(err error) {
	fmt.Fprintf(os.Stderr, "reaper: %v\n", err)
	os.Exit(1)
}
