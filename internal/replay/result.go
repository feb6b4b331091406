package replay

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reaper-k8s/reaper/internal/ec2server"
	"github.com/reaper-k8s/reaper/internal/esm"
	"github.com/reaper-k8s/reaper/internal/kubeproxy"
	"github.com/reaper-k8s/reaper/pkg/model"
	"github.com/reaper-k8s/reaper/pkg/reaper"
)

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
	// Containers is how many containers each Pod ran: Exits × Containers
	// container exits.
	Containers int
	Scale      float64
	Share      float64
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
	// SQS counts the work queue's requests by action, those a deployment
	// makes (not the lab's GetQueueAttributes polls).
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

// Lasts are when the last payload was delivered and when the last Pod was
// seen terminal (zero if none was).
func (r *BurstResult) Lasts() (delivered, terminal time.Time) {
	for _, p := range r.Pods {
		if p.Delivered.After(delivered) {
			delivered = p.Delivered
		}
		if p.Terminal.After(terminal) {
			terminal = p.Terminal
		}
	}
	return delivered, terminal
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
		// Only what a deployment makes: the functions never read the
		// queue's attributes, the lab's mapping and drain polls do.
		if c.Queue == queue && c.Action != "GetQueueAttributes" {
			res.SQS[c.Action]++
		}
	}
	if d, ok := stack.SQS.Depth(queueNameOf(b.Lab.DeadLetterURL)); ok {
		res.DeadLettered = d.Visible + d.InFlight
	}

	res.Kube = b.Kube.Calls.Counts()
	res.KubeErrors = b.Kube.Calls.CountsFunc(func(c kubeproxy.Call) bool { return c.ErrorCode != "" })
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
