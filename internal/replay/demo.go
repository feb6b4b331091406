package replay

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"path/filepath"
	"slices"
	"sort"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reaper-k8s/reaper/internal/ec2server"
	"github.com/reaper-k8s/reaper/pkg/exitline"
)

// Row is one Pod of a demo run as it ended.
type Row struct {
	Pod      string
	ExitCode string
	Phase    corev1.PodPhase
	Reason   string
	Instance string
	State    ec2server.State
}

// Result is a demo run: the rows, the invocation latencies, the EC2
// requests the run made, by action, and, when the invocations did not each
// wait for the work they queued, how long after the last one the queue had
// drained.
type Result struct {
	Name        string
	Rows        []Row
	Latencies   []time.Duration
	EC2Requests map[string]int
	DrainedIn   time.Duration
}

// Finalized counts Pods in a terminal phase.
func (r Result) Finalized() int {
	return count(r.Rows, func(row Row) bool { return row.Phase == corev1.PodSucceeded || row.Phase == corev1.PodFailed })
}

// Terminated counts instances shutting down or terminated.
func (r Result) Terminated() int {
	return count(r.Rows, func(row Row) bool { return row.State == ec2server.Terminated || row.State == ec2server.ShuttingDown })
}

// Leaked counts instances still up although their Pod has ended.
func (r Result) Leaked() int {
	return count(r.Rows, func(row Row) bool {
		return (row.Phase == corev1.PodSucceeded || row.Phase == corev1.PodFailed) &&
			row.State != ec2server.Terminated && row.State != ec2server.ShuttingDown
	})
}

// Percentile returns the p-th percentile (0..100) of the latencies.
func (r Result) Percentile(p float64) time.Duration {
	if len(r.Latencies) == 0 {
		return 0
	}
	l := slices.Clone(r.Latencies)
	slices.Sort(l)
	return l[min(len(l)-1, int(float64(len(l))*p/100))]
}

func count(rows []Row, f func(Row) bool) int {
	n := 0
	for _, r := range rows {
		if f(r) {
			n++
		}
	}
	return n
}

// Replicas30 is the observed case: 30 replicas of a GPU sample whose
// command ends together. Each exit line is replayed through exitrecorder,
// one after the other without waiting for the reconciler, as CloudWatch
// Logs delivers them; the reconciler takes them in batches. progress (may
// be nil) is told of each.
func (l *Lab) Replicas30(ctx context.Context, recordings string, progress io.Writer) (Result, error) {
	sc, err := l.Prepare(ctx, filepath.Join(recordings, "replicas30"), corev1.RestartPolicyNever, nil)
	if err != nil {
		return Result{}, err
	}
	res := Result{Name: "replicas30: 30 GPU sample Pods whose command ends"}
	before := len(l.Stack.EC2.Calls())
	payloads := sc.Payloads("exitrecorder")
	bar := NewProgress(progress, "replicas30", len(payloads))
	for i, p := range payloads {
		bar.Step(i, "exit lines replayed")
		start := time.Now()
		if err := l.InvokeOnly(ctx, "exitrecorder", p, nil); err != nil {
			return res, err
		}
		res.Latencies = append(res.Latencies, time.Since(start))
	}
	bar.Step(len(payloads), "exit lines replayed")
	last := time.Now()
	if err := l.DrainSent(ctx, last); err != nil {
		return res, err
	}
	res.DrainedIn = time.Since(last)
	res.EC2Requests = l.Stack.EC2.TallySince(before).Requests
	res.Rows, err = l.rows(ctx, sc)
	return res, err
}

// windowEnd is when the exit-wait window of the scenario's instances
// closes, from the gone states their records hold.
func (l *Lab) windowEnd(ctx context.Context, sc *Scenario, exitWait time.Duration) (time.Time, error) {
	recs := l.Ledger.GetMany(ctx, slices.Collect(maps.Values(sc.Instances)))
	if len(recs.Left) > 0 {
		id := slices.Min(slices.Collect(maps.Keys(recs.Left)))
		return time.Time{}, fmt.Errorf("%d ledger records not read, %s: %w", len(recs.Left), id, recs.Left[id])
	}
	var end time.Time
	for _, rec := range recs.Found {
		if rec.Gone != nil && rec.GoneSince().Add(exitWait).After(end) {
			end = rec.GoneSince().Add(exitWait)
		}
	}
	return end, nil
}

func (l *Lab) rows(ctx context.Context, sc *Scenario) ([]Row, error) {
	var rows []Row
	for name, pod := range sc.Pods {
		p, err := l.ObservePod(ctx, pod.Namespace, name)
		if err != nil {
			return nil, err
		}
		if p.Gone {
			return nil, fmt.Errorf("pod %s/%s is gone", pod.Namespace, name)
		}
		row := Row{Pod: pod.Namespace + "/" + name, ExitCode: "-", Phase: p.Phase, Reason: p.Reason, Instance: sc.Instances[name]}
		if p.ExitCode != nil {
			row.ExitCode = fmt.Sprint(*p.ExitCode)
		}
		if i, ok := l.Stack.EC2.Instance(row.Instance); ok {
			row.State = i.State
		}
		rows = append(rows, row)
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].Pod < rows[j].Pod })
	return rows, nil
}

