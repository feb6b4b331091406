// Package vkprovider is the reference integration of a virtual-kubelet
// provider with Reaper: one EC2 instance per Pod, launched with
// pkg/userdata's user-data and tags, on the pod and node controllers of
// github.com/virtual-kubelet/virtual-kubelet/node.
//
// What it shows a provider author:
//
//   - CreatePod launches with userdata.Launch: its tags let Reaper believe
//     the instance's exit lines, its user-data runs the workload under the
//     supervisor that writes them. The cluster identity tag (the UID of the
//     cluster's kube-system namespace, read once at start) lets Reaper
//     terminate the instance as an orphan once its Pod is gone; without it
//     Reaper never would.
//   - GetPodStatus reads the exit from the ledger (ledger.Get, then the Pod
//     UID check) before it looks at the instance: once the instance is gone
//     its state says nothing about the exit code, the ledger does.
//   - A terminal Pod is never written again: Reaper (or the provider, from
//     the ledger) wrote the truth, and the apiserver does not refuse phase
//     flips.
//   - An instance gone with no exit in the ledger is left to Reaper, which
//     waits for a late exit line before it finalizes the Pod as lost.
package vkprovider

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"
	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	"github.com/virtual-kubelet/virtual-kubelet/node"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/reaper-k8s/reaper/pkg/ledger"
	"github.com/reaper-k8s/reaper/pkg/model"
	"github.com/reaper-k8s/reaper/pkg/userdata"
)

// NodePrefix starts the name of every virtual node whose Pods Reaper may
// finalize: deploy/admission.yaml lets Reaper write only Pods bound to such
// a node.
const NodePrefix = "reaper-virtual-"

// Taint keeps ordinary Pods off the virtual node; Pods for it tolerate it.
var Taint = corev1.Taint{Key: "virtual-kubelet.io/provider", Value: "reaper", Effect: corev1.TaintEffectNoSchedule}

// Config is what the provider needs.
type Config struct {
	// NodeName must start with NodePrefix.
	NodeName string
	// Cluster is REAPER_CLUSTER of the Reaper deployment serving the cluster.
	Cluster string
	// ClusterUID is the cluster's identity, the UID of its kube-system
	// namespace, for the cluster identity tag of every instance. Empty: Run
	// reads it from Kube (get on namespaces/kube-system).
	ClusterUID string
	Kube       kubernetes.Interface
	EC2        *ec2.Client
	// Ledger is Reaper's ledger table.
	Ledger *ledger.Table
	// ImageID and InstanceType are what RunInstances launches.
	ImageID      string
	InstanceType ec2types.InstanceType
	// StatusSyncPeriod is how often the status of each live Pod is
	// recomputed (default 5s, virtual-kubelet's own period).
	StatusSyncPeriod time.Duration
}

// Run registers the virtual node and runs the node and pod controllers until
// ctx is done.
func Run(ctx context.Context, cfg Config) error {
	return run(ctx, cfg, func(cfg Config, lister corev1listers.PodLister) node.PodLifecycleHandler {
		return newProvider(cfg, lister)
	})
}

// run is Run with the pod handler that newHandler makes.
func run(ctx context.Context, cfg Config, newHandler func(Config, corev1listers.PodLister) node.PodLifecycleHandler) error {
	if !strings.HasPrefix(cfg.NodeName, NodePrefix) {
		return fmt.Errorf("vkprovider: node name %q does not start with %q", cfg.NodeName, NodePrefix)
	}
	if cfg.Cluster == "" || cfg.Kube == nil || cfg.EC2 == nil || cfg.Ledger == nil {
		return errors.New("vkprovider: Cluster, Kube, EC2 and Ledger are required")
	}
	if cfg.StatusSyncPeriod <= 0 {
		cfg.StatusSyncPeriod = 5 * time.Second
	}
	if cfg.ClusterUID == "" {
		// Reaper reads the same namespace of the apiserver it reaches, and
		// treats an instance as an orphan only when the two agree.
		ns, err := cfg.Kube.CoreV1().Namespaces().Get(ctx, metav1.NamespaceSystem, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("vkprovider: read the cluster identity (the UID of namespace %s): %w", metav1.NamespaceSystem, err)
		}
		cfg.ClusterUID = string(ns.UID)
	}

	nc, err := node.NewNodeController(node.NaiveNodeProvider{}, virtualNode(cfg.NodeName), cfg.Kube.CoreV1().Nodes())
	if err != nil {
		return err
	}

	podFactory := informers.NewSharedInformerFactoryWithOptions(cfg.Kube, time.Minute,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", cfg.NodeName).String()
		}))
	factory := informers.NewSharedInformerFactory(cfg.Kube, time.Minute)
	pods := podFactory.Core().V1().Pods()

	broadcaster := record.NewBroadcaster()
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cfg.Kube.CoreV1().Events("")})
	defer broadcaster.Shutdown()

	p := newHandler(cfg, pods.Lister())
	pc, err := node.NewPodController(node.PodControllerConfig{
		PodClient:         cfg.Kube.CoreV1(),
		PodInformer:       pods,
		EventRecorder:     broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: cfg.NodeName}),
		Provider:          p,
		ConfigMapInformer: factory.Core().V1().ConfigMaps(),
		SecretInformer:    factory.Core().V1().Secrets(),
		ServiceInformer:   factory.Core().V1().Services(),
	})
	if err != nil {
		return err
	}
	podFactory.Start(ctx.Done())
	factory.Start(ctx.Done())
	defer podFactory.Shutdown()
	defer factory.Shutdown()

	errs := make(chan error, 2)
	go func() { errs <- nc.Run(ctx) }()
	go func() { errs <- pc.Run(ctx, 4) }()
	err = <-errs
	if ctx.Err() != nil {
		return nil
	}
	return err
}

