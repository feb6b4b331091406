package replay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/reaper-k8s/reaper/examples/vkprovider"
	"github.com/reaper-k8s/reaper/internal/ec2server"
	"github.com/reaper-k8s/reaper/internal/esm"
	"github.com/reaper-k8s/reaper/internal/kubeproxy"
	"github.com/reaper-k8s/reaper/internal/localstack"
	"github.com/reaper-k8s/reaper/pkg/exitline"
	"github.com/reaper-k8s/reaper/pkg/intake"
	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/model"
	"github.com/reaper-k8s/reaper/pkg/reaper"
	"github.com/reaper-k8s/reaper/pkg/userdata"
)

// BurstOptions shape a burst: Exits Pods that end at once, each on an
// instance of its own.
type BurstOptions struct {
	Exits int
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

// Hosts model hosts that power themselves off after their exit line, as
// the default user-data's do (userdata.ShutdownWhenShipped): each host
// powers off a random time from PowerOffMin to PowerOffMax after its exit
// line is delivered, except a NeverPowerOff part of them, which stay on
// until Reaper terminates them. Powering off is what EC2 shows of it: the
// instance is shutting-down at once and terminated ShutdownTime later (on
// the EC2 test server, SetState; a host that finds its instance no longer
// running, because Reaper terminated it first, does nothing). With
// StateChanges, EventBridge's event follows each of the two states.
//
// With AfterPodWritten a host that powers off waits for Reaper's tag on its
// instance first, and powers off PowerOffMin to PowerOffMax after it saw it.
//
// The draws come from a generator seeded with Seed, one draw per exit in
// the order of the exits: the same seed and number of exits power off the
// same hosts at the same offsets from their deliveries (or their tags).
type Hosts struct {
	// PowerOffMin and PowerOffMax bound a host's power-off after its
	// delivery (defaults 3 s and 7 s).
	PowerOffMin, PowerOffMax time.Duration
	// NeverPowerOff is the part of the hosts, from 0 to 1, that never power
	// off: round(NeverPowerOff·Exits) of them, picked at random.
	NeverPowerOff float64
	// ShutdownTime is how long a host that powers off stays shutting-down
	// before EC2 reports it terminated (default 1 s). The EC2 test server
	// settles Reaper's terminations at once.
	ShutdownTime time.Duration
	// LineAgeMin and LineAgeMax bound how long before its delivery each exit
	// line was written, its finishedAt: CloudWatch Logs delivers a line a
	// moment after the agent ships it (default 0, delivered as written).
	// Without Hosts a line's finishedAt is when its Pod was created.
	LineAgeMin, LineAgeMax time.Duration
	Seed                   uint64
	// AfterPodWritten, when not empty, is the tag key Reaper puts on an
	// instance once it has written its Pod's terminal status
	// (REAPER_TAG_POD_WRITTEN, which NewBurst then gives the functions): a
	// host that powers off does so PowerOffMin – PowerOffMax after it first
	// sees that tag on its instance instead of after its line's delivery.
	// It reads its tags as a real host reads them through the instance
	// metadata; here from the EC2 test server's instance, every tagPoll
	// (one loop over every host still waiting). A host whose instance is
	// no longer running before it sees the tag (Reaper terminated it) does
	// nothing. Hosts drawn never to power off never do.
	AfterPodWritten string
	// TagWaitMax is how long a host waits for the tag before it powers off
	// anyway, as a real host gives up waiting after its shutdown delay
	// (default userdata.DefaultShutdownDelay, 10 min, as deployed hosts
	// wait: a host that gives up before Reaper has written its Pod hands
	// the Pod to a provider that reads the instance's state).
	TagWaitMax time.Duration
}

// tagPoll is how often the hosts waiting for Reaper's tag read their
// instances' tags.
const tagPoll = 200 * time.Millisecond

func (h Hosts) withDefaults() Hosts {
	if h.PowerOffMin == 0 && h.PowerOffMax == 0 {
		h.PowerOffMin, h.PowerOffMax = 3*time.Second, 7*time.Second
	}
	if h.ShutdownTime == 0 {
		h.ShutdownTime = time.Second
	}
	if h.TagWaitMax == 0 {
		h.TagWaitMax = userdata.DefaultShutdownDelay
	}
	return h
}

func (h Hosts) check() error {
	if h.PowerOffMin < 0 || h.PowerOffMax < h.PowerOffMin || h.LineAgeMin < 0 || h.LineAgeMax < h.LineAgeMin ||
		h.ShutdownTime < 0 || h.NeverPowerOff < 0 || h.NeverPowerOff > 1 || h.TagWaitMax < 0 {
		return fmt.Errorf("burst: hosts %+v: want 0 ≤ min ≤ max for the power-off and the line age, a shutdown time and a wait for the tag of at least 0 and a part never powering off in [0, 1]", h)
	}
	return nil
}

// hostPlan is what one host will do.
type hostPlan struct {
	powersOff bool
	// after is how long after the delivery it powers off; lineAge how long
	// before the delivery its exit line was written.
	after, lineAge time.Duration
}

// plan draws what each of n hosts will do.
func (h Hosts) plan(n int) []hostPlan {
	rng := rand.New(rand.NewPCG(h.Seed, 0x6057))
	out := make([]hostPlan, n)
	never := int(math.Round(h.NeverPowerOff * float64(n)))
	for k, i := range rng.Perm(n) {
		out[i].powersOff = k >= never
	}
	between := func(lo, hi time.Duration) time.Duration {
		return lo + time.Duration(rng.Int64N(int64(hi-lo)+1))
	}
	for i := range out {
		out[i].after = between(h.PowerOffMin, h.PowerOffMax)
		out[i].lineAge = between(h.LineAgeMin, h.LineAgeMax)
	}
	return out
}

// Burst is a lab for bursts of exits: its own ledger table and work queue,
// exitrecorders to deliver through, reconcilers paced at the scaled
// published limits, and a counting proxy in front of DynamoDB.
type Burst struct {
	Lab  *Lab
	opts BurstOptions
	// dynamo counts the functions' DynamoDB requests: no counter can be put
	// inside the emulated processes, so their endpoint is a proxy.
	dynamo *OperationCounter
	// Kube is the functions' way to the apiserver: it counts their
	// requests, and a test can slow it down or make it fail.
	Kube    *kubeproxy.Proxy
	kubeDir string
	// ec2 notes the functions' EC2 requests by SDK operation.
	ec2 *ec2Recorder
	// exitSenders and stateSenders deliver payloads, one invocation at a
	// time each; the first of each is the lab's own.
	exitSenders, stateSenders []*localstack.Function
}

// NewBurst creates the burst's lab on stack with a ledger table of its own
// (so a queue of its own) from bootstraps, which must hold the
// exitrecorder and the reconciler, and the statechange function for
// StateChanges.
func NewBurst(ctx context.Context, stack *localstack.Stack, table string, bootstraps map[string]string, opts BurstOptions) (*Burst, error) {
	opts = opts.withDefaults()
	if opts.Exits < 1 || opts.Scale <= 0 || opts.Share <= 0 || opts.Share > 1 {
		return nil, fmt.Errorf("burst: %d exits, scale %v, share %v: want at least one exit, a positive scale and a share in (0, 1]", opts.Exits, opts.Scale, opts.Share)
	}
	if opts.Hosts != nil {
		if err := opts.Hosts.check(); err != nil {
			return nil, err
		}
	}
	if opts.Provider < NoProvider || opts.Provider > StatusFromInstance || opts.ProviderPoll < 0 {
		return nil, fmt.Errorf("burst: provider %v polling every %v: no such provider", opts.Provider, opts.ProviderPoll)
	}
	names := []string{metrics.FunctionExitRecorder, metrics.FunctionReconciler}
	if opts.StateChanges {
		names = append(names, metrics.FunctionStateChange)
	}
	bins := map[string]string{}
	for _, name := range names {
		bin, ok := bootstraps[name]
		if !ok {
			return nil, fmt.Errorf("burst: no %s bootstrap", name)
		}
		bins[name] = bin
	}
	dynamo, err := NewOperationCounter(stack.DynamoEndpoint)
	if err != nil {
		return nil, err
	}
	b := &Burst{opts: opts, dynamo: dynamo, ec2: newEC2Recorder(stack.EC2.URL())}
	kubeconfig, err := b.startKubeProxy(stack)
	if err != nil {
		b.Stop()
		return nil, err
	}
	labOpts := opts.Lab
	labOpts.Env = append(slices.Clone(labOpts.Env),
		"KUBECONFIG="+kubeconfig,
		"AWS_ENDPOINT_URL_DYNAMODB="+dynamo.URL(),
		"AWS_ENDPOINT_URL_EC2="+b.ec2.srv.URL,
		"REAPER_EC2_LIMITS="+opts.Limits,
		fmt.Sprintf("REAPER_EC2_SHARE=%g", opts.Share))
	if opts.Hosts != nil && opts.Hosts.AfterPodWritten != "" {
		labOpts.Env = append(labOpts.Env, "REAPER_TAG_POD_WRITTEN="+opts.Hosts.AfterPodWritten)
	}
	if b.Lab, err = NewLabWith(ctx, stack, table, bins, labOpts); err != nil {
		b.Stop()
		return nil, err
	}
	start := func(name string) ([]*localstack.Function, error) {
		fs := []*localstack.Function{b.Lab.Functions[name]}
		for len(fs) < opts.Senders {
			f, err := localstack.StartFunction(ctx, bins[name], b.Lab.Env)
			if err != nil {
				return fs, err
			}
			fs = append(fs, f)
		}
		return fs, nil
	}
	b.exitSenders, err = start(metrics.FunctionExitRecorder)
	if err == nil && opts.StateChanges {
		b.stateSenders, err = start(metrics.FunctionStateChange)
	}
	if err != nil {
		b.Stop()
		return nil, err
	}
	return b, nil
}

// startKubeProxy starts the proxy the functions reach the apiserver
// through, with the identity the lab's functions have (the stack's
// administrator), and returns the path of their kubeconfig.
func (b *Burst) startKubeProxy(stack *localstack.Stack) (string, error) {
	var err error
	if b.Kube, err = kubeproxy.Start(stack.RESTConfig()); err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp("", "reaper-burst-")
	if err != nil {
		return "", err
	}
	b.kubeDir = dir
	path := filepath.Join(dir, "kubeconfig")
	return path, b.Kube.WriteKubeconfig(path, stack.RESTConfig())
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

// Stop stops the lab and the extra senders.
func (b *Burst) Stop() {
	for _, fs := range [][]*localstack.Function{b.exitSenders, b.stateSenders} {
		for _, f := range fs[min(1, len(fs)):] {
			f.Stop()
		}
	}
	if b.Lab != nil {
		b.Lab.Stop()
	}
	if b.Kube != nil {
		b.Kube.Close()
		os.RemoveAll(b.kubeDir)
	}
	b.dynamo.Close()
	b.ec2.srv.Close()
}

// burstRuns numbers the runs of this process: each gets its own namespace
// and instance ids on the shared stack.
var burstRuns atomic.Int64

// BurstPod is one Pod of a burst and how it ended.
type BurstPod struct {
	Name, InstanceID string
	ExitCode         int
	// Delivered is when its exit payload was handed to an exitrecorder;
	// Terminal when the apiserver reported it Succeeded or Failed (zero if
	// it never did), with Phase.
	Delivered, Terminal time.Time
	Phase               corev1.PodPhase
	// ShuttingDown is when the first successful TerminateInstances naming
	// its instance arrived (zero if none did).
	ShuttingDown time.Time
	// Terminates counts the TerminateInstances operations that succeeded
	// naming it: an SDK retry of an operation is the same operation.
	Terminates int
	// With Hosts: PowersOff says its host was drawn to power itself off,
	// and PoweredOff is when it did (zero if it never did, or found its
	// instance already ended by Reaper).
	PowersOff  bool
	PoweredOff time.Time
	// EndState is the instance's state on the EC2 test server once the
	// burst is over.
	EndState ec2server.State
	// Reason and ExitSeen are the container's terminated reason and exit
	// code in the status the Pod was first seen terminal with (ExitSeen -1
	// when it had none).
	Reason   string
	ExitSeen int
	// Wrong says the Pod did not end with its exit line's truth: first
	// seen terminal, or at the end of the burst, with another phase or exit
	// code than its line's (Succeeded with 0, Failed with the code), or
	// with the reason vkprovider.InstanceGone, a provider's status.
	Wrong bool
	// TagSeen, with Hosts.AfterPodWritten, is when its host first saw
	// Reaper's tag on its instance (zero if it never did).
	TagSeen time.Time
}

// Gone is when the instance first ended: Reaper's first successful
// TerminateInstances naming it or its host's power-off, whichever came
// first (zero if neither did).
func (p BurstPod) Gone() time.Time {
	switch {
	case p.ShuttingDown.IsZero():
		return p.PoweredOff
	case p.PoweredOff.IsZero() || p.ShuttingDown.Before(p.PoweredOff):
		return p.ShuttingDown
	default:
		return p.PoweredOff
	}
}

// BatchCost is one reconciler invocation: its batch line and the
// emulator's duration for it.
type BatchCost struct {
	reaper.BatchSummary
	Duration time.Duration
}

// BurstResult is what a burst took and came to.
type BurstResult struct {
	Exits int
	Scale float64
	Share float64
	// Namespace holds the burst's Pods.
	Namespace string
	Pods      []BurstPod
	// FirstDelivery is when the first payload went out; Delivering how
	// long delivering all of them took.
	FirstDelivery time.Time
	Delivering    time.Duration
	// EC2 counts the functions' EC2 requests by action while the burst ran
	// (refused ones included), as the recorder in front of the EC2 test
	// server saw them, and Refused those answered RequestLimitExceeded (the
	// server's buckets refused them). Retried counts the requests that
	// were SDK retries of an operation already sent.
	EC2, Refused, Retried map[string]int
	// Kube counts the functions' apiserver requests by "VERB
	// resource[/subresource]", through Burst.Kube; KubeErrors those of
	// them answered with an error or cut short by the client.
	Kube, KubeErrors map[string]int
	// Dynamo counts the functions' DynamoDB requests by operation.
	Dynamo map[string]int
	// SQS counts the work queue's requests by action.
	SQS map[string]int
	// StateEvents is how many state-change events were delivered.
	StateEvents int
	// Mapping is what the event source mapping did during the burst.
	Invocations, FailedInvocations int
	BatchSizes                     []int
	// Batches are the reconciler invocations, in no particular order
	// across reconcilers.
	Batches []BatchCost
	// DeadLettered is the dead-letter queue's depth after the burst.
	DeadLettered int
	// TerminateNamed counts the burst's instances named in at least one
	// TerminateInstances request, whatever its answer: what the account's
	// TerminateInstances resource bucket was asked for. PoweredOff counts
	// the hosts that powered their instance off (BurstPod.PoweredOff).
	TerminateNamed, PoweredOff int
	// Provider is the provider that ran beside Reaper (BurstOptions).
	// ProviderEC2 and ProviderRefused count its EC2 requests by action
	// while the burst ran, and those refused; ProviderDynamo its DynamoDB
	// requests (LedgerFirst's ledger reads). None of them is among EC2,
	// Refused or Dynamo.
	Provider                                     ProviderStyle
	ProviderEC2, ProviderRefused, ProviderDynamo map[string]int
	// WrongPods are the Pods that did not end with their exit's truth
	// (BurstPod.Wrong), in the order of the exits.
	WrongPods []string
}

// AllGone is the time from the first delivery until the last instance was
// gone (BurstPod.Gone), and whether every one was.
func (r *BurstResult) AllGone() (time.Duration, bool) {
	var last time.Time
	for _, p := range r.Pods {
		g := p.Gone()
		if g.IsZero() {
			return 0, false
		}
		if g.After(last) {
			last = g
		}
	}
	return last.Sub(r.FirstDelivery), true
}

// StillRunning are the instances the EC2 test server did not report
// shutting-down or terminated once the burst was over.
func (r *BurstResult) StillRunning() []string {
	var out []string
	for _, p := range r.Pods {
		if !model.IsEnding(string(p.EndState)) {
			out = append(out, p.InstanceID)
		}
	}
	return out
}

// AllShuttingDown is the time from the first delivery until the last
// instance was shutting down, and whether every one was.
func (r *BurstResult) AllShuttingDown() (time.Duration, bool) {
	var last time.Time
	for _, p := range r.Pods {
		if p.ShuttingDown.IsZero() {
			return 0, false
		}
		if p.ShuttingDown.After(last) {
			last = p.ShuttingDown
		}
	}
	return last.Sub(r.FirstDelivery), true
}

// PodLatencies are, sorted, each terminal Pod's time from its delivery
// until the apiserver reported it terminal.
func (r *BurstResult) PodLatencies() []time.Duration {
	var out []time.Duration
	for _, p := range r.Pods {
		if !p.Terminal.IsZero() {
			out = append(out, p.Terminal.Sub(p.Delivered))
		}
	}
	slices.Sort(out)
	return out
}

// TerminateFloor is the least time EC2's resource bucket for
// TerminateInstances (1,000 instances, 20 a second, refill × the scale)
// allows for every instance to be shutting down to a client that may spend
// share of it: (N − share·1000) / (share·20·scale), at least zero.
func (r *BurstResult) TerminateFloor(share float64) time.Duration {
	b := model.PublishedBudget().TerminateInstances
	s := (float64(r.Exits) - share*float64(b.Capacity)) / (share * b.Refill * r.Scale)
	return time.Duration(math.Max(0, s) * float64(time.Second))
}

// Run lets the burst's Pods end at once: it creates Exits running Pods
// with tagged instances, delivers their exit payloads through the
// exitrecorders in parallel (with Hosts the hosts then power off; with
// StateChanges the state-change events of each instance that ends are
// delivered too), waits until every host has done what it will and the
// work queue is drained, and reports what it took. Every seventh Pod
// exits 1, the others 0. With a Provider, the provider adopts the Pods
// before the first delivery and runs until every Pod is terminal. The EC2
// test server must be the burst's alone while it runs.
func (b *Burst) Run(ctx context.Context) (*BurstResult, error) {
	run := burstRuns.Add(1)
	n := b.opts.Exits
	stack := b.Lab.Stack
	res := &BurstResult{Exits: n, Scale: b.opts.Scale, Share: b.opts.Share, Namespace: fmt.Sprintf("burst-%d", run), Pods: make([]BurstPod, n),
		Provider: b.opts.Provider}
	bar := NewProgress(b.opts.Progress, "burst", n)
	node := ""
	if b.opts.Provider != NoProvider {
		node = fmt.Sprintf("%sburst-%d", vkprovider.NodePrefix, run)
	}
	exits, err := b.createPods(ctx, run, node, res, bar)
	if err != nil {
		return nil, err
	}
	byInstance := make(map[string]int, n)
	for i, p := range res.Pods {
		byInstance[p.InstanceID] = i
	}
	var prov *providerRun
	if b.opts.Provider != NoProvider {
		instances := make(map[types.UID]string, n)
		for _, e := range exits {
			instances[e.Pod.UID] = e.InstanceID
		}
		if prov, err = b.startProvider(ctx, node, instances); err != nil {
			return nil, err
		}
		defer prov.stop()
		bar.Step(0, fmt.Sprintf("provider %s adopting the Pods", b.opts.Provider))
		if err := prov.waitAdopted(ctx, stack, res.Namespace, n); err != nil {
			return nil, err
		}
	}

	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	terminal, err := watchTerminal(watchCtx, stack, res.Namespace)
	if err != nil {
		return nil, err
	}
	ec2Before, sqsBefore := len(stack.EC2.Calls()), len(stack.SQS.Calls())
	b.Kube.Calls.Reset()
	b.dynamo.Reset()
	b.ec2.reset()
	if prov != nil {
		prov.reset()
	}
	stats := b.Lab.Mapping.Stats()
	logsBefore := make([]int, len(b.Lab.Reconcilers))
	for i, f := range b.Lab.Reconcilers {
		logsBefore[i] = len(f.Logs())
	}

	var delivered atomic.Int64
	gone := &goneSet{ids: map[string]bool{}}
	stopBar := bar.Follow(func() (int, string) {
		return gone.len(), fmt.Sprintf("exits: %d delivered, instances gone", delivered.Load())
	})
	stopCounting := make(chan struct{})

	var states *stateSender
	if b.opts.StateChanges {
		states = b.startStateChanges(ctx, ec2Before, byInstance, gone)
	} else {
		go countGone(stopCounting, stack, ec2Before, byInstance, gone)
	}
	var hosts *hostRun
	if h := b.opts.Hosts; h != nil {
		hosts = newHostRun(ctx, stack, *h, res.Pods, states, gone)
		// On an early return too, no host may touch an instance after Run.
		defer hosts.stop()
	}
	res.FirstDelivery = time.Now()
	deliverErr := b.deliver(ctx, res, exits, &delivered, hosts)
	res.Delivering = time.Since(res.FirstDelivery)
	if hosts != nil {
		// Every host that powers off has done so before the counts.
		hosts.wait()
	}
	errs := []error{deliverErr, b.Lab.Drain(ctx)}
	if states != nil {
		res.StateEvents, err = states.finish()
		errs = append(errs, err, b.Lab.Drain(ctx))
	}
	// The watch lags the apiserver's writes a little.
	errs = append(errs, terminal.wait(ctx, n, 10*time.Second))
	close(stopCounting)
	stopBar()
	stopWatch()
	if prov != nil {
		// Stopped before the Pods' end states are read.
		errs = append(errs, prov.stop())
		res.ProviderEC2, res.ProviderRefused = prov.ec2.counts()
		if prov.dynamo != nil {
			res.ProviderDynamo = prov.dynamo.Counts()
		}
	}

	b.collect(ctx, res, byInstance, terminal, ec2Before, sqsBefore, stats, logsBefore, &errs)
	return res, errors.Join(errs...)
}

// Follow shows what state says on the indicator four times a second, until
// the returned stop is called, which shows the last step: the indicator
// ends there, however many steps state says are done.
func (p *Progress) Follow(state func() (done int, what string)) (stop func()) {
	quit, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-quit:
				return
			case <-tick.C:
				done, what := state()
				p.Step(min(done, p.total-1), what)
			}
		}
	}()
	return func() {
		close(quit)
		<-exited
		_, what := state()
		p.Step(p.total, what)
	}
}

