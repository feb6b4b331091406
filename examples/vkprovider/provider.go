// Package vkprovider is the reference integration of a virtual-kubelet
// provider with Reaper: one EC2 instance per Pod, launched with
// pkg/userdata's user-data and tags, on the pod and node controllers of
// github.com/virtual-kubelet/virtual-kubelet/node.
//
// What it shows a provider author:
//
//   - CreatePod launches with userdata.Launch: its tags let Reaper believe
//     the instance's exit lines, its user-data runs the workload under the
//     supervisor that writes them. Each launch draws its own exit token:
//     the user-data carries it, the tags its hash, and Reaper believes a
//     line for the instance only when it carries the token, so no other
//     host can speak for this Pod. The cluster identity tag (the UID of the
//     cluster's kube-system namespace, read once at start) lets Reaper
//     terminate the instance as an orphan once its Pod is gone; without it
//     Reaper never would.
//   - GetPodStatus reads the exit from the ledger (ledger.GetMany, then the
//     Pod UID check) once the instance is no longer running, before it lets
//     the instance's state say anything: a gone instance says nothing about
//     the exit code, the ledger does.
//   - While the instance is up, the status covers every container of the
//     Pod, init containers and sidecars included, in spec order, by the
//     kubelet's rule; a container's end comes only from Reaper, which
//     writes it from the host's exit line while the others run on, and the
//     provider keeps what Reaper wrote of it.
//   - A terminal Pod is never written again: Reaper (or the provider, from
//     the ledger) wrote the truth, and the apiserver does not refuse phase
//     flips.
//   - An instance gone with no exit in the ledger is left to Reaper, which
//     waits for a late exit line before it finalizes the Pod as lost.
//   - The status loop costs one DescribeInstances per 1,000 live Pods each
//     period, and one BatchGetItem per 100 of those whose instance ended,
//     not a call per Pod: in a real account its DescribeInstances share the
//     account's buckets with Reaper (Config.StatusSyncPeriod).
//
// RunStatusFromInstance is the other provider style, the one that ignores
// the ledger and derives a Pod's status from its instance's state alone; it
// is here to show what that style loses, and what it needs of the hosts.
package vkprovider

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"regexp"
	"slices"
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
	"github.com/reaper-k8s/reaper/pkg/podstatus"
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
	// ImageID and InstanceType are what RunInstances launches. ImageID is
	// required.
	ImageID      string
	InstanceType ec2types.InstanceType
	// InstanceProfile is the IAM instance profile every instance launches
	// with, its ARN or its name: the host's CloudWatch agent ships the exit
	// lines with its role's credentials, so the role must carry the
	// stack's AgentPolicyArn (docs/provider.md, "IAM the instance needs"),
	// and the provider's own role iam:PassRole on it. Required: a host
	// without it ships no line, and Reaper learns of its Pod's exit only
	// as a loss.
	InstanceProfile string
	// SubnetIDs are the subnets instances launch in; each Pod's instance
	// goes to one picked by its Pod UID, so that a retried launch (same
	// client token) names the same subnet. They must reach CloudWatch Logs
	// and the image registry (a NAT gateway, or VPC endpoints). Empty: a
	// default subnet of the default VPC, as EC2 picks it.
	SubnetIDs []string
	// SecurityGroupIDs are the security groups of every instance, of the
	// subnets' VPC; they must allow outbound HTTPS. Empty: the VPC's
	// default security group.
	SecurityGroupIDs []string
	// StatusSyncPeriod is how often the status of each live Pod is
	// recomputed (default 5s, virtual-kubelet's own period). Each period
	// costs ⌈live Pods / 1,000⌉ DescribeInstances naming the instances (and
	// for Run ⌈ended / 100⌉ BatchGetItem on the ledger for the Pods whose
	// instances are no longer running). In a real account those share
	// the account's DescribeInstances buckets with Reaper and every other
	// tool: named without a filter or pagination, they draw on the smaller
	// one (50, refill 10 a second), so a 1 s period over 10,000 Pods would
	// take all of its refill.
	StatusSyncPeriod time.Duration
	// InstanceOf, when set, finds the instance of a Pod the provider has not
	// seen yet, in place of the lookup by the Pod UID tag (one
	// DescribeInstances per Pod): a provider that adopts instances launched
	// by something else (a test lab that makes its own, a migration from
	// another provider) names them here. A Pod it names none for is
	// launched as usual.
	InstanceOf func(*corev1.Pod) (string, bool)
}

