package vkprovider

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	"github.com/virtual-kubelet/virtual-kubelet/node"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/labels"
	corev1listers "k8s.io/client-go/listers/core/v1"
)

// InstanceGone is the reason instanceStateProvider gives a Pod whose
// instance went.
const InstanceGone = "InstanceGone"

// RunInstanceStateOnly is Run with instanceStateProvider, polling every poll.
func RunInstanceStateOnly(ctx context.Context, cfg Config, poll time.Duration) error {
	return run(ctx, cfg, func(cfg Config, lister corev1listers.PodLister) node.PodLifecycleHandler {
		return &instanceStateProvider{provider: newProvider(cfg, lister), poll: poll}
	})
}

// instanceStateProvider knows only the instance state, as a provider that
// ignores the ledger does: an instance shutting down or terminated makes
// its Pod Failed with exit 255, InstanceGone. It polls often and notifies
// at once, so it races each of Reaper's writes; Reaper wins only by writing
// the Pod before it terminates the instance.
type instanceStateProvider struct {
	*provider
	poll time.Duration
}

func (p *instanceStateProvider) GetPodStatus(ctx context.Context, namespace, name string) (*corev1.PodStatus, error) {
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
	out, err := p.cfg.EC2.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{id}})
	if err != nil {
		return nil, err
	}
	for _, r := range out.Reservations {
		for _, inst := range r.Instances {
			return fromState(pod, inst), nil
		}
	}
	return nil, errdefs.NotFoundf("instance %s of %s/%s is not found", id, namespace, name)
}

func (p *instanceStateProvider) NotifyPods(ctx context.Context, notify func(*corev1.Pod)) {
	go every(ctx, p.poll, func() { p.sync(ctx, notify) })
}

// sync describes the instances of every live Pod in one call and notifies
// each status that changed.
func (p *instanceStateProvider) sync(ctx context.Context, notify func(*corev1.Pod)) {
	pods, err := p.lister.List(labels.Everything())
	if err != nil {
		return
	}
	byInstance := map[string]*corev1.Pod{}
	p.mu.Lock()
	for _, pod := range pods {
		if id, ok := p.instances[pod.UID]; ok && !terminal(pod.Status.Phase) && pod.DeletionTimestamp == nil {
			byInstance[id] = pod
		}
	}
	p.mu.Unlock()
	if len(byInstance) == 0 {
		return
	}
	out, err := p.cfg.EC2.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: slices.Collect(maps.Keys(byInstance))})
	if err != nil {
		return
	}
	for _, r := range out.Reservations {
		for _, inst := range r.Instances {
			pod := byInstance[aws.ToString(inst.InstanceId)]
			if pod == nil {
				continue
			}
			st := fromState(pod, inst)
			p.mu.Lock()
			same := apiequality.Semantic.DeepEqual(p.notified[pod.UID], st)
			p.notified[pod.UID] = st
			p.mu.Unlock()
			if !same {
				updated := pod.DeepCopy()
				updated.Status = *st
				notify(updated)
			}
		}
	}
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
		st.Phase = corev1.PodFailed
		st.ContainerStatuses = []corev1.ContainerStatus{containerStatus(pod, corev1.ContainerState{
			Terminated: &corev1.ContainerStateTerminated{ExitCode: 255, Reason: InstanceGone},
		})}
		return st
	default:
		return pod.Status.DeepCopy()
	}
}