// createPods creates the Pods and their instances and returns the exit
// payloads: running Pods on VirtualNode, or with node Pods bound to it for
// its provider to report Running.
func (b *Burst) createPods(ctx context.Context, run int64, node string, res *BurstResult, bar *Progress) ([]Exit, error) {
	exits, err := b.Lab.createExits(ctx, res.Namespace, node, len(res.Pods), func(i int) (string, string, int) {
		code := 0
		if i%7 == 6 {
			code = 1
		}
		return fmt.Sprintf("exit-%05d", i), fmt.Sprintf("i-0b5%02x%012x", run%256, i), code
	}, func(created int) {
		if created%100 == 0 {
			bar.Step(0, fmt.Sprintf("creating Pods: %d", created))
		}
	})
	for i, e := range exits {
		if e.Pod != nil {
			res.Pods[i] = BurstPod{Name: e.Pod.Name, InstanceID: e.InstanceID, ExitCode: e.Code}
		}
	}
	return exits, err
}

// Exit is a running Pod on a managed instance of its own, with the
// subscription payload that ends it with Code.
type Exit struct {
	Pod        *corev1.Pod
	InstanceID string
	Code       int
	Payload    []byte
}

// ExitNames names the i-th exit of a batch: its Pod, its instance and its
// exit code.
type ExitNames func(i int) (pod, instanceID string, code int)

