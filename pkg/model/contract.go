package model

import "strings"

// EC2 instance state names, as DescribeInstances and the state-change
// events spell them.
const (
	StatePending      = "pending"
	StateRunning      = "running"
	StateShuttingDown = "shutting-down"
	StateTerminated   = "terminated"
	StateStopping     = "stopping"
	StateStopped      = "stopped"
)

// The EventBridge events of EC2 instance state changes: the CDK rule
// selects them, and package statechange accepts nothing else.
const (
	StateChangeSource     = "aws.ec2"
	StateChangeDetailType = "EC2 Instance State-change Notification"
)

// IsGone reports whether a state means the instance no longer runs its Pod.
func IsGone(state string) bool {
	switch state {
	case StateShuttingDown, StateTerminated, StateStopping, StateStopped:
		return true
	}
	return false
}

// IsEnding reports whether the instance is already on its way out, so a
// terminate request would change nothing.
func IsEnding(state string) bool { return state == StateShuttingDown || state == StateTerminated }

// stateRanks order the states of one lifecycle, to order events with the
// same timestamp (EventBridge times have one-second resolution).
var stateRanks = map[string]int{
	StatePending: 0, StateRunning: 1, StateStopping: 2, StateStopped: 3, StateShuttingDown: 4, StateTerminated: 5,
}

// KnownState reports whether state is one of EC2's instance state names.
func KnownState(state string) bool {
	_, ok := stateRanks[state]
	return ok
}

// StateRank is the state's place in an instance's lifecycle.
func StateRank(state string) int { return stateRanks[state] }

// The launch tag keys of the contract: a provider writes them when it
// launches an instance for a Pod, and Reaper believes an exit line only
// when they agree with it.
const (
	DefaultTagManaged      = "reaper.io/managed"
	DefaultTagCluster      = "reaper.io/cluster"
	DefaultTagPodNamespace = "reaper.io/pod-namespace"
	DefaultTagPodName      = "reaper.io/pod-name"
	DefaultTagPodUID       = "reaper.io/pod-uid"
	// DefaultTagClusterUID carries the identity of the cluster the Pod
	// belongs to: the UID of its kube-system namespace, which a recreated
	// cluster of the same name does not share. Reaper treats an instance as
	// an orphan only when it equals the identity of the apiserver Reaper
	// reaches.
	DefaultTagClusterUID = "reaper.io/cluster-uid"
	// DefaultTagExitToken carries ExitTokenHash of the launch's exit token.
	DefaultTagExitToken = "reaper.io/exit-token-sha256"
)

// TagKeys are the launch tag keys a deployment uses.
type TagKeys struct {
	// Managed, with the value "true", marks an instance Reaper may
	// terminate (IAM allows it only there).
	Managed string
	// Cluster names the cluster whose Pod the instance runs: an instance is
	// a deployment's only when this tag equals its cluster name.
	Cluster string
	// PodNamespace, PodName and PodUID name the instance's Pod: Reaper
	// believes an exit line only for the Pod the three name.
	PodNamespace string
	// PodName is the Pod's name (see PodNamespace).
	PodName string
	// PodUID is the Pod's UID (see PodNamespace): a Pod replaced by
	// another of the same name is never written.
	PodUID string
	// ClusterUID carries the cluster identity, the UID of the cluster's
	// kube-system namespace (DefaultTagClusterUID): an instance is an
	// orphan only when it equals the identity of the apiserver Reaper
	// reaches, so an instance without it is never terminated as one.
	ClusterUID string
	// ExitToken carries the SHA-256 (ExitTokenHash) of the launch's exit
	// token, the secret the host's wrapper adds to every exit line: Reaper
	// believes a line for an instance with this tag only when the line's
	// token hashes to it, so no other host can speak for its Pod.
	ExitToken string
	// PodWritten, when set, is the tag Reaper puts on a running instance
	// once it has written its Pod's terminal status, its value the time of
	// the write: a host that powers itself off only once it reads this tag
	// through the instance metadata (userdata.ShutdownWhenPodWritten)
	// never ends before its Pod tells the truth. It has no default: empty,
	// Reaper tags nothing. It must be a key the instance metadata can show
	// (ValidMetadataTagKey).
	PodWritten string
}

// ValidMetadataTagKey reports whether key may be the key of a tag on an
// instance whose tags the instance metadata shows (InstanceMetadataTags):
// EC2 then refuses to launch an instance, or to tag one, with any other
// key. Letters, digits and + - = . , _ : @ only (no "/" nor spaces), up to
// 128 characters, not "." nor ".." nor "_index", and not aws:-prefixed.
func ValidMetadataTagKey(key string) bool {
	if key == "" || len(key) > 128 || key == "." || key == ".." || key == "_index" || strings.HasPrefix(strings.ToLower(key), "aws:") {
		return false
	}
	for _, c := range key {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', strings.ContainsRune("+-=.,_:@", c):
		default:
			return false
		}
	}
	return true
}

// DefaultTagKeys are the contract's default keys.
func DefaultTagKeys() TagKeys {
	return TagKeys{
		Managed:      DefaultTagManaged,
		Cluster:      DefaultTagCluster,
		PodNamespace: DefaultTagPodNamespace,
		PodName:      DefaultTagPodName,
		PodUID:       DefaultTagPodUID,
		ClusterUID:   DefaultTagClusterUID,
		ExitToken:    DefaultTagExitToken,
	}
}

// WithDefaults fills the empty keys with the defaults.
func (k TagKeys) WithDefaults() TagKeys {
	d := DefaultTagKeys()
	for _, f := range []struct{ v, def *string }{
		{&k.Managed, &d.Managed}, {&k.Cluster, &d.Cluster}, {&k.PodNamespace, &d.PodNamespace},
		{&k.PodName, &d.PodName}, {&k.PodUID, &d.PodUID}, {&k.ClusterUID, &d.ClusterUID},
		{&k.ExitToken, &d.ExitToken},
	} {
		if *f.v == "" {
			*f.v = *f.def
		}
	}
	return k
}

// DefaultLogGroup is the exit log group of a cluster's Reaper deployment,
// the one its construct creates and subscribes to: log group names are
// unique in an account and region, and each deployment's agent policy
// covers its own group only, so one cluster's hosts cannot write another
// cluster's exit lines.
func DefaultLogGroup(cluster string) string { return "/reaper/" + cluster + "/exits" }