func virtualNode(name string) *corev1.Node {
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("1000"),
		corev1.ResourceMemory: resource.MustParse("4Ti"),
		corev1.ResourcePods:   resource.MustParse("1000"),
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			"type": "virtual-kubelet", "kubernetes.io/role": "agent", corev1.LabelHostname: name,
		}},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{Taint}},
		Status: corev1.NodeStatus{
			Capacity: capacity, Allocatable: capacity,
			Conditions: []corev1.NodeCondition{{
				Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "ProviderReady",
				LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(),
			}},
		},
	}
}

// provider implements node.PodLifecycleHandler and node.PodNotifier. It
// notifies statuses itself rather than letting virtual-kubelet poll
// GetPodStatus, so that the period is its own and terminal Pods are skipped
// before any EC2 or ledger call.
type provider struct {
	cfg    Config
	lister corev1listers.PodLister

	mu sync.Mutex
	// pods are the Pods the provider runs, by namespace/name.
	pods map[string]*corev1.Pod
	// instances maps a Pod UID to its instance.
	instances map[types.UID]string
	// notified is the last status notified per Pod UID.
	notified map[types.UID]*corev1.PodStatus
}

func newProvider(cfg Config, lister corev1listers.PodLister) *provider {
	return &provider{cfg: cfg, lister: lister, pods: map[string]*corev1.Pod{},
		instances: map[types.UID]string{}, notified: map[types.UID]*corev1.PodStatus{}}
}

func key(namespace, name string) string { return namespace + "/" + name }