// fixtureWorkers bounds concurrent fixture writes to the apiserver.
const fixtureWorkers = 16

// CreateExits creates n exits in namespace (created when missing), named by
// names, fixtureWorkers at a time: each a running Pod (restart policy Never)
// on a managed instance, and its payload (ExitPayload with seq i).
// created, when not nil, is told how many are done after each one. An exit
// whose Pod could not be created is left zero, with its error among those
// returned.
func (l *Lab) CreateExits(ctx context.Context, namespace string, n int, names ExitNames, created func(done int)) ([]Exit, error) {
	return l.createExits(ctx, namespace, "", n, names, created)
}

// createExits is CreateExits, with Pods bound to node (BoundPod) rather
// than running on VirtualNode when node is not empty.
func (l *Lab) createExits(ctx context.Context, namespace, node string, n int, names ExitNames, created func(done int)) ([]Exit, error) {
	if err := l.Stack.EnsureNamespaces(ctx, namespace); err != nil {
		return nil, err
	}
	exits := make([]Exit, n)
	errs := make([]error, n)
	var done atomic.Int64
	next := make(chan int)
	var wg sync.WaitGroup
	for range fixtureWorkers {
		wg.Go(func() {
			for i := range next {
				name, id, code := names(i)
				var pod *corev1.Pod
				var err error
				if node == "" {
					pod, err = l.RunningPod(ctx, namespace, name, corev1.RestartPolicyNever)
				} else {
					pod, err = l.BoundPod(ctx, namespace, name, node, corev1.RestartPolicyNever)
				}
				if err != nil {
					errs[i] = err
					continue
				}
				l.AddInstance(id, pod, true)
				exits[i] = Exit{Pod: pod, InstanceID: id, Code: code}
				exits[i].Payload, errs[i] = ExitPayload(id, pod, code, i)
				if c := done.Add(1); created != nil {
					created(int(c))
				}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return exits, errors.Join(errs...)
}

// ExitPayload is the subscription payload carrying the exit line of the
// Pod's container (restart policy Never: no restart), encoded as
// CloudWatch Logs delivers it and as the Lambda runtime hands it to the
// function: JSON. seq makes the log event id unique.
func ExitPayload(instanceID string, pod *corev1.Pod, code, seq int) ([]byte, error) {
	ev, err := ExitLogsEvent(instanceID, pod, exitline.Line{ContainerID: BareContainerID(pod), ExitCode: code}, seq)
	if err != nil {
		return nil, err
	}
	return json.Marshal(ev)
}

// deliver hands every exit's payload to the exitrecorders, one invocation
// at a time each, and checks each summary. With hosts, each payload is
// made as it goes out, its line written lineAge before, and its host is
// told when it was delivered.
func (b *Burst) deliver(ctx context.Context, res *BurstResult, exits []Exit, delivered *atomic.Int64, hosts *hostRun) error {
	next := make(chan int)
	errs := make([]error, len(exits))
	var wg sync.WaitGroup
	for _, f := range b.exitSenders {
		wg.Go(func() {
			for i := range next {
				at, payload := time.Now(), exits[i].Payload
				if hosts != nil {
					payload, errs[i] = exitPayloadAt(exits[i], i, at.Add(-hosts.plan[i].lineAge))
				}
				res.Pods[i].Delivered = at
				if errs[i] == nil {
					errs[i] = invokeExpect(ctx, f, payload, func(s intake.ExitSummary) bool { return s.Recorded == 1 && s.Queued == 1 })
				}
				if hosts != nil && errs[i] == nil {
					hosts.delivered(i, at)
				}
				delivered.Add(1)
			}
		})
	}
	for i := range exits {
		next <- i
	}
	close(next)
	wg.Wait()
	return errors.Join(errs...)
}

// exitPayloadAt is ExitPayload for an exit whose line says it finished at
// finishedAt.
func exitPayloadAt(e Exit, seq int, finishedAt time.Time) ([]byte, error) {
	ev, err := ExitLogsEvent(e.InstanceID, e.Pod, exitline.Line{ContainerID: BareContainerID(e.Pod), ExitCode: e.Code, FinishedAt: finishedAt.UTC()}, seq)
	if err != nil {
		return nil, err
	}
	return json.Marshal(ev)
}

// hostRun is the hosts of a burst while it runs (Hosts).
type hostRun struct {
	ctx      context.Context
	cancel   context.CancelFunc
	ec2      *ec2server.Server
	plan     []hostPlan
	pods     []BurstPod
	shutdown time.Duration
	// states, when not nil, delivers the state-change events.
	states *stateSender
	gone   *goneSet
	// wg counts the steps scheduled and not yet taken, a host waiting for
	// its tag among them.
	wg sync.WaitGroup

	// tagKey is Hosts.AfterPodWritten; waiting holds the hosts waiting for
	// it, with when each started to.
	tagKey  string
	tagWait time.Duration
	mu      sync.Mutex
	waiting map[int]time.Time
	// closed says the tag loop has stopped: no host may wait any more.
	closed bool
	// loopDone is closed when the tag loop has returned.
	loopDone chan struct{}
}

func newHostRun(ctx context.Context, stack *localstack.Stack, h Hosts, pods []BurstPod, states *stateSender, gone *goneSet) *hostRun {
	r := &hostRun{ec2: stack.EC2, plan: h.plan(len(pods)), pods: pods, shutdown: h.ShutdownTime, states: states, gone: gone,
		tagKey: h.AfterPodWritten, tagWait: h.TagWaitMax, waiting: map[int]time.Time{}, loopDone: make(chan struct{})}
	r.ctx, r.cancel = context.WithCancel(ctx)
	for i := range pods {
		pods[i].PowersOff = r.plan[i].powersOff
	}
	if r.tagKey != "" {
		go r.tagLoop()
	} else {
		close(r.loopDone)
	}
	return r
}

// delivered tells host i its exit line was delivered at: it powers off its
// plan's time later, or with a tag key its plan's time after it sees the
// tag, if it ever does.
func (r *hostRun) delivered(i int, at time.Time) {
	if !r.plan[i].powersOff {
		return
	}
	if r.tagKey == "" {
		r.later(time.Until(at.Add(r.plan[i].after)), func() { r.powerOff(i) })
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.closed {
		r.wg.Add(1)
		r.waiting[i] = at
	}
}

// tagLoop reads, every tagPoll, the instance tags of every host waiting for
// the tag: one that sees it powers off its plan's time later; one whose
// instance no longer runs has nothing left to do; one that waited tagWait
// powers off at once. When the run stops, the hosts still waiting stop
// too.
func (r *hostRun) tagLoop() {
	defer close(r.loopDone)
	tick := time.NewTicker(tagPoll)
	defer tick.Stop()
	for {
		select {
		case <-r.ctx.Done():
			r.mu.Lock()
			r.closed = true
			for i := range r.waiting {
				delete(r.waiting, i)
				r.wg.Done()
			}
			r.mu.Unlock()
			return
		case <-tick.C:
		}
		r.mu.Lock()
		waiting := make([]int, 0, len(r.waiting))
		for i := range r.waiting {
			waiting = append(waiting, i)
		}
		r.mu.Unlock()
		for _, i := range waiting {
			inst, ok := r.ec2.Instance(r.pods[i].InstanceID)
			now := time.Now()
			r.mu.Lock()
			since := r.waiting[i]
			r.mu.Unlock()
			switch {
			case !ok || inst.State != ec2server.Running:
			case inst.Tags[r.tagKey] != "":
				r.pods[i].TagSeen = now
				r.later(r.plan[i].after, func() { r.powerOff(i) })
			case now.Sub(since) >= r.tagWait:
				r.later(0, func() { r.powerOff(i) })
			default:
				continue
			}
			r.mu.Lock()
			delete(r.waiting, i)
			r.mu.Unlock()
			r.wg.Done()
		}
	}
}

// later runs step after d, unless the run was stopped by then.
func (r *hostRun) later(d time.Duration, step func()) {
	r.wg.Add(1)
	time.AfterFunc(d, func() {
		defer r.wg.Done()
		if r.ctx.Err() == nil {
			step()
		}
	})
}

// powerOff powers host i off: its instance is shutting-down at once and
// terminated a shutdown time later, each state with its event. A host
// whose instance Reaper already ended has nothing left to do.
func (r *hostRun) powerOff(i int) {
	id := r.pods[i].InstanceID
	if inst, ok := r.ec2.Instance(id); !ok || inst.State != ec2server.Running {
		return
	}
	r.ec2.SetState(id, ec2server.ShuttingDown)
	r.pods[i].PoweredOff = time.Now()
	r.gone.add(id)
	r.event(id, model.StateShuttingDown)
	r.later(r.shutdown, func() {
		r.ec2.SetState(id, ec2server.Terminated)
		r.event(id, model.StateTerminated)
	})
}

func (r *hostRun) event(id, state string) {
	if r.states != nil {
		r.states.send(id, state)
	}
}

// wait waits until every host told of its delivery has powered off, or
// found its instance ended first.
func (r *hostRun) wait() { r.wg.Wait() }

// stop cancels the steps not yet taken and waits for those under way.
func (r *hostRun) stop() {
	r.cancel()
	<-r.loopDone
	r.wg.Wait()
}

// goneSet is the burst's instances seen gone so far, for the progress
// indicator.
type goneSet struct {
	mu  sync.Mutex
	ids map[string]bool
}

func (g *goneSet) add(id string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.ids[id] = true
}

func (g *goneSet) len() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.ids)
}

// invokeExpect invokes f and checks its decoded response with ok.
func invokeExpect[T any](ctx context.Context, f *localstack.Function, payload []byte, ok func(T) bool) error {
	resp, fnErr, err := f.Invoke(ctx, payload)
	if err == nil && fnErr != nil {
		err = fnErr
	}
	if err != nil {
		return fmt.Errorf("%s: %w", f.Name, err)
	}
	var out T
	if err := json.Unmarshal(resp, &out); err != nil || !ok(out) {
		return fmt.Errorf("%s: response %s", f.Name, resp)
	}
	return nil
}

// tailPoll is how often the EC2 test server's log is read for terminates.
const tailPoll = 50 * time.Millisecond

// terminatedSince calls fn with each burst instance a call from index from
// on of the server's terminated (ec2server.Call.Terminated), and returns
// the index to read from next.
func terminatedSince(stack *localstack.Stack, from int, byInstance map[string]int, fn func(id string)) int {
	calls := stack.EC2.Calls()
	for _, c := range calls[min(from, len(calls)):] {
		for _, id := range c.Terminated() {
			if _, ok := byInstance[id]; ok {
				fn(id)
			}
		}
	}
	return len(calls)
}

// countGone adds the burst instances terminated so far to gone, for the
// progress indicator, until stop is closed.
func countGone(stop <-chan struct{}, stack *localstack.Stack, from int, byInstance map[string]int, gone *goneSet) {
	tick := time.NewTicker(tailPoll)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
			from = terminatedSince(stack, from, byInstance, gone.add)
		}
	}
}

// stateSender delivers the state-change events of the burst's instances
// as EventBridge does, once per instance and state: shutting-down, then
// terminated. Those of an instance Reaper terminates are sent when its
// TerminateInstances shows in the EC2 test server's log (the server
// settles it at once); a host that powers off sends its own (send).
type stateSender struct {
	stop chan struct{}
	done chan struct{}
	sent atomic.Int64
	err  error

	mu     sync.Mutex
	queued map[stateKey]bool
	// events holds every event queued: there are at most two per instance.
	events chan stateKey
}

// stateKey is an instance and a state it reached.
type stateKey struct{ id, state string }

func (b *Burst) startStateChanges(ctx context.Context, from int, byInstance map[string]int, gone *goneSet) *stateSender {
	all := 2 * len(byInstance)
	s := &stateSender{stop: make(chan struct{}), done: make(chan struct{}), queued: map[stateKey]bool{}, events: make(chan stateKey, all)}
	var wg sync.WaitGroup
	errs := make([]error, len(b.stateSenders))
	for k, f := range b.stateSenders {
		wg.Go(func() {
			for ev := range s.events {
				payload, err := json.Marshal(StateChangeEvent(fmt.Sprintf("burst-%s-%s", ev.id, ev.state), ev.id, ev.state, time.Now().UTC().Truncate(time.Second)))
				if err == nil {
					err = invokeExpect(ctx, f, payload, func(s intake.StateSummary) bool { return s.Queued })
				}
				if err != nil {
					errs[k] = errors.Join(errs[k], err)
					continue
				}
				s.sent.Add(1)
			}
		})
	}
	stack := b.Lab.Stack
	go func() {
		defer close(s.done)
		// shuttingDown are the instances terminated whose terminated state
		// EC2 did not report yet: a host powering one off ends it when its
		// shutdown does.
		shuttingDown := map[string]bool{}
		tail := func() {
			from = terminatedSince(stack, from, byInstance, func(id string) {
				gone.add(id)
				s.send(id, model.StateShuttingDown)
				shuttingDown[id] = true
			})
			for id := range shuttingDown {
				if inst, ok := stack.EC2.Instance(id); ok && inst.State == ec2server.Terminated {
					s.send(id, model.StateTerminated)
					delete(shuttingDown, id)
				}
			}
		}
		tick := time.NewTicker(tailPoll)
		defer tick.Stop()
	loop:
		for s.count() < all {
			select {
			case <-s.stop:
				break loop
			case <-tick.C:
				tail()
			}
		}
		tail()
		close(s.events)
		wg.Wait()
		s.err = errors.Join(errs...)
	}()
	return s
}

// send queues the event of id reaching state, unless it was queued before.
// It may not be called after finish.
func (s *stateSender) send(id, state string) {
	k := stateKey{id, state}
	s.mu.Lock()
	if s.queued[k] {
		s.mu.Unlock()
		return
	}
	s.queued[k] = true
	s.mu.Unlock()
	s.events <- k
}

func (s *stateSender) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.queued)
}

