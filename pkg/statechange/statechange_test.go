package statechange

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/reaper-k8s/reaper/pkg/model"
)

func event(detail string) events.CloudWatchEvent {
	return events.CloudWatchEvent{Source: model.StateChangeSource, DetailType: model.StateChangeDetailType, Time: time.Date(2026, 11, 30, 7, 0, 0, 0, time.UTC), Detail: json.RawMessage(detail)}
}

func TestParse(t *testing.T) {
	m, err := Parse(event(`{"instance-id":"i-0123456789abcdef0","state":"terminated"}`))
	if err != nil || m.InstanceID != "i-0123456789abcdef0" || m.State != "terminated" || m.Time.Hour() != 7 {
		t.Fatalf("%+v %v", m, err)
	}
	for name, tc := range map[string]struct {
		ev   events.CloudWatchEvent
		want string
	}{
		"other source": {events.CloudWatchEvent{Source: "aws.events", DetailType: "Scheduled Event"}, "not an EC2 state change"},
		"bad detail":   {event(`[`), "state change detail"},
		"bad id":       {event(`{"instance-id":"web-1","state":"running"}`), "not an EC2 instance id"},
		"ten digits":   {event(`{"instance-id":"i-0123456789","state":"stopped"}`), `instance-id "i-0123456789" is not an EC2 instance id`},
		"bad state":    {event(`{"instance-id":"i-0123456789abcdef0","state":"melting"}`), "unknown state"},
	} {
		if _, err := Parse(tc.ev); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
}
