package replay

import (
	"context"
	"crypto/md5"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	ddbtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/reaper-k8s/reaper/internal/ec2server"
	"github.com/reaper-k8s/reaper/pkg/exitline"
	"github.com/reaper-k8s/reaper/pkg/ledger"
	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/model"
	"github.com/reaper-k8s/reaper/pkg/statechange"
	"github.com/reaper-k8s/reaper/pkg/workqueue"
)

// The sample world of events/README.md: one instance running the Pod
// default/sample-job. State-change events name only the instance, so the
// Pod they are about comes from here.
const (
	SampleNamespace  = "default"
	SamplePod        = "sample-job"
	SampleUID        = "5f0c8e1a-7b5d-4c3e-9a41-2d6f0b8c1e11"
	SampleInstanceID = "i-0123456789abcdef0"
)

// World is what Seed created, to look at again (Observe) once the event
// has been handled.
type World struct {
	Pods      []PodView
	Instances []InstanceView
}

// PodView is a seeded Pod before and after the event.
type PodView struct {
	Namespace, Name string
	// Before is the phase it was seeded with, "" when it was not created.
	Before corev1.PodPhase
	PodState
}

// InstanceView is a seeded instance before and after the event.
type InstanceView struct {
	ID            string
	Before, After ec2server.State
	// Record is its ledger record after the event, nil when it has none.
	Record *ledger.Record
	// WaitUntil is when its exit-wait window closes, if it is open.
	WaitUntil time.Time
}

// SeedOptions tune Seed.
type SeedOptions struct {
	// KeepTime leaves a state change, or a work item, with its recorded
	// time.
	KeepTime bool
	// Progress reports what is seeded; nil says nothing.
	Progress func(format string, a ...any)
}

// Seed creates the Pods and instances an event talks about, as
// EventFunction tells its shape, and returns the payload to send for it:
// the event restamped with the live Pods' UIDs (the apiserver assigns its
// own) and, unless KeepTime, moved to now. It clears what an earlier event
// left of them first, so events can share a lab. An event of no shape
// Reaper knows seeds nothing and is sent as it is.
func (l *Lab) Seed(ctx context.Context, event []byte, opts SeedOptions) ([]byte, World, error) {
	progress := opts.Progress
	if progress == nil {
		progress = func(string, ...any) {}
	}
	takes, err := EventFunction(event)
	if err != nil {
		return nil, World{}, err
	}
	var (
		w       World
		payload = event
	)
	switch takes {
	case metrics.FunctionExitRecorder:
		payload, err = l.seedExits(ctx, event, &w, progress)
	case metrics.FunctionStateChange:
		payload, err = l.seedStateChange(ctx, event, opts.KeepTime, &w, progress)
	case metrics.FunctionSweeper:
		err = l.seedOrphan(ctx, &w, progress)
	case metrics.FunctionReconciler:
		payload, err = l.seedQueue(ctx, event, opts.KeepTime, &w, progress)
	default:
		progress("the event is none Reaper knows: nothing seeded, sent as it is")
	}
	if err != nil {
		return nil, World{}, fmt.Errorf("seed: %w", err)
	}
	return payload, w, nil
}

// EventFunction names the function that takes an event of this shape, or
// "" when the shape is none of Reaper's.
func EventFunction(event []byte) (string, error) {
	var probe struct {
		AWSLogs    json.RawMessage `json:"awslogs"`
		Source     string          `json:"source"`
		DetailType string          `json:"detail-type"`
		Records    []struct {
			EventSource string `json:"eventSource"`
		} `json:"Records"`
	}
	if err := json.Unmarshal(event, &probe); err != nil {
		return "", fmt.Errorf("not a JSON event: %w", err)
	}
	switch {
	case probe.AWSLogs != nil:
		return metrics.FunctionExitRecorder, nil
	case probe.Source == model.StateChangeSource && probe.DetailType == model.StateChangeDetailType:
		return metrics.FunctionStateChange, nil
	case probe.DetailType == "Scheduled Event":
		return metrics.FunctionSweeper, nil
	case len(probe.Records) > 0 && probe.Records[0].EventSource == "aws:sqs":
		return metrics.FunctionReconciler, nil
	}
	return "", nil
}