// finish delivers the events queued so far and those of the terminations
// seen so far, and returns how many events were delivered.
func (s *stateSender) finish() (int, error) {
	close(s.stop)
	<-s.done
	return int(s.sent.Load()), s.err
}

// terminalWatch records when and how each Pod of a namespace is first seen
// Succeeded or Failed.
type terminalWatch struct {
	mu   sync.Mutex
	ends map[string]podEnd
	// changed is signalled (without blocking) at each new terminal Pod.
	changed chan struct{}
	err     error
}

// podEnd is a terminal Pod's status as seen at a time.
type podEnd struct {
	at     time.Time
	phase  corev1.PodPhase
	reason string
	// code is the container's exit code, -1 when it has none.
	code int
}

// endOf is the terminal status of pod now, and whether it has one.
func endOf(pod *corev1.Pod) (podEnd, bool) {
	if pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed {
		return podEnd{}, false
	}
	e := podEnd{at: time.Now(), phase: pod.Status.Phase, code: -1}
	for _, cs := range pod.Status.ContainerStatuses {
		if t := cs.State.Terminated; t != nil {
			e.reason, e.code = t.Reason, int(t.ExitCode)
		}
	}
	return e, true
}

// truthful says e is what an exit with code ends its Pod with: Succeeded
// with 0, Failed with the code, and not a provider's "instance gone".
func (e podEnd) truthful(code int) bool {
	phase := corev1.PodSucceeded
	if code != 0 {
		phase = corev1.PodFailed
	}
	return e.phase == phase && e.code == code && e.reason != vkprovider.InstanceGone
}

