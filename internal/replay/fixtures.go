package replay

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/events"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/reaper-k8s/reaper/internal/ec2server"
	"github.com/reaper-k8s/reaper/internal/labstack"
	"github.com/reaper-k8s/reaper/pkg/exitline"
	"github.com/reaper-k8s/reaper/pkg/model"
)

// VirtualNode is the node name the test Pods are bound to; no kubelet
// answers for it, as on a virtual node.
const VirtualNode = "reaper-virtual-node"

// RunningPod creates a Pod bound to the virtual node and gives it the
// status a provider writes once the instance runs it: Running, Ready, with
// a running container status carrying image, imageID and containerID.
func (l *Lab) RunningPod(ctx context.Context, namespace, name string, policy corev1.RestartPolicy) (*corev1.Pod, error) {
	pod, err := l.BoundPod(ctx, namespace, name, VirtualNode, policy)
	if err != nil {
		return nil, err
	}
	pods := l.Stack.Kube.CoreV1().Pods(namespace)
	started := metav1.NewTime(time.Now().Add(-time.Hour).Truncate(time.Second))
	sum := sha256.Sum256([]byte(pod.UID))
	status := corev1.PodStatus{
		Phase:     corev1.PodRunning,
		StartTime: &started,
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: started},
			{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: started},
		},
		ContainerStatuses: []corev1.ContainerStatus{{
			Name:        "main",
			Image:       "public.ecr.aws/docker/library/busybox:1.37",
			ImageID:     "docker-pullable://public.ecr.aws/docker/library/busybox@sha256:" + hex.EncodeToString(sum[:]),
			ContainerID: ContainerID(pod),
			Ready:       true,
			Started:     new(true),
			State:       corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: started}},
		}},
	}
	patch, err := json.Marshal(map[string]any{"status": status})
	if err != nil {
		return nil, err
	}
	return pods.Patch(ctx, name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
}

// BoundPod creates a Pod bound to node with no status: Pending, until the
// node's provider reports it.
func (l *Lab) BoundPod(ctx context.Context, namespace, name, node string, policy corev1.RestartPolicy) (*corev1.Pod, error) {
	if err := l.Stack.EnsureNamespaces(ctx, namespace); err != nil {
		return nil, err
	}
	pod, err := l.Stack.Kube.CoreV1().Pods(namespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: corev1.PodSpec{
			NodeName:      node,
			RestartPolicy: policy,
			Containers:    []corev1.Container{{Name: "main", Image: "public.ecr.aws/docker/library/busybox:1.37"}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create pod %s/%s: %w", namespace, name, err)
	}
	return pod, nil
}

// PodShape is a Pod of several containers: its init containers in order
// (one whose name starts with "sidecar" is a native sidecar, an init
// container with restartPolicy Always), its regular containers, its
// restart policy and its terminationGracePeriodSeconds (0: the default).
type PodShape struct {
	Init, Containers []string
	Policy           corev1.RestartPolicy
	Grace            int64
}

// ShapedPod creates a Pod of shape bound to the virtual node. running
// gives it the status a provider writes once the instance runs it:
// Running, every regular container and sidecar running, the regular
// init containers completed; otherwise it stays Pending with no status,
// as a provider leaves a Pod whose instance is still starting.
func (l *Lab) ShapedPod(ctx context.Context, namespace, name string, shape PodShape, running bool) (*corev1.Pod, error) {
	if err := l.Stack.EnsureNamespaces(ctx, namespace); err != nil {
		return nil, err
	}
	const image = "public.ecr.aws/docker/library/busybox:1.37"
	spec := corev1.PodSpec{NodeName: VirtualNode, RestartPolicy: shape.Policy}
	if shape.Grace > 0 {
		spec.TerminationGracePeriodSeconds = &shape.Grace
	}
	for _, c := range shape.Init {
		init := corev1.Container{Name: c, Image: image}
		if strings.HasPrefix(c, "sidecar") {
			init.RestartPolicy = new(corev1.ContainerRestartPolicyAlways)
		}
		spec.InitContainers = append(spec.InitContainers, init)
	}
	for _, c := range shape.Containers {
		spec.Containers = append(spec.Containers, corev1.Container{Name: c, Image: image})
	}
	pods := l.Stack.Kube.CoreV1().Pods(namespace)
	pod, err := pods.Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}, Spec: spec}, metav1.CreateOptions{})
	if err != nil || !running {
		return pod, err
	}
	started := metav1.NewTime(time.Now().Add(-time.Hour).Truncate(time.Second))
	status := corev1.PodStatus{Phase: corev1.PodRunning, StartTime: &started}
	run := func(name string) corev1.ContainerStatus {
		return corev1.ContainerStatus{Name: name, Image: image, ContainerID: "docker://" + BareContainerID(pod) + name, Ready: true, Started: new(true),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: started}}}
	}
	for _, c := range spec.InitContainers {
		cs := run(c.Name)
		if c.RestartPolicy == nil {
			cs.Ready, cs.Started = false, new(false)
			cs.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "Completed", StartedAt: started, FinishedAt: started}}
		}
		status.InitContainerStatuses = append(status.InitContainerStatuses, cs)
	}
	for _, c := range spec.Containers {
		status.ContainerStatuses = append(status.ContainerStatuses, run(c.Name))
	}
	patch, err := json.Marshal(map[string]any{"status": status})
	if err != nil {
		return nil, err
	}
	return pods.Patch(ctx, name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
}

