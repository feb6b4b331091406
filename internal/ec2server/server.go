// Package ec2server is an in-process stand-in for the Amazon EC2 Query API,
// limited to the calls Reaper makes: DescribeInstances, TerminateInstances and
// CreateTags, plus the RunInstances a provider makes. Tests point the real
// aws-sdk-go-v2 EC2 client at it (through ec2.Options.BaseEndpoint or
// AWS_ENDPOINT_URL_EC2), so request encoding, response parsing, error mapping
// and retries are exercised for real.
//
// Behaviour follows EC2 where Reaper depends on it: requests naming unknown
// instances fail as a whole with InvalidInstanceID.NotFound, terminating an
// instance twice succeeds, terminated instances stay visible, and throttling
// answers RequestLimitExceeded with HTTP 503. Requests are not authenticated.
//
// Throttling is injected by Throttle and ThrottleUntil, or modeled on EC2's
// published token buckets after EnableBuckets, which HoldEmpty empties for
// a while as the account's other tools do.
//
// A Server is safe for concurrent use.
package ec2server

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"sync"
	"time"

	"github.com/reaper-k8s/reaper/internal/callrecord"
	"github.com/reaper-k8s/reaper/pkg/model"
)

// State is an EC2 instance state name.
type State string

// The instance states EC2 reports.
const (
	Pending      State = model.StatePending
	Running      State = model.StateRunning
	ShuttingDown State = model.StateShuttingDown
	Terminated   State = model.StateTerminated
	Stopping     State = model.StateStopping
	Stopped      State = model.StateStopped
)

var stateCodes = map[State]int32{
	Pending:      0,
	Running:      16,
	ShuttingDown: 32,
	Terminated:   48,
	Stopping:     64,
	Stopped:      80,
}

// Code returns the numeric state code EC2 reports next to the name, or -1 for
// an unknown state.
func (s State) Code() int32 {
	if c, ok := stateCodes[s]; ok {
		return c
	}
	return -1
}

// StateReason explains the last state change, as in EC2's stateReason.
type StateReason struct {
	Code    string // e.g. Server.SpotInstanceTermination
	Message string
}

// Instance is one fake EC2 instance.
type Instance struct {
	// ID must look like an EC2 id: "i-" and 8 or 17 lowercase hex digits.
	// AddInstance generates one when empty.
	ID           string
	State        State             // default Running
	Tags         map[string]string // key -> value
	LaunchTime   time.Time         // default: when added
	InstanceType string            // optional, e.g. "g5.xlarge"
	StateReason  StateReason       // optional; set by TerminateInstances
	// DisableAPITermination is termination protection: a
	// TerminateInstances naming the instance fails with
	// OperationNotPermitted and terminates none of the call's instances.
	DisableAPITermination bool
	// MetadataTags says the instance metadata shows its tags
	// (InstanceMetadataTags enabled): EC2 then refuses a launch, or a
	// CreateTags, with a key the metadata cannot show
	// (model.ValidMetadataTagKey).
	MetadataTags bool
}

func (i Instance) clone() Instance {
	i.Tags = maps.Clone(i.Tags)
	return i
}

// Call is one request the server received. Its Injected says a fault from
// FailNext or Throttle answered it.
type Call struct {
	callrecord.Call
	InstanceIDs []string   // InstanceId.N, in request order
	Params      url.Values // the whole decoded form
	Refused     bool       // refused by a token bucket (EnableBuckets)
}

// Terminated is the instances the call terminated: those a successful
// TerminateInstances named, nil for any other call.
func (c Call) Terminated() []string {
	if c.Action != "TerminateInstances" || c.ErrorCode != "" {
		return nil
	}
	return c.InstanceIDs
}

// Server is a fake EC2 endpoint on a loopback httptest server.
type Server struct {
	http *httptest.Server

	mu        sync.Mutex
	instances map[string]*record
	seq       int64 // insertion counter: gives a stable order for pagination
	faults    []*fault
	settle    time.Duration
	buckets   *buckets // nil unless EnableBuckets

	calls callrecord.Record[Call]
}

