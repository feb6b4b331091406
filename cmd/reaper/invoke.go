package main

import (
	"bytes"
	"context"
	"crypto/md5"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
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
	"github.com/reaper-k8s/reaper/internal/localstack"
	"github.com/reaper-k8s/reaper/internal/replay"
	"github.com/reaper-k8s/reaper/pkg/config"
	"github.com/reaper-k8s/reaper/pkg/exitline"
	"github.com/reaper-k8s/reaper/pkg/ledger"
	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/model"
	"github.com/reaper-k8s/reaper/pkg/reaper"
	"github.com/reaper-k8s/reaper/pkg/statechange"
	"github.com/reaper-k8s/reaper/pkg/workqueue"
)

func init() {
	register("invoke", subcommand{
		summary: "run one function on one event against a local stack, print its response and what it and the reconciler did",
		run:     runInvoke,
	})
}

// The sample world of events/README.md: one instance running the Pod
// default/sample-job. State-change events name only the instance, so the
// Pod they are about comes from here.
const (
	sampleNamespace  = "default"
	samplePod        = "sample-job"
	sampleUID        = "5f0c8e1a-7b5d-4c3e-9a41-2d6f0b8c1e11"
	sampleInstanceID = "i-0123456789abcdef0"
)

// invokeTable is the ledger table of the local stack.
const invokeTable = "reaper-ledger"

// envFlag collects repeated -env K=V flags.
type envFlag []string

func (e *envFlag) String() string { return strings.Join(*e, " ") }

func (e *envFlag) Set(v string) error {
	if k, _, ok := strings.Cut(v, "="); !ok || k == "" {
		return fmt.Errorf("%q is not K=V", v)
	}
	*e = append(*e, v)
	return nil
}

func runInvoke(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("invoke", flag.ContinueOnError)
	fn := fs.String("fn", "", "the function: exitrecorder, statechange, sweeper or reconciler (default: the one that takes the event)")
	eventPath := fs.String("event", "", "the event file, e.g. events/exitrecorder/oom.json")
	keepStack := fs.Bool("keep-stack", false, "keep the stack and the function running after the call, until interrupted")
	keepTime := fs.Bool("keep-time", false, "send a state change, or a work item, with its own time (default: now, so the exit-wait window opens now)")
	verbose := fs.Bool("v", false, "also print the log output of the function and the reconciler")
	var env envFlag
	fs.Var(&env, "env", "`K=V` added to the function's environment, e.g. REAPER_DRY_RUN=true (repeatable)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: reaper invoke [-fn <function>] -event <file> [-keep-stack] [-keep-time] [-v] [-env K=V ...]\n\n"+
			"Builds the function and the reconciler for this machine, starts a local stack (etcd,\n"+
			"kube-apiserver, dynalite, EC2 and SQS test servers) with the reconciler behind the work\n"+
			"queue, seeds the Pods and instances the event talks about, invokes the function once under\n"+
			"the Lambda runtime interface emulator, waits until the reconciler has done the work it\n"+
			"queued, and prints the function's response and what became of the Pods and instances.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *eventPath == "" || fs.NArg() > 0 {
		fs.Usage()
		return errors.New("-event <file> is required and takes no other arguments")
	}
	event, err := os.ReadFile(*eventPath)
	if err != nil {
		return err
	}
	name, err := pickFunction(*fn, event, *eventPath)
	if err != nil {
		return err
	}

	root, err := replay.ModuleRoot()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "reaper-invoke-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	progress := func(format string, a ...any) { fmt.Fprintf(os.Stderr, "» "+format+"\n", a...) }

	// The other functions only queue work: the reconciler does it.
	names := []string{name}
	if name != metrics.FunctionReconciler {
		names = append(names, metrics.FunctionReconciler)
	}
	progress("building functions/%s for %s/%s", strings.Join(names, " and functions/"), runtime.GOOS, runtime.GOARCH)
	bins, err := replay.Build(ctx, root, filepath.Join(dir, "build"), names...)
	if err != nil {
		return err
	}
	progress("starting the local stack (etcd, kube-apiserver, dynalite, EC2 and SQS test servers)")
	stack, err := localstack.Start(ctx, localstack.Options{})
	if err != nil {
		return err
	}
	defer stack.Stop()
	lab, err := replay.NewLab(ctx, stack, invokeTable, bins, env...)
	if err != nil {
		return err
	}
	defer lab.Stop()
	progress("%s runs under the Lambda runtime interface emulator at %s", name, lab.Functions[name].URL)
	progress("the reconciler takes the work queue %s through an event source mapping, in %d environments",
		lab.QueueURL, len(lab.Reconcilers))

	inv, err := invokeEvent(ctx, lab, name, event, invokeOptions{KeepTime: *keepTime, Progress: progress})
	if err != nil {
		return err
	}
	inv.print(os.Stdout, *verbose)

	if *keepStack {
		progress("the stack keeps running; reach it from another shell with:")
		for _, kv := range lab.Env {
			if k, _, _ := strings.Cut(kv, "="); k == "KUBECONFIG" || k == "REAPER_TABLE" || k == "REAPER_QUEUE_URL" || strings.HasPrefix(k, "AWS_") {
				fmt.Fprintf(os.Stderr, "  export %s\n", kv)
			}
		}
		for _, i := range inv.Instances {
			fmt.Fprintf(os.Stderr, "  go run ./cmd/reaper ledger get %s\n", i.ID)
		}
		progress("press Ctrl-C to stop it")
		<-ctx.Done()
	}
	if inv.Err != nil {
		fmt.Fprintf(os.Stderr, "errorType:    %s\nerrorMessage: %s\n", inv.Err.Type, inv.Err.Message)
		return fmt.Errorf("%s returned an error", name)
	}
	return nil
}

