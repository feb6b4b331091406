// Package cfnserver is an in-process stand-in for AWS CloudFormation,
// speaking the Query protocol (POST / with a form body, Action=<Action>,
// Version=2010-05-15; XML answers) that aws-sdk-go-v2's cloudformation
// client uses. Tests point the real client at it (AWS_ENDPOINT_URL_CLOUDFORMATION,
// or cloudformation.Options.BaseEndpoint), so request encoding, response
// parsing and error mapping are exercised for real.
//
// It answers only what reads a deployed stack: DescribeStacks (one stack by
// name or id, or every stack) and ListStackResources (pages of 100, as
// CloudFormation gives). A stack that does not exist is a 400 ValidationError
// "Stack with id <name> does not exist", as from CloudFormation. Stacks are
// seeded with PutStack, not deployed: there are no templates, change sets
// or events. Other actions answer InvalidAction. Requests are not
// authenticated.
//
// A Server is safe for concurrent use.
package cfnserver

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/xml"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"time"
)

// The identity the server answers as: stack ids are
// arn:aws:cloudformation:<Region>:<AccountID>:stack/<name>/<uuid>.
const (
	AccountID = "123456789012"
	Region    = "us-east-1"
)

// apiVersion is the Query API version the SDK sends.
const apiVersion = "2010-05-15"

// resourcesPerPage is how many resources ListStackResources returns a
// page: CloudFormation's fixed page size for it.
const resourcesPerPage = 100

// Stack is one deployed stack.
type Stack struct {
	Name string
	// Status is the StackStatus, e.g. CREATE_COMPLETE (the default).
	Status string
	// Outputs are the stack's outputs by key.
	Outputs map[string]string
	// Resources are the stack's resources, in the order ListStackResources
	// returns them.
	Resources []Resource
	// ID is set by PutStack: the stack's ARN.
	ID string
	// Created is set by PutStack when zero.
	Created time.Time
}

// Resource is one resource of a stack.
type Resource struct {
	LogicalID  string
	PhysicalID string
	Type       string // e.g. AWS::Lambda::Function
	// Status is the ResourceStatus, e.g. CREATE_COMPLETE (the default).
	Status string
}

// Server is a fake CloudFormation endpoint on a loopback httptest server.
type Server struct {
	http *httptest.Server

	mu     sync.Mutex
	stacks map[string]Stack // by name
	// order is the stacks' names as PutStack first put them: the order
	// DescribeStacks lists them in, as CloudFormation's is stable.
	order []string
}

// New starts a Server listening on 127.0.0.1. Close it when done.
func New() *Server {
	s := &Server{stacks: map[string]Stack{}}
	s.http = httptest.NewServer(s)
	return s
}

// URL is the endpoint to give the SDK, e.g. http://127.0.0.1:41234.
func (s *Server) URL() string { return s.http.URL }

// Close shuts the listener down and waits for in-flight requests.
func (s *Server) Close() { s.http.Close() }

// PutStack stores st, replacing any stack of the same name (keeping its
// id), with defaults filled in, and returns what it stored.
func (s *Server) PutStack(st Stack) Stack {
	if st.Status == "" {
		st.Status = "CREATE_COMPLETE"
	}
	if st.Created.IsZero() {
		st.Created = time.Now().UTC().Truncate(time.Second)
	}
	st.Resources = slices.Clone(st.Resources)
	for i := range st.Resources {
		if st.Resources[i].Status == "" {
			st.Resources[i].Status = "CREATE_COMPLETE"
		}
	}
	st.Outputs = maps.Clone(st.Outputs)
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.stacks[st.Name]; ok {
		st.ID = old.ID
	} else {
		st.ID = fmt.Sprintf("arn:aws:cloudformation:%s:%s:stack/%s/%s", Region, AccountID, st.Name, newUUID())
		s.order = append(s.order, st.Name)
	}
	s.stacks[st.Name] = st
	return st
}

// Stack returns the stack called name as stored.
func (s *Server) Stack(name string) (Stack, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.stacks[name]
	return st, ok
}

// DeleteStack forgets the stack called name, as CloudFormation does once a
// deletion completes.
func (s *Server) DeleteStack(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.stacks, name)
	s.order = slices.DeleteFunc(s.order, func(n string) bool { return n == name })
}

type apiError struct {
	status  int
	code    string
	message string
}

// ServeHTTP implements the Query protocol for the actions above.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	reqID := newUUID()
	if r.Method != http.MethodPost {
		writeError(w, reqID, &apiError{http.StatusBadRequest, "InvalidAction", "cfnserver expects POST with a form body."})
		return
	}
	if err := r.ParseForm(); err != nil {
		writeError(w, reqID, &apiError{http.StatusBadRequest, "MalformedQueryString", err.Error()})
		return
	}
	if v := r.PostForm.Get("Version"); v != apiVersion {
		writeError(w, reqID, &apiError{http.StatusBadRequest, "InvalidParameterValue", fmt.Sprintf("Version %q is not %s.", v, apiVersion)})
		return
	}
	var (
		out  any
		aerr *apiError
	)
	switch action := r.PostForm.Get("Action"); action {
	case "DescribeStacks":
		out, aerr = s.describeStacks(r.PostForm.Get("StackName"), reqID)
	case "ListStackResources":
		out, aerr = s.listStackResources(r.PostForm.Get("StackName"), r.PostForm.Get("NextToken"), reqID)
	default:
		aerr = &apiError{http.StatusBadRequest, "InvalidAction", fmt.Sprintf("The action %s is not valid for this web service.", action)}
	}
	if aerr != nil {
		writeError(w, reqID, aerr)
		return
	}
	w.Header().Set("Content-Type", "text/xml")
	w.Header().Set("x-amzn-RequestId", reqID)
	body, err := xml.Marshal(out)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	_, _ = w.Write(append([]byte(xml.Header), body...))
}

