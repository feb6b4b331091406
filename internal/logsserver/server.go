// Package logsserver is an in-process stand-in for Amazon CloudWatch Logs,
// speaking the JSON protocol (awsJson1_1: POST /, X-Amz-Target
// Logs_20140328.<Action>) that aws-sdk-go-v2's cloudwatchlogs client uses.
// Tests point the real client at it (AWS_ENDPOINT_URL_CLOUDWATCH_LOGS, or
// cloudwatchlogs.Options.BaseEndpoint), so request encoding, response
// parsing and error mapping are exercised for real.
//
// It answers only what reads a log group: FilterLogEvents and
// DescribeSubscriptionFilters. Log groups, their subscription filters and
// their events are seeded with the Go methods (CreateLogGroup,
// PutSubscriptionFilter, PutLogEvent); nothing is delivered to a filter's
// destination. A log group that does not exist is a 400
// ResourceNotFoundException "The specified log group does not exist.", as
// from CloudWatch Logs.
//
// Filter patterns: FilterLogEvents takes the empty pattern (every event)
// and a single JSON comparison, { $.a.b = "value" } or { $.a != value },
// which is what Reaper's subscription filter uses; a JSON pattern matches
// only events whose message is a JSON object. Any other pattern is an
// InvalidParameterException saying so, rather than a wrong answer. Other
// actions answer UnknownOperationException. Requests are not
// authenticated.
//
// A Server is safe for concurrent use.
package logsserver

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The identity the server answers as: log group ARNs are
// arn:aws:logs:<Region>:<AccountID>:log-group:<name>.
const (
	AccountID = "123456789012"
	Region    = "us-east-1"
)

const (
	jsonContentType = "application/x-amz-json-1.1"
	targetPrefix    = "Logs_20140328."
	// maxFilterEvents is FilterLogEvents' largest and default limit.
	maxFilterEvents = 10000
	// maxSubscriptionFilters is DescribeSubscriptionFilters' largest and
	// default limit.
	maxSubscriptionFilters = 50
)

// Event is one log event.
type Event struct {
	Stream  string
	Time    time.Time
	Message string
}

// SubscriptionFilter is one subscription filter of a log group.
type SubscriptionFilter struct {
	Name           string
	Pattern        string
	DestinationARN string
}

type logGroup struct {
	created time.Time
	filters []SubscriptionFilter
	events  []storedEvent
}

type storedEvent struct {
	Event
	id       string
	ingested time.Time
}

// Server is a fake CloudWatch Logs endpoint on a loopback httptest server.
type Server struct {
	http *httptest.Server

	mu     sync.Mutex
	groups map[string]*logGroup // by name
}

// New starts a Server listening on 127.0.0.1. Close it when done.
func New() *Server {
	s := &Server{groups: map[string]*logGroup{}}
	s.http = httptest.NewServer(s)
	return s
}

// URL is the endpoint to give the SDK, e.g. http://127.0.0.1:41234.
func (s *Server) URL() string { return s.http.URL }

// Close shuts the listener down and waits for in-flight requests.
func (s *Server) Close() { s.http.Close() }

// CreateLogGroup creates the log group called name; an existing one keeps
// its filters and events.
func (s *Server) CreateLogGroup(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.groups[name]; !ok {
		s.groups[name] = &logGroup{created: time.Now()}
	}
}

// DeleteLogGroup deletes the log group called name with its filters and
// events.
func (s *Server) DeleteLogGroup(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.groups, name)
}

// PutSubscriptionFilter adds f to the log group, replacing a filter of the
// same name. It panics when the group does not exist: a mistake in the test.
func (s *Server) PutSubscriptionFilter(group string, f SubscriptionFilter) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.mustGroup(group)
	g.filters = slices.DeleteFunc(g.filters, func(old SubscriptionFilter) bool { return old.Name == f.Name })
	g.filters = append(g.filters, f)
}

// DeleteSubscriptionFilter removes the filter called name from the group.
func (s *Server) DeleteSubscriptionFilter(group, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.mustGroup(group)
	g.filters = slices.DeleteFunc(g.filters, func(f SubscriptionFilter) bool { return f.Name == name })
}

// PutLogEvent appends ev to the group, ingested now. It panics when the
// group does not exist: a mistake in the test.
func (s *Server) PutLogEvent(group string, ev Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.mustGroup(group)
	g.events = append(g.events, storedEvent{Event: ev, id: newID(), ingested: time.Now()})
}

func (s *Server) mustGroup(name string) *logGroup {
	g, ok := s.groups[name]
	if !ok {
		panic(fmt.Sprintf("logsserver: no log group %q", name))
	}
	return g
}

type apiError struct {
	code    string
	message string
}

var errNoGroup = &apiError{"ResourceNotFoundException", "The specified log group does not exist."}