// watchTerminal lists the namespace's Pods, then watches them until ctx
// ends, listing again when the apiserver closes the watch.
func watchTerminal(ctx context.Context, stack *localstack.Stack, namespace string) (*terminalWatch, error) {
	w := &terminalWatch{ends: map[string]podEnd{}, changed: make(chan struct{}, 1)}
	pods := stack.Kube.CoreV1().Pods(namespace)
	start := func() (watch.Interface, error) {
		list, err := pods.List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, err
		}
		for i := range list.Items {
			w.see(&list.Items[i])
		}
		return pods.Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	}
	wi, err := start()
	if err != nil {
		return nil, fmt.Errorf("watch pods of %s: %w", namespace, err)
	}
	go func() {
		for {
			for ev := range wi.ResultChan() {
				if pod, ok := ev.Object.(*corev1.Pod); ok {
					w.see(pod)
				}
			}
			wi.Stop()
			if ctx.Err() != nil {
				return
			}
			if wi, err = start(); err != nil {
				w.mu.Lock()
				w.err = err
				w.mu.Unlock()
				return
			}
		}
	}()
	return w, nil
}

func (w *terminalWatch) see(pod *corev1.Pod) {
	e, ok := endOf(pod)
	if !ok {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.ends[pod.Name]; ok {
		return
	}
	w.ends[pod.Name] = e
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

// wait waits until n Pods are terminal, or for at most patience once no
// new one arrives.
func (w *terminalWatch) wait(ctx context.Context, n int, patience time.Duration) error {
	for {
		w.mu.Lock()
		got, err := len(w.ends), w.err
		w.mu.Unlock()
		if got >= n {
			return nil
		}
		if err != nil {
			return fmt.Errorf("watch pods: %w", err)
		}
		t := time.NewTimer(patience)
		select {
		case <-w.changed:
			t.Stop()
		case <-t.C:
			return fmt.Errorf("%d of %d Pods terminal", got, n)
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
}

// collect fills in what the counters saw from the given starting points.
func (b *Burst) collect(ctx context.Context, res *BurstResult, byInstance map[string]int, terminal *terminalWatch,
	ec2Before, sqsBefore int, stats0 esm.Stats, logsBefore []int, errs *[]error) {
	stack := b.Lab.Stack
	terminal.mu.Lock()
	for i := range res.Pods {
		p := &res.Pods[i]
		p.ExitSeen = -1
		if e, ok := terminal.ends[p.Name]; ok {
			p.Terminal, p.Phase, p.Reason, p.ExitSeen = e.at, e.phase, e.reason, e.code
			p.Wrong = !e.truthful(p.ExitCode)
		}
	}
	terminal.mu.Unlock()
	// A terminal status may still change (the apiserver lets one phase
	// flip to the other): the end states count as well.
	list, err := stack.Kube.CoreV1().Pods(res.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		*errs = append(*errs, fmt.Errorf("list the Pods at the end: %w", err))
	} else {
		byName := make(map[string]*corev1.Pod, len(list.Items))
		for i := range list.Items {
			byName[list.Items[i].Name] = &list.Items[i]
		}
		for i := range res.Pods {
			p := &res.Pods[i]
			if pod, ok := byName[p.Name]; ok {
				if e, ok := endOf(pod); ok && !e.truthful(p.ExitCode) {
					p.Wrong = true
				}
			}
		}
	}
	for _, p := range res.Pods {
		if p.Wrong {
			res.WrongPods = append(res.WrongPods, p.Name)
		}
	}

	ec2 := stack.EC2.TallySince(ec2Before)
	res.EC2, res.Refused = b.ec2.requests()
	for id, at := range ec2.FirstTerminated {
		if i, ok := byInstance[id]; ok {
			res.Pods[i].ShuttingDown = at
		}
	}
	var terminates map[string]int
	res.Retried, terminates = b.ec2.operations()
	for id, n := range terminates {
		if i, ok := byInstance[id]; ok {
			res.Pods[i].Terminates = n
		}
	}
	for id := range b.ec2.terminateNamed() {
		if _, ok := byInstance[id]; ok {
			res.TerminateNamed++
		}
	}
	for i := range res.Pods {
		p := &res.Pods[i]
		if !p.PoweredOff.IsZero() {
			res.PoweredOff++
		}
		if inst, ok := stack.EC2.Instance(p.InstanceID); ok {
			p.EndState = inst.State
		}
	}

	queue := queueNameOf(b.Lab.QueueURL)
	res.SQS = map[string]int{}
	sqsCalls := stack.SQS.Calls()
	for _, c := range sqsCalls[min(sqsBefore, len(sqsCalls)):] {
		if c.Queue == queue {
			res.SQS[c.Action]++
		}
	}
	if d, ok := stack.SQS.Depth(queueNameOf(b.Lab.DeadLetterURL)); ok {
		res.DeadLettered = d.Visible + d.InFlight
	}

	res.Kube, res.KubeErrors = map[string]int{}, map[string]int{}
	for _, c := range b.Kube.Calls.Calls() {
		res.Kube[c.Action]++
		if c.ErrorCode != "" {
			res.KubeErrors[c.Action]++
		}
	}
	res.Dynamo = b.dynamo.Counts()

	stats := b.Lab.Mapping.Stats()
	res.Invocations = stats.Invocations - stats0.Invocations
	res.FailedInvocations = stats.FailedInvocations - stats0.FailedInvocations
	res.BatchSizes = slices.Clone(stats.BatchSizes[len(stats0.BatchSizes):])
	for i, f := range b.Lab.Reconcilers {
		res.Batches = append(res.Batches, batchCosts(f.Logs()[logsBefore[i]:])...)
	}
}

func queueNameOf(url string) string { return url[strings.LastIndex(url, "/")+1:] }

var reportLineRE = regexp.MustCompile(`^REPORT RequestId: \S+\s+(?:Init Duration: [0-9.]+ ms\s+)?Duration: ([0-9.]+) ms`)

// batchCosts reads a reconciler's log: each "batch" line, with the
// duration of the emulator's REPORT line that follows it.
func batchCosts(logs string) []BatchCost {
	var out []BatchCost
	for line := range strings.SplitSeq(logs, "\n") {
		if m := reportLineRE.FindStringSubmatch(line); m != nil {
			if len(out) > 0 && out[len(out)-1].Duration == 0 {
				ms, _ := strconv.ParseFloat(m[1], 64)
				out[len(out)-1].Duration = time.Duration(ms * float64(time.Millisecond))
			}
			continue
		}
		if !strings.Contains(line, `"msg":"batch"`) {
			continue
		}
		var c BatchCost
		if json.Unmarshal([]byte(line[strings.IndexByte(line, '{'):]), &c.BatchSummary) == nil {
			out = append(out, c)
		}
	}
	return out
}

// KubeRequests reads the apiserver's request counter
// (apiserver_request_total) summed by "VERB resource[/subresource]"; a
// request to a path outside the API (/metrics, /healthz) counts as
// "VERB -".
func KubeRequests(ctx context.Context, stack *localstack.Stack) (map[string]int, error) {
	raw, err := stack.Kube.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("apiserver metrics: %w", err)
	}
	out := map[string]int{}
	for line := range strings.SplitSeq(string(raw), "\n") {
		rest, ok := strings.CutPrefix(line, "apiserver_request_total{")
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(rest, "} ")
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if !ok || err != nil {
			continue
		}
		l := map[string]string{}
		for _, m := range metricLabelRE.FindAllStringSubmatch(labels, -1) {
			l[m[1]] = m[2]
		}
		key := l["verb"] + " -"
		if l["resource"] != "" {
			key = l["verb"] + " " + l["resource"]
			if l["subresource"] != "" {
				key += "/" + l["subresource"]
			}
		}
		out[key] += int(v)
	}
	return out, nil
}

var metricLabelRE = regexp.MustCompile(`(\w+)="([^"]*)"`)

// OperationCounter is a reverse proxy in front of an AWS JSON-protocol
// endpoint (dynalite) that counts the requests by operation, the action of
// their X-Amz-Target header ("DynamoDB_20120810.UpdateItem" counts as
// UpdateItem). Point a client's endpoint at URL.
type OperationCounter struct {
	srv    *httptest.Server
	mu     sync.Mutex
	counts map[string]int
}

// NewOperationCounter starts a counting proxy for target.
func NewOperationCounter(target string) (*OperationCounter, error) {
	u, err := url.Parse(target)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("proxy target %q: not a URL", target)
	}
	c := &OperationCounter{counts: map[string]int{}}
	proxy := httputil.NewSingleHostReverseProxy(u)
	// Enough idle connections for every client at once: the default two
	// would open and close a connection for most requests.
	proxy.Transport = &http.Transport{MaxIdleConnsPerHost: 256, IdleConnTimeout: time.Minute}
	c.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		target := r.Header.Get("X-Amz-Target")
		c.mu.Lock()
		c.counts[target[strings.LastIndexByte(target, '.')+1:]]++
		c.mu.Unlock()
		proxy.ServeHTTP(w, r)
	}))
	return c, nil
}

