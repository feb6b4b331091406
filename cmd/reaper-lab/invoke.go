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

	corev1 "k8s.io/api/core/v1"

	"github.com/reaper-k8s/reaper/internal/cli"
	"github.com/reaper-k8s/reaper/internal/labstack"
	"github.com/reaper-k8s/reaper/internal/replay"
	"github.com/reaper-k8s/reaper/pkg/ledger"
	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/reaper"
)

func init() {
	cli.Register("invoke", cli.Command{
		Summary: "run one function on one event against a local stack, print its response and what it and the reconciler did",
		Run:     runInvoke,
	})
}

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
	keepTime := fs.Bool("keep-time", false, "send a state change, or a work item, with its own time (default: now); a state change delivered late still opens the exit-wait window when Reaper first records it")
	verbose := fs.Bool("v", false, "also print the log output of the function and the reconciler")
	var env envFlag
	fs.Var(&env, "env", "`K=V` added to the function's environment, e.g. REAPER_DRY_RUN=true (repeatable)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: reaper-lab invoke [-fn <function>] -event <file> [-keep-stack] [-keep-time] [-v] [-env K=V ...]\n\n"+
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
	beat := heartbeat(os.Stderr, "building the functions")
	bins, err := replay.Build(ctx, root, filepath.Join(dir, "build"), names...)
	beat()
	if err != nil {
		return err
	}
	progress("starting the local stack (etcd, kube-apiserver, dynalite, EC2 and SQS test servers)")
	stack, err := labstack.Start(ctx, labstack.Options{})
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

	inv, err := lab.InvokeEvent(ctx, name, event, replay.SeedOptions{KeepTime: *keepTime, Progress: progress})
	if err != nil {
		return err
	}
	printInvocation(os.Stdout, inv, *verbose)

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

// pickFunction checks fn (may be empty) against the event's shape.
func pickFunction(fn string, event []byte, path string) (string, error) {
	if fn != "" && !slices.Contains(replay.Functions, fn) {
		return "", fmt.Errorf("unknown function %q (want one of %s)", fn, strings.Join(replay.Functions, ", "))
	}
	takes, err := replay.EventFunction(event)
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

// printInvocation writes the response, indented, then what became of the
// Pods and instances, what the reconciler did and, with verbose or on a
// function error, the logs.
func printInvocation(w io.Writer, inv *replay.Invocation, verbose bool) {
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
		fmt.Fprintf(tw, "  pod %s/%s\t%s → %s\n", p.Namespace, p.Name, phaseOr(p.Before, "absent"), podAfter(p))
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
		fmt.Fprintf(w, "  exit claim not believed: %s: %s\n", n.Instance, n.Reason)
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
	for _, e := range rec.Runs() {
		exit := fmt.Sprintf("exit code %d (restart %d)", e.ExitCode, e.RestartCount)
		if len(rec.Runs()) > 1 {
			exit = e.Container + " " + exit
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

// podAfter says what a seeded Pod is after the call.
func podAfter(p replay.PodView) string {
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