// eventFunction names the function that takes an event of this shape, or
// "" when the shape is none of Reaper's.
func eventFunction(event []byte) (string, error) {
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
		return "exitrecorder", nil
	case probe.Source == statechange.Source && probe.DetailType == statechange.DetailType:
		return "statechange", nil
	case probe.DetailType == "Scheduled Event":
		return "sweeper", nil
	case len(probe.Records) > 0 && probe.Records[0].EventSource == "aws:sqs":
		return metrics.FunctionReconciler, nil
	}
	return "", nil
}

// pickFunction checks fn (may be empty) against the event's shape.
func pickFunction(fn string, event []byte, path string) (string, error) {
	if fn != "" && !slices.Contains(replay.Functions, fn) {
		return "", fmt.Errorf("unknown function %q (want one of %s)", fn, strings.Join(replay.Functions, ", "))
	}
	takes, err := eventFunction(event)
	if err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	switch {
	case fn == "" && takes == "":
		return "", fmt.Errorf("%s is no event Reaper knows: name the function with -fn", path)
	case fn == "":
		return takes, nil
	case takes != "" && takes != fn:
		return "", fmt.Errorf("%s is an event for %s, not for %s", path, takes, fn)
	}
	return fn, nil
}

// invokeOptions tune invokeEvent.
type invokeOptions struct {
	// KeepTime sends a state change, or a work item, with its recorded
	// time.
	KeepTime bool
	// Progress reports what is seeded; nil says nothing.
	Progress func(format string, a ...any)
}

// invocation is one call, the reconciler's work it led to, and what they
// changed.
type invocation struct {
	Function string
	// Payload is what was sent: the event, restamped or moved in time.
	Payload  []byte
	Response []byte
	// Err is the function's error, if it returned one.
	Err      *localstack.FunctionError
	Duration time.Duration
	// Drain is how long the reconciler took, after the call, to clear the
	// work queue of what had been sent to it.
	Drain time.Duration
	// Logs is what the function and the emulator wrote from the call until
	// the queue was drained.
	Logs string
	// ReconcilerLogs is what the other reconciler environments wrote then.
	ReconcilerLogs string
	// Batches are the reconciler's "batch" lines: the invocation's own,
	// when the function is the reconciler, and those of the queued work.
	Batches []reaper.BatchSummary
	// NotBelieved are the exit claims the reconciler rejected, as
	// "instance: reason".
	NotBelieved []string
	// Terminated are the instances of the TerminateInstances calls EC2
	// accepted, in call order.
	Terminated []string
	Pods       []podView
	Instances  []instanceView
}

// podView is a seeded Pod before and after the call.
type podView struct {
	Namespace, Name string
	// Before is the phase it was seeded with, "" when it was not created.
	Before corev1.PodPhase
	// Gone: the Pod does not exist after the call.
	Gone     bool
	Phase    corev1.PodPhase
	ExitCode *int32
	// Reason is the container's: Completed, Error, OOMKilled,
	// CrashLoopBackOff, ContainerStatusUnknown.
	Reason   string
	Restarts int32
	// Disruption is the DisruptionTarget condition's reason, if any.
	Disruption string
}