// ContainerID is the docker container ID the fixtures give a Pod's
// container, with the runtime scheme.
func ContainerID(pod *corev1.Pod) string {
	return "docker://" + BareContainerID(pod)
}

// BareContainerID is the ID as `docker inspect` prints it.
func BareContainerID(pod *corev1.Pod) string {
	sum := sha256.Sum256([]byte("container/" + string(pod.UID)))
	return hex.EncodeToString(sum[:])
}

// AddInstance puts an instance for the Pod on the EC2 test server, tagged
// as the provider tags it for the stack's cluster (managed=false leaves the
// managed tag off).
func (l *Lab) AddInstance(id string, pod *corev1.Pod, managed bool) {
	l.AddTaggedInstance(id, l.InstanceTags(pod, managed, labstack.Cluster))
}

// AddTaggedInstance puts a running instance with these tags on the EC2 test
// server.
func (l *Lab) AddTaggedInstance(id string, tags map[string]string) {
	l.Stack.EC2.AddInstance(ec2server.Instance{ID: id, State: ec2server.Running, Tags: tags, LaunchTime: time.Now().Add(-time.Hour)})
}

// InstanceTags are the launch tags a provider writes for the Pod's
// instance in cluster (managed=false leaves the managed tag off), with the
// identity of the lab's apiserver.
func (l *Lab) InstanceTags(pod *corev1.Pod, managed bool, cluster string) map[string]string {
	keys := model.DefaultTagKeys()
	tags := map[string]string{
		keys.ClusterUID:   l.ClusterUID,
		keys.Cluster:      cluster,
		keys.PodNamespace: pod.Namespace,
		keys.PodName:      pod.Name,
		keys.PodUID:       string(pod.UID),
	}
	if managed {
		tags[keys.Managed] = "true"
	}
	return tags
}

// Step is one recorded event of a scenario: a file named
// NNN-<function>-<what>.json holding the event exactly as Lambda receives
// it. Exit payloads are also decoded, for the Pods their lines name.
type Step struct {
	Path     string
	Function string
	Event    json.RawMessage
	// Logs is the decoded subscription payload of an exitrecorder step.
	Logs *events.CloudwatchLogsData
}

// Subject is a Pod and the instance it runs on, as a scenario recorded them.
type Subject struct {
	InstanceID string `json:"instanceId"`
	Namespace  string `json:"namespace"`
	Name       string `json:"name"`
	// RecordedUID is the Pod UID in the recording; the live Pod gets a new
	// one from the apiserver, and Restamp maps one to the other.
	RecordedUID string `json:"uid"`
}

