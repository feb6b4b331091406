// Package reaperapp wires the Reaper that the sweeper and the reconciler
// run, and that the CLI, the benchmarks and the property tests build the
// same way: the ledger, the Pods, the fleet and the work queue, read-only
// in a dry run (package app).
package reaperapp

import (
	"context"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"k8s.io/client-go/rest"

	"github.com/reaper-k8s/reaper/pkg/app"
	"github.com/reaper-k8s/reaper/pkg/config"
	"github.com/reaper-k8s/reaper/pkg/instances"
	"github.com/reaper-k8s/reaper/pkg/kube"
	"github.com/reaper-k8s/reaper/pkg/ledger"
	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/reaper"
	"github.com/reaper-k8s/reaper/pkg/workqueue"
)

// Clients are the outside systems' clients a Reaper is wired to. New builds
// each one left nil from the setup: the functions leave them all nil, and a
// test sets the ones it points elsewhere or wraps.
type Clients struct {
	app.Clients
	DynamoDB *dynamodb.Client
	EC2      *ec2.Client
	// Kube is the apiserver's REST configuration (default: how
	// Config.Kube says to reach it).
	Kube *rest.Config
	// DeadLetters is the work queue's dead-letter queue (default: the
	// queue at Config.DeadLetterURL, when set).
	DeadLetters reaper.Queue
}

// Policy is the decision policy a configuration sets.
func Policy(cfg config.Config) reaper.Policy {
	return reaper.Policy{ExitWait: cfg.ExitWait, TerminateStopped: cfg.TerminateStopped, OrphanCap: cfg.OrphanCap,
		PowerOffGrace: cfg.PowerOffGrace, PodWrittenTag: cfg.Tags.PodWritten, Reconcilers: cfg.ReconcilerConcurrency}
}

// New wires the Reaper of the setup's function.
func New(ctx context.Context, s app.Setup, c Clients) (*reaper.Reaper, error) {
	cfg := s.Config
	c.Clients = c.Clients.WithDefaults(s)
	if c.DeadLetters == nil && cfg.DeadLetterURL != "" {
		c.DeadLetters = workqueue.New(sqs.NewFromConfig(s.AWS), cfg.DeadLetterURL)
	}
	r := &reaper.Reaper{
		Queue:       c.Queue,
		DeadLetters: c.DeadLetters,
		Policy:      Policy(cfg),
		Log:         s.Log,
		Metrics:     s.Metrics(),
		Now:         s.Now,
	}
	if c.DynamoDB == nil {
		c.DynamoDB = dynamodb.NewFromConfig(s.AWS)
	}
	table := ledger.New(c.DynamoDB, cfg.Table)
	r.Ledger = table

	if c.Kube == nil {
		var err error
		if c.Kube, err = kube.RESTConfig(ctx, cfg.Kube, s.AWS); err != nil {
			return nil, err
		}
	}
	kc, err := kube.NewClient(c.Kube)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	pods := kube.NewStatusWriter(kc)
	pods.Log, pods.Metrics = s.Log, r.Metrics
	r.Pods = pods

	if c.EC2 == nil {
		c.EC2 = ec2.NewFromConfig(s.AWS)
	}
	fleet := instances.NewFleet(c.EC2, cfg.Tags, cfg.Cluster)
	if s.Function == metrics.FunctionReconciler {
		// The reconciler makes the calls that grow with the number of
		// exits: it paces them below its share of the account's buckets.
		fleet.Pace(cfg.ReconcilerBudget(), func(d time.Duration) { r.Metrics.Observe(metrics.EC2PacingWait, d) }).SharedBy(cfg.ReconcilerConcurrency)
	}
	r.Fleet = fleet

	if cfg.DryRun {
		r.Ledger, r.Pods, r.Fleet = ledger.ReadOnly{Table: table}, kube.ReadOnly{StatusWriter: pods}, instances.ReadOnly{Fleet: fleet}
	}
	return r, nil
}