// ServeHTTP implements the JSON protocol for the actions above.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	action, hasTarget := strings.CutPrefix(r.Header.Get("X-Amz-Target"), targetPrefix)
	body, err := io.ReadAll(r.Body)
	var (
		out  any
		aerr *apiError
	)
	switch {
	case r.Method != http.MethodPost || !hasTarget:
		aerr = &apiError{"UnknownOperationException", "logsserver expects POST with X-Amz-Target " + targetPrefix + "<Action>."}
	case err != nil:
		aerr = &apiError{"SerializationException", err.Error()}
	case action == "FilterLogEvents":
		out, aerr = s.filterLogEvents(body)
	case action == "DescribeSubscriptionFilters":
		out, aerr = s.describeSubscriptionFilters(body)
	default:
		aerr = &apiError{"UnknownOperationException", "logsserver does not answer " + action + "."}
	}
	w.Header().Set("Content-Type", jsonContentType)
	w.Header().Set("x-amzn-RequestId", newID())
	if aerr != nil {
		w.WriteHeader(http.StatusBadRequest)
		out = struct {
			Type    string `json:"__type"`
			Message string `json:"message"`
		}{aerr.code, aerr.message}
	}
	_ = json.NewEncoder(w).Encode(out)
}

// decode reads the request body into v.
func decode(body []byte, v any) *apiError {
	if err := json.Unmarshal(body, v); err != nil {
		return &apiError{"SerializationException", err.Error()}
	}
	return nil
}

// groupName resolves logGroupName or logGroupIdentifier (a name or an ARN).
func groupName(name, identifier string) (string, *apiError) {
	switch {
	case name != "" && identifier != "":
		return "", &apiError{"InvalidParameterException", "LogGroup name and LogGroup ARN are mutually exclusive parameters."}
	case identifier != "":
		_, n, ok := strings.Cut(identifier, ":log-group:")
		if !ok {
			return identifier, nil
		}
		return strings.TrimSuffix(n, ":*"), nil
	case name == "":
		return "", &apiError{"InvalidParameterException", "Either LogGroup name or LogGroup ARN must be specified."}
	}
	return name, nil
}

func (s *Server) filterLogEvents(body []byte) (any, *apiError) {
	var in struct {
		LogGroupName        string   `json:"logGroupName"`
		LogGroupIdentifier  string   `json:"logGroupIdentifier"`
		LogStreamNames      []string `json:"logStreamNames"`
		LogStreamNamePrefix string   `json:"logStreamNamePrefix"`
		StartTime           *int64   `json:"startTime"`
		EndTime             *int64   `json:"endTime"`
		FilterPattern       string   `json:"filterPattern"`
		NextToken           string   `json:"nextToken"`
		Limit               int      `json:"limit"`
	}
	if aerr := decode(body, &in); aerr != nil {
		return nil, aerr
	}
	name, aerr := groupName(in.LogGroupName, in.LogGroupIdentifier)
	if aerr != nil {
		return nil, aerr
	}
	if len(in.LogStreamNames) > 0 && in.LogStreamNamePrefix != "" {
		return nil, &apiError{"InvalidParameterException", "logStreamNames and logStreamNamePrefix are mutually exclusive parameters."}
	}
	limit := in.Limit
	switch {
	case limit == 0:
		limit = maxFilterEvents
	case limit < 1 || limit > maxFilterEvents:
		return nil, &apiError{"InvalidParameterException", fmt.Sprintf("limit %d is not between 1 and %d.", limit, maxFilterEvents)}
	}
	match, aerr := compilePattern(in.FilterPattern)
	if aerr != nil {
		return nil, aerr
	}
	start := 0
	if in.NextToken != "" {
		n, err := strconv.Atoi(in.NextToken)
		if err != nil || n < 0 {
			return nil, &apiError{"InvalidParameterException", "The specified nextToken is invalid."}
		}
		start = n
	}

	s.mu.Lock()
	g, ok := s.groups[name]
	var events []storedEvent
	if ok {
		events = slices.Clone(g.events)
	}
	s.mu.Unlock()
	if !ok {
		return nil, errNoGroup
	}
	slices.SortStableFunc(events, func(a, b storedEvent) int { return a.Time.Compare(b.Time) })

	type outEvent struct {
		LogStreamName string `json:"logStreamName"`
		Timestamp     int64  `json:"timestamp"`
		Message       string `json:"message"`
		IngestionTime int64  `json:"ingestionTime"`
		EventID       string `json:"eventId"`
	}
	var out struct {
		Events    []outEvent `json:"events"`
		NextToken string     `json:"nextToken,omitempty"`
	}
	out.Events = []outEvent{}
	for i := start; i < len(events); i++ {
		ev := events[i]
		ms := ev.Time.UnixMilli()
		switch {
		case in.StartTime != nil && ms < *in.StartTime, in.EndTime != nil && ms > *in.EndTime,
			len(in.LogStreamNames) > 0 && !slices.Contains(in.LogStreamNames, ev.Stream),
			!strings.HasPrefix(ev.Stream, in.LogStreamNamePrefix), !match(ev.Message):
			continue
		}
		if len(out.Events) == limit {
			out.NextToken = strconv.Itoa(i)
			break
		}
		out.Events = append(out.Events, outEvent{ev.Stream, ms, ev.Message, ev.ingested.UnixMilli(), ev.id})
	}
	return out, nil
}

