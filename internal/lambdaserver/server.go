// Package lambdaserver is an in-process stand-in for the AWS Lambda control
// plane, speaking the REST-JSON protocol that aws-sdk-go-v2's lambda client
// uses. Tests point the real client at it (AWS_ENDPOINT_URL_LAMBDA, or
// lambda.Options.BaseEndpoint), so request encoding, response parsing and
// error mapping are exercised for real.
//
// It answers only GetFunction (GET /2015-03-31/functions/{name}), by name,
// full ARN or partial ARN (123456789012:function:name), of $LATEST: a
// function that does not exist, or a version or alias, is a 404
// ResourceNotFoundException "Function not found: <arn>", as from Lambda.
// Functions are seeded with PutFunction; nothing runs (the lab runs function
// code in the Lambda runtime interface emulator, see internal/labstack).
// Other requests answer 404 UnknownOperationException. Requests are not
// authenticated.
//
// A Server is safe for concurrent use.
package lambdaserver

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
)

// The identity the server answers as: function ARNs are
// arn:aws:lambda:<Region>:<AccountID>:function:<name>.
const (
	AccountID = "123456789012"
	Region    = "us-east-1"
)

// Function is one function's configuration.
type Function struct {
	Name string
	// Environment holds the function's environment variables.
	Environment map[string]string
	// State is Active (the default), Pending, Inactive or Failed.
	State string
	// StateReason says why, for a state that is not Active.
	StateReason string
	// LastUpdateStatus is Successful (the default), InProgress or Failed.
	LastUpdateStatus string
}

// ARN is the function's ARN.
func (f Function) ARN() string {
	return "arn:aws:lambda:" + Region + ":" + AccountID + ":function:" + f.Name
}

// Server is a fake Lambda endpoint on a loopback httptest server.
type Server struct {
	http *httptest.Server

	mu        sync.Mutex
	functions map[string]Function // by name
}

// New starts a Server listening on 127.0.0.1. Close it when done.
func New() *Server {
	s := &Server{functions: map[string]Function{}}
	s.http = httptest.NewServer(s)
	return s
}

// URL is the endpoint to give the SDK, e.g. http://127.0.0.1:41234.
func (s *Server) URL() string { return s.http.URL }

// Close shuts the listener down and waits for in-flight requests.
func (s *Server) Close() { s.http.Close() }

// PutFunction stores fn, replacing any function of the same name, with
// defaults filled in, and returns what it stored.
func (s *Server) PutFunction(fn Function) Function {
	if fn.State == "" {
		fn.State = "Active"
	}
	if fn.LastUpdateStatus == "" {
		fn.LastUpdateStatus = "Successful"
	}
	fn.Environment = maps.Clone(fn.Environment)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.functions[fn.Name] = fn
	return fn
}

// DeleteFunction forgets the function called name.
func (s *Server) DeleteFunction(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.functions, name)
}

const functionsPath = "/2015-03-31/functions/"

// functionRef is what GetFunction's FunctionName takes: a name, a full ARN
// or a partial ARN, each with an optional :qualifier.
var functionRef = regexp.MustCompile(`^(?:arn:aws[a-zA-Z-]*:lambda:[a-z0-9-]+:)?(?:(\d{12}):function:)?([a-zA-Z0-9_-]{1,140})(?::(\$LATEST|[a-zA-Z0-9_-]+))?$`)

// ServeHTTP implements GetFunction.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("x-amzn-RequestId", newRequestID())
	raw, ok := strings.CutPrefix(r.URL.EscapedPath(), functionsPath)
	ref, err := url.PathUnescape(raw)
	if !ok || err != nil || r.Method != http.MethodGet || ref == "" || strings.Contains(ref, "/") {
		writeError(w, http.StatusNotFound, "UnknownOperationException", "lambdaserver answers only GetFunction")
		return
	}
	m := functionRef.FindStringSubmatch(ref)
	if m == nil {
		writeError(w, http.StatusBadRequest, "InvalidParameterValueException", fmt.Sprintf("1 validation error detected: Value '%s' at 'functionName' failed to satisfy constraint", ref))
		return
	}
	account, name, qualifier := m[1], m[2], m[3]
	if q := r.URL.Query().Get("Qualifier"); q != "" {
		qualifier = q
	}
	s.mu.Lock()
	fn, found := s.functions[name]
	s.mu.Unlock()
	arn := Function{Name: name}.ARN()
	if qualifier != "" && qualifier != "$LATEST" {
		arn += ":" + qualifier
		found = false // no versions or aliases here
	}
	if !found || (account != "" && account != AccountID) {
		writeError(w, http.StatusNotFound, "ResourceNotFoundException", "Function not found: "+arn)
		return
	}
	type environment struct {
		Variables map[string]string `json:"Variables"`
	}
	type configuration struct {
		FunctionName     string       `json:"FunctionName"`
		FunctionArn      string       `json:"FunctionArn"`
		Runtime          string       `json:"Runtime"`
		Handler          string       `json:"Handler"`
		Version          string       `json:"Version"`
		State            string       `json:"State"`
		StateReason      string       `json:"StateReason,omitempty"`
		LastUpdateStatus string       `json:"LastUpdateStatus"`
		PackageType      string       `json:"PackageType"`
		Environment      *environment `json:"Environment,omitempty"`
	}
	out := struct {
		Configuration configuration     `json:"Configuration"`
		Code          map[string]string `json:"Code"`
	}{
		Configuration: configuration{
			FunctionName: fn.Name, FunctionArn: fn.ARN(), Runtime: "provided.al2023", Handler: "bootstrap", Version: "$LATEST",
			State: fn.State, StateReason: fn.StateReason, LastUpdateStatus: fn.LastUpdateStatus, PackageType: "Zip",
		},
		Code: map[string]string{"RepositoryType": "S3", "Location": "https://awslambda-" + Region + "-tasks.s3.amazonaws.com/snapshots/" + AccountID + "/" + fn.Name},
	}
	if fn.Environment != nil {
		out.Configuration.Environment = &environment{Variables: fn.Environment}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

func writeError(w http.ResponseWriter, status int, code, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Amzn-ErrorType", code)
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(struct {
		Type    string `json:"Type"`
		Message string `json:"Message"`
	}{"User", message})
}

func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}