// CreatePod launches the Pod's instance, unless it has one already (the
// provider restarted, or the create is retried).
func (p *provider) CreatePod(ctx context.Context, pod *corev1.Pod) error {
	id, err := p.instanceOf(ctx, pod)
	if err != nil {
		return err
	}
	if id == "" {
		if id, err = p.launch(ctx, pod); err != nil {
			return err
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pods[key(pod.Namespace, pod.Name)] = pod.DeepCopy()
	p.instances[pod.UID] = id
	return nil
}

func (p *provider) launch(ctx context.Context, pod *corev1.Pod) (string, error) {
	if len(pod.Spec.Containers) != 1 || len(pod.Spec.InitContainers) != 0 {
		return "", errdefs.InvalidInput("one instance runs exactly one container")
	}
	c := pod.Spec.Containers[0]
	up := userdata.Pod{Namespace: pod.Namespace, Name: pod.Name, UID: string(pod.UID), Container: c.Name,
		Image: c.Image, Command: c.Command, Args: c.Args, RestartPolicy: string(pod.Spec.RestartPolicy)}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			up.Env = append(up.Env, userdata.EnvVar{Name: e.Name, Value: e.Value})
		}
	}
	ls, err := userdata.Launch(up, userdata.Options{Cluster: p.cfg.Cluster, ClusterUID: p.cfg.ClusterUID})
	if err != nil {
		return "", errdefs.AsInvalidInput(err)
	}
	tags := make([]ec2types.Tag, 0, len(ls.Tags))
	for k, v := range ls.Tags {
		tags = append(tags, ec2types.Tag{Key: aws.String(k), Value: aws.String(v)})
	}
	out, err := p.cfg.EC2.RunInstances(ctx, &ec2.RunInstancesInput{
		MinCount: aws.Int32(1), MaxCount: aws.Int32(1),
		ImageId: aws.String(p.cfg.ImageID), InstanceType: p.cfg.InstanceType,
		UserData:                          aws.String(ls.UserDataBase64),
		InstanceInitiatedShutdownBehavior: ec2types.ShutdownBehavior(ls.InstanceInitiatedShutdownBehavior),
		MetadataOptions: &ec2types.InstanceMetadataOptionsRequest{
			HttpTokens:              ec2types.HttpTokensState(ls.MetadataHTTPTokens),
			HttpPutResponseHopLimit: aws.Int32(ls.MetadataHTTPPutResponseHopLimit),
		},
		// The UID in the token makes a retried launch of the same Pod
		// return the first instance instead of a second one.
		ClientToken:       aws.String(string(pod.UID)),
		TagSpecifications: []ec2types.TagSpecification{{ResourceType: ec2types.ResourceTypeInstance, Tags: tags}},
	})
	if err != nil {
		return "", fmt.Errorf("launch instance for %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	if len(out.Instances) != 1 {
		return "", fmt.Errorf("launch instance for %s/%s: %d instances", pod.Namespace, pod.Name, len(out.Instances))
	}
	return aws.ToString(out.Instances[0].InstanceId), nil
}

// instanceOf returns the Pod's instance, from memory or else by its UID
// tag; "" when it has none.
func (p *provider) instanceOf(ctx context.Context, pod *corev1.Pod) (string, error) {
	p.mu.Lock()
	id, ok := p.instances[pod.UID]
	p.mu.Unlock()
	if ok {
		return id, nil
	}
	keys := model.DefaultTagKeys()
	out, err := p.cfg.EC2.DescribeInstances(ctx, &ec2.DescribeInstancesInput{Filters: []ec2types.Filter{
		{Name: aws.String("tag:" + keys.PodUID), Values: []string{string(pod.UID)}},
		{Name: aws.String("tag:" + keys.Cluster), Values: []string{p.cfg.Cluster}},
	}})
	if err != nil {
		return "", fmt.Errorf("find the instance of %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	for _, r := range out.Reservations {
		for _, i := range r.Instances {
			return aws.ToString(i.InstanceId), nil
		}
	}
	return "", nil
}

// UpdatePod changes nothing: a running instance takes no Pod spec change.
func (p *provider) UpdatePod(context.Context, *corev1.Pod) error { return nil }

// DeletePod terminates the Pod's instance.
func (p *provider) DeletePod(ctx context.Context, pod *corev1.Pod) error {
	id, err := p.instanceOf(ctx, pod)
	if err != nil {
		return err
	}
	if id != "" {
		_, err := p.cfg.EC2.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{id}})
		var apiErr smithy.APIError
		if err != nil && !(errors.As(err, &apiErr) && apiErr.ErrorCode() == "InvalidInstanceID.NotFound") {
			return fmt.Errorf("terminate %s of %s/%s: %w", id, pod.Namespace, pod.Name, err)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.pods, key(pod.Namespace, pod.Name))
	delete(p.instances, pod.UID)
	delete(p.notified, pod.UID)
	return nil
}

// GetPod returns the Pod as the provider runs it.
func (p *provider) GetPod(_ context.Context, namespace, name string) (*corev1.Pod, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pod, ok := p.pods[key(namespace, name)]
	if !ok {
		return nil, errdefs.NotFoundf("pod %s/%s is not known", namespace, name)
	}
	return pod.DeepCopy(), nil
}

// GetPods returns every Pod the provider runs.
func (p *provider) GetPods(context.Context) ([]*corev1.Pod, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*corev1.Pod, 0, len(p.pods))
	for _, pod := range p.pods {
		out = append(out, pod.DeepCopy())
	}
	return out, nil
}

// GetPodStatus is the Pod's status: the terminal exit from the ledger when
// it holds one for this Pod, otherwise what the instance state says.
func (p *provider) GetPodStatus(ctx context.Context, namespace, name string) (*corev1.PodStatus, error) {
	pod, err := p.lister.Pods(namespace).Get(name)
	if err != nil {
		return nil, errdefs.AsNotFound(err)
	}
	return p.status(ctx, pod)
}

func (p *provider) status(ctx context.Context, pod *corev1.Pod) (*corev1.PodStatus, error) {
	id, err := p.instanceOf(ctx, pod)
	if err != nil {
		return nil, err
	}
	if id == "" {
		return nil, errdefs.NotFoundf("pod %s/%s has no instance", pod.Namespace, pod.Name)
	}
	rec, ok, err := p.cfg.Ledger.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	// The ledger is keyed by instance: only a record naming this very Pod
	// (not an earlier one of the same name) and checked against the
	// instance's tags speaks for it.
	if ok && rec.Pod.UID == string(pod.UID) && !rec.Unverified && rec.Exit != nil && rec.Exit.Terminal() {
		return exited(pod, *rec.Exit), nil
	}
	out, err := p.cfg.EC2.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{id}})
	if err != nil {
		return nil, fmt.Errorf("describe %s of %s/%s: %w", id, pod.Namespace, pod.Name, err)
	}
	if len(out.Reservations) != 1 || len(out.Reservations[0].Instances) != 1 {
		return nil, fmt.Errorf("describe %s of %s/%s: not one instance", id, pod.Namespace, pod.Name)
	}
	inst := out.Reservations[0].Instances[0]
	switch inst.State.Name {
	case ec2types.InstanceStateNamePending:
		return pending(pod), nil
	case ec2types.InstanceStateNameRunning:
		return running(pod, aws.ToTime(inst.LaunchTime)), nil
	default:
		// Gone with no exit recorded: Reaper waits for a late exit line and
		// then finalizes the Pod; a status written here would pre-empt it.
		return pod.Status.DeepCopy(), nil
	}
}

