package model

// Why Reaper did not act on an exit line, a claim or a state change: the
// one list of them, logged and counted as the metrics' Reason dimension
// (LinesRejected, StateChangesRefused).
const (
	// ReasonInvalid: not an exit line v1, or a field out of its limits.
	ReasonInvalid = "invalid"
	// ReasonOtherInstance: the line names another instance than the log
	// stream it was written to.
	ReasonOtherInstance = "other-instance"
	// ReasonInvalidToken: the line's exit token is outside its bounds
	// (ValidExitToken); the line is refused whatever else it says.
	ReasonInvalidToken = "invalid-token"
	// ReasonFinishedInFuture: finishedAt lies further ahead than the clock
	// skew a host may have.
	ReasonFinishedInFuture = "finished-in-future"
	// ReasonUndecodable: a subscription payload that could not be decoded,
	// or a log stream not named after an instance.
	ReasonUndecodable = "undecodable"

	// A host writes the exit line and may write into any log stream of the
	// group (IAM cannot tie a stream to the writer's instance), so what a
	// line or a record built from one says is checked against the
	// instance's launch tags, which only the provider wrote.

	// ReasonNotManaged: the instance lacks the managed tag.
	ReasonNotManaged = "not-managed"
	// ReasonOtherCluster: the instance belongs to another cluster.
	ReasonOtherCluster = "other-cluster"
	// ReasonInstanceUnknown: EC2 does not know the instance, and the record
	// was never checked against its tags.
	ReasonInstanceUnknown = "instance-unknown"
	// ReasonNoPodTags: the instance carries no Pod tags to compare with.
	ReasonNoPodTags = "no-pod-tags"
	// ReasonPodMismatch: the Pod named differs from the one the tags name.
	ReasonPodMismatch = "pod-mismatch"
	// ReasonAfterTerminal: an exit of a Pod whose terminal exit is
	// recorded, other than that one: the first terminal exit is final.
	ReasonAfterTerminal = "after-terminal"
	// ReasonTokenMismatch: the instance carries an exit-token hash
	// (TagKeys.ExitToken) and the claim's token, absent or another, does
	// not hash to it.
	ReasonTokenMismatch = "token-mismatch"

	// ReasonUnknownContainer: the claim names a container its Pod's spec
	// does not have (a wrapper configured with the wrong name).
	ReasonUnknownContainer = "unknown-container"
	// ReasonTooManyContainers: the claim names a further container of a
	// Pod whose record keeps the most it can (ledger.MaxContainers).
	ReasonTooManyContainers = "too-many-containers"

	// ReasonNotConfirmed: a state change claiming the instance gone while
	// EC2 kept describing it running.
	ReasonNotConfirmed = "not-confirmed"
	// ReasonInFuture: a state change dated further ahead than the clock
	// skew allows.
	ReasonInFuture = "in-future"
)
