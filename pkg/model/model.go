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
	// ReceivedAt is when Reaper recorded the line.
	ReceivedAt time.Time `dynamodbav:"receivedAt" json:"receivedAt,omitempty"`
}

// Terminal reports whether this exit ends the Pod: the host supervisor is
// not going to restart the container.
func (e Exit) Terminal() bool { return !e.WillRestart }

// Gone is how an instance went away when it did so without (or before) an
// exit line: the EC2 state it reached and when.
type Gone struct {
	State string    `dynamodbav:"state" json:"state,omitempty"`
	At    time.Time `dynamodbav:"at" json:"at,omitempty"`
}

// Outcome is what Reaper learned about a Pod's run: a container exit, or the
// instance gone with no exit line (Lost).
type Outcome struct {
	InstanceID string
	Exit       *Exit
	Lost       *Gone
	// LostAfter is the exit-wait window that expired, for the message.
	LostAfter time.Duration
}

// OutcomeLost is the key of a Lost outcome.
const OutcomeLost = "lost"

// Key identifies an outcome in the ledger's PodSynced field, so a step that
// already wrote it is not repeated: "exit/<restart count>" or OutcomeLost.
func (o Outcome) Key() string {
	if o.Exit != nil {
		return fmt.Sprintf("exit/%d", o.Exit.RestartCount)
	}
	return OutcomeLost
}

// Terminal reports whether the outcome ends the Pod.
func (o Outcome) Terminal() bool { return o.Exit == nil || o.Exit.Terminal() }

var (
	instanceIDPattern = regexp.MustCompile(`^i-[0-9a-f]{8,17}$`)
	uuidPattern       = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)
)

// ValidUID reports whether uid has the shape of a Kubernetes object's UID,
// a UUID.
func ValidUID(uid string) bool { return uuidPattern.MatchString(uid) }

// ValidInstanceID reports whether id has the shape of an EC2 instance id:
// "i-" and 8 to 17 hexadecimal digits.
func ValidInstanceID(id string) bool { return instanceIDPattern.MatchString(id) }
