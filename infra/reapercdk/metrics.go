package reapercdk

import (
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatch"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatchactions"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssqs"
	"github.com/aws/aws-cdk-go/awscdk/v2/interfaces/interfacesawscloudwatch"
	"github.com/aws/jsii-runtime-go"

	"github.com/reaper-k8s/reaper/pkg/metrics"
)

// The dashboard and the alarms on the metrics the functions record in
// Embedded Metric Format. Their names, units and dimensions are the
// contract in pkg/metrics (names.go), which pkg/reaper records with.

// graphPeriod is the period of every dashboard graph.
const graphPeriod = 5 * time.Minute

// DefaultDashboardName is the dashboard of a cluster's deployment,
// "Reaper-<cluster>" with characters CloudWatch does not allow in a
// dashboard name (other than letters, digits, - and _) replaced by "-".
func DefaultDashboardName(cluster string) string {
	name := metrics.DefaultNamespace + "-" + strings.Map(func(r rune) rune {
		if r < utf8.RuneSelf && (unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_') {
			return r
		}
		return '-'
	}, cluster)
	return name[:min(len(name), 255)]
}

// metric is a metric of the contract recorded by one function.
func (r *Reaper) metric(name, function, statistic string) awscloudwatch.Metric {
	return awscloudwatch.NewMetric(&awscloudwatch.MetricProps{
		Namespace:     jsii.String(r.Props.MetricsNamespace),
		MetricName:    jsii.String(name),
		DimensionsMap: &map[string]*string{metrics.FunctionDim: jsii.String(function)},
		Statistic:     jsii.String(statistic),
		Period:        seconds(alarmPeriod),
		Label:         jsii.String(function),
	})
}

// insightsSum is the sum of a count of the contract over every function
// that records it and, if the count has one, every value of its further
// dimension: a Metrics Insights query, which needs no list of either (a
// metric math alarm takes ten metrics at most, and SEARCH is for graphs
// only).
func (r *Reaper) insightsSum(d metrics.Definition) awscloudwatch.IMetric {
	keys := metrics.FunctionDim
	if d.Dim != "" {
		keys += ", " + d.Dim
	}
	return awscloudwatch.NewMathExpression(&awscloudwatch.MathExpressionProps{
		Expression: jsii.String(fmt.Sprintf(`SELECT SUM(%s) FROM SCHEMA("%s", %s)`, d.Name, r.Props.MetricsNamespace, keys)),
		Label:      jsii.String(d.Name),
		Period:     seconds(alarmPeriod),
	})
}

// definition is the contract's definition of a metric.
func definition(name string) metrics.Definition {
	for _, d := range metrics.Definitions {
		if d.Name == name {
			return d
		}
	}
	panic("reapercdk: no metric " + name + " in metrics.Definitions")
}