func (s *Server) describeSubscriptionFilters(body []byte) (any, *apiError) {
	var in struct {
		LogGroupName     string `json:"logGroupName"`
		FilterNamePrefix string `json:"filterNamePrefix"`
		NextToken        string `json:"nextToken"`
		Limit            int    `json:"limit"`
	}
	if aerr := decode(body, &in); aerr != nil {
		return nil, aerr
	}
	if in.LogGroupName == "" {
		return nil, &apiError{"InvalidParameterException", "logGroupName is required."}
	}
	limit := in.Limit
	switch {
	case limit == 0:
		limit = maxSubscriptionFilters
	case limit < 1 || limit > maxSubscriptionFilters:
		return nil, &apiError{"InvalidParameterException", fmt.Sprintf("limit %d is not between 1 and %d.", limit, maxSubscriptionFilters)}
	}
	start := 0
	if in.NextToken != "" {
		n, err := strconv.Atoi(in.NextToken)
		if err != nil || n < 0 {
			return nil, &apiError{"InvalidParameterException", "The specified nextToken is invalid."}
		}
		start = n
	}
	s.mu.Lock()
	g, ok := s.groups[in.LogGroupName]
	var filters []SubscriptionFilter
	var created time.Time
	if ok {
		filters, created = slices.Clone(g.filters), g.created
	}
	s.mu.Unlock()
	if !ok {
		return nil, errNoGroup
	}
	type outFilter struct {
		FilterName     string `json:"filterName"`
		LogGroupName   string `json:"logGroupName"`
		FilterPattern  string `json:"filterPattern"`
		DestinationArn string `json:"destinationArn"`
		Distribution   string `json:"distribution"`
		CreationTime   int64  `json:"creationTime"`
	}
	var out struct {
		SubscriptionFilters []outFilter `json:"subscriptionFilters"`
		NextToken           string      `json:"nextToken,omitempty"`
	}
	out.SubscriptionFilters = []outFilter{}
	for i := start; i < len(filters); i++ {
		f := filters[i]
		if !strings.HasPrefix(f.Name, in.FilterNamePrefix) {
			continue
		}
		if len(out.SubscriptionFilters) == limit {
			out.NextToken = strconv.Itoa(i)
			break
		}
		out.SubscriptionFilters = append(out.SubscriptionFilters, outFilter{f.Name, in.LogGroupName, f.Pattern, f.DestinationARN, "ByLogStream", created.UnixMilli()})
	}
	return out, nil
}

// jsonComparison is the one JSON filter pattern this server evaluates:
// { $.path op value }, value quoted or bare.
var jsonComparison = regexp.MustCompile(`^\{\s*\$\.([A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)*)\s*(=|!=)\s*("(?:[^"\\]|\\.)*"|[^\s"{}]+)\s*\}$`)

// compilePattern returns the matcher of a filter pattern, or an
// InvalidParameterException for a pattern this server does not evaluate.
func compilePattern(pattern string) (func(message string) bool, *apiError) {
	if strings.TrimSpace(pattern) == "" {
		return func(string) bool { return true }, nil
	}
	m := jsonComparison.FindStringSubmatch(strings.TrimSpace(pattern))
	if m == nil {
		return nil, &apiError{"InvalidParameterException", fmt.Sprintf("logsserver evaluates only the empty pattern and { $.field = value }, not %q.", pattern)}
	}
	path, negate, want := strings.Split(m[1], "."), m[2] == "!=", m[3]
	if strings.HasPrefix(want, `"`) {
		if err := json.Unmarshal([]byte(want), &want); err != nil {
			return nil, &apiError{"InvalidParameterException", fmt.Sprintf("Invalid filter pattern %q: %v", pattern, err)}
		}
	}
	return func(message string) bool {
		var v any
		if json.Unmarshal([]byte(message), &v) != nil {
			return false
		}
		for _, key := range path {
			obj, ok := v.(map[string]any)
			if !ok {
				return false
			}
			if v, ok = obj[key]; !ok {
				return false
			}
		}
		var got string
		switch v := v.(type) {
		case string:
			got = v
		case float64:
			got = strconv.FormatFloat(v, 'f', -1, 64)
		case bool:
			got = strconv.FormatBool(v)
		default:
			return false
		}
		return (got == want) != negate
	}, nil
}

func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
