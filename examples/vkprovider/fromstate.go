package vkprovider

import (
	"context"
	"maps"
	"slices"

	"github.com/aws/aws-sdk-go-v2/aws"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	"github.com/virtual-kubelet/virtual-kubelet/node"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1listers "k8s.io/client-go/listers/core/v1"

	"github.com/reaper-k8s/reaper/pkg/podstatus"
)

// InstanceGone is the reason RunStatusFromInstance's provider gives each
// container of a Pod whose instance went (shutting-down or terminated) that
// the Pod did not show ended.
const InstanceGone = "InstanceGone"

// RunStatusFromInstance is Run with the other provider style, the one that
// ignores Reaper's ledger: a Pod's status comes from its instance's EC2
// state alone, as many providers derive it. While the instance is pending
// or running, the statuses are Run's. An instance shutting down or
// terminated ends its Pod: every container the Pod does not show ended
// gets exit code 255 and reason InstanceGone, whatever its exit was (one
// whose turn never came waits, PodInitializing), and the Pod is Failed, or
// Succeeded when every regular container shows exit 0 and only sidecars
// went with the instance, as the kubelet's rule says. Each
// StatusSyncPeriod it describes the instances of every live Pod together,
// ⌈live Pods / 1,000⌉ DescribeInstances, and notifies each change at once.
// Config.Ledger is not used.
//
// Such a provider keeps a Pod's true exit only when Reaper writes the Pod
// before the provider sees its instance go: the terminal Pod is then
// skipped, and virtual-kubelet's stale write is refused on its
// resourceVersion. Reaper's own terminate comes after its write, but a host
// that powers itself off right after its exit line (userdata's default,
// ShutdownWhenShipped) goes before a burst's write reaches its Pod, and the
// Pod ends as InstanceGone for good. Run it only with hosts that power off
// once Reaper has tagged their instance as written (REAPER_TAG_POD_WRITTEN),
// or that stay on until Reaper terminates them; Run, which reads the ledger
// first, has no such need.
func RunStatusFromInstance(ctx context.Context, cfg Config) error {
	return run(ctx, cfg, func(cfg Config, lister corev1listers.PodLister) node.PodLifecycleHandler {
		return &statusFromInstance{provider: newProvider(cfg, lister)}
	})
}

// statusFromInstance is the provider of RunStatusFromInstance: the
// reference provider with its status taken from the instance state alone.
type statusFromInstance struct {
	*provider
}

// GetPodStatus is what the Pod's instance state says of it.
func (p *statusFromInstance) GetPodStatus(ctx context.Context, namespace, name string) (*corev1.PodStatus, error) {
	pod, err := p.lister.Pods(namespace).Get(name)
	if err != nil {
		return nil, errdefs.AsNotFound(err)
	}
	p.mu.Lock()
	id, ok := p.instances[pod.UID]
	p.mu.Unlock()
	if !ok {
		return nil, errdefs.NotFoundf("pod %s/%s has no instance", namespace, name)
	}
	sts, err := p.statuses(ctx, map[string]*corev1.Pod{id: pod})
	if err != nil {
		return nil, err
	}
	st, ok := sts[pod.UID]
	if !ok {
		return nil, errdefs.NotFoundf("instance %s of %s/%s is not found", id, namespace, name)
	}
	return st, nil
}

// NotifyPods starts the status loop.
func (p *statusFromInstance) NotifyPods(ctx context.Context, notify func(*corev1.Pod)) {
	go every(ctx, p.cfg.StatusSyncPeriod, func() {
		live := p.livePods()
		sts, _ := p.statuses(ctx, live)
		p.notifyChanged(live, sts, notify)
	})
}

// statuses are the statuses of the Pods, keyed by their instances, that
// EC2 can tell, by Pod UID.
func (p *statusFromInstance) statuses(ctx context.Context, byInstance map[string]*corev1.Pod) (map[types.UID]*corev1.PodStatus, error) {
	insts, err := describe(ctx, p.cfg.EC2, slices.Sorted(maps.Keys(byInstance)))
	out := make(map[types.UID]*corev1.PodStatus, len(insts))
	for id, inst := range insts {
		pod := byInstance[id]
		out[pod.UID] = fromState(pod, inst)
	}
	return out, err
}

// fromState is the Pod's status as the instance's state alone tells it.
func fromState(pod *corev1.Pod, inst ec2types.Instance) *corev1.PodStatus {
	switch inst.State.Name {
	case ec2types.InstanceStateNamePending:
		return pending(pod)
	case ec2types.InstanceStateNameRunning:
		return running(pod, aws.ToTime(inst.LaunchTime))
	case ec2types.InstanceStateNameShuttingDown, ec2types.InstanceStateNameTerminated:
		st := pod.Status.DeepCopy()
		var initialized bool
		st.InitContainerStatuses, st.ContainerStatuses, initialized = podContainers(pod, metav1.Time{},
			func(cs corev1.ContainerStatus, _ podstatus.Kind, _ metav1.Time) corev1.ContainerStatus {
				cs.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
					ExitCode: 255, Reason: InstanceGone, ContainerID: cs.ContainerID,
				}}
				cs.Ready, cs.Started = false, aws.Bool(false)
				return cs
			})
		// Nothing of the Pod runs again: the kubelet's rule over its
		// containers as the Pod ended, and Failed where that rule
		// would wait (a container whose turn never came).
		st.Phase = podstatus.Phase(&pod.Spec, st.InitContainerStatuses, st.ContainerStatuses, true, initialized)
		if !podstatus.Terminal(st.Phase) {
			st.Phase = corev1.PodFailed
		}
		return st
	default:
		return pod.Status.DeepCopy()
	}
}