// metricAlarms watch what the functions' own errors cannot show: lines
// that were not believed, instances that bill on after their Pod ended for
// a fault (terminateLatencyAlarm), instances the events never reported,
// and the safety checks that kept Reaper from acting: orphans held back by
// the cap, instances of another cluster identity, terminations EC2
// refused.
func (r *Reaper) metricAlarms() {
	// Any reason, from any function.
	r.alarm("LinesRejected", "Reaper did not act on exit lines or records (any reason): see the dashboard's reasons and the functions' \"rejected\" and \"not believed\" log lines",
		r.insightsSum(definition(metrics.LinesRejected)), 0)

	r.terminateLatencyAlarm()

	r.alarm("OrphansFound", "Reaper's sweep found managed instances without a live Pod that no event reported: a leak the event path missed",
		r.metric(metrics.OrphansFound, metrics.FunctionSweeper, "Sum"), 0)

	// Any is worth a page, from whichever function held them back: the
	// sweeper hands at most the cap to the reconciler, and a reconciler
	// batch that gathers more orphans than the cap (several sweeps' worth,
	// or a wrong cluster's whole fleet) holds the rest back too.
	r.alarm("OrphansHeldBack", "Reaper found more orphans than OrphanCap (REAPER_ORPHAN_CAP) of the owned instances and left the rest running: "+
		"check that Reaper reaches the right cluster (a wrong Kubernetes endpoint makes the whole fleet look orphaned) before raising the cap; see the sweeper's and the reconciler's logs",
		r.insightsSum(definition(metrics.OrphansHeldBack)), 0)
	// The sweeper and the reconciler both check the identity: any
	// function's count.
	r.alarm("ClusterIdentityMismatch", "Reaper found managed instances whose cluster identity tag differs from the cluster it reaches (or that carry none) "+
		"and treats none of them as orphans: check the Kubernetes endpoint Reaper reaches and the provider's tags; see the sweeper's and the reconciler's logs",
		r.insightsSum(definition(metrics.ClusterIdentityMismatch)), 0)
	// Any EC2 error code: they are not known in advance, and every one
	// leaves an instance Reaper owns billing on.
	r.alarm("TerminationsRefused", "EC2 refused to terminate instances Reaper owns (any reason: OperationNotPermitted for termination protection, "+
		"UnauthorizedOperation for a tag the IAM conditions do not match, ...): they bill on, and Reaper asks again an hour later; "+
		"see the dashboard's reasons and the reconciler's log",
		r.insightsSum(definition(metrics.TerminationsRefused)), 0)
}

// PacedLookback is how long after the reconciler last paced (deferred
// work, or waited for EC2 tokens) its terminate latency is taken for load
// (see terminateLatencyAlarm): the longest a paced instance can still wait
// after the deferral that names it, SQS's longest delay
// (workqueue.MaxDelay, 15 minutes; a longer wait is deferred again, which
// counts anew), plus the batching window, a reconciler's run (its
// timeout) and one alarm period, in whole periods.
func (p Props) PacedLookback() time.Duration {
	const maxDelay = 15 * time.Minute
	d := maxDelay + p.ReconcilerBatchingWindow + ReconcilerTimeout + alarmPeriod
	return (d + alarmPeriod - 1).Truncate(alarmPeriod)
}

