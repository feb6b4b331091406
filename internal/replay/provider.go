package replay

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"

	"github.com/reaper-k8s/reaper/examples/vkprovider"
	"github.com/reaper-k8s/reaper/internal/labstack"
	"github.com/reaper-k8s/reaper/pkg/ledger"
)

// ProviderStyle is a virtual-kubelet provider that runs beside Reaper in a
// burst (BurstOptions.Provider): examples/vkprovider in one of its two
// styles.
type ProviderStyle int

const (
	// NoProvider runs none: nothing but Reaper writes the burst's Pods.
	NoProvider ProviderStyle = iota
	// LedgerFirst is vkprovider.Run: a Pod's exit comes from Reaper's
	// ledger, and its instance's state tells only Pending and Running.
	LedgerFirst
	// StatusFromInstance is vkprovider.RunStatusFromInstance: a Pod's
	// status comes from its instance's state alone, an instance gone makes
	// it Failed, 255, InstanceGone.
	StatusFromInstance
)

func (s ProviderStyle) String() string {
	switch s {
	case NoProvider:
		return "none"
	case LedgerFirst:
		return "ledger-first"
	case StatusFromInstance:
		return "status-from-instance"
	}
	return fmt.Sprintf("ProviderStyle(%d)", int(s))
}

// defaultProviderPoll is the provider's status period in a burst. A real
// provider on virtual-kubelet refreshes statuses every 5 s by default; one
// that wants its Pods to follow their instances closely polls every
// second, which is what the burst runs: a period shorter than the hosts'
// 3 – 7 s power-off and than Reaper's write latency in a burst, so that the
// race between the provider and Reaper shows. It costs up to ⌈live Pods /
// 1,000⌉ DescribeInstances a second, naming the instances without a filter
// or pagination: 10 for 10,000 Pods, the whole refill of the account's
// bucket for such calls (50, refill 10 a second) in a real account, a
// quarter of it at the lab's × 4. Set ProviderPoll to 5 s for
// virtual-kubelet's default.
const defaultProviderPoll = time.Second

// providerRun is the provider running beside one burst: its node and pod
// controllers on the burst's Pods, which are bound to its virtual node.
type providerRun struct {
	style    ProviderStyle
	node     string
	cancel   context.CancelFunc
	stopOnce sync.Once
	// done is closed when the provider has returned, with err.
	done chan struct{}
	err  error
	// ec2 counts the provider's EC2 requests on its own client: it talks
	// to the EC2 test server directly, not through the recorder that
	// counts the functions'. dynamo counts its ledger reads (LedgerFirst).
	ec2    *requestCounter
	dynamo *OperationCounter
}

// startProvider runs the provider of the burst's style on node, adopting
// each Pod's instance from instances (by Pod UID) instead of launching one.
func (b *Burst) startProvider(ctx context.Context, node string, instances map[types.UID]string) (*providerRun, error) {
	stack := b.Lab.Stack
	awsCfg := stack.AWSConfig(ctx)
	p := &providerRun{style: b.opts.Provider, node: node, done: make(chan struct{}), ec2: &requestCounter{}}
	var next http.RoundTripper = http.DefaultTransport
	if hc, ok := awsCfg.HTTPClient.(*http.Client); ok && hc.Transport != nil {
		next = hc.Transport
	}
	p.ec2.next = next
	ec2Cfg := awsCfg.Copy()
	ec2Cfg.HTTPClient = &http.Client{Transport: p.ec2}
	cfg := vkprovider.Config{
		NodeName: node, Cluster: labstack.Cluster, ClusterUID: b.Lab.ClusterUID, Kube: stack.Kube,
		// The EC2 test server itself, not the recorder that counts the
		// functions' requests: the provider's polling is not Reaper's and
		// is counted apart (BurstResult.ProviderEC2). In a real account it
		// shares the account's DescribeInstances buckets with Reaper and
		// every other tool, as here it shares the test server's (its
		// calls name instances without a filter: the unfiltered bucket).
		EC2:     ec2.NewFromConfig(ec2Cfg),
		ImageID: "ami-0123456789abcdef0", InstanceType: ec2types.InstanceTypeG5Xlarge,
		InstanceProfile:  "reaper-host",
		StatusSyncPeriod: b.opts.ProviderPoll,
		InstanceOf: func(pod *corev1.Pod) (string, bool) {
			id, ok := instances[pod.UID]
			return id, ok
		},
	}
	run := vkprovider.RunStatusFromInstance
	if p.style == LedgerFirst {
		var err error
		if p.dynamo, err = NewOperationCounter(stack.DynamoEndpoint); err != nil {
			return nil, err
		}
		db := dynamodb.NewFromConfig(awsCfg, func(o *dynamodb.Options) { o.BaseEndpoint = aws.String(p.dynamo.URL()) })
		cfg.Ledger = ledger.New(db, b.Lab.Table)
		run = vkprovider.Run
	}
	runCtx, cancel := context.WithCancel(ctx)
	p.cancel = cancel
	go func() {
		defer close(p.done)
		p.err = run(runCtx, cfg)
	}()
	return p, nil
}

// stop stops the provider and returns what it failed with. Calling it
// again does nothing more.
func (p *providerRun) stop() error {
	p.stopOnce.Do(func() {
		p.cancel()
		<-p.done
		if p.dynamo != nil {
			p.dynamo.Close()
		}
	})
	if p.err != nil {
		return fmt.Errorf("provider %s: %w", p.style, p.err)
	}
	return nil
}

// reset forgets the provider's requests so far.
func (p *providerRun) reset() {
	p.ec2.reset()
	if p.dynamo != nil {
		p.dynamo.Reset()
	}
}

// adoptPatience bounds the wait for the provider's first statuses: the
// wait goes on while they keep coming.
const adoptPatience = time.Minute

// waitAdopted waits until the provider has reported every one of the n
// Pods of namespace Running, as it did when their instances started, and
// virtual-kubelet's Events of their creation have stopped coming: the
// burst then starts with the provider in its steady state, polling
// statuses that do not change.
func (p *providerRun) waitAdopted(ctx context.Context, stack *labstack.Stack, namespace string, n int) error {
	pods, events := stack.Kube.CoreV1().Pods(namespace), stack.Kube.CoreV1().Events(namespace)
	created := metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("reason", "ProviderCreateSuccess").String()}
	lastRunning, lastEvents, since := -1, -1, time.Now()
	for quiet := 0; ; {
		select {
		case <-p.done:
			return fmt.Errorf("provider %s stopped before it reported the Pods Running: %v", p.style, p.err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
		list, err := pods.List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		running := 0
		for i := range list.Items {
			if list.Items[i].Status.Phase == corev1.PodRunning {
				running++
			}
		}
		evs, err := events.List(ctx, created)
		if err != nil {
			return err
		}
		if running != lastRunning || len(evs.Items) != lastEvents {
			lastRunning, lastEvents, since, quiet = running, len(evs.Items), time.Now(), 0
		} else {
			quiet++
		}
		// The broadcaster may drop Events when its queue is full: two
		// quiet seconds end the wait for them.
		if running == n && (len(evs.Items) >= n || quiet >= 2) {
			return nil
		}
		if time.Since(since) > adoptPatience {
			return fmt.Errorf("provider %s: %d of %d Pods Running, %d created Events, no change for %v", p.style, running, n, len(evs.Items), adoptPatience)
		}
	}
}