type record struct {
	inst Instance
	seq  int64
	// TerminateInstances leaves the instance in a transient state that
	// becomes target at or after `at`. Evaluated lazily on every access, so no
	// timers or goroutines are needed.
	target State
	at     time.Time
}

type fault struct {
	action    string // "" matches every action
	remaining int    // answers left; ignored when until is set
	until     time.Time
	code      string
	status    int
}

// New starts a Server listening on 127.0.0.1. Close it when done.
func New() *Server {
	s := &Server{instances: map[string]*record{}}
	s.http = httptest.NewServer(s)
	return s
}

// URL is the endpoint to give the SDK, e.g. http://127.0.0.1:41234.
func (s *Server) URL() string { return s.http.URL }

// Close shuts the listener down and waits for in-flight requests.
func (s *Server) Close() { s.http.Close() }

var idPattern = regexp.MustCompile(`^i-([0-9a-f]{8}|[0-9a-f]{17})$`)

// NewInstanceID returns a random, well-formed 17-digit instance id.
func NewInstanceID() string {
	b := make([]byte, 9)
	_, _ = rand.Read(b)
	return "i-" + hex.EncodeToString(b)[:17]
}

// AddInstance stores inst, replacing any instance with the same ID, and
// returns it with defaults filled in. It panics on a malformed ID or an
// unknown state: those are mistakes in the test, not conditions to handle.
func (s *Server) AddInstance(inst Instance) Instance {
	if inst.ID == "" {
		inst.ID = NewInstanceID()
	}
	if !idPattern.MatchString(inst.ID) {
		panic(fmt.Sprintf("ec2server: malformed instance id %q", inst.ID))
	}
	if inst.State == "" {
		inst.State = Running
	}
	if inst.State.Code() < 0 {
		panic(fmt.Sprintf("ec2server: unknown state %q", inst.State))
	}
	if inst.LaunchTime.IsZero() {
		inst.LaunchTime = time.Now().UTC().Truncate(time.Millisecond)
	}
	inst = inst.clone()

	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.instances[inst.ID]; ok {
		r.inst, r.target = inst, ""
		return inst.clone()
	}
	s.seq++
	s.instances[inst.ID] = &record{inst: inst, seq: s.seq}
	return inst.clone()
}

// RemoveInstance forgets an instance, as EC2 does some time after it is
// terminated: later requests naming it get InvalidInstanceID.NotFound.
func (s *Server) RemoveInstance(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.instances, id)
}