// URL is the proxy's endpoint.
func (c *OperationCounter) URL() string { return c.srv.URL }

// Counts returns the requests by operation since the start or Reset.
func (c *OperationCounter) Counts() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.counts)
}

// Reset forgets the counts.
func (c *OperationCounter) Reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.counts)
}

// Close stops the proxy.
func (c *OperationCounter) Close() { c.srv.Close() }

// ec2Recorder is a reverse proxy in front of the EC2 test server that notes
// each request's SDK invocation id (amz-sdk-invocation-id), which the SDK
// gives an operation and keeps across its retries. The test server's log
// counts attempts; the recorder tells operations apart: against a server
// this fast the SDK now and then loses an answer that was sent (see
// sqsserver.BufferedBodies) and retries an operation that had succeeded.
type ec2Recorder struct {
	srv *httptest.Server
	mu  sync.Mutex
	ops []ec2Request
}

// ec2Request is one request as the recorder saw it.
type ec2Request struct {
	action, invocation string
	instances          []string
	status             int
	// code is the answer's error code, "" on success.
	code string
}

func newEC2Recorder(target string) *ec2Recorder {
	u, _ := url.Parse(target)
	proxy := httputil.NewSingleHostReverseProxy(u)
	proxy.Transport = &http.Transport{MaxIdleConnsPerHost: 256, IdleConnTimeout: time.Minute}
	rec := &ec2Recorder{}
	rec.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		form, _ := url.ParseQuery(string(body))
		req := ec2Request{action: form.Get("Action"), invocation: r.Header.Get("Amz-Sdk-Invocation-Id")}
		for k, v := range form {
			if strings.HasPrefix(k, "InstanceId.") {
				req.instances = append(req.instances, v...)
			}
		}
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		proxy.ServeHTTP(sw, r)
		req.status, req.code = sw.status, errorCode(sw.errorBody)
		rec.mu.Lock()
		rec.ops = append(rec.ops, req)
		rec.mu.Unlock()
	}))
	return rec
}

