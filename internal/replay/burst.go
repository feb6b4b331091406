package replay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/reaper-k8s/reaper/examples/vkprovider"
	"github.com/reaper-k8s/reaper/internal/kubeproxy"
	"github.com/reaper-k8s/reaper/internal/labstack"
	"github.com/reaper-k8s/reaper/pkg/intake"
	"github.com/reaper-k8s/reaper/pkg/metrics"
)

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
	exitSenders, stateSenders []*labstack.Function
}

// NewBurst creates the burst's lab on stack with a ledger table of its own
// (so a queue of its own) from bootstraps, which must hold the
// exitrecorder and the reconciler, and the statechange function for
// StateChanges.
func NewBurst(ctx context.Context, stack *labstack.Stack, table string, bootstraps map[string]string, opts BurstOptions) (*Burst, error) {
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
	start := func(name string) ([]*labstack.Function, error) {
		fs := []*labstack.Function{b.Lab.Functions[name]}
		for len(fs) < opts.Senders {
			f, err := labstack.StartFunction(ctx, bins[name], b.Lab.Env)
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
func (b *Burst) startKubeProxy(stack *labstack.Stack) (string, error) {
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

// Stop stops the lab and the extra senders.
func (b *Burst) Stop() {
	for _, fs := range [][]*labstack.Function{b.exitSenders, b.stateSenders} {
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
	res := &BurstResult{Exits: n, Containers: b.opts.Containers, Scale: b.opts.Scale, Share: b.opts.Share, Namespace: fmt.Sprintf("burst-%d", run), Pods: make([]BurstPod, n),
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

// createPods creates the Pods and their instances and returns the exit
// payloads: running Pods on VirtualNode, or with node Pods bound to it for
// its provider to report Running.
func (b *Burst) createPods(ctx context.Context, run int64, node string, res *BurstResult, bar *Progress) ([]Exit, error) {
	exits, err := b.Lab.createExits(ctx, res.Namespace, node, len(res.Pods), b.opts.Containers, func(i int) (string, string, int) {
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
				for _, before := range exits[i].Before {
					if errs[i] == nil {
						errs[i] = invokeExpect(ctx, f, before, func(s intake.ExitSummary) bool { return s.Recorded == 1 && s.Queued == 1 })
					}
				}
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

// invokeExpect invokes f and checks its decoded response with ok.
func invokeExpect[T any](ctx context.Context, f *labstack.Function, payload []byte, ok func(T) bool) error {
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