// SetState moves an instance to state at once, cancelling any transition in
// progress (use it to simulate a spot interruption or an operator's stop:
// the server does not answer StopInstances, which Reaper never calls). It
// panics if the instance does not exist or the state is unknown.
func (s *Server) SetState(id string, state State) {
	if state.Code() < 0 {
		panic(fmt.Sprintf("ec2server: unknown state %q", state))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.instances[id]
	if !ok {
		panic(fmt.Sprintf("ec2server: SetState on unknown instance %q", id))
	}
	r.inst.State, r.target = state, ""
}

// Instance returns the current view of an instance.
func (s *Server) Instance(id string) (Instance, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.instances[id]
	if !ok {
		return Instance{}, false
	}
	r.advance(time.Now())
	return r.inst.clone(), true
}

// SetTransitionDelay sets how long an instance stays shutting-down after
// TerminateInstances before it becomes terminated. The default, zero,
// settles it before the next request, though the TerminateInstances answer
// still reports the transient state like EC2 does.
func (s *Server) SetTransitionDelay(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.settle = d
}

// Calls returns a copy of every request received since New or ResetCalls.
func (s *Server) Calls() []Call {
	out := s.calls.Calls()
	for i := range out {
		out[i].InstanceIDs = slices.Clone(out[i].InstanceIDs)
		out[i].Params = cloneValues(out[i].Params)
	}
	return out
}

// CallCount returns how many requests for action were received, faulted
// and refused ones included.
func (s *Server) CallCount(action string) int { return s.calls.Count(action) }

// ResetCalls forgets the recorded calls. Instances and faults stay.
func (s *Server) ResetCalls() { s.calls.Reset() }

// Tally is what a stretch of the server's calls came to.
type Tally struct {
	// Requests counts the calls by action as CallCount does, faulted and
	// refused ones included; Refused counts those the buckets refused.
	Requests, Refused map[string]int
	// FirstTerminated is, by instance, when the first call that terminated
	// it (Call.Terminated) arrived.
	FirstTerminated map[string]time.Time
}

// TallySince tallies the calls from index from of Calls on.
func (s *Server) TallySince(from int) Tally {
	t := Tally{Requests: map[string]int{}, Refused: map[string]int{}, FirstTerminated: map[string]time.Time{}}
	calls := s.calls.Calls()
	for _, c := range calls[min(from, len(calls)):] {
		t.Requests[c.Action]++
		if c.Refused {
			t.Refused[c.Action]++
		}
		for _, id := range c.Terminated() {
			if _, ok := t.FirstTerminated[id]; !ok {
				t.FirstTerminated[id] = c.Time
			}
		}
	}
	return t
}

// FailNext answers the next n requests for action ("" for any action) with
// the EC2 error code and HTTP status, without touching any instance. A zero
// httpStatus picks the status EC2 uses for the code (400 for client errors).
// Faults queue up in the order they were registered.
func (s *Server) FailNext(action string, n int, code string, httpStatus int) {
	if n <= 0 {
		return
	}
	s.addFault(&fault{action: action, remaining: n, code: code, status: httpStatus})
}

// Throttle answers the next n requests for action ("" for any) with
// RequestLimitExceeded (HTTP 503), which the SDK retries as a throttle.
func (s *Server) Throttle(action string, n int) {
	s.FailNext(action, n, "RequestLimitExceeded", 0)
}

// ThrottleUntil answers every request for action ("" for any) with
// RequestLimitExceeded until the given time.
func (s *Server) ThrottleUntil(action string, until time.Time) {
	s.addFault(&fault{action: action, until: until, code: "RequestLimitExceeded"})
}

// ClearFaults drops every pending fault.
func (s *Server) ClearFaults() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = nil
}

func (s *Server) addFault(f *fault) {
	if f.status == 0 {
		f.status = defaultStatus(f.code)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = append(s.faults, f)
}

// takeFault returns the fault that answers this request, if any, and
// consumes one use of it. Called with s.mu held.
func (s *Server) takeFault(action string, now time.Time) *fault {
	for i := 0; i < len(s.faults); i++ {
		f := s.faults[i]
		expired := (f.until.IsZero() && f.remaining <= 0) || (!f.until.IsZero() && !now.Before(f.until))
		if expired {
			s.faults = slices.Delete(s.faults, i, i+1)
			i--
			continue
		}
		if f.action != "" && f.action != action {
			continue
		}
		if f.until.IsZero() {
			f.remaining--
		}
		return f
	}
	return nil
}

// advance completes a pending termination that is due.
func (r *record) advance(now time.Time) {
	if r.target != "" && !now.Before(r.at) {
		r.inst.State, r.target = r.target, ""
	}
}

func defaultStatus(code string) int {
	switch code {
	case "RequestLimitExceeded", "ServiceUnavailable", "Unavailable":
		return 503
	case "InternalError", "InternalFailure":
		return 500
	case "DryRunOperation":
		return 412
	}
	return 400
}

func cloneValues(v url.Values) url.Values {
	out := make(url.Values, len(v))
	for k, vs := range v {
		out[k] = slices.Clone(vs)
	}
	return out
}