// instanceView is a seeded instance before and after the call.
type instanceView struct {
	ID            string
	Before, After ec2server.State
	// Record is its ledger record after the call, nil when it has none.
	Record *ledger.Record
	// WaitUntil is when its exit-wait window closes, if it is open.
	WaitUntil time.Time
}

// world is what seeding created, to look at again after the call.
type world struct {
	pods      []podView
	instances []instanceView
}

// invokeEvent seeds the Pods and instances the event talks about on the
// lab's stack, invokes the function once, waits until the reconciler has
// done the work sent to the queue until then, and looks at them again. It
// clears what an earlier call left of them first, so calls can share a
// stack.
func invokeEvent(ctx context.Context, lab *replay.Lab, fn string, event []byte, opts invokeOptions) (*invocation, error) {
	if opts.Progress == nil {
		opts.Progress = func(string, ...any) {}
	}
	f, ok := lab.Functions[fn]
	if !ok {
		return nil, fmt.Errorf("function %s is not running", fn)
	}
	takes, err := eventFunction(event)
	if err != nil {
		return nil, err
	}
	var (
		w       world
		payload = event
	)
	switch takes {
	case "exitrecorder":
		payload, err = seedExits(ctx, lab, event, &w, opts.Progress)
	case "statechange":
		payload, err = seedStateChange(ctx, lab, event, opts.KeepTime, &w, opts.Progress)
	case "sweeper":
		err = seedOrphan(ctx, lab, &w, opts.Progress)
	case metrics.FunctionReconciler:
		payload, err = seedQueue(ctx, lab, event, opts.KeepTime, &w, opts.Progress)
	default:
		opts.Progress("the event is none Reaper knows: nothing seeded, sent as it is")
	}
	if err != nil {
		return nil, fmt.Errorf("seed: %w", err)
	}

	inv := &invocation{Function: fn, Payload: payload}
	logStart := len(f.Logs())
	reconcilerStart := map[*localstack.Function]int{}
	for _, r := range lab.Reconcilers {
		if r != f {
			reconcilerStart[r] = len(r.Logs())
		}
	}
	start := time.Now()
	inv.Response, inv.Err, err = f.Invoke(ctx, payload)
	inv.Duration = time.Since(start)
	if err != nil {
		return nil, err
	}
	returned := time.Now()
	if err := lab.DrainSent(ctx, returned); err != nil {
		return nil, fmt.Errorf("the reconciler did not finish the queued work: %w", err)
	}
	inv.Drain = time.Since(returned)
	inv.Logs = logsSince(f, logStart)
	for r, offset := range reconcilerStart {
		inv.ReconcilerLogs += settledLogs(r, offset)
	}
	inv.Batches, inv.NotBelieved = reconcilerLines(inv.Logs + inv.ReconcilerLogs)
	for _, c := range lab.Stack.EC2.Calls() {
		if c.Action == "TerminateInstances" && c.ErrorCode == "" && !c.Refused && !c.Time.Before(start) {
			inv.Terminated = append(inv.Terminated, c.InstanceIDs...)
		}
	}
	if err := observe(ctx, lab, &w); err != nil {
		return nil, err
	}
	inv.Pods, inv.Instances = w.pods, w.instances
	return inv, nil
}