// Run registers the virtual node and runs the node and pod controllers until
// ctx is done, with the ledger-first provider: a Pod's exit comes from
// Reaper's ledger, and the instance's state tells only Pending and Running.
func Run(ctx context.Context, cfg Config) error {
	if cfg.Ledger == nil {
		return errors.New("vkprovider: Ledger is required")
	}
	return run(ctx, cfg, func(cfg Config, lister corev1listers.PodLister) node.PodLifecycleHandler {
		return newProvider(cfg, lister)
	})
}

// run is Run with the pod handler that newHandler makes.
func run(ctx context.Context, cfg Config, newHandler func(Config, corev1listers.PodLister) node.PodLifecycleHandler) error {
	if err := cfg.validate(); err != nil {
		return err
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
	// The pod controller takes ConfigMap, Secret and Service informers to
	// resolve the containers' environment references before CreatePod.
	// With that resolution off they are never read, so their factory is
	// never started: the provider lists no Secret, ConfigMap or Service.
	unused := informers.NewSharedInformerFactory(cfg.Kube, 0)
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
		ConfigMapInformer: unused.Core().V1().ConfigMaps(),
		SecretInformer:    unused.Core().V1().Secrets(),
		ServiceInformer:   unused.Core().V1().Services(),
		// The provider sees the Pod's spec as written: an environment
		// from references (valueFrom, envFrom) is refused (hostPod), not
		// resolved into literal values that the user-data would carry,
		// Secrets' among them; and no Service variables are added, whose
		// cluster IPs a host outside the cluster network cannot reach.
		SkipDownwardAPIResolution: true,
	})
	if err != nil {
		return err
	}
	podFactory.Start(ctx.Done())
	defer podFactory.Shutdown()

	errs := make(chan error, 2)
	go func() { errs <- nc.Run(ctx) }()
	go func() { errs <- pc.Run(ctx, 4) }()
	err = <-errs
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// The forms of EC2's resource ids and of IAM's instance profiles.
var (
	subnetID        = regexp.MustCompile(`^subnet-(?:[0-9a-f]{8}|[0-9a-f]{17})$`)
	securityGroupID = regexp.MustCompile(`^sg-(?:[0-9a-f]{8}|[0-9a-f]{17})$`)
	profileName     = regexp.MustCompile(`^[\w+=,.@-]{1,128}$`)
	profileARN      = regexp.MustCompile(`^arn:aws[a-z-]*:iam::\d{12}:instance-profile/(?:[\x21-\x7e]*/)?[\w+=,.@-]{1,128}$`)
)

// maxSecurityGroups is EC2's most security groups on one network
// interface (the quota's ceiling; its default is 5).
const maxSecurityGroups = 16

// validate says what is wrong with the configuration, every problem at
// once.
func (cfg Config) validate() error {
	var errs []error
	if !strings.HasPrefix(cfg.NodeName, NodePrefix) {
		errs = append(errs, fmt.Errorf("node name %q does not start with %q", cfg.NodeName, NodePrefix))
	}
	if cfg.Cluster == "" || cfg.Kube == nil || cfg.EC2 == nil {
		errs = append(errs, errors.New("fields Cluster, Kube and EC2 are required"))
	}
	if cfg.ImageID == "" {
		errs = append(errs, errors.New("ImageID is required"))
	}
	switch {
	case cfg.InstanceProfile == "":
		errs = append(errs, errors.New("InstanceProfile is required: without a role the hosts' CloudWatch agent ships no exit line"))
	case !profileName.MatchString(cfg.InstanceProfile) && !profileARN.MatchString(cfg.InstanceProfile):
		errs = append(errs, fmt.Errorf("InstanceProfile %q is neither an instance profile's name nor its ARN (arn:aws:iam::ACCOUNT:instance-profile/NAME)", cfg.InstanceProfile))
	}
	ids := func(field string, ids []string, form *regexp.Regexp, example string) {
		seen := map[string]bool{}
		for _, id := range ids {
			switch {
			case !form.MatchString(id):
				errs = append(errs, fmt.Errorf("%s: %q is not an id like %s", field, id, example))
			case seen[id]:
				errs = append(errs, fmt.Errorf("%s: %s is named twice", field, id))
			}
			seen[id] = true
		}
	}
	ids("SubnetIDs", cfg.SubnetIDs, subnetID, "subnet-0123456789abcdef0")
	ids("SecurityGroupIDs", cfg.SecurityGroupIDs, securityGroupID, "sg-0123456789abcdef0")
	if n := len(cfg.SecurityGroupIDs); n > maxSecurityGroups {
		errs = append(errs, fmt.Errorf("SecurityGroupIDs: %d, more than the %d EC2 allows on an instance", n, maxSecurityGroups))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("vkprovider: %w", err)
	}
	return nil
}