// Recorded is a scenario as stored in testdata: its steps, and the Pods
// and instances they concern (subjects.json lists those no exit line names).
type Recorded struct {
	Steps    []Step
	Subjects []Subject
}

// Load reads a scenario directory.
func Load(dir string) (Recorded, error) {
	var rec Recorded
	paths, err := filepath.Glob(filepath.Join(dir, "[0-9]*.json"))
	if err != nil {
		return rec, err
	}
	sort.Strings(paths)
	if len(paths) == 0 {
		return rec, fmt.Errorf("no recorded events in %s", dir)
	}
	seen := map[string]bool{}
	if b, err := os.ReadFile(filepath.Join(dir, "subjects.json")); err == nil {
		if err := json.Unmarshal(b, &rec.Subjects); err != nil {
			return rec, fmt.Errorf("%s/subjects.json: %w", dir, err)
		}
		for _, s := range rec.Subjects {
			seen[s.RecordedUID] = true
		}
	}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return rec, err
		}
		parts := strings.SplitN(filepath.Base(p), "-", 3)
		if len(parts) < 2 {
			return rec, fmt.Errorf("%s: name is not NNN-<function>-….json", p)
		}
		st := Step{Path: p, Function: strings.TrimSuffix(parts[1], ".json"), Event: b}
		if st.Function == "exitrecorder" {
			var ev events.CloudwatchLogsEvent
			if err := json.Unmarshal(b, &ev); err != nil {
				return rec, fmt.Errorf("%s: %w", p, err)
			}
			data, err := ev.AWSLogs.Parse()
			if err != nil {
				return rec, fmt.Errorf("%s: %w", p, err)
			}
			st.Logs = &data
			for _, e := range data.LogEvents {
				l, err := exitline.Parse([]byte(e.Message))
				if err != nil || seen[l.PodUID] || l.InstanceID != data.LogStream {
					continue
				}
				seen[l.PodUID] = true
				rec.Subjects = append(rec.Subjects, Subject{InstanceID: data.LogStream, Namespace: l.PodNamespace, Name: l.PodName, RecordedUID: l.PodUID})
			}
		}
		rec.Steps = append(rec.Steps, st)
	}
	return rec, nil
}

// Restamp returns an exit payload with recorded Pod UIDs replaced by live
// ones, re-encoded as CloudWatch Logs delivers it. Every other field of each
// line is kept, and bad lines are kept as they are.
func Restamp(data events.CloudwatchLogsData, uids map[string]types.UID) ([]byte, error) {
	data.LogEvents = slices.Clone(data.LogEvents)
	for i, e := range data.LogEvents {
		var fields map[string]any
		if json.Unmarshal([]byte(e.Message), &fields) != nil {
			continue
		}
		old, _ := fields["podUID"].(string)
		live, ok := uids[old]
		if !ok {
			continue
		}
		fields["podUID"] = string(live)
		b, err := json.Marshal(fields)
		if err != nil {
			return nil, err
		}
		data.LogEvents[i].Message = string(b)
	}
	ev, err := exitline.Encode(data)
	if err != nil {
		return nil, err
	}
	return json.Marshal(ev)
}

// Scenario is a recorded scenario made live: its Pods created and running,
// its instances tagged on the EC2 test server, its payloads restamped.
type Scenario struct {
	// Pods by name, as created.
	Pods map[string]*corev1.Pod
	// Instances maps a Pod's name to its instance.
	Instances map[string]string
	// Steps are ready to invoke, in recording order.
	Steps []LiveStep
}

// LiveStep is a step ready to invoke.
type LiveStep struct {
	Function string
	Payload  []byte
}

// Payloads returns the payloads of the steps for one function.
func (sc *Scenario) Payloads(function string) [][]byte {
	var out [][]byte
	for _, st := range sc.Steps {
		if st.Function == function {
			out = append(out, st.Payload)
		}
	}
	return out
}