// Print writes the table and the summary.
func (r Result) Print(w io.Writer) {
	fmt.Fprintf(w, "\n== %s\n\n", r.Name)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "POD\tEXIT CODE\tPHASE\tREASON\tINSTANCE\tINSTANCE STATE")
	for _, row := range r.Rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", row.Pod, row.ExitCode, row.Phase, row.Reason, row.Instance, row.State)
	}
	tw.Flush()
	fmt.Fprintf(w, "\nended %d/%d  terminated %d/%d  leaked %d  handler latency p50 %s p99 %s (%d invocations)\n",
		r.Finalized(), len(r.Rows), r.Terminated(), len(r.Rows), r.Leaked(),
		r.Percentile(50).Round(100*time.Microsecond), r.Percentile(99).Round(100*time.Microsecond), len(r.Latencies))
	if r.DrainedIn > 0 {
		fmt.Fprintf(w, "work queue drained %s after the last invocation\n", r.DrainedIn.Round(time.Millisecond))
	}
	actions := slices.Sorted(maps.Keys(r.EC2Requests))
	fmt.Fprintf(w, "EC2 requests:")
	if len(actions) == 0 {
		fmt.Fprintf(w, " none")
	}
	for _, a := range actions {
		fmt.Fprintf(w, " %s %d", a, r.EC2Requests[a])
	}
	fmt.Fprintln(w)
}

// Spot10 is the second demo: spot reclaims 10 instances; for 5 of them the
// exit line arrives after the terminated event, inside the exit-wait window,
// and wins; the other 5 Pods are finalized as lost by the sweep once the
// exit-wait window the state changes opened (exitWait after the instances
// went) has passed. progress (may be nil) is told of each step, and of the
// wait for the window.
func (l *Lab) Spot10(ctx context.Context, recordings string, exitWait time.Duration, progress io.Writer) (Result, error) {
	sc, err := l.Prepare(ctx, filepath.Join(recordings, "spot10"), corev1.RestartPolicyNever, nil)
	if err != nil {
		return Result{}, err
	}
	res := Result{Name: "spot10: spot reclaims 10 instances, 5 exit lines arrive late"}
	before := len(l.Stack.EC2.Calls())
	var windowEnd time.Time
	bar := NewProgress(progress, "spot10", len(sc.Steps))
	for i, st := range sc.Steps {
		if st.Function == "sweeper" {
			if windowEnd.IsZero() {
				if windowEnd, err = l.windowEnd(ctx, sc, exitWait); err != nil {
					return res, err
				}
			}
			bar.Step(i, fmt.Sprintf("waiting %s for the exit-wait window to close", time.Until(windowEnd).Round(time.Second)))
			time.Sleep(time.Until(windowEnd) + 100*time.Millisecond)
		}
		bar.Step(i, st.Function)
		start := time.Now()
		if err := l.Play(ctx, st, nil); err != nil {
			return res, fmt.Errorf("%s: %w", st.Function, err)
		}
		res.Latencies = append(res.Latencies, time.Since(start))
	}
	bar.Step(len(sc.Steps), "events replayed")
	res.EC2Requests = l.Stack.EC2.TallySince(before).Requests
	res.Rows, err = l.rows(ctx, sc)
	return res, err
}

// SeedJob is the third demo: the node-installer Job's Pod, an init
// container (downloader) and then the installer (provisioner), whose run a
// container runtime restart interrupts. The downloader's end is shown and
// ends nothing: the demo fails if its line ends the Pod or its instance.
// The installer's end ends the Pod Succeeded, and its instance once. A row
// a container.
func (l *Lab) SeedJob(ctx context.Context, progress io.Writer) (Result, error) {
	const (
		namespace, name = "installs", "node-installer-7xk2q"
		id              = "i-05eed000000000001"
	)
	res := Result{Name: "seed job: an init container, then the installer across a runtime restart"}
	pod, err := l.ShapedPod(ctx, namespace, name, PodShape{Init: []string{"downloader"}, Containers: []string{"provisioner"}, Policy: corev1.RestartPolicyNever}, true)
	if err != nil {
		return res, err
	}
	l.AddInstance(id, pod, true)
	before := len(l.Stack.EC2.Calls())
	lines := []exitline.Line{
		{Container: "downloader", OthersRunning: true},
		{Container: "provisioner", RuntimeRestarted: true},
	}
	bar := NewProgress(progress, "seed job", len(lines))
	for i, line := range lines {
		bar.Step(i, line.Container+"'s exit")
		line.ContainerID = BareContainerID(pod) + line.Container
		ev, err := ExitLogsEvent(id, pod, line, i+1)
		if err != nil {
			return res, err
		}
		b, err := json.Marshal(ev)
		if err != nil {
			return res, err
		}
		start := time.Now()
		if err := l.Invoke(ctx, "exitrecorder", b, nil); err != nil {
			return res, err
		}
		res.Latencies = append(res.Latencies, time.Since(start))
		if i == 0 {
			p, err := l.ObservePod(ctx, namespace, name)
			if err != nil {
				return res, err
			}
			inst, _ := l.Stack.EC2.Instance(id)
			if p.Phase != corev1.PodRunning || inst.State != ec2server.Running {
				return res, fmt.Errorf("after the init container's exit the Pod is %s and its instance %s: the installer still runs", p.Phase, inst.State)
			}
		}
	}
	bar.Step(len(lines), "exit lines replayed")
	res.EC2Requests = l.Stack.EC2.TallySince(before).Requests
	p, err := l.Stack.Kube.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return res, err
	}
	inst, _ := l.Stack.EC2.Instance(id)
	for _, cs := range append(slices.Clone(p.Status.InitContainerStatuses), p.Status.ContainerStatuses...) {
		row := Row{Pod: namespace + "/" + name + " " + cs.Name, ExitCode: "-", Phase: p.Status.Phase, Instance: id, State: inst.State}
		if t := cs.State.Terminated; t != nil {
			row.ExitCode, row.Reason = fmt.Sprint(t.ExitCode), t.Reason
		}
		res.Rows = append(res.Rows, row)
	}
	return res, nil
}
