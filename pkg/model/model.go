// Package model is Reaper's vocabulary, shared by every other package: the
// Pod an instance runs, its container's exit, how an instance went away,
// the outcome a Pod's status must carry, and the contract a provider and
// Reaper agree on (launch tag keys, EC2 state names, the exit log group).
// It imports only the standard library, so the pure parts of Reaper (the
// status truth table, the host-side renderer) link no SDK through it.
package model

import (
	"fmt"
	"regexp"
	"strings"
	"time"
)

// PodRef names the Pod an instance runs. The UID tells a Pod from a later
// one with the same name.
type PodRef struct {
	Namespace string `dynamodbav:"namespace" json:"namespace,omitempty"`
	Name      string `dynamodbav:"name" json:"name,omitempty"`
	UID       string `dynamodbav:"uid" json:"uid,omitempty"`
}

func (p PodRef) String() string { return p.Namespace + "/" + p.Name }

// Exit is a container exit as the host wrapper reported it.
type Exit struct {
	Container        string    `dynamodbav:"container" json:"container,omitempty"`
	ContainerID      string    `dynamodbav:"containerId,omitempty" json:"containerId,omitempty"`
	ExitCode         int       `dynamodbav:"exitCode" json:"exitCode"`
	OOMKilled        bool      `dynamodbav:"oomKilled" json:"oomKilled"`
	Signal           string    `dynamodbav:"signal,omitempty" json:"signal,omitempty"`
	Error            string    `dynamodbav:"error,omitempty" json:"error,omitempty"`
	StartedAt        time.Time `dynamodbav:"startedAt" json:"startedAt,omitempty"`
	FinishedAt       time.Time `dynamodbav:"finishedAt" json:"finishedAt,omitempty"`
	RestartCount     int32     `dynamodbav:"restartCount" json:"restartCount"`
	RuntimeRestarted bool      `dynamodbav:"runtimeRestarted,omitempty" json:"runtimeRestarted,omitempty"`
	WillRestart      bool      `dynamodbav:"willRestart,omitempty" json:"willRestart,omitempty"`
	BackoffSeconds   int       `dynamodbav:"backoffSeconds,omitempty" json:"backoffSeconds,omitempty"`
	// Message is the container's termination message, as the host read it
	// (its terminationMessagePath, or the tail of its log under
	// FallbackToLogsOnError): the workload's own text, shown in the
	// container's status and never read for a decision.
	Message string `dynamodbav:"message,omitempty" json:"message,omitempty"`
	// OthersRunning is the host's word that other containers of the Pod
	// still run, or are still to start, after this run. Reaper decides
	// the Pod's end from the Pod's spec; it falls back on this only when
	// the spec cannot be read (podstatus.HostSaysEnded). A wrapper of one
	// container never sets it.
	OthersRunning bool `dynamodbav:"othersRunning,omitempty" json:"othersRunning,omitempty"`
	// ReceivedAt is when Reaper recorded the line.
	ReceivedAt time.Time `dynamodbav:"receivedAt" json:"receivedAt,omitempty"`
}

// Terminal reports whether this exit ends its container for good: the
// host supervisor is not going to restart it. Whether it ends the Pod
// depends on the Pod's other containers (podstatus.Phase).
func (e Exit) Terminal() bool { return !e.WillRestart }

// Gone is how an instance went away when it did so without (or before) an
// exit line: the EC2 state it reached and when.
type Gone struct {
	State string    `dynamodbav:"state" json:"state,omitempty"`
	At    time.Time `dynamodbav:"at" json:"at,omitempty"`
}

// Outcome is what Reaper learned about a Pod's run: the latest exit of
// each container that reported one, and whether the instance went away
// with containers still unaccounted for (Lost), or the Pod's sidecars
// outlived its termination grace (SidecarsLost).
type Outcome struct {
	InstanceID string
	// Exits are the latest exit of each container that reported one, one
	// per container, in container name order.
	Exits []Exit
	// Lost is set when the instance went away and the exit-wait window
	// passed: a container it ran with no terminal exit is lost.
	Lost *Gone
	// LostAfter is the exit-wait window that expired, for the message.
	LostAfter time.Duration
	// SidecarsLost says every regular container ended for good a
	// termination grace period ago: a sidecar with no terminal exit by
	// then is lost, as the kubelet would have killed it.
	SidecarsLost bool
}

// MaxContainers is how many containers (init and regular) a Pod Reaper
// serves may have: Reaper's record of an instance is one DynamoDB item
// (at most 400 KB) and keeps each container's latest exit, which with
// its termination message and error takes up to about 8.5 KB. A provider
// refuses a larger Pod at launch (userdata.Pod.Validate); Reaper refuses
// a line for a further container (ReasonTooManyContainers).
const MaxContainers = 32

// OutcomeLost is the key of a Lost outcome.
const OutcomeLost = "lost"

// Key identifies an outcome in the ledger's PodSynced field, so a step that
// already wrote it is not repeated: "exit/<restart count>" for one
// container's exit, "<container>=exit/<restart count>,…" for several,
// "+sidecars-lost" after it when the sidecars are taken as lost, or
// OutcomeLost.
func (o Outcome) Key() string {
	if o.Lost != nil {
		return OutcomeLost
	}
	var key string
	if len(o.Exits) == 1 {
		key = fmt.Sprintf("exit/%d", o.Exits[0].RestartCount)
	} else {
		parts := make([]string, len(o.Exits))
		for i, e := range o.Exits {
			parts[i] = fmt.Sprintf("%s=exit/%d", e.Container, e.RestartCount)
		}
		key = strings.Join(parts, ",")
	}
	if o.SidecarsLost {
		key += "+sidecars-lost"
	}
	return key
}

// Latest is the exit Reaper received last (nil: none), the one an Event
// tells of.
func (o Outcome) Latest() *Exit {
	var latest *Exit
	for i := range o.Exits {
		e := &o.Exits[i]
		if latest == nil || e.ReceivedAt.After(latest.ReceivedAt) ||
			(e.ReceivedAt.Equal(latest.ReceivedAt) && e.FinishedAt.After(latest.FinishedAt)) {
			latest = e
		}
	}
	return latest
}

// ExitOf is the exit of the container called name (nil: it reported
// none).
func (o Outcome) ExitOf(name string) *Exit {
	for i := range o.Exits {
		if o.Exits[i].Container == name {
			return &o.Exits[i]
		}
	}
	return nil
}

var (
	instanceIDPattern = regexp.MustCompile(`^i-([0-9a-f]{8}|[0-9a-f]{17})$`)
	uuidPattern       = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)
)

// ValidUID reports whether uid has the shape of a Kubernetes object's UID,
// a UUID.
func ValidUID(uid string) bool { return uuidPattern.MatchString(uid) }

// ValidInstanceID reports whether id has the shape EC2 accepts for an
// instance id: "i-" and 8 or 17 lower-case hexadecimal digits. EC2 fails a
// whole call naming any other (InvalidInstanceID.Malformed), so an id of
// another length is refused where it enters Reaper (a log stream, a line,
// a work item, a state change) and costs its own claim only.
func ValidInstanceID(id string) bool { return instanceIDPattern.MatchString(id) }