// Prepare makes the recordings in dir live: a running Pod with policy and a
// tagged instance per subject. managed, when not nil, says which instances
// carry the managed tag (default: all).
func (l *Lab) Prepare(ctx context.Context, dir string, policy corev1.RestartPolicy, managed func(Subject) bool) (*Scenario, error) {
	rec, err := Load(dir)
	if err != nil {
		return nil, err
	}
	sc := &Scenario{Pods: map[string]*corev1.Pod{}, Instances: map[string]string{}}
	uids := map[string]types.UID{}
	for _, s := range rec.Subjects {
		pod, err := l.RunningPod(ctx, s.Namespace, s.Name, policy)
		if err != nil {
			return nil, err
		}
		sc.Pods[s.Name], sc.Instances[s.Name], uids[s.RecordedUID] = pod, s.InstanceID, pod.UID
		l.AddInstance(s.InstanceID, pod, managed == nil || managed(s))
	}
	// EventBridge events are moved in time so the recording starts now:
	// the exit-wait window runs from their times.
	var first time.Time
	for _, st := range rec.Steps {
		var ev events.CloudWatchEvent
		if st.Logs == nil && json.Unmarshal(st.Event, &ev) == nil && (first.IsZero() || ev.Time.Before(first)) {
			first = ev.Time
		}
	}
	shift := time.Since(first)
	for _, st := range rec.Steps {
		payload := []byte(st.Event)
		if st.Logs != nil {
			payload, err = Restamp(*st.Logs, uids)
		} else {
			var ev events.CloudWatchEvent
			if err = json.Unmarshal(st.Event, &ev); err == nil {
				ev.Time = ev.Time.Add(shift).UTC().Truncate(time.Second)
				payload, err = json.Marshal(ev)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", st.Path, err)
		}
		sc.Steps = append(sc.Steps, LiveStep{Function: st.Function, Payload: payload})
	}
	return sc, nil
}

// Account is the AWS account the lab's events come from.
const Account = "123456789012"

// StateChangeEvent is the EventBridge event EC2 sends when an instance
// reaches state at time at, with the given event id.
func StateChangeEvent(eventID, instanceID, state string, at time.Time) events.CloudWatchEvent {
	detail, _ := json.Marshal(map[string]string{"instance-id": instanceID, "state": state})
	return events.CloudWatchEvent{
		Version: "0", ID: eventID, DetailType: model.StateChangeDetailType, Source: model.StateChangeSource,
		AccountID: Account, Time: at, Region: labstack.Region,
		Resources: []string{"arn:aws:ec2:" + labstack.Region + ":" + Account + ":instance/" + instanceID},
		Detail:    detail,
	}
}

// ExitLogsEvent is the subscription payload CloudWatch Logs delivers for
// one exit line of the Pod on instance id, the seq-th line of its stream.
// The line's identity fields are the Pod's and the instance's; its times,
// when unset, say the container ran for the hour until now.
func ExitLogsEvent(id string, pod *corev1.Pod, l exitline.Line, seq int) (events.CloudwatchLogsEvent, error) {
	l.Reaper, l.V, l.InstanceID = exitline.Kind, exitline.Version, id
	l.PodNamespace, l.PodName, l.PodUID = pod.Namespace, pod.Name, string(pod.UID)
	if l.Container == "" {
		l.Container = "main"
	}
	if l.FinishedAt.IsZero() {
		l.FinishedAt = time.Now().UTC()
	}
	if l.StartedAt.IsZero() {
		l.StartedAt = l.FinishedAt.Add(-time.Hour)
	}
	msg, err := json.Marshal(l)
	if err != nil {
		return events.CloudwatchLogsEvent{}, err
	}
	return exitline.Encode(events.CloudwatchLogsData{
		Owner: Account, LogGroup: model.DefaultLogGroup(labstack.Cluster), LogStream: id,
		SubscriptionFilters: []string{"reaper-exits"}, MessageType: "DATA_MESSAGE",
		LogEvents: []events.CloudwatchLogsLogEvent{{
			ID: fmt.Sprintf("3808%032d", seq), Timestamp: l.FinishedAt.UnixMilli(), Message: string(msg),
		}},
	})
}