// seedExits creates each Pod the exit lines name, running, and the managed
// instance of the log stream, and restamps the lines with the live Pods'
// UIDs.
func (l *Lab) seedExits(ctx context.Context, event []byte, w *World, progress func(string, ...any)) ([]byte, error) {
	var ev events.CloudwatchLogsEvent
	if err := json.Unmarshal(event, &ev); err != nil {
		return nil, err
	}
	data, err := ev.AWSLogs.Parse()
	if err != nil {
		progress("the payload does not decode (%v): nothing seeded, sent as it is", err)
		return event, nil
	}
	if data.MessageType != "DATA_MESSAGE" {
		progress("a %s: nothing to seed", data.MessageType)
		return event, nil
	}
	type subject struct {
		namespace, name string
		uids            []string
		restarts        bool
	}
	var subjects []*subject
	for _, e := range data.LogEvents {
		line, err := exitline.Parse([]byte(e.Message))
		if err != nil || line.InstanceID != data.LogStream {
			continue // the function rejects it; nothing to seed
		}
		i := slices.IndexFunc(subjects, func(s *subject) bool { return s.namespace == line.PodNamespace && s.name == line.PodName })
		if i < 0 {
			subjects = append(subjects, &subject{namespace: line.PodNamespace, name: line.PodName})
			i = len(subjects) - 1
		}
		s := subjects[i]
		if !slices.Contains(s.uids, line.PodUID) {
			s.uids = append(s.uids, line.PodUID)
		}
		s.restarts = s.restarts || line.WillRestart
	}
	if len(subjects) == 0 {
		progress("no exit line names a Pod on instance %s: nothing seeded", data.LogStream)
		return event, nil
	}

	if err := l.ClearInstance(ctx, data.LogStream); err != nil {
		return nil, err
	}
	uids := map[string]types.UID{}
	var first *corev1.Pod
	for _, s := range subjects {
		if err := l.clearPod(ctx, s.namespace, s.name); err != nil {
			return nil, err
		}
		policy := corev1.RestartPolicyNever
		if s.restarts {
			policy = corev1.RestartPolicyOnFailure
		}
		pod, err := l.RunningPod(ctx, s.namespace, s.name, policy)
		if err != nil {
			return nil, err
		}
		for _, uid := range s.uids {
			uids[uid] = pod.UID
		}
		if first == nil {
			first = pod
		}
		w.Pods = append(w.Pods, PodView{Namespace: s.namespace, Name: s.name, Before: pod.Status.Phase})
		progress("seeded Pod %s/%s, %s (restartPolicy %s), uid %s; the exit lines' podUID %s is restamped to it",
			s.namespace, s.name, pod.Status.Phase, policy, pod.UID, strings.Join(s.uids, ", "))
	}
	l.AddInstance(data.LogStream, first, true)
	w.Instances = append(w.Instances, InstanceView{ID: data.LogStream, Before: ec2server.Running})
	progress("seeded instance %s, running, tagged managed for Pod %s/%s", data.LogStream, first.Namespace, first.Name)
	return Restamp(data, uids)
}

// seedStateChange creates the sample Pod running on the event's instance,
// moves the instance to the event's state (the world changes, then
// EventBridge tells) and, unless keepTime, moves the event to now.
func (l *Lab) seedStateChange(ctx context.Context, event []byte, keepTime bool, w *World, progress func(string, ...any)) ([]byte, error) {
	var ev events.CloudWatchEvent
	if err := json.Unmarshal(event, &ev); err != nil {
		return nil, err
	}
	m, err := statechange.Parse(ev)
	if err != nil {
		progress("not a valid state change (%v): nothing seeded, sent as it is", err)
		return event, nil
	}
	if err := l.ClearInstance(ctx, m.InstanceID); err != nil {
		return nil, err
	}
	if err := l.clearPod(ctx, SampleNamespace, SamplePod); err != nil {
		return nil, err
	}
	pod, err := l.RunningPod(ctx, SampleNamespace, SamplePod, corev1.RestartPolicyNever)
	if err != nil {
		return nil, err
	}
	w.Pods = append(w.Pods, PodView{Namespace: pod.Namespace, Name: pod.Name, Before: pod.Status.Phase})
	progress("seeded Pod %s/%s, %s, uid %s (the sample Pod of events/README.md)", pod.Namespace, pod.Name, pod.Status.Phase, pod.UID)
	l.AddInstance(m.InstanceID, pod, true)
	if m.State != string(ec2server.Running) {
		l.Stack.EC2.SetState(m.InstanceID, ec2server.State(m.State))
	}
	w.Instances = append(w.Instances, InstanceView{ID: m.InstanceID, Before: ec2server.State(m.State)})
	progress("seeded instance %s, %s as the event says, tagged managed for Pod %s/%s", m.InstanceID, m.State, pod.Namespace, pod.Name)
	if keepTime {
		return event, nil
	}
	recorded := ev.Time
	ev.Time = time.Now().UTC().Truncate(time.Second)
	progress("event time %s moved to now, %s, as if EC2 had just sent it (-keep-time sends it as recorded)",
		recorded.UTC().Format(time.RFC3339), ev.Time.Format(time.RFC3339))
	return json.Marshal(ev)
}