// subnetOf is the subnet the Pod's instance launches in: one of
// Config.SubnetIDs picked by the Pod's UID, or nil when there are none.
// The same Pod always gets the same subnet, as a retried RunInstances with
// its client token must name it.
func (cfg Config) subnetOf(uid types.UID) *string {
	if len(cfg.SubnetIDs) == 0 {
		return nil
	}
	h := fnv.New32a()
	h.Write([]byte(uid))
	return aws.String(cfg.SubnetIDs[h.Sum32()%uint32(len(cfg.SubnetIDs))])
}

// instanceProfile is Config.InstanceProfile as RunInstances takes it: by
// ARN or by name.
func (cfg Config) instanceProfile() *ec2types.IamInstanceProfileSpecification {
	if strings.HasPrefix(cfg.InstanceProfile, "arn:") {
		return &ec2types.IamInstanceProfileSpecification{Arn: aws.String(cfg.InstanceProfile)}
	}
	return &ec2types.IamInstanceProfileSpecification{Name: aws.String(cfg.InstanceProfile)}
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
	up, err := hostPod(pod)
	if err != nil {
		return "", errdefs.AsInvalidInput(fmt.Errorf("%s/%s cannot run on an instance: %w", pod.Namespace, pod.Name, err))
	}
	ls, err := userdata.Launch(up, userdata.Options{Cluster: p.cfg.Cluster, ClusterUID: p.cfg.ClusterUID})
	if err != nil {
		return "", errdefs.AsInvalidInput(fmt.Errorf("%s/%s cannot run on an instance: %w", pod.Namespace, pod.Name, err))
	}
	tags := make([]ec2types.Tag, 0, len(ls.Tags))
	for k, v := range ls.Tags {
		tags = append(tags, ec2types.Tag{Key: aws.String(k), Value: aws.String(v)})
	}
	out, err := p.cfg.EC2.RunInstances(ctx, &ec2.RunInstancesInput{
		MinCount: aws.Int32(1), MaxCount: aws.Int32(1),
		ImageId: aws.String(p.cfg.ImageID), InstanceType: p.cfg.InstanceType,
		// The role the CloudWatch agent ships the exit lines with.
		IamInstanceProfile:                p.cfg.instanceProfile(),
		SubnetId:                          p.cfg.subnetOf(pod.UID),
		SecurityGroupIds:                  p.cfg.SecurityGroupIDs,
		UserData:                          aws.String(ls.UserDataBase64),
		InstanceInitiatedShutdownBehavior: ec2types.ShutdownBehavior(ls.InstanceInitiatedShutdownBehavior),
		MetadataOptions: &ec2types.InstanceMetadataOptionsRequest{
			HttpTokens:              ec2types.HttpTokensState(ls.MetadataHTTPTokens),
			HttpPutResponseHopLimit: aws.Int32(ls.MetadataHTTPPutResponseHopLimit),
			// Hosts in userdata.ShutdownWhenPodWritten read Reaper's tag there.
			InstanceMetadataTags: ec2types.InstanceMetadataTagsState(ls.MetadataTags),
		},
		// The UID in the token makes a retried launch of the same Pod
		// return the first instance instead of a second one, whose
		// user-data and tags agree on the first launch's exit token.
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

// hostPod maps the Pod's spec to what the host runs: init containers
// (sidecars among them), containers, the restart policy, the grace,
// emptyDir volumes and their mounts, termination messages, and each
// container's command, args and literal environment. What the host cannot
// do as the spec says is refused, every problem at once, rather than run
// differently: other volume kinds, a memory-backed emptyDir, subPath
// mounts, volume devices, ephemeral containers, the host's network, and
// environment from references (valueFrom, envFrom), which the provider
// does not resolve. The error becomes the Pod's ProviderCreateFailed
// event.
func hostPod(pod *corev1.Pod) (userdata.Pod, error) {
	var errs []error
	up := userdata.Pod{Namespace: pod.Namespace, Name: pod.Name, UID: string(pod.UID),
		RestartPolicy: string(pod.Spec.RestartPolicy), TerminationGracePeriodSeconds: pod.Spec.TerminationGracePeriodSeconds}
	if len(pod.Spec.EphemeralContainers) > 0 {
		errs = append(errs, errors.New("ephemeral containers are not supported"))
	}
	if pod.Spec.HostNetwork {
		errs = append(errs, errors.New("hostNetwork would give the workload the instance role's credentials"))
	}
	// refused are the volumes refused, whose mounts are not checked again.
	refused := map[string]bool{}
	for _, v := range pod.Spec.Volumes {
		switch {
		case serviceAccountToken(v):
			refused[v.Name] = true
			errs = append(errs, fmt.Errorf("volume %s: the service account token is not supported: set automountServiceAccountToken: false on the Pod or its ServiceAccount", v.Name))
		case v.EmptyDir == nil:
			refused[v.Name] = true
			errs = append(errs, fmt.Errorf("volume %s: only emptyDir volumes are supported", v.Name))
		case v.EmptyDir.Medium != corev1.StorageMediumDefault:
			refused[v.Name] = true
			errs = append(errs, fmt.Errorf("volume %s: emptyDir medium %q is not supported (the host's disk only)", v.Name, v.EmptyDir.Medium))
		default:
			up.Volumes = append(up.Volumes, userdata.Volume{Name: v.Name, EmptyDir: &userdata.EmptyDir{}})
		}
	}
	container := func(field string, c corev1.Container) userdata.Container {
		hc := userdata.Container{Name: c.Name, Image: c.Image, Command: c.Command, Args: c.Args,
			TerminationMessagePath: c.TerminationMessagePath, TerminationMessagePolicy: string(c.TerminationMessagePolicy)}
		if c.RestartPolicy != nil {
			hc.RestartPolicy = string(*c.RestartPolicy)
		}
		if len(c.EnvFrom) > 0 {
			errs = append(errs, fmt.Errorf("%s (%s): envFrom is not supported", field, c.Name))
		}
		for _, e := range c.Env {
			if e.ValueFrom != nil {
				errs = append(errs, fmt.Errorf("%s (%s): env %s comes from a reference (valueFrom), which is not supported", field, c.Name, e.Name))
				continue
			}
			hc.Env = append(hc.Env, userdata.EnvVar{Name: e.Name, Value: e.Value})
		}
		for _, m := range c.VolumeMounts {
			if refused[m.Name] {
				continue
			}
			if m.SubPath != "" || m.SubPathExpr != "" {
				errs = append(errs, fmt.Errorf("%s (%s): volume mount %s with a subPath is not supported", field, c.Name, m.Name))
				continue
			}
			hc.VolumeMounts = append(hc.VolumeMounts, userdata.VolumeMount{Name: m.Name, MountPath: m.MountPath, ReadOnly: m.ReadOnly})
		}
		if len(c.VolumeDevices) > 0 {
			errs = append(errs, fmt.Errorf("%s (%s): volume devices are not supported", field, c.Name))
		}
		return hc
	}
	for i, c := range pod.Spec.InitContainers {
		up.InitContainers = append(up.InitContainers, container(fmt.Sprintf("initContainers[%d]", i), c))
	}
	for i, c := range pod.Spec.Containers {
		up.Containers = append(up.Containers, container(fmt.Sprintf("containers[%d]", i), c))
	}
	if err := up.Validate(); err != nil {
		errs = append(errs, err)
	}
	return up, errors.Join(errs...)
}

// serviceAccountToken says whether v carries a service account token: the
// projected volume the apiserver's ServiceAccount admission adds to every
// Pod (kube-api-access-…) unless automountServiceAccountToken is false.
// The provider mints no token for the host.
func serviceAccountToken(v corev1.Volume) bool {
	if v.Projected == nil {
		return false
	}
	return slices.ContainsFunc(v.Projected.Sources, func(p corev1.VolumeProjection) bool { return p.ServiceAccountToken != nil })
}

// instanceOf returns the Pod's instance, from memory or else from
// Config.InstanceOf or by its UID tag; "" when it has none.
func (p *provider) instanceOf(ctx context.Context, pod *corev1.Pod) (string, error) {
	p.mu.Lock()
	id, ok := p.instances[pod.UID]
	p.mu.Unlock()
	if ok {
		return id, nil
	}
	if p.cfg.InstanceOf != nil {
		id, _ := p.cfg.InstanceOf(pod)
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

// GetPodStatus is the Pod's status: what the instance state says while it
// is pending or running; once it is not, the terminal exit from the ledger
// when it holds one for this Pod.
func (p *provider) GetPodStatus(ctx context.Context, namespace, name string) (*corev1.PodStatus, error) {
	pod, err := p.lister.Pods(namespace).Get(name)
	if err != nil {
		return nil, errdefs.AsNotFound(err)
	}
	id, err := p.instanceOf(ctx, pod)
	if err != nil {
		return nil, err
	}
	if id == "" {
		return nil, errdefs.NotFoundf("pod %s/%s has no instance", pod.Namespace, pod.Name)
	}
	sts, err := p.statuses(ctx, map[string]*corev1.Pod{id: pod})
	if err != nil {
		return nil, err
	}
	st, ok := sts[pod.UID]
	if !ok {
		return nil, errdefs.NotFoundf("instance %s of %s/%s is not found", id, pod.Namespace, pod.Name)
	}
	return st, nil
}

// statuses are the statuses of the Pods, keyed by their instances, that
// EC2 or the ledger can tell, by Pod UID. Every instance is described; a
// Pod whose instance is pending or running gets what that says, and only
// the others (shutting down, stopped, terminated, unknown to EC2) are read
// from the ledger: a Pod whose ledger record holds its terminal exit gets
// it, the rest keep their status. While the instance runs, Reaper writes
// the exit to the Pod itself, so the ledger reads follow the instances that
// ended, not the Pods that run. The ledger's answers stand even when the
// describes fail.
func (p *provider) statuses(ctx context.Context, byInstance map[string]*corev1.Pod) (map[types.UID]*corev1.PodStatus, error) {
	out := make(map[types.UID]*corev1.PodStatus, len(byInstance))
	if len(byInstance) == 0 {
		return out, nil
	}
	insts, describeErr := describe(ctx, p.cfg.EC2, slices.Sorted(maps.Keys(byInstance)))
	var ended []string
	for id, pod := range byInstance {
		inst, ok := insts[id]
		switch {
		case ok && inst.State.Name == ec2types.InstanceStateNamePending:
			out[pod.UID] = pending(pod)
		case ok && inst.State.Name == ec2types.InstanceStateNameRunning:
			out[pod.UID] = running(pod, aws.ToTime(inst.LaunchTime))
		default:
			ended = append(ended, id)
		}
	}
	if len(ended) == 0 {
		return out, describeErr
	}
	slices.Sort(ended)
	recs := p.cfg.Ledger.GetMany(ctx, ended)
	var ledgerErr error
	for _, id := range ended {
		pod := byInstance[id]
		// A Pod whose record could not be read gets no status from this
		// round; the error names the first such instance.
		if err, left := recs.Left[id]; left {
			if ledgerErr == nil {
				ledgerErr = fmt.Errorf("ledger: %d of %d records not read, %s: %w", len(recs.Left), len(ended), id, err)
			}
			continue
		}
		// The ledger is keyed by instance: only a record naming this very
		// Pod (not an earlier one of the same name) and checked against
		// the instance's tags speaks for it.
		if st := endedFromLedger(pod, id, recs.Found[id]); st != nil {
			out[pod.UID] = st
		} else if _, described := insts[id]; described {
			// Gone with no exit recorded: Reaper waits for a late exit
			// line and then finalizes the Pod; a status written here
			// would pre-empt it.
			out[pod.UID] = pod.Status.DeepCopy()
		}
	}
	return out, errors.Join(describeErr, ledgerErr)
}

// endedFromLedger is the status of pod as its instance's ledger record
// (rec, the zero Record when there is none) ends it, by the kubelet's rule
// over every container's exit (podstatus.Build), or nil while the record
// does not end it. Only a record naming this very Pod (not an earlier one
// of the same name) speaks for it: Reaper records an exit only once the
// instance's tags back it.
func endedFromLedger(pod *corev1.Pod, id string, rec ledger.Record) *corev1.PodStatus {
	if rec.Pod.UID != string(pod.UID) || len(rec.Runs()) == 0 {
		return nil
	}
	st, ok := podstatus.Build(pod, model.Outcome{InstanceID: id, Exits: rec.Runs()}, time.Now())
	if !ok || !podstatus.Terminal(st.Phase) {
		return nil
	}
	return &st
}

// describeIDs is EC2's limit on the instance ids one DescribeInstances
// names; filterValues its limit on the values of one filter.
const (
	describeIDs  = 1000
	filterValues = 200
)

// describe returns the instances among ids that EC2 knows, by id, naming
// describeIDs ids a call. EC2 fails a call naming an id it does not know
// (InvalidInstanceID.NotFound: launched moments ago, or terminated long
// ago), so such a call's ids are described again by an instance-id filter,
// filterValues a call, which leaves the unknown ones out. What was
// described before an error comes with it.
func describe(ctx context.Context, client *ec2.Client, ids []string) (map[string]ec2types.Instance, error) {
	out := make(map[string]ec2types.Instance, len(ids))
	add := func(res *ec2.DescribeInstancesOutput) {
		for _, r := range res.Reservations {
			for _, inst := range r.Instances {
				out[aws.ToString(inst.InstanceId)] = inst
			}
		}
	}
	for chunk := range slices.Chunk(ids, describeIDs) {
		res, err := client.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: chunk})
		if err == nil {
			add(res)
			continue
		}
		var apiErr smithy.APIError
		if !errors.As(err, &apiErr) || apiErr.ErrorCode() != "InvalidInstanceID.NotFound" {
			return out, fmt.Errorf("describe %d instances: %w", len(chunk), err)
		}
		for part := range slices.Chunk(chunk, filterValues) {
			pages := ec2.NewDescribeInstancesPaginator(client, &ec2.DescribeInstancesInput{
				Filters: []ec2types.Filter{{Name: aws.String("instance-id"), Values: part}},
			})
			for pages.HasMorePages() {
				res, err := pages.NextPage(ctx)
				if err != nil {
					return out, fmt.Errorf("describe %d instances: %w", len(part), err)
				}
				add(res)
			}
		}
	}
	return out, nil
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

// syncStatuses computes the statuses of every live Pod together and
// notifies those that changed.
func (p *provider) syncStatuses(ctx context.Context, notify func(*corev1.Pod)) {
	live := p.livePods()
	sts, _ := p.statuses(ctx, live)
	p.notifyChanged(live, sts, notify)
}

// livePods are the Pods of the node whose status may still change, by
// instance: those the provider runs that are neither terminal nor being
// deleted. A terminal status is the truth, whoever wrote it; a Pod being
// deleted is virtual-kubelet's to finish.
func (p *provider) livePods() map[string]*corev1.Pod {
	pods, err := p.lister.List(labels.Everything())
	if err != nil {
		return nil
	}
	out := map[string]*corev1.Pod{}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pod := range pods {
		if id, ok := p.instances[pod.UID]; ok && !terminal(pod.Status.Phase) && pod.DeletionTimestamp == nil {
			out[id] = pod
		}
	}
	return out
}

// notifyChanged notifies each status of sts that differs from the last one
// notified for its Pod, unless the Pod was deleted meanwhile.
func (p *provider) notifyChanged(byInstance map[string]*corev1.Pod, sts map[types.UID]*corev1.PodStatus, notify func(*corev1.Pod)) {
	for _, pod := range byInstance {
		st, ok := sts[pod.UID]
		if !ok {
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

// InstancePending is the reason the provider gives a container waiting for
// its Pod's instance to start.
const InstancePending = "InstancePending"

// pending is the Pod's status while its instance starts: every container
// waits, those whose turn would come first for the instance, the rest for
// the Pod's init containers.
func pending(pod *corev1.Pod) *corev1.PodStatus {
	st := pod.Status.DeepCopy()
	st.Phase = corev1.PodPending
	st.InitContainerStatuses, st.ContainerStatuses, _ = podContainers(pod, metav1.Time{},
		func(cs corev1.ContainerStatus, _ podstatus.Kind, _ metav1.Time) corev1.ContainerStatus {
			return waitingFor(cs, InstancePending)
		})
	return st
}

// running is the Pod's status while its instance runs, launched at
// launched: the containers as podContainers shows them, with the
// kubelet's phase over them (podstatus.Phase) and conditions to match.
// The Pod is Ready only once every regular init container shows completed
// and every regular container and sidecar runs: a Pod whose init
// containers the provider cannot see completed is not ready, whatever the
// instance says. The conditions keep their transition times while their
// status holds, so that the same Pod status gives the same result and the
// provider notifies, and virtual-kubelet writes, only changes: each write
// of the whole status is one that may land over Reaper's.
func running(pod *corev1.Pod, launched time.Time) *corev1.PodStatus {
	started := metav1.NewTime(launched.Truncate(time.Second))
	inits, regulars, initialized := podContainers(pod, started, runningFor)
	phase := podstatus.Phase(&pod.Spec, inits, regulars, false, initialized)
	if podstatus.Terminal(phase) {
		// The statuses Reaper wrote from the exit lines say the Pod
		// ended: ending it, with its instance, is Reaper's, which
		// writes the phase itself; a status written here would pre-empt
		// it.
		return pod.Status.DeepCopy()
	}
	ready := initialized
	for i, cs := range inits {
		if podstatus.KindOf(&pod.Spec, pod.Spec.InitContainers[i].Name) == podstatus.KindSidecar {
			ready = ready && cs.Ready
		}
	}
	for _, cs := range regulars {
		ready = ready && cs.Ready
	}
	// A condition that turns now turns at the latest moment the statuses
	// tell of, not at the time of this computation, so that it is the
	// same each period.
	at := started
	for _, cs := range slices.Concat(inits, regulars) {
		for _, t := range []metav1.Time{runningSince(cs.State), terminatedAt(cs.State), terminatedAt(cs.LastTerminationState)} {
			if t.After(at.Time) {
				at = t
			}
		}
	}
	cond := func(t corev1.PodConditionType, ok bool, notReason string) corev1.PodCondition {
		c := corev1.PodCondition{Type: t, Status: corev1.ConditionTrue, LastTransitionTime: at}
		if !ok {
			c.Status, c.Reason = corev1.ConditionFalse, notReason
		}
		for _, old := range pod.Status.Conditions {
			if old.Type == t && old.Status == c.Status {
				c.LastTransitionTime = old.LastTransitionTime
			}
		}
		return c
	}
	return &corev1.PodStatus{
		Phase:     phase,
		StartTime: &started,
		Conditions: []corev1.PodCondition{
			cond(corev1.PodScheduled, true, ""),
			cond(corev1.PodInitialized, initialized, podstatus.ReasonNotInitialized),
			cond(corev1.ContainersReady, ready, podstatus.ReasonNotReady),
			cond(corev1.PodReady, ready, podstatus.ReasonNotReady),
		},
		InitContainerStatuses: inits,
		ContainerStatuses:     regulars,
	}
}

// podContainers are complete statuses of every container of pod, its init
// containers (sidecars among them) and its containers, in spec order, as
// far as the provider can tell, and whether every regular init container
// shows completed.
//
// The provider sees the instance, not its containers: a container's end
// reaches it only as the status Reaper wrote from the host's exit line.
// So a container the Pod shows terminated keeps that status, of which the
// provider knows nothing later; the apiserver would also refuse a write
// turning it back under restartPolicy Never, and with it every later
// change the whole status carried. Of the others, those whose turn has
// come (every regular init container before them shows completed) are
// live(cs, kind, since), since being when their turn came: the instance's
// launch, or the end of the last regular init container before them. The
// rest wait for the init containers (PodInitializing), as the kubelet
// shows a container that has not started. Regular init containers are
// thus shown as the kubelet shows them at the Pod's start, the first not
// completed running and the later ones waiting, until Reaper writes their
// exits: the provider cannot tell which of them ran, and one shown
// completed without its exit would be a guess that makes the Pod look
// initialized.
func podContainers(pod *corev1.Pod, since metav1.Time, live func(cs corev1.ContainerStatus, kind podstatus.Kind, since metav1.Time) corev1.ContainerStatus) (inits, regulars []corev1.ContainerStatus, initialized bool) {
	initialized = true
	status := func(c corev1.Container, current []corev1.ContainerStatus) corev1.ContainerStatus {
		cs := corev1.ContainerStatus{Name: c.Name, Image: c.Image}
		for _, old := range current {
			if old.Name == c.Name {
				// What the Pod shows of it (image id, container id,
				// restarts, the last termination) stays.
				cs = *old.DeepCopy()
			}
		}
		switch {
		case cs.State.Terminated != nil:
			return cs
		case !initialized:
			return waitingFor(cs, podstatus.ReasonPodInitializing)
		}
		return live(cs, podstatus.KindOf(&pod.Spec, c.Name), since)
	}
	for _, c := range pod.Spec.InitContainers {
		cs := status(c, pod.Status.InitContainerStatuses)
		inits = append(inits, cs)
		if podstatus.KindOf(&pod.Spec, c.Name) != podstatus.KindInit {
			continue
		}
		if t := cs.State.Terminated; t == nil || t.ExitCode != 0 {
			initialized = false
		} else if t.FinishedAt.After(since.Time) {
			since = t.FinishedAt
		}
	}
	for _, c := range pod.Spec.Containers {
		regulars = append(regulars, status(c, pod.Status.ContainerStatuses))
	}
	return inits, regulars, initialized
}

// runningFor is a container whose turn came at since on a running
// instance: it runs. One the Pod shows running keeps its start. One the
// Pod shows waiting to restart (the host restarts it in place, after a
// backoff, and reports no start) runs again from its last end at the
// earliest, keeping its restart count and last termination. Sidecars and
// regular containers are ready once they run (the host runs no probes);
// a regular init container never is.
func runningFor(cs corev1.ContainerStatus, kind podstatus.Kind, since metav1.Time) corev1.ContainerStatus {
	switch {
	case cs.State.Running != nil:
		since = cs.State.Running.StartedAt
	case cs.LastTerminationState.Terminated != nil && cs.LastTerminationState.Terminated.FinishedAt.After(since.Time):
		since = cs.LastTerminationState.Terminated.FinishedAt
	}
	cs.State = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: since}}
	cs.Started = aws.Bool(true)
	cs.Ready = kind != podstatus.KindInit
	return cs
}

// waitingFor is cs waiting to start for reason.
func waitingFor(cs corev1.ContainerStatus, reason string) corev1.ContainerStatus {
	cs.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason}}
	cs.Ready, cs.Started = false, aws.Bool(false)
	return cs
}

func runningSince(s corev1.ContainerState) metav1.Time {
	if s.Running != nil {
		return s.Running.StartedAt
	}
	return metav1.Time{}
}

func terminatedAt(s corev1.ContainerState) metav1.Time {
	if s.Terminated != nil {
		return s.Terminated.FinishedAt
	}
	return metav1.Time{}
}