// settledLogs returns what a reconciler environment logged after offset,
// waiting a moment for the REPORT line of each batch it started.
func settledLogs(f *localstack.Function, offset int) string {
	deadline := time.Now().Add(time.Second)
	for {
		logs := f.Logs()
		if len(logs) < offset {
			return logs
		}
		seg := logs[offset:]
		if strings.Count(seg, "START RequestId:") == strings.Count(seg, "REPORT RequestId:") || time.Now().After(deadline) {
			return seg
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// reconcilerLines picks the reconciler's batch summaries and rejected exit
// claims out of log output (slog JSON lines among the emulator's).
func reconcilerLines(logs string) (batches []reaper.BatchSummary, notBelieved []string) {
	for line := range strings.Lines(logs) {
		if !strings.HasPrefix(line, "{") {
			continue
		}
		var l struct {
			Msg      string `json:"msg"`
			Instance string `json:"instance"`
			Reason   string `json:"reason"`
			reaper.BatchSummary
		}
		if json.Unmarshal([]byte(line), &l) != nil {
			continue
		}
		switch l.Msg {
		case "batch":
			batches = append(batches, l.BatchSummary)
		case "exit line not believed":
			notBelieved = append(notBelieved, l.Instance+": "+l.Reason)
		}
	}
	return batches, notBelieved
}

// logsSince returns what the function logged after offset, waiting a
// moment for the emulator's REPORT line, which it writes after answering.
func logsSince(f *localstack.Function, offset int) string {
	deadline := time.Now().Add(time.Second)
	for {
		logs := f.Logs()
		if len(logs) < offset {
			return logs
		}
		if strings.Contains(logs[offset:], "REPORT RequestId:") || time.Now().After(deadline) {
			return logs[offset:]
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// seedExits creates each Pod the exit lines name, running, and the managed
// instance of the log stream, and restamps the lines with the live Pods'
// UIDs (the apiserver assigns its own).
func seedExits(ctx context.Context, lab *replay.Lab, event []byte, w *world, progress func(string, ...any)) ([]byte, error) {
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
		l, err := exitline.Parse([]byte(e.Message))
		if err != nil || l.InstanceID != data.LogStream {
			continue // the function rejects it; nothing to seed
		}
		i := slices.IndexFunc(subjects, func(s *subject) bool { return s.namespace == l.PodNamespace && s.name == l.PodName })
		if i < 0 {
			subjects = append(subjects, &subject{namespace: l.PodNamespace, name: l.PodName})
			i = len(subjects) - 1
		}
		s := subjects[i]
		if !slices.Contains(s.uids, l.PodUID) {
			s.uids = append(s.uids, l.PodUID)
		}
		s.restarts = s.restarts || l.WillRestart
	}
	if len(subjects) == 0 {
		progress("no exit line names a Pod on instance %s: nothing seeded", data.LogStream)
		return event, nil
	}

	if err := clearWorld(ctx, lab, data.LogStream); err != nil {
		return nil, err
	}
	uids := map[string]types.UID{}
	var first *corev1.Pod
	for _, s := range subjects {
		if err := clearPod(ctx, lab, s.namespace, s.name); err != nil {
			return nil, err
		}
		policy := corev1.RestartPolicyNever
		if s.restarts {
			policy = corev1.RestartPolicyOnFailure
		}
		pod, err := lab.RunningPod(ctx, s.namespace, s.name, policy)
		if err != nil {
			return nil, err
		}
		for _, uid := range s.uids {
			uids[uid] = pod.UID
		}
		if first == nil {
			first = pod
		}
		w.pods = append(w.pods, podView{Namespace: s.namespace, Name: s.name, Before: pod.Status.Phase})
		progress("seeded Pod %s/%s, %s (restartPolicy %s), uid %s; the exit lines' podUID %s is restamped to it",
			s.namespace, s.name, pod.Status.Phase, policy, pod.UID, strings.Join(s.uids, ", "))
	}
	lab.AddInstance(data.LogStream, first, true)
	w.instances = append(w.instances, instanceView{ID: data.LogStream, Before: ec2server.Running})
	progress("seeded instance %s, running, tagged managed for Pod %s/%s", data.LogStream, first.Namespace, first.Name)
	return replay.Restamp(data, uids)
}

// seedStateChange creates the sample Pod running on the event's instance,
// moves the instance to the event's state (the world changes, then
// EventBridge tells) and, unless keepTime, moves the event to now.
func seedStateChange(ctx context.Context, lab *replay.Lab, event []byte, keepTime bool, w *world, progress func(string, ...any)) ([]byte, error) {
	var ev events.CloudWatchEvent
	if err := json.Unmarshal(event, &ev); err != nil {
		return nil, err
	}
	m, err := statechange.Parse(ev)
	if err != nil {
		progress("not a valid state change (%v): nothing seeded, sent as it is", err)
		return event, nil
	}
	if err := clearWorld(ctx, lab, m.InstanceID); err != nil {
		return nil, err
	}
	if err := clearPod(ctx, lab, sampleNamespace, samplePod); err != nil {
		return nil, err
	}
	pod, err := lab.RunningPod(ctx, sampleNamespace, samplePod, corev1.RestartPolicyNever)
	if err != nil {
		return nil, err
	}
	w.pods = append(w.pods, podView{Namespace: pod.Namespace, Name: pod.Name, Before: pod.Status.Phase})
	progress("seeded Pod %s/%s, %s, uid %s (the sample Pod of events/README.md)", pod.Namespace, pod.Name, pod.Status.Phase, pod.UID)
	lab.AddInstance(m.InstanceID, pod, true)
	if m.State != string(ec2server.Running) {
		lab.Stack.EC2.SetState(m.InstanceID, ec2server.State(m.State))
	}
	w.instances = append(w.instances, instanceView{ID: m.InstanceID, Before: ec2server.State(m.State)})
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
func seedOrphan(ctx context.Context, lab *replay.Lab, w *world, progress func(string, ...any)) error {
	if err := clearWorld(ctx, lab, sampleInstanceID); err != nil {
		return err
	}
	if err := clearPod(ctx, lab, sampleNamespace, samplePod); err != nil {
		return err
	}
	gone := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: sampleNamespace, Name: samplePod, UID: sampleUID}}
	lab.AddInstance(sampleInstanceID, gone, true)
	w.pods = append(w.pods, podView{Namespace: sampleNamespace, Name: samplePod})
	w.instances = append(w.instances, instanceView{ID: sampleInstanceID, Before: ec2server.Running})
	progress("seeded an orphan for the sweep: instance %s, running since an hour ago, tagged managed for Pod %s/%s, which does not exist",
		sampleInstanceID, sampleNamespace, samplePod)
	return nil
}

// seedQueue seeds the world of a reconciler batch: every instance its work
// items name, tagged managed for the Pod its exit claims name (the first,
// if they name several) or else the sample Pod, and at the furthest state
// they report; every claimed Pod running, and the sample Pod too, unless an
// orphan report is about it, which says it no longer exists. It restamps the
// claims with the live Pods' UIDs and, unless keepTime, moves the items to
// now, as if they had just been sent.
func seedQueue(ctx context.Context, lab *replay.Lab, event []byte, keepTime bool, w *world, progress func(string, ...any)) ([]byte, error) {
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
		switch it.Kind {
		case workqueue.KindExit:
			key := it.Pod.Namespace + "/" + it.Pod.Name
			if !slices.Contains(s.claims, key) {
				s.claims = append(s.claims, key)
			}
			if _, ok := claimed[key]; !ok {
				claimed[key] = *it.Pod
			}
			if !slices.Contains(claimUIDs[key], it.Pod.UID) {
				claimUIDs[key] = append(claimUIDs[key], it.Pod.UID)
			}
			restarts[key] = restarts[key] || it.Exit.WillRestart
		case workqueue.KindState:
			if model.StateRank(it.State) > model.StateRank(s.state) {
				s.state = it.State
			}
		case workqueue.KindOrphan:
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
		if err := clearPod(ctx, lab, ref.Namespace, ref.Name); err != nil {
			return nil, err
		}
		if absent {
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ref.Namespace, Name: ref.Name, UID: types.UID(ref.UID)}}
			seeded[key] = pod
			w.pods = append(w.pods, podView{Namespace: ref.Namespace, Name: ref.Name})
			progress("Pod %s/%s does not exist, as the orphan report says", ref.Namespace, ref.Name)
			return pod, nil
		}
		policy := corev1.RestartPolicyNever
		if restarts[key] {
			policy = corev1.RestartPolicyOnFailure
		}
		pod, err := lab.RunningPod(ctx, ref.Namespace, ref.Name, policy)
		if err != nil {
			return nil, err
		}
		for _, uid := range claimUIDs[key] {
			uids[uid] = pod.UID
		}
		seeded[key] = pod
		w.pods = append(w.pods, podView{Namespace: pod.Namespace, Name: pod.Name, Before: pod.Status.Phase})
		if len(claimUIDs[key]) > 0 {
			progress("seeded Pod %s/%s, %s (restartPolicy %s), uid %s; the claims' pod uid %s is restamped to it",
				pod.Namespace, pod.Name, pod.Status.Phase, policy, pod.UID, strings.Join(claimUIDs[key], ", "))
		} else {
			progress("seeded Pod %s/%s, %s, uid %s (the sample Pod of events/README.md)", pod.Namespace, pod.Name, pod.Status.Phase, pod.UID)
		}
		return pod, nil
	}
	for _, s := range subjects {
		if err := clearWorld(ctx, lab, s.id); err != nil {
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
			if tagged, err = seedPod(model.PodRef{Namespace: sampleNamespace, Name: samplePod, UID: sampleUID}, s.orphan); err != nil {
				return nil, err
			}
		}
		lab.AddInstance(s.id, tagged, true)
		state := ec2server.Running
		if s.state != "" && s.state != string(ec2server.Running) {
			state = ec2server.State(s.state)
			lab.Stack.EC2.SetState(s.id, state)
		}
		w.instances = append(w.instances, instanceView{ID: s.id, Before: state})
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

// clearWorld forgets an instance on the EC2 test server and in the ledger.
func clearWorld(ctx context.Context, lab *replay.Lab, instanceID string) error {
	lab.Stack.EC2.RemoveInstance(instanceID)
	db := dynamodb.NewFromConfig(lab.Stack.AWSConfig(ctx))
	_, err := db.DeleteItem(ctx, &dynamodb.DeleteItemInput{
		TableName: aws.String(lab.Table),
		Key:       map[string]ddbtypes.AttributeValue{ledger.KeyAttribute: &ddbtypes.AttributeValueMemberS{Value: instanceID}},
	})
	return err
}

// clearPod deletes a Pod at once (no kubelet confirms a graceful delete)
// and waits until it is gone.
func clearPod(ctx context.Context, lab *replay.Lab, namespace, name string) error {
	pods := lab.Stack.Kube.CoreV1().Pods(namespace)
	err := pods.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
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

// observe fills in what the seeded Pods and instances are after the call,
// and what the ledger holds of the instances.
func observe(ctx context.Context, lab *replay.Lab, w *world) error {
	policy, err := labPolicy(lab.Env)
	if err != nil {
		return err
	}
	for i := range w.pods {
		v := &w.pods[i]
		p, err := lab.Stack.Kube.CoreV1().Pods(v.Namespace).Get(ctx, v.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			v.Gone = true
			continue
		}
		if err != nil {
			return err
		}
		v.Phase = p.Status.Phase
		for _, cs := range p.Status.ContainerStatuses {
			v.Restarts = cs.RestartCount
			term := cs.State.Terminated
			if term == nil {
				term = cs.LastTerminationState.Terminated
			}
			if term != nil {
				v.ExitCode, v.Reason = &term.ExitCode, term.Reason
			}
			if cs.State.Waiting != nil {
				v.Reason = cs.State.Waiting.Reason
			}
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue {
				v.Disruption = c.Reason
			}
		}
	}
	for i := range w.instances {
		v := &w.instances[i]
		if inst, ok := lab.Stack.EC2.Instance(v.ID); ok {
			v.After = inst.State
		}
		rec, ok, err := lab.Ledger.Get(ctx, v.ID)
		if err != nil {
			return err
		}
		if ok {
			v.Record = &rec
			v.WaitUntil = reaper.Decide(rec, time.Now(), policy).WaitUntil
		}
	}
	return nil
}

// labPolicy is the decision policy the lab's functions run with.
func labPolicy(env []string) (reaper.Policy, error) {
	vars := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		vars[k] = v // the last one wins, as in a process's environment
	}
	cfg, err := config.Read(func(k string) string { return vars[k] }, config.Needs{})
	if err != nil {
		return reaper.Policy{}, err
	}
	return reaper.Policy{ExitWait: cfg.ExitWait, TerminateStopped: cfg.TerminateStopped}, nil
}

// print writes the response, indented, then what became of the Pods and
// instances, what the reconciler did and, with verbose or on a function
// error, the logs.
func (inv *invocation) print(w io.Writer, verbose bool) {
	var pretty bytes.Buffer
	if json.Indent(&pretty, inv.Response, "", "  ") != nil {
		pretty.Reset()
		pretty.Write(inv.Response)
	}
	fmt.Fprintln(w, strings.TrimRight(pretty.String(), "\n"))

	status := "ok"
	if inv.Err != nil {
		status = "error " + inv.Err.Type
	}
	fmt.Fprintf(w, "\nwhat happened (%s in %s; work queue drained %s after):\n",
		status, inv.Duration.Round(time.Millisecond), inv.Drain.Round(time.Millisecond))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, p := range inv.Pods {
		fmt.Fprintf(tw, "  pod %s/%s\t%s → %s\n", p.Namespace, p.Name, phaseOr(p.Before, "absent"), p.after())
	}
	for _, i := range inv.Instances {
		after := string(i.After)
		if after == "" {
			after = "gone"
		}
		fmt.Fprintf(tw, "  instance %s\t%s → %s\n", i.ID, i.Before, after)
	}
	for _, i := range inv.Instances {
		fmt.Fprintf(tw, "  ledger %s\t%s\n", i.ID, recordSummary(i.Record))
	}
	tw.Flush()
	for _, i := range inv.Instances {
		if !i.WaitUntil.IsZero() {
			fmt.Fprintf(w, "  %s: exit-wait window open until %s: an exit line before then still decides the Pod,\n"+
				"  after it the sweep finalizes the Pod as lost\n", i.ID, i.WaitUntil.UTC().Format(time.RFC3339))
		}
	}
	if len(inv.Pods)+len(inv.Instances) == 0 {
		fmt.Fprintln(w, "  nothing was seeded, so nothing to show")
	}

	fmt.Fprintln(w, "\nwhat the reconciler did:")
	for _, b := range inv.Batches {
		fmt.Fprintf(w, "  batch: %s\n", batchSummary(b))
	}
	if len(inv.Batches) == 0 {
		fmt.Fprintln(w, "  nothing: no work was queued")
	}
	for _, n := range inv.NotBelieved {
		fmt.Fprintf(w, "  exit claim not believed: %s\n", n)
	}
	if len(inv.Terminated) > 0 {
		fmt.Fprintf(w, "  TerminateInstances: %s\n", strings.Join(inv.Terminated, ", "))
	}

	if verbose || inv.Err != nil {
		fmt.Fprintf(w, "\nfunction log:\n%s", indent(inv.Logs))
	}
	if verbose && inv.ReconcilerLogs != "" {
		fmt.Fprintf(w, "\nreconciler log:\n%s", indent(inv.ReconcilerLogs))
	}
}

// batchSummary lists a batch's counts that are not zero as the
// reconciler's "batch" line names them, in its order.
func batchSummary(b reaper.BatchSummary) string {
	var parts []string
	for _, c := range []struct {
		key string
		n   int
	}{
		{"messages", b.Messages}, {"instances", b.Instances}, {"invalid", b.Invalid}, {"lookups", b.Lookups},
		{"skipped", b.Skipped}, {"rejected", b.Rejected}, {"reconciled", b.Reconciled}, {"patched", b.Patched},
		{"terminated", b.Terminated}, {"orphans", b.Orphans}, {"deferred", b.Deferred}, {"failed", b.Failed},
	} {
		if c.n != 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", c.key, c.n))
		}
	}
	if len(parts) == 0 {
		return "empty"
	}
	return strings.Join(parts, " ")
}

// recordSummary says what a ledger record holds, nil saying there is none.
func recordSummary(rec *ledger.Record) string {
	if rec == nil {
		return "no record"
	}
	var parts []string
	if e := rec.Exit; e != nil {
		exit := fmt.Sprintf("exit code %d (restart %d)", e.ExitCode, e.RestartCount)
		if rec.Unverified {
			exit += ", not yet checked against the tags"
		}
		parts = append(parts, exit)
	}
	if g := rec.Gone; g != nil {
		parts = append(parts, fmt.Sprintf("gone %s at %s", g.State, g.At.UTC().Format(time.RFC3339)))
	}
	if rec.PodSynced != "" {
		parts = append(parts, "Pod status written")
	}
	if !rec.Terminated.IsZero() {
		parts = append(parts, "terminate done")
	}
	if rec.Pending != "" {
		parts = append(parts, "work pending")
	} else {
		parts = append(parts, "settled")
	}
	return strings.Join(parts, ", ")
}

func (p podView) after() string {
	if p.Gone {
		return "absent"
	}
	var b strings.Builder
	b.WriteString(string(p.Phase))
	if p.ExitCode != nil {
		fmt.Fprintf(&b, ", exit code %d", *p.ExitCode)
	}
	if p.Reason != "" {
		fmt.Fprintf(&b, ", reason %s", p.Reason)
	}
	if p.Restarts > 0 {
		fmt.Fprintf(&b, ", restarts %d", p.Restarts)
	}
	if p.Disruption != "" {
		fmt.Fprintf(&b, ", disruption %s", p.Disruption)
	}
	return b.String()
}

func phaseOr(p corev1.PodPhase, none string) string {
	if p == "" {
		return none
	}
	return string(p)
}

func indent(s string) string {
	var b strings.Builder
	for line := range strings.Lines(s) {
		b.WriteString("  " + line)
	}
	if s != "" && !strings.HasSuffix(s, "\n") {
		b.WriteString("\n")
	}
	return b.String()
}