// terminateLatencyAlarm alarms when instances bill on after their Pod
// ended for a fault, not for a burst.
//
// FinishToTerminated grows with a burst by design: the reconcilers share
// EC2's TerminateInstances bucket (EC2Share of its 1,000 instances,
// refilled at 20 a second: 500, then 10 a second at the default share),
// so the last of N exits waits about (N - 500) / 10 seconds, and a p99
// over TerminateLatencyAlarm (2 minutes) follows from any burst of a
// couple of thousand exits. A threshold scaled by the backlog does not
// help: in the period a burst's last instances end, the queue is short
// while their latency is the whole burst's.
//
// What pacing leaves behind is its own record: work put back for want of
// tokens or time (WorkItemsDeferred), or a wait for tokens within a batch
// (EC2PacingWait), by the reconciler. A paced instance's last deferral
// comes at most SQS's longest delay before it returns, so every instance
// whose latency pacing explains ends within PacedLookback of a period with
// one. The alarm that notifies is a composite: the p99 over the threshold
// (TerminateLatencyP99) while the reconciler has not paced for
// PacedLookback (ReconcilerPaced OK). The two it combines notify nobody.
// A fault during a burst (a slow apiserver, a throttled reconciler, a
// refused terminate) still fires its own alarms, and this one once the
// burst has drained and the fault persists.
func (r *Reaper) terminateLatencyAlarm() {
	p := r.Props
	// The worst terminating function's p99: percentiles of different
	// functions do not add up. Only the reconciler terminates today.
	worst := map[string]awscloudwatch.IMetric{}
	for _, fn := range functions {
		if fn.terminates {
			worst[fn.name] = r.metric(metrics.FinishToTerminated, fn.name, "p99")
		}
	}
	latency := r.quietAlarm("TerminateLatencyP99", fmt.Sprintf("Reaper took over %s (p99) from a container's exit to terminating its instance; "+
		"part of TerminateLatency, which alarms when the reconciler has not paced: notifies nobody", p.TerminateLatencyAlarm),
		awscloudwatch.NewMathExpression(&awscloudwatch.MathExpressionProps{
			Expression:   jsii.String("MAX(METRICS())"),
			UsingMetrics: &worst,
			Label:        jsii.String(metrics.FinishToTerminated + " p99, worst function"),
			Period:       seconds(alarmPeriod),
		}), float64(p.TerminateLatencyAlarm.Milliseconds()), 1)
	lookback := p.PacedLookback()
	paced := r.quietAlarm("ReconcilerPaced", fmt.Sprintf("The reconciler deferred work or waited for EC2 tokens within the last %s: "+
		"a burst is paced below EC2's limits, and TerminateLatency does not alarm; notifies nobody", lookback),
		awscloudwatch.NewMathExpression(&awscloudwatch.MathExpressionProps{
			Expression: jsii.String("FILL(deferred, 0) + FILL(waited, 0)"),
			UsingMetrics: &map[string]awscloudwatch.IMetric{
				"deferred": r.metric(metrics.WorkItemsDeferred, metrics.FunctionReconciler, "Sum"),
				"waited":   r.metric(metrics.EC2PacingWait, metrics.FunctionReconciler, "Maximum"),
			},
			Label:  jsii.String("work deferred + longest EC2 pacing wait (ms)"),
			Period: seconds(alarmPeriod),
		}), 0, int(lookback/alarmPeriod))
	r.TerminateLatency = awscloudwatch.NewCompositeAlarm(r.Construct, jsii.String("TerminateLatency"), &awscloudwatch.CompositeAlarmProps{
		AlarmDescription: jsii.String(fmt.Sprintf("Reaper took over %s (p99) from a container's exit to terminating its instance, "+
			"and the reconciler has not paced for EC2's limits within %s: instances bill on after their Pod ended for a fault, not for a burst; "+
			"see the dashboard's QueueAge, EC2PacingWait, WorkItemsDeferred and the reconciler's log", p.TerminateLatencyAlarm, lookback)),
		AlarmRule: awscloudwatch.AlarmRule_AllOf(
			awscloudwatch.AlarmRule_FromAlarm(latency, awscloudwatch.AlarmState_ALARM),
			awscloudwatch.AlarmRule_Not(awscloudwatch.AlarmRule_FromAlarm(paced, awscloudwatch.AlarmState_ALARM)),
		),
	})
	if r.AlarmTopic != nil {
		action := awscloudwatchactions.NewSnsAction(r.AlarmTopic)
		r.TerminateLatency.AddAlarmAction(action)
		r.TerminateLatency.AddOkAction(action)
	}
}

// quietAlarm fires when metric is above threshold in any of the last
// periods, and notifies nobody: it is a part of a composite alarm.
func (r *Reaper) quietAlarm(id, description string, metric awscloudwatch.IMetric, threshold float64, periods int) awscloudwatch.Alarm {
	a := awscloudwatch.NewAlarm(r.Construct, jsii.String(id), &awscloudwatch.AlarmProps{
		Metric:             metric,
		AlarmDescription:   jsii.String(description),
		Threshold:          jsii.Number(threshold),
		ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_THRESHOLD,
		EvaluationPeriods:  jsii.Number(periods),
		DatapointsToAlarm:  jsii.Number(1),
		TreatMissingData:   awscloudwatch.TreatMissingData_NOT_BREACHING,
	})
	r.Alarms = append(r.Alarms, a)
	return a
}