// NotifyPods starts the status loop.
func (p *provider) NotifyPods(ctx context.Context, notify func(*corev1.Pod)) {
	go every(ctx, p.cfg.StatusSyncPeriod, func() { p.syncStatuses(ctx, notify) })
}

// every calls fn each period until ctx ends.
func every(ctx context.Context, period time.Duration, fn func()) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fn()
		}
	}
}

func (p *provider) syncStatuses(ctx context.Context, notify func(*corev1.Pod)) {
	pods, err := p.lister.List(labels.Everything())
	if err != nil {
		return
	}
	for _, pod := range pods {
		// A terminal status is the truth, whoever wrote it; a Pod being
		// deleted is virtual-kubelet's to finish.
		if terminal(pod.Status.Phase) || pod.DeletionTimestamp != nil {
			continue
		}
		st, err := p.status(ctx, pod)
		if err != nil {
			continue
		}
		p.mu.Lock()
		_, live := p.instances[pod.UID]
		same := apiequality.Semantic.DeepEqual(p.notified[pod.UID], st)
		if live && !same {
			p.notified[pod.UID] = st
		}
		p.mu.Unlock()
		if live && !same {
			updated := pod.DeepCopy()
			updated.Status = *st
			notify(updated)
		}
	}
}

func terminal(phase corev1.PodPhase) bool {
	return phase == corev1.PodSucceeded || phase == corev1.PodFailed
}

func pending(pod *corev1.Pod) *corev1.PodStatus {
	st := pod.Status.DeepCopy()
	st.Phase = corev1.PodPending
	st.ContainerStatuses = []corev1.ContainerStatus{containerStatus(pod, corev1.ContainerState{
		Waiting: &corev1.ContainerStateWaiting{Reason: "InstancePending"},
	})}
	return st
}

func running(pod *corev1.Pod, launched time.Time) *corev1.PodStatus {
	started := metav1.NewTime(launched.Truncate(time.Second))
	cs := containerStatus(pod, corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: started}})
	cs.Ready, cs.Started = true, aws.Bool(true)
	return &corev1.PodStatus{
		Phase:     corev1.PodRunning,
		StartTime: &started,
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: started},
			{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: started},
			{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: started},
			{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: started},
		},
		ContainerStatuses: []corev1.ContainerStatus{cs},
	}
}

// exited is the status of the Pod whose container ended for good with e,
// as the kubelet reports it.
func exited(pod *corev1.Pod, e model.Exit) *corev1.PodStatus {
	st := pod.Status.DeepCopy()
	reason := "Completed"
	st.Phase = corev1.PodSucceeded
	switch {
	case e.OOMKilled:
		st.Phase, reason = corev1.PodFailed, "OOMKilled"
	case e.ExitCode != 0:
		st.Phase, reason = corev1.PodFailed, "Error"
	}
	cs := containerStatus(pod, corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
		ExitCode: int32(e.ExitCode), Reason: reason, Message: e.Error, ContainerID: e.ContainerID,
		StartedAt: metav1.NewTime(e.StartedAt), FinishedAt: metav1.NewTime(e.FinishedAt),
	}})
	cs.RestartCount, cs.ContainerID = e.RestartCount, e.ContainerID
	st.ContainerStatuses = []corev1.ContainerStatus{cs}
	for i, c := range st.Conditions {
		if c.Type == corev1.PodReady || c.Type == corev1.ContainersReady {
			st.Conditions[i].Status, st.Conditions[i].Reason = corev1.ConditionFalse, "PodCompleted"
		}
	}
	return st
}

// containerStatus is the status of the Pod's container in state, keeping
// what an earlier status of the provider said of its image.
func containerStatus(pod *corev1.Pod, state corev1.ContainerState) corev1.ContainerStatus {
	c := pod.Spec.Containers[0]
	cs := corev1.ContainerStatus{Name: c.Name, Image: c.Image, State: state, Started: aws.Bool(false)}
	for _, old := range pod.Status.ContainerStatuses {
		if old.Name == c.Name {
			cs.ImageID, cs.ContainerID, cs.RestartCount = old.ImageID, old.ContainerID, old.RestartCount
		}
	}
	return cs
}
