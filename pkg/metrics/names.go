package metrics

// The metrics below are the contract between the code that records them
// (pkg/reaper and the functions) and the dashboard and alarms that read
// them (infra/reapercdk): a name changed on one side only leaves a graph
// empty and an alarm silent. Every metric carries FunctionDim, set to the
// recording function's name, and at most the one further dimension listed
// in Definitions. Counts are recorded with Recorder.Count (unit Count) and
// read as sums; latencies with Recorder.Observe (unit Milliseconds) and
// read as percentiles.

// NamespaceEnv is the environment variable naming the namespace a
// deployment's functions record under; unset, DefaultNamespace. Each
// deployment has its own, so that two clusters' metrics (and alarms) in one
// account stay apart.
const NamespaceEnv = "REAPER_METRICS_NAMESPACE"

// Values of FunctionDim: the functions' names.
const (
	FunctionExitRecorder = "exitrecorder"
	FunctionStateChange  = "statechange"
	FunctionSweeper      = "sweeper"
	FunctionReconciler   = "reconciler"
)

// The dimensions a metric may carry besides FunctionDim (see Outcome and
// Reason).
const (
	OutcomeDim = "Outcome"
	ReasonDim  = "Reason"
)

// Counts (unit Count).
const (
	// ExitsRecorded: well-formed exit lines the exitrecorder took, once
	// their claims are on the work queue (intake.ExitSummary.Recorded):
	// queued, not yet checked nor in the ledger, which only the reconciler
	// writes an exit to. The name stays: the dashboard reads it.
	ExitsRecorded = "ExitsRecorded"
	// LinesRejected: exit lines not acted on, by ReasonDim.
	LinesRejected = "LinesRejected"
	// PodStatusesWritten: Pod statuses written, by OutcomeDim: the
	// terminal ones and the restarts counted on a Running Pod.
	PodStatusesWritten = "PodStatusesWritten"
	// InstancesTerminated: TerminateInstances accepted for an instance
	// whose Pod ended.
	InstancesTerminated = "InstancesTerminated"
	// OrphansTerminated: TerminateInstances accepted for a managed
	// instance without a live Pod.
	OrphansTerminated = "OrphansTerminated"
	// OrphansFound: managed instances without a live Pod that no event
	// had reported: each is a leak the event path missed.
	OrphansFound = "OrphansFound"
	// OrphansHeldBack: orphans a sweep found beyond its cap
	// (REAPER_ORPHAN_CAP of the owned instances) and left running. Any is
	// worth a look: a wrong Kubernetes endpoint makes the whole fleet look
	// orphaned.
	OrphansHeldBack = "OrphansHeldBack"
	// ClusterIdentityMismatch: instances whose cluster identity tag differs
	// from the identity of the apiserver Reaper reaches (or that carry
	// none); no orphan check treats them as orphans.
	ClusterIdentityMismatch = "ClusterIdentityMismatch"
	// TerminationsRefused: instances TerminateInstances refused (for
	// example termination protection), by ReasonDim (the EC2 error code).
	// Reaper stops asking until the sweep finds them again.
	TerminationsRefused = "TerminationsRefused"
	// PodWrittenTagsFailed: running instances whose Pod Reaper wrote but
	// could not tag as written (REAPER_TAG_POD_WRITTEN): their hosts wait
	// for the tag, and Reaper terminates them when the grace ends.
	PodWrittenTagsFailed = "PodWrittenTagsFailed"
	// StateChangesRefused: state changes Reaper did not record, by
	// ReasonDim: EC2 describes the instance running (the message claimed
	// it gone), or the change lies in the future.
	StateChangesRefused = "StateChangesRefused"
	// WorkItemsRetried: pending work (a Pod write, a termination) tried
	// again after an earlier attempt failed.
	WorkItemsRetried = "WorkItemsRetried"
	// WorkItemsQueued: instances handed to the work queue.
	WorkItemsQueued = "WorkItemsQueued"
	// WorkItemsDeferred: instances the reconciler put back on the queue
	// because its share of EC2's token buckets would not cover them
	// before its deadline.
	WorkItemsDeferred = "WorkItemsDeferred"
	// WorkDeadLettered: instances whose work the reconciler could not
	// finish in workqueue.MaxAttempts batches, sent to the dead-letter
	// queue with the reason.
	WorkDeadLettered = "WorkDeadLettered"
	// SweepLeftOver: ledger writes a sweep had no time for, left to the
	// next sweep.
	SweepLeftOver = "SweepLeftOver"
	// UnknownInstancesRemembered: exit claims for instances EC2 answered
	// lately it does not know, taken as unknown without a call (a flood
	// of made-up instance ids).
	UnknownInstancesRemembered = "UnknownInstancesRemembered"
	// WorkItemsFailed: instances the reconciler returned as batch item
	// failures; SQS delivers them again after the visibility timeout.
	WorkItemsFailed = "WorkItemsFailed"
	// ExitTokensUnexpected: exit claims whose line carries an exit token
	// for an instance EC2 describes without an exit-token tag (under the
	// key REAPER_TAG_EXIT_TOKEN): believed, as for any instance launched
	// without a token, but a host that writes a token was launched with
	// one, so the provider tags its hash under another key and no token
	// is checked.
	ExitTokensUnexpected = "ExitTokensUnexpected"
	// EventsNotPosted: Events on a Pod that could not be posted after its
	// status was written. The step still counts as done: the status is
	// what matters, the Event only says why.
	EventsNotPosted = "EventsNotPosted"
)

