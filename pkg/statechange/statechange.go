// Package statechange parses EventBridge "EC2 Instance State-change
// Notification" events.
package statechange

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/reaper-k8s/reaper/pkg/model"
)

// Message is one instance state change.
type Message struct {
	InstanceID string
	State      string
	// Time is when EC2 says the change happened.
	Time time.Time
}

type detail struct {
	InstanceID string `json:"instance-id"`
	State      string `json:"state"`
}

// Parse validates an event and extracts the state change.
func Parse(ev events.CloudWatchEvent) (Message, error) {
	if ev.Source != model.StateChangeSource || ev.DetailType != model.StateChangeDetailType {
		return Message{}, fmt.Errorf("not an EC2 state change: source %q, detail-type %q", ev.Source, ev.DetailType)
	}
	var d detail
	if err := json.Unmarshal(ev.Detail, &d); err != nil {
		return Message{}, fmt.Errorf("state change detail: %w", err)
	}
	if !model.ValidInstanceID(d.InstanceID) {
		return Message{}, fmt.Errorf("state change: instance-id %q is not an EC2 instance id", d.InstanceID)
	}
	if !model.KnownState(d.State) {
		return Message{}, fmt.Errorf("state change of %s: unknown state %q", d.InstanceID, d.State)
	}
	if ev.Time.IsZero() {
		return Message{}, fmt.Errorf("state change of %s: no time", d.InstanceID)
	}
	return Message{InstanceID: d.InstanceID, State: d.State, Time: ev.Time}, nil
}
