package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
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
	"github.com/reaper-k8s/reaper/pkg/exitline"
	"github.com/reaper-k8s/reaper/pkg/ledger"
	"github.com/reaper-k8s/reaper/pkg/statechange"
)

func init() {
	register("invoke", subcommand{
		summary: "run one function on one event against a local stack, print its response and what it did",
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
	fn := fs.String("fn", "", "the function: exitrecorder, statechange or sweeper (default: the one that takes the event)")
	eventPath := fs.String("event", "", "the event file, e.g. events/exitrecorder/oom.json")
	keepStack := fs.Bool("keep-stack", false, "keep the stack and the function running after the call, until interrupted")
	keepTime := fs.Bool("keep-time", false, "send a state-change event with its own time (default: now, so the exit-wait window opens now)")
	verbose := fs.Bool("v", false, "also print the function's log output")
	var env envFlag
	fs.Var(&env, "env", "`K=V` added to the function's environment, e.g. REAPER_DRY_RUN=true (repeatable)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: reaper invoke [-fn <function>] -event <file> [-keep-stack] [-keep-time] [-v] [-env K=V ...]\n\n"+
			"Builds the function for this machine, starts a local stack (etcd, kube-apiserver, dynalite,\n"+
			"EC2 test server), seeds the Pod and instance the event talks about, invokes the function\n"+
			"once under the Lambda runtime interface emulator and prints its response and what it did.")
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

	progress("building functions/%s for %s/%s", name, runtime.GOOS, runtime.GOARCH)
	bins, err := replay.Build(ctx, root, filepath.Join(dir, "build"), name)
	if err != nil {
		return err
	}
	progress("starting the local stack (etcd, kube-apiserver, dynalite, EC2 test server)")
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

	inv, err := invokeEvent(ctx, lab, name, event, invokeOptions{KeepTime: *keepTime, Progress: progress})
	if err != nil {
		return err
	}
	inv.print(os.Stdout, *verbose)

	if *keepStack {
		progress("the stack keeps running; reach it from another shell with:")
		for _, kv := range lab.Env {
			if k, _, _ := strings.Cut(kv, "="); k == "KUBECONFIG" || k == "REAPER_TABLE" || strings.HasPrefix(k, "AWS_") {
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
	// KeepTime sends a state change with its recorded time.
	KeepTime bool
	// Progress reports what is seeded; nil says nothing.
	Progress func(format string, a ...any)
}

// invocation is one call and what it changed.
type invocation struct {
	Function string
	// Payload is what was sent: the event, restamped or moved in time.
	Payload  []byte
	Response []byte
	// Err is the function's error, if it returned one.
	Err      *localstack.FunctionError
	Duration time.Duration
	// Logs is what the function and the emulator wrote during the call.
	Logs      string
	Pods      []podView
	Instances []instanceView
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
}

// world is what seeding created, to look at again after the call.
type world struct {
	pods      []podView
	instances []instanceView
}

// invokeEvent seeds the Pods and instance the event talks about on the
// lab's stack, invokes the function once and looks at them again. It
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
	default:
		opts.Progress("the event is none Reaper knows: nothing seeded, sent as it is")
	}
	if err != nil {
		return nil, fmt.Errorf("seed: %w", err)
	}

	inv := &invocation{Function: fn, Payload: payload}
	logStart := len(f.Logs())
	start := time.Now()
	inv.Response, inv.Err, err = f.Invoke(ctx, payload)
	inv.Duration = time.Since(start)
	if err != nil {
		return nil, err
	}
	inv.Logs = logsSince(f, logStart)
	if err := observe(ctx, lab, &w); err != nil {
		return nil, err
	}
	inv.Pods, inv.Instances = w.pods, w.instances
	return inv, nil
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

// observe fills in what the seeded Pods and instances are after the call.
func observe(ctx context.Context, lab *replay.Lab, w *world) error {
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
	}
	return nil
}

// print writes the response, indented, then what became of the Pods and
// instances and, with verbose or on a function error, the function's logs.
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
	fmt.Fprintf(w, "\nwhat happened (%s in %s):\n", status, inv.Duration.Round(time.Millisecond))
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
	tw.Flush()
	var resp struct {
		WaitUntil string `json:"waitUntil"`
	}
	if json.Unmarshal(inv.Response, &resp) == nil && resp.WaitUntil != "" {
		fmt.Fprintf(w, "  exit-wait window open until %s: an exit line before then still decides the Pod,\n"+
			"  after it the sweep finalizes the Pod as lost\n", resp.WaitUntil)
	}
	if len(inv.Pods)+len(inv.Instances) == 0 {
		fmt.Fprintln(w, "  nothing was seeded, so nothing to show")
	}
	if verbose || inv.Err != nil {
		fmt.Fprintf(w, "\nfunction log:\n%s", indent(inv.Logs))
	}
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