// dashboard lays out the alarms, then rows of three graphs: the counts of
// the contract, its latencies, the functions' Lambda metrics and the
// queues.
func (r *Reaper) dashboard() {
	p := r.Props
	alarms := []interfacesawscloudwatch.IAlarmRef{r.TerminateLatency}
	for _, a := range r.Alarms {
		alarms = append(alarms, a)
	}
	rows := [][]awscloudwatch.IWidget{{awscloudwatch.NewAlarmStatusWidget(&awscloudwatch.AlarmStatusWidgetProps{
		Title: jsii.String("Alarms"), Alarms: &alarms, Width: jsii.Number(24),
	})}}
	var counts, latencies []awscloudwatch.IWidget
	for _, d := range metrics.Definitions {
		if d.Unit == metrics.Count {
			counts = append(counts, r.contractGraph(d))
		} else {
			latencies = append(latencies, r.contractGraph(d))
		}
	}
	for _, group := range [][]awscloudwatch.IWidget{
		counts,
		latencies,
		r.lambdaGraphs(),
		{r.workQueueGraph(), queueGraph("Failure queue: events that failed every retry", r.FailureQueue)},
	} {
		for len(group) > 0 {
			n := min(3, len(group))
			rows = append(rows, group[:n])
			group = group[n:]
		}
	}

	var name *string
	if !unresolved(p.ClusterName) {
		name = jsii.String(DefaultDashboardName(p.ClusterName))
	}
	r.Dashboard = awscloudwatch.NewDashboard(r.Construct, jsii.String("Dashboard"), &awscloudwatch.DashboardProps{
		DashboardName:   name,
		DefaultInterval: awscdk.Duration_Hours(jsii.Number(3)),
		Widgets:         widgetRows(rows),
	})
}

// contractGraph graphs one metric of the contract for every function that
// records it (and every value of its dimension): counts as sums, latencies
// as p50 and p99. Search expressions find the series, so the graph needs
// no list of who records what.
func (r *Reaper) contractGraph(d metrics.Definition) awscloudwatch.IWidget {
	keys := []string{metrics.FunctionDim}
	label := "${PROP('Dim." + metrics.FunctionDim + "')}"
	if d.Dim != "" {
		keys = append(keys, d.Dim)
		label += " ${PROP('Dim." + d.Dim + "')}"
	}
	search := func(statistic, prefix string) awscloudwatch.IMetric {
		return awscloudwatch.NewMathExpression(&awscloudwatch.MathExpressionProps{
			Expression: jsii.String(fmt.Sprintf(`SEARCH('{"%s",%s} MetricName="%s"', '%s', %d)`,
				r.Props.MetricsNamespace, strings.Join(keys, ","), d.Name, statistic, int(graphPeriod.Seconds()))),
			Label:  jsii.String(prefix + label),
			Period: seconds(graphPeriod),
		})
	}
	props := &awscloudwatch.GraphWidgetProps{
		Title:     jsii.String(d.Name + ": " + d.Title),
		Width:     jsii.Number(8),
		LeftYAxis: &awscloudwatch.YAxisProps{Min: jsii.Number(0), ShowUnits: jsii.Bool(false), Label: jsii.String(string(d.Unit))},
	}
	if d.Unit == metrics.Count {
		props.Left = &[]awscloudwatch.IMetric{search("Sum", "")}
		return awscloudwatch.NewGraphWidget(props)
	}
	// Milliseconds, the other unit of the contract.
	props.Left = &[]awscloudwatch.IMetric{search("p50", "p50 "), search("p99", "p99 ")}
	if d.Name == metrics.FinishToTerminated {
		props.LeftAnnotations = &[]*awscloudwatch.HorizontalAnnotation{{
			Value: jsii.Number(float64(r.Props.TerminateLatencyAlarm.Milliseconds())), Label: jsii.String("alarm (p99)"),
		}}
	}
	return awscloudwatch.NewGraphWidget(props)
}