// lookup finds a stack by name or by id, as StackName takes either.
func (s *Server) lookup(nameOrID string) (Stack, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st, ok := s.stacks[nameOrID]; ok {
		return st, nil
	}
	for _, st := range s.stacks {
		if st.ID == nameOrID {
			return st, nil
		}
	}
	return Stack{}, &apiError{http.StatusBadRequest, "ValidationError", fmt.Sprintf("Stack with id %s does not exist", nameOrID)}
}

func (s *Server) describeStacks(name, reqID string) (any, *apiError) {
	var stacks []Stack
	if name != "" {
		st, aerr := s.lookup(name)
		if aerr != nil {
			return nil, aerr
		}
		stacks = append(stacks, st)
	} else {
		s.mu.Lock()
		for _, name := range s.order {
			if st, ok := s.stacks[name]; ok {
				stacks = append(stacks, st)
			}
		}
		s.mu.Unlock()
	}
	out := describeStacksResponse{Xmlns: xmlns, RequestID: reqID}
	for _, st := range stacks {
		x := xmlStack{Name: st.Name, ID: st.ID, Status: st.Status, Created: st.Created.Format(time.RFC3339)}
		for _, k := range slices.Sorted(maps.Keys(st.Outputs)) {
			x.Outputs = append(x.Outputs, xmlOutput{Key: k, Value: st.Outputs[k]})
		}
		out.Stacks = append(out.Stacks, x)
	}
	return out, nil
}

func (s *Server) listStackResources(name, token, reqID string) (any, *apiError) {
	if name == "" {
		return nil, &apiError{http.StatusBadRequest, "ValidationError", "1 validation error detected: Value null at 'stackName' failed to satisfy constraint: Member must not be null"}
	}
	st, aerr := s.lookup(name)
	if aerr != nil {
		return nil, aerr
	}
	start := 0
	if token != "" {
		n, err := strconv.Atoi(token)
		if err != nil || n < 0 || n > len(st.Resources) {
			return nil, &apiError{http.StatusBadRequest, "ValidationError", fmt.Sprintf("Invalid NextToken %q", token)}
		}
		start = n
	}
	end := min(start+resourcesPerPage, len(st.Resources))
	out := listStackResourcesResponse{Xmlns: xmlns, RequestID: reqID}
	for _, res := range st.Resources[start:end] {
		out.Resources = append(out.Resources, xmlResource(res))
	}
	if end < len(st.Resources) {
		out.NextToken = strconv.Itoa(end)
	}
	return out, nil
}

const xmlns = "http://cloudformation.amazonaws.com/doc/2010-05-15/"

type describeStacksResponse struct {
	XMLName   xml.Name   `xml:"DescribeStacksResponse"`
	Xmlns     string     `xml:"xmlns,attr"`
	Stacks    []xmlStack `xml:"DescribeStacksResult>Stacks>member"`
	RequestID string     `xml:"ResponseMetadata>RequestId"`
}

type xmlStack struct {
	Name    string      `xml:"StackName"`
	ID      string      `xml:"StackId"`
	Status  string      `xml:"StackStatus"`
	Created string      `xml:"CreationTime"`
	Outputs []xmlOutput `xml:"Outputs>member"`
}

type xmlOutput struct {
	Key   string `xml:"OutputKey"`
	Value string `xml:"OutputValue"`
}

type listStackResourcesResponse struct {
	XMLName   xml.Name      `xml:"ListStackResourcesResponse"`
	Xmlns     string        `xml:"xmlns,attr"`
	Resources []xmlResource `xml:"ListStackResourcesResult>StackResourceSummaries>member"`
	NextToken string        `xml:"ListStackResourcesResult>NextToken,omitempty"`
	RequestID string        `xml:"ResponseMetadata>RequestId"`
}

type xmlResource struct {
	LogicalID  string `xml:"LogicalResourceId"`
	PhysicalID string `xml:"PhysicalResourceId"`
	Type       string `xml:"ResourceType"`
	Status     string `xml:"ResourceStatus"`
}

type errorResponse struct {
	XMLName   xml.Name `xml:"ErrorResponse"`
	Xmlns     string   `xml:"xmlns,attr"`
	Type      string   `xml:"Error>Type"`
	Code      string   `xml:"Error>Code"`
	Message   string   `xml:"Error>Message"`
	RequestID string   `xml:"RequestId"`
}

func writeError(w http.ResponseWriter, reqID string, e *apiError) {
	body, _ := xml.Marshal(errorResponse{Xmlns: xmlns, Type: "Sender", Code: e.code, Message: e.message, RequestID: reqID})
	w.Header().Set("Content-Type", "text/xml")
	w.Header().Set("x-amzn-RequestId", reqID)
	w.WriteHeader(e.status)
	_, _ = w.Write(append([]byte(xml.Header), body...))
}

func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}