// seedOrphan gives the sweep work: a managed instance launched an hour ago
// whose Pod no longer exists.
func (l *Lab) seedOrphan(ctx context.Context, w *World, progress func(string, ...any)) error {
	if err := l.ClearInstance(ctx, SampleInstanceID); err != nil {
		return err
	}
	if err := l.clearPod(ctx, SampleNamespace, SamplePod); err != nil {
		return err
	}
	gone := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: SampleNamespace, Name: SamplePod, UID: SampleUID}}
	l.AddInstance(SampleInstanceID, gone, true)
	w.Pods = append(w.Pods, PodView{Namespace: SampleNamespace, Name: SamplePod})
	w.Instances = append(w.Instances, InstanceView{ID: SampleInstanceID, Before: ec2server.Running})
	progress("seeded an orphan for the sweep: instance %s, running since an hour ago, tagged managed for Pod %s/%s, which does not exist",
		SampleInstanceID, SampleNamespace, SamplePod)
	return nil
}

// seedQueue seeds the world of a reconciler batch: every instance its work
// items name, tagged managed for the Pod its exit claims name (the first,
// if they name several) or else the sample Pod, and at the furthest state
// they report; every claimed Pod running, and the sample Pod too, unless an
// orphan report is about it, which says it no longer exists. It restamps the
// claims with the live Pods' UIDs and, unless keepTime, moves the items to
// now, as if they had just been sent.
func (l *Lab) seedQueue(ctx context.Context, event []byte, keepTime bool, w *World, progress func(string, ...any)) ([]byte, error) {
	var ev events.SQSEvent
	if err := json.Unmarshal(event, &ev); err != nil {
		return nil, err
	}
	type subject struct {
		id     string
		claims []string // the claimed Pods, as namespace/name
		state  string
		orphan bool
	}
	var (
		subjects  []*subject
		items     = make([]*workqueue.Item, len(ev.Records))
		claimed   = map[string]model.PodRef{} // by namespace/name, the first claim's
		claimUIDs = map[string][]string{}
		restarts  = map[string]bool{}
	)
	for i, rec := range ev.Records {
		it, err := workqueue.Parse(rec)
		if err != nil {
			progress("%v: sent as it is, for the reconciler to drop", err)
			continue
		}
		items[i] = &it
		j := slices.IndexFunc(subjects, func(s *subject) bool { return s.id == it.InstanceID })
		if j < 0 {
			subjects = append(subjects, &subject{id: it.InstanceID})
			j = len(subjects) - 1
		}
		s := subjects[j]
		switch c := it.Body.(type) {
		case workqueue.ExitClaim:
			key := c.Pod.Namespace + "/" + c.Pod.Name
			if !slices.Contains(s.claims, key) {
				s.claims = append(s.claims, key)
			}
			if _, ok := claimed[key]; !ok {
				claimed[key] = c.Pod
			}
			if !slices.Contains(claimUIDs[key], c.Pod.UID) {
				claimUIDs[key] = append(claimUIDs[key], c.Pod.UID)
			}
			restarts[key] = restarts[key] || c.Exit.WillRestart
		case workqueue.StateChange:
			if model.StateRank(c.State) > model.StateRank(s.state) {
				s.state = c.State
			}
		case workqueue.OrphanCheck:
			s.orphan = true
		}
	}
	if len(subjects) == 0 {
		progress("no work item names an instance: nothing seeded")
		return event, nil
	}

	uids := map[string]types.UID{}
	seeded := map[string]*corev1.Pod{}
	// seedPod creates the Pod once, running, or when absent only makes
	// sure it does not exist.
	seedPod := func(ref model.PodRef, absent bool) (*corev1.Pod, error) {
		key := ref.Namespace + "/" + ref.Name
		if pod, ok := seeded[key]; ok {
			return pod, nil
		}
		if err := l.clearPod(ctx, ref.Namespace, ref.Name); err != nil {
			return nil, err
		}
		if absent {
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ref.Namespace, Name: ref.Name, UID: types.UID(ref.UID)}}
			seeded[key] = pod
			w.Pods = append(w.Pods, PodView{Namespace: ref.Namespace, Name: ref.Name})
			progress("Pod %s/%s does not exist, as the orphan report says", ref.Namespace, ref.Name)
			return pod, nil
		}
		policy := corev1.RestartPolicyNever
		if restarts[key] {
			policy = corev1.RestartPolicyOnFailure
		}
		pod, err := l.RunningPod(ctx, ref.Namespace, ref.Name, policy)
		if err != nil {
			return nil, err
		}
		for _, uid := range claimUIDs[key] {
			uids[uid] = pod.UID
		}
		seeded[key] = pod
		w.Pods = append(w.Pods, PodView{Namespace: pod.Namespace, Name: pod.Name, Before: pod.Status.Phase})
		if len(claimUIDs[key]) > 0 {
			progress("seeded Pod %s/%s, %s (restartPolicy %s), uid %s; the claims' pod uid %s is restamped to it",
				pod.Namespace, pod.Name, pod.Status.Phase, policy, pod.UID, strings.Join(claimUIDs[key], ", "))
		} else {
			progress("seeded Pod %s/%s, %s, uid %s (the sample Pod of events/README.md)", pod.Namespace, pod.Name, pod.Status.Phase, pod.UID)
		}
		return pod, nil
	}
	for _, s := range subjects {
		if err := l.ClearInstance(ctx, s.id); err != nil {
			return nil, err
		}
		var tagged *corev1.Pod
		for _, key := range s.claims {
			pod, err := seedPod(claimed[key], false)
			if err != nil {
				return nil, err
			}
			if tagged == nil {
				tagged = pod
			}
		}
		if tagged == nil {
			var err error
			if tagged, err = seedPod(model.PodRef{Namespace: SampleNamespace, Name: SamplePod, UID: SampleUID}, s.orphan); err != nil {
				return nil, err
			}
		}
		l.AddInstance(s.id, tagged, true)
		state := ec2server.Running
		if s.state != "" && s.state != string(ec2server.Running) {
			state = ec2server.State(s.state)
			l.Stack.EC2.SetState(s.id, state)
		}
		w.Instances = append(w.Instances, InstanceView{ID: s.id, Before: state})
		progress("seeded instance %s, %s, tagged managed for Pod %s/%s", s.id, state, tagged.Namespace, tagged.Name)
	}

	now := time.Now().UTC().Truncate(time.Millisecond)
	for i, it := range items {
		if it == nil {
			continue
		}
		if it.Pod != nil {
			pod := *it.Pod
			if uid, ok := uids[pod.UID]; ok {
				pod.UID = string(uid)
			}
			it.Pod = &pod
		}
		rec := &ev.Records[i]
		if !keepTime {
			if it.Kind == workqueue.KindState {
				it.At = now.Truncate(time.Second)
			}
			if !it.QueuedAt.IsZero() {
				it.QueuedAt = now
			}
			if _, ok := rec.Attributes["SentTimestamp"]; ok {
				rec.Attributes["SentTimestamp"] = strconv.FormatInt(now.UnixMilli(), 10)
			}
		}
		body, err := json.Marshal(it.Message)
		if err != nil {
			return nil, err
		}
		rec.Body, rec.Md5OfBody = string(body), fmt.Sprintf("%x", md5.Sum(body))
	}
	if !keepTime {
		progress("the work items' times moved to now, %s, as if just sent (-keep-time sends them as recorded)", now.Format(time.RFC3339))
	}
	return json.Marshal(ev)
}

// ClearInstance forgets an instance on the EC2 test server and in the
// ledger.
func (l *Lab) ClearInstance(ctx context.Context, instanceID string) error {
	l.Stack.EC2.RemoveInstance(instanceID)
	db := dynamodb.NewFromConfig(l.Stack.AWSConfig(ctx))
	_, err := db.DeleteItem(ctx, &dynamodb.DeleteItemInput{
		TableName: aws.String(l.Table),
		Key:       map[string]ddbtypes.AttributeValue{ledger.KeyAttribute: &ddbtypes.AttributeValueMemberS{Value: instanceID}},
	})
	return err
}

// DeletePod deletes a Pod at once (no kubelet confirms a graceful deletion
// on the virtual node) and waits until it is gone.
func (l *Lab) DeletePod(ctx context.Context, namespace, name string) error {
	pods := l.Stack.Kube.CoreV1().Pods(namespace)
	if err := pods.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := pods.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pod %s/%s is still there 10s after its deletion", namespace, name)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// clearPod makes sure a Pod does not exist.
func (l *Lab) clearPod(ctx context.Context, namespace, name string) error {
	if err := l.DeletePod(ctx, namespace, name); !apierrors.IsNotFound(err) {
		return err
	}
	return nil
}