// Latencies (unit Milliseconds), from the container's finishedAt in the
// exit line.
const (
	// FinishToRecorded: to the exit's ledger record.
	FinishToRecorded = "FinishToRecorded"
	// FinishToPodTerminal: to the Pod's terminal status being written.
	FinishToPodTerminal = "FinishToPodTerminal"
	// FinishToTerminated: to TerminateInstances being accepted.
	FinishToTerminated = "FinishToTerminated"
	// QueueAge: how long a work item waited in the work queue before a
	// function took it (unit Milliseconds).
	QueueAge = "QueueAge"
	// EC2PacingWait: how long a reconciler batch waited for its share of
	// EC2's token buckets (unit Milliseconds).
	EC2PacingWait = "EC2PacingWait"
)

// Values of OutcomeDim on PodStatusesWritten.
const (
	OutcomeSucceeded = "Succeeded"
	OutcomeFailed    = "Failed"
	OutcomeLost      = "Lost"
	OutcomeRestart   = "Restart"
)

// Definition is one metric of the contract.
type Definition struct {
	Name string
	Unit Unit
	// Dim is the dimension the metric carries besides FunctionDim, or "".
	Dim string
	// Title says in a few words what the metric shows.
	Title string
}

// Definitions are every metric of the contract, counts first, in the order
// the dashboard shows them.
var Definitions = []Definition{
	{ExitsRecorded, Count, "", "Exit lines queued for the reconciler"},
	{LinesRejected, Count, ReasonDim, "Exit lines rejected, by reason"},
	{PodStatusesWritten, Count, OutcomeDim, "Pod statuses written, by outcome"},
	{InstancesTerminated, Count, "", "Instances terminated after their Pod"},
	{OrphansTerminated, Count, "", "Orphan instances terminated"},
	{OrphansFound, Count, "", "Orphan instances found (missed by events)"},
	{OrphansHeldBack, Count, "", "Orphans held back by the cap"},
	{ClusterIdentityMismatch, Count, "", "Instances of another cluster identity"},
	{TerminationsRefused, Count, ReasonDim, "Terminations refused by EC2, by reason"},
	{StateChangesRefused, Count, ReasonDim, "State changes refused, by reason"},
	{PodWrittenTagsFailed, Count, "", "Pod-written tags not put"},
	{WorkItemsRetried, Count, "", "Work items retried"},
	{WorkItemsQueued, Count, "", "Instances handed to the work queue"},
	{WorkItemsDeferred, Count, "", "Instances deferred for want of time or EC2 tokens"},
	{WorkItemsFailed, Count, "", "Instances returned to the queue as failures"},
	{WorkDeadLettered, Count, "", "Instances whose work went to the dead-letter queue"},
	{SweepLeftOver, Count, "", "Sweep ledger writes left to the next sweep"},
	{UnknownInstancesRemembered, Count, "", "Claims of instances EC2 lately did not know"},
	{ExitTokensUnexpected, Count, "", "Exit tokens of instances without the token tag"},
	{FinishToRecorded, Milliseconds, "", "Container finish to ledger record"},
	{FinishToPodTerminal, Milliseconds, "", "Container finish to Pod terminal status"},
	{FinishToTerminated, Milliseconds, "", "Container finish to TerminateInstances accepted"},
	{QueueAge, Milliseconds, "", "Work item age when taken from the queue"},
	{EC2PacingWait, Milliseconds, "", "Reconciler wait for EC2 tokens"},
}
