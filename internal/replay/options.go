package replay

import (
	"fmt"
	"io"
	"time"

	"github.com/reaper-k8s/reaper/pkg/model"
)

// BurstOptions shape a burst: Exits Pods that end at once, each on an
// instance of its own.
type BurstOptions struct {
	Exits int
	// Containers is how many regular containers each Pod runs (default
	// 1). With more, each of the others ends first, exit 0, its line
	// (othersRunning) delivered on its own, then the Pod's last one with
	// the Pod's exit code: Exits Pods make Exits × Containers container
	// exits.
	Containers int
	// Senders are the exitrecorder environments the exit payloads are
	// delivered through in parallel, as Lambda runs concurrent invocations
	// of a subscription's payloads (default 4). With StateChanges as many
	// statechange environments deliver the EventBridge events.
	Senders int
	// Scale compresses time: the reconciler paces itself at EC2's published
	// buckets with their refill rates multiplied by Scale (default 1). Turn
	// the EC2 test server's buckets on at the same scale before Run:
	// EnableBuckets(ec2server.PublishedLimits(), Scale).
	Scale float64
	// Share is the part of the buckets the reconcilers take together
	// (REAPER_EC2_SHARE; default 0.5, the function's default).
	Share float64
	// Limits are the buckets the reconcilers pace themselves at
	// (REAPER_EC2_LIMITS; default ScaledLimits(Scale)).
	Limits string
	// StateChanges also delivers, for each instance that ends, the
	// shutting-down and terminated events EventBridge sends: once per
	// instance and state, whether Reaper terminated it or its host powered
	// itself off (Hosts).
	StateChanges bool
	// Hosts, when not nil, model the instances' hosts, which power
	// themselves off after their exit line; without it an instance runs
	// until Reaper terminates it.
	Hosts *Hosts
	// Provider, when not NoProvider, runs examples/vkprovider in that style
	// beside Reaper, its node and pod controllers on the burst's Pods:
	// they are then created Pending, bound to a virtual node of the run's
	// own (vkprovider.NodePrefix + "burst-<run>"), and the provider adopts
	// each one's instance (Config.InstanceOf) and reports it Running before
	// the first delivery. Its requests go to the EC2 test server itself,
	// sharing its buckets with the functions', and are counted apart
	// (BurstResult.ProviderEC2).
	Provider ProviderStyle
	// ProviderPoll is the provider's status period (default 1 s: see
	// defaultProviderPoll).
	ProviderPoll time.Duration
	// Progress, when not nil, shows a one-line progress indicator.
	Progress io.Writer
	// Lab shapes the lab. Its BatchingWindow and QueueVisibility default
	// to the construct's (1 s, and 6 × the reconciler's 5 min timeout)
	// rather than NewLab's 50 ms and 5 s: a burst's batches take longer
	// than 5 s, and a visibility timeout shorter than a batch hands its
	// messages to a second reconciler while the first still works on them.
	Lab LabOptions
}

func (o BurstOptions) withDefaults() BurstOptions {
	if o.Senders == 0 {
		o.Senders = 4
	}
	if o.Containers == 0 {
		o.Containers = 1
	}
	if o.Scale == 0 {
		o.Scale = 1
	}
	if o.Share == 0 {
		o.Share = 0.5
	}
	if o.Limits == "" {
		o.Limits = ScaledLimits(o.Scale)
	}
	if o.Lab.BatchingWindow == 0 {
		o.Lab.BatchingWindow = time.Second
	}
	if o.Lab.QueueVisibility == 0 {
		o.Lab.QueueVisibility = 30 * time.Minute
	}
	if o.Hosts != nil {
		h := o.Hosts.withDefaults()
		o.Hosts = &h
	}
	if o.ProviderPoll == 0 {
		o.ProviderPoll = defaultProviderPoll
	}
	return o
}

// ScaledLimits is REAPER_EC2_LIMITS for EC2's published buckets with their
// refill rates multiplied by scale, as EnableBuckets scales the test
// server's.
func ScaledLimits(scale float64) string {
	p := model.PublishedBudget()
	return fmt.Sprintf("describe=%d/%g,terminate=%d/%g,terminate-instances=%d/%g,create-tags=%d/%g",
		p.Describe.Capacity, p.Describe.Refill*scale,
		p.Terminate.Capacity, p.Terminate.Refill*scale,
		p.TerminateInstances.Capacity, p.TerminateInstances.Refill*scale,
		p.CreateTags.Capacity, p.CreateTags.Refill*scale)
}