// lambdaGraphs are the functions' errors, throttles and duration.
func (r *Reaper) lambdaGraphs() []awscloudwatch.IWidget {
	opts := func(statistic, label string) *awscloudwatch.MetricOptions {
		return &awscloudwatch.MetricOptions{Statistic: jsii.String(statistic), Period: seconds(graphPeriod), Label: jsii.String(label)}
	}
	var errs, throttles, duration []awscloudwatch.IMetric
	for i, fn := range r.Functions() {
		name := functions[i].name
		errs = append(errs, fn.MetricErrors(opts("Sum", name)))
		throttles = append(throttles, fn.MetricThrottles(opts("Sum", name)))
		duration = append(duration, fn.MetricDuration(opts("p50", "p50 "+name)), fn.MetricDuration(opts("p99", "p99 "+name)))
	}
	graph := func(title string, m []awscloudwatch.IMetric) awscloudwatch.IWidget {
		return awscloudwatch.NewGraphWidget(&awscloudwatch.GraphWidgetProps{
			Title: jsii.String(title), Left: &m, Width: jsii.Number(8), LeftYAxis: &awscloudwatch.YAxisProps{Min: jsii.Number(0)},
		})
	}
	return []awscloudwatch.IWidget{
		graph("Lambda errors", errs),
		graph("Lambda throttles", throttles),
		graph("Lambda duration", duration),
	}
}

// workQueueGraph shows the work queue's depth, what the reconcilers hold,
// the age of its oldest message and the dead-letter queue's depth. The
// reconcilers' own QueueAge, in milliseconds, has its graph among the
// latencies.
func (r *Reaper) workQueueGraph() awscloudwatch.IWidget {
	opts := func(label string) *awscloudwatch.MetricOptions {
		return &awscloudwatch.MetricOptions{Statistic: jsii.String("Maximum"), Period: seconds(graphPeriod), Label: jsii.String(label)}
	}
	return awscloudwatch.NewGraphWidget(&awscloudwatch.GraphWidgetProps{
		Title: jsii.String("Work queue: instances waiting for the reconciler"),
		Width: jsii.Number(8),
		Left: &[]awscloudwatch.IMetric{
			r.WorkQueue.MetricApproximateNumberOfMessagesVisible(opts("messages visible")),
			r.WorkQueue.MetricApproximateNumberOfMessagesNotVisible(opts("messages in flight")),
			r.DeadLetterQueue.MetricApproximateNumberOfMessagesVisible(opts("dead letters visible")),
		},
		Right:      &[]awscloudwatch.IMetric{r.WorkQueue.MetricApproximateAgeOfOldestMessage(opts("oldest message age"))},
		LeftYAxis:  &awscloudwatch.YAxisProps{Min: jsii.Number(0)},
		RightYAxis: &awscloudwatch.YAxisProps{Min: jsii.Number(0)},
		RightAnnotations: &[]*awscloudwatch.HorizontalAnnotation{{
			Value: jsii.Number(r.Props.QueueAgeAlarm.Seconds()), Label: jsii.String("alarm"),
		}},
	})
}

// queueGraph shows a queue's depth and the age of its oldest message.
func queueGraph(title string, q awssqs.IQueue) awscloudwatch.IWidget {
	opts := func(label string) *awscloudwatch.MetricOptions {
		return &awscloudwatch.MetricOptions{Statistic: jsii.String("Maximum"), Period: seconds(graphPeriod), Label: jsii.String(label)}
	}
	return awscloudwatch.NewGraphWidget(&awscloudwatch.GraphWidgetProps{
		Title:      jsii.String(title),
		Width:      jsii.Number(8),
		Left:       &[]awscloudwatch.IMetric{q.MetricApproximateNumberOfMessagesVisible(opts("messages visible"))},
		Right:      &[]awscloudwatch.IMetric{q.MetricApproximateAgeOfOldestMessage(opts("oldest message age"))},
		LeftYAxis:  &awscloudwatch.YAxisProps{Min: jsii.Number(0)},
		RightYAxis: &awscloudwatch.YAxisProps{Min: jsii.Number(0)},
	})
}

func widgetRows(rows [][]awscloudwatch.IWidget) *[]*[]awscloudwatch.IWidget {
	out := make([]*[]awscloudwatch.IWidget, len(rows))
	for i := range rows {
		out[i] = &rows[i]
	}
	return &out
}