func (r *ec2Recorder) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops = nil
}

// requests returns, since the last reset, the requests by action and
// those answered RequestLimitExceeded.
func (r *ec2Recorder) requests() (requests, refused map[string]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	requests, refused = map[string]int{}, map[string]int{}
	for _, op := range r.ops {
		requests[op.action]++
		if op.code == "RequestLimitExceeded" {
			refused[op.action]++
		}
	}
	return requests, refused
}

// operations returns, since the last reset, the requests by action that
// retried an operation already seen, and per instance the successful
// TerminateInstances operations that named it.
func (r *ec2Recorder) operations() (retried, terminates map[string]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	retried = map[string]int{}
	seen := map[string]bool{}
	for _, op := range r.ops {
		if op.invocation != "" && seen[op.invocation] {
			retried[op.action]++
		}
		seen[op.invocation] = true
	}
	return retried, r.terminatesAnswered(http.StatusOK)
}

// terminates counts, since the last reset, per instance the
// TerminateInstances operations naming it that were answered status at
// least once: the SDK's retries of an operation (one invocation id) are
// one operation.
func (r *ec2Recorder) terminates(status int) map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.terminatesAnswered(status)
}

// terminateNamed is, since the last reset, the instances named in a
// TerminateInstances request, whatever its answer.
func (r *ec2Recorder) terminateNamed() map[string]bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]bool{}
	for _, op := range r.ops {
		if op.action == "TerminateInstances" {
			for _, id := range op.instances {
				out[id] = true
			}
		}
	}
	return out
}

func (r *ec2Recorder) terminatesAnswered(status int) map[string]int {
	out := map[string]int{}
	counted := map[[2]string]bool{}
	for _, op := range r.ops {
		if op.action != "TerminateInstances" || op.status != status {
			continue
		}
		for _, id := range op.instances {
			if k := [2]string{op.invocation, id}; !counted[k] {
				counted[k] = true
				out[id]++
			}
		}
	}
	return out
}

// statusWriter keeps the status code of the response it writes, and the
// body of an error.
type statusWriter struct {
	http.ResponseWriter
	status    int
	errorBody []byte
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

// maxErrorBody bounds what statusWriter keeps of an error's body: EC2's
// error responses are a few hundred bytes.
const maxErrorBody = 4096

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status >= 400 && len(w.errorBody) < maxErrorBody {
		w.errorBody = append(w.errorBody, p[:min(len(p), maxErrorBody-len(w.errorBody))]...)
	}
	return w.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
