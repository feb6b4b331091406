package ec2server

import (
	"cmp"
	"crypto/rand"
	"encoding/base64"
	"encoding/xml"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/reaper-k8s/reaper/internal/callrecord"
	"github.com/reaper-k8s/reaper/pkg/model"
)

const (
	xmlns   = "http://ec2.amazonaws.com/doc/2016-11-15/"
	ownerID = "123456789012"
	// maxIDs is EC2's limit on InstanceId.N for the instance actions.
	maxIDs = 1000
)

// apiError is an EC2 error answer.
type apiError struct {
	status  int
	code    string
	message string
}

func errorf(code, format string, args ...any) *apiError {
	return &apiError{status: defaultStatus(code), code: code, message: fmt.Sprintf(format, args...)}
}

// ServeHTTP implements the EC2 Query protocol: form-encoded parameters in a
// POST body (or GET query), XML answers.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	reqID := requestID()
	if err := r.ParseForm(); err != nil {
		writeError(w, reqID, errorf("InvalidParameterValue", "cannot parse the request: %v", err))
		return
	}
	action := r.Form.Get("Action")
	ids := indexedList(r.Form, "InstanceId")
	now := time.Now()

	s.mu.Lock()
	call := Call{Call: callrecord.Call{Action: action, Time: now}, InstanceIDs: ids, Params: cloneValues(r.Form)}
	var (
		body any
		aerr *apiError
	)
	if f := s.takeFault(action, now); f != nil {
		call.Injected = true
		aerr = &apiError{status: f.status, code: f.code, message: faultMessage(f.code)}
	} else if !s.admit(action, r.Form, ids, now) {
		call.Refused = true
		aerr = errorf("RequestLimitExceeded", "Request limit exceeded.")
	} else {
		for _, rec := range s.instances {
			rec.advance(now)
		}
		body, aerr = s.dispatch(action, r.Form, ids, now, reqID)
	}
	if aerr != nil {
		call.ErrorCode = aerr.code
	}
	s.calls.Add(call)
	s.mu.Unlock()

	if aerr != nil {
		writeError(w, reqID, aerr)
		return
	}
	writeXML(w, http.StatusOK, body)
}

// dispatch runs one action. Called with s.mu held.
func (s *Server) dispatch(action string, form url.Values, ids []string, now time.Time, reqID string) (any, *apiError) {
	switch action {
	case "":
		return nil, errorf("MissingAction", "The request must contain the parameter Action")
	case "DescribeInstances":
		return s.describeInstances(form, ids, reqID)
	case "TerminateInstances":
		return s.terminateInstances(form, ids, now, reqID)
	case "RunInstances":
		return s.runInstances(form, now, reqID)
	case "CreateTags":
		return s.createTags(form, reqID)
	default:
		return nil, errorf("InvalidAction", "The action %s is not valid for this web service.", action)
	}
}

// runInstances launches MinCount instances, running at once, with the tags
// of the TagSpecification.N whose ResourceType is instance: enough for a
// provider that launches one instance per Pod. Other launch parameters are
// accepted and recorded in the call, not modeled.
func (s *Server) runInstances(form url.Values, now time.Time, reqID string) (any, *apiError) {
	n, err := strconv.Atoi(form.Get("MinCount"))
	if err != nil || n < 1 || n > maxIDs {
		return nil, errorf("InvalidParameterValue", "Value (%s) for parameter minCount is invalid.", form.Get("MinCount"))
	}
	tags := map[string]string{}
	for _, i := range indexes(form, "TagSpecification", ".ResourceType") {
		prefix := "TagSpecification." + strconv.Itoa(i)
		if form.Get(prefix+".ResourceType") != "instance" {
			continue
		}
		for _, j := range indexes(form, prefix+".Tag", ".Key") {
			tag := prefix + ".Tag." + strconv.Itoa(j)
			tags[form.Get(tag+".Key")] = form.Get(tag + ".Value")
		}
	}
	metadataTags := form.Get("MetadataOptions.InstanceMetadataTags") == "enabled"
	if metadataTags {
		if aerr := metadataTagKeys(slices.Collect(maps.Keys(tags))); aerr != nil {
			return nil, aerr
		}
	}
	if form.Get("DryRun") == "true" {
		return nil, errorf("DryRunOperation", "Request would have succeeded, but DryRun flag is set.")
	}
	s.seq++
	out := runResponse{Xmlns: xmlns, RequestID: reqID, ReservationID: fmt.Sprintf("r-%017x", s.seq), OwnerID: ownerID}
	for range n {
		inst := Instance{ID: NewInstanceID(), State: Running, Tags: maps.Clone(tags),
			LaunchTime: now.UTC().Truncate(time.Millisecond), InstanceType: form.Get("InstanceType"), MetadataTags: metadataTags}
		s.seq++
		s.instances[inst.ID] = &record{inst: inst, seq: s.seq}
		out.Instances = append(out.Instances, toXML(inst))
	}
	return out, nil
}

// createTags puts the tags Tag.N on the instances ResourceId.N, all or
// nothing, like EC2: at most 1,000 resources; one unknown id, or a key an
// instance whose metadata shows its tags cannot carry, fails the request.
func (s *Server) createTags(form url.Values, reqID string) (any, *apiError) {
	ids := indexedList(form, "ResourceId")
	if len(ids) == 0 || len(ids) > maxIDs {
		return nil, errorf("InvalidParameterValue", "CreateTags takes 1 to %d resource ids, not %d.", maxIDs, len(ids))
	}
	tags := map[string]string{}
	for _, j := range indexes(form, "Tag", ".Key") {
		tag := "Tag." + strconv.Itoa(j)
		tags[form.Get(tag+".Key")] = form.Get(tag + ".Value")
	}
	if len(tags) == 0 {
		return nil, errorf("MissingParameter", "The request must contain the parameter Tag.")
	}
	recs, aerr := s.lookup(ids)
	if aerr != nil {
		return nil, aerr
	}
	for _, rec := range recs {
		if rec.inst.MetadataTags {
			if aerr := metadataTagKeys(slices.Collect(maps.Keys(tags))); aerr != nil {
				return nil, aerr
			}
		}
	}
	for _, rec := range recs {
		if rec.inst.Tags == nil {
			rec.inst.Tags = map[string]string{}
		}
		maps.Copy(rec.inst.Tags, tags)
	}
	return createTagsResponse{Xmlns: xmlns, RequestID: reqID, Return: true}, nil
}

// metadataTagKeys refuses keys that an instance whose metadata shows its
// tags cannot carry.
func metadataTagKeys(keys []string) *apiError {
	slices.Sort(keys)
	for _, k := range keys {
		if !model.ValidMetadataTagKey(k) {
			return errorf("InvalidParameterValue", "Tag key %q is not allowed on an instance whose tags are in its instance metadata: use only letters, digits and + - = . , _ : @.", k)
		}
	}
	return nil
}

// lookup resolves ids all-or-nothing, like EC2: one malformed or unknown id
// fails the whole request.
func (s *Server) lookup(ids []string) ([]*record, *apiError) {
	var missing []string
	recs := make([]*record, 0, len(ids))
	for _, id := range ids {
		if !idPattern.MatchString(id) {
			return nil, errorf("InvalidInstanceID.Malformed", "Invalid id: %q", id)
		}
		if r, ok := s.instances[id]; ok {
			recs = append(recs, r)
		} else {
			missing = append(missing, id)
		}
	}
	switch len(missing) {
	case 0:
		return recs, nil
	case 1:
		return nil, errorf("InvalidInstanceID.NotFound", "The instance ID '%s' does not exist", missing[0])
	default:
		return nil, errorf("InvalidInstanceID.NotFound", "The instance IDs '%s' do not exist", strings.Join(missing, ", "))
	}
}

func (s *Server) describeInstances(form url.Values, ids []string, reqID string) (any, *apiError) {
	maxResults := 0
	if v := form.Get("MaxResults"); v != "" {
		if len(ids) > 0 {
			return nil, errorf("InvalidParameterCombination", "The parameter instancesSet cannot be used with the parameter maxResults")
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 5 || n > 1000 {
			return nil, errorf("InvalidParameterValue", "Value ( %s ) for parameter maxResults is invalid. Expecting a value between 5 and 1000.", v)
		}
		maxResults = n
	}
	var after int64
	if tok := form.Get("NextToken"); tok != "" {
		var ok bool
		if after, ok = parseToken(tok); !ok {
			return nil, errorf("InvalidPaginationToken", "The pagination token %q is not valid or is expired.", tok)
		}
	}
	filters, aerr := parseFilters(form)
	if aerr != nil {
		return nil, aerr
	}

	var recs []*record
	if len(ids) > 0 {
		if recs, aerr = s.lookup(ids); aerr != nil {
			return nil, aerr
		}
		recs = dedupe(recs)
		slices.SortFunc(recs, bySeq)
	} else if named, ok := filters.exactIDs(); ok {
		// Reaper names instances by an instance-id filter: answer from the
		// index rather than scanning every instance, so the server's cost
		// per call does not grow with the fleet the benchmarks build.
		for _, id := range named {
			if r, ok := s.instances[id]; ok {
				recs = append(recs, r)
			}
		}
		recs = dedupe(recs)
		slices.SortFunc(recs, bySeq)
	} else {
		for _, r := range s.instances {
			recs = append(recs, r)
		}
		slices.SortFunc(recs, bySeq)
	}

	out := describeResponse{Xmlns: xmlns, RequestID: reqID}
	for _, r := range recs {
		if r.seq <= after || !filters.match(r.inst) {
			continue
		}
		if maxResults > 0 && len(out.Reservations) == maxResults {
			// The token names the last instance returned, so instances added
			// or removed between pages neither repeat nor shift the window.
			out.NextToken = makeToken(out.Reservations[len(out.Reservations)-1].seq)
			break
		}
		// One reservation per instance, as RunInstances with count 1 gives.
		out.Reservations = append(out.Reservations, xmlReservation{
			ReservationID: fmt.Sprintf("r-%017x", r.seq),
			OwnerID:       ownerID,
			Instances:     []xmlInstance{toXML(r.inst)},
			seq:           r.seq,
		})
	}
	return out, nil
}

func bySeq(a, b *record) int { return cmp.Compare(a.seq, b.seq) }

// dedupe drops repeated records, keeping the first of each.
func dedupe(recs []*record) []*record {
	seen := make(map[*record]bool, len(recs))
	return slices.DeleteFunc(recs, func(r *record) bool {
		dup := seen[r]
		seen[r] = true
		return dup
	})
}

// terminateInstances moves every instance named to shutting-down, which
// settles as terminated (SetTransitionDelay), from any state: EC2 terminates
// pending, running, stopping and stopped instances alike. One already
// shutting down keeps its schedule, and one already terminated stays so,
// reported again as EC2 does.
func (s *Server) terminateInstances(form url.Values, ids []string, now time.Time, reqID string) (any, *apiError) {
	if len(ids) == 0 {
		return nil, errorf("MissingParameter", "The request must contain the parameter InstanceId")
	}
	if len(ids) > maxIDs {
		return nil, errorf("InvalidRequest", "%d exceeds the maximum number of instance IDs that can be specified (%d). Please specify fewer than %d instance IDs.", len(ids), maxIDs, maxIDs)
	}
	recs, aerr := s.lookup(ids)
	if aerr != nil {
		return nil, aerr
	}
	recs = dedupe(recs) // an id named twice changes state once
	// Validate every instance before changing any: the request is atomic.
	for _, r := range recs {
		if r.inst.DisableAPITermination {
			return nil, errorf("OperationNotPermitted", "The instance '%s' may not be terminated. Modify its 'disableApiTermination' instance attribute and try again.", r.inst.ID)
		}
	}
	if form.Get("DryRun") == "true" {
		return nil, errorf("DryRunOperation", "Request would have succeeded, but DryRun flag is set.")
	}

	out := terminateResponse{Xmlns: xmlns, RequestID: reqID}
	for _, r := range recs {
		prev := r.inst.State
		if prev != ShuttingDown && prev != Terminated {
			r.inst.State = ShuttingDown
			r.inst.StateReason = StateReason{Code: "Client.UserInitiatedShutdown", Message: "Client.UserInitiatedShutdown: User initiated shutdown"}
			r.target, r.at = Terminated, now.Add(s.settle)
		}
		cur := r.inst.State
		out.Instances = append(out.Instances, xmlStateChange{
			InstanceID:    r.inst.ID,
			CurrentState:  xmlState{Code: cur.Code(), Name: string(cur)},
			PreviousState: xmlState{Code: prev.Code(), Name: string(prev)},
		})
	}
	return out, nil
}

// filterSet is DescribeInstances' Filter.N: filters AND, values within one
// filter OR.
type filterSet []filter

type filter struct {
	name   string
	values []string
}

func parseFilters(form url.Values) (filterSet, *apiError) {
	var fs filterSet
	for _, i := range indexes(form, "Filter", ".Name") {
		prefix := "Filter." + strconv.Itoa(i)
		f := filter{name: form.Get(prefix + ".Name"), values: indexedList(form, prefix+".Value")}
		switch {
		case strings.HasPrefix(f.name, "tag:"), f.name == "tag-key", f.name == "tag-value",
			f.name == "instance-state-name", f.name == "instance-state-code", f.name == "instance-id":
		default:
			return nil, errorf("InvalidParameterValue", "The filter '%s' is invalid", f.name)
		}
		fs = append(fs, f)
	}
	return fs, nil
}

// exactIDs returns the values of an instance-id filter when there is one
// and none of its values is a wildcard pattern.
func (fs filterSet) exactIDs() ([]string, bool) {
	for _, f := range fs {
		if f.name == "instance-id" && !slices.ContainsFunc(f.values, func(v string) bool { return strings.ContainsAny(v, "*?") }) {
			return f.values, true
		}
	}
	return nil, false
}

func (fs filterSet) match(inst Instance) bool {
	for _, f := range fs {
		if !f.match(inst) {
			return false
		}
	}
	return true
}

func (f filter) match(inst Instance) bool {
	matchAny := func(candidates ...string) bool {
		for _, c := range candidates {
			for _, pattern := range f.values {
				if glob(pattern, c) {
					return true
				}
			}
		}
		return false
	}
	switch {
	case strings.HasPrefix(f.name, "tag:"):
		v, ok := inst.Tags[strings.TrimPrefix(f.name, "tag:")]
		return ok && matchAny(v)
	case f.name == "tag-key":
		for k := range inst.Tags {
			if matchAny(k) {
				return true
			}
		}
		return false
	case f.name == "tag-value":
		for _, v := range inst.Tags {
			if matchAny(v) {
				return true
			}
		}
		return false
	case f.name == "instance-state-name":
		return matchAny(string(inst.State))
	case f.name == "instance-state-code":
		return matchAny(strconv.Itoa(int(inst.State.Code())))
	case f.name == "instance-id":
		return matchAny(inst.ID)
	}
	return false
}

// glob matches EC2 filter wildcards: * (any run) and ? (one character).
func glob(pattern, s string) bool {
	if !strings.ContainsAny(pattern, "*?") {
		return pattern == s
	}
	p, str := []rune(pattern), []rune(s)
	pi, si, star, mark := 0, 0, -1, 0
	for si < len(str) {
		switch {
		case pi < len(p) && (p[pi] == '?' || p[pi] == str[si]):
			pi++
			si++
		case pi < len(p) && p[pi] == '*':
			star, mark = pi, si
			pi++
		case star >= 0:
			pi = star + 1
			mark++
			si = mark
		default:
			return false
		}
	}
	for pi < len(p) && p[pi] == '*' {
		pi++
	}
	return pi == len(p)
}

// indexedList reads a Query-protocol list: prefix.1, prefix.2, ... in index
// order (gaps allowed, as the protocol does not forbid them).
func indexedList(form url.Values, prefix string) []string {
	var out []string
	for _, i := range indexes(form, prefix, "") {
		out = append(out, form.Get(prefix+"."+strconv.Itoa(i)))
	}
	return out
}

// indexes returns the sorted N of every key "prefix.N<suffix>" in form.
func indexes(form url.Values, prefix, suffix string) []int {
	var out []int
	for k := range form {
		rest, ok := strings.CutPrefix(k, prefix+".")
		if !ok {
			continue
		}
		if rest, ok = strings.CutSuffix(rest, suffix); !ok {
			continue
		}
		if n, err := strconv.Atoi(rest); err == nil && n > 0 {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

func makeToken(seq int64) string {
	return base64.RawURLEncoding.EncodeToString([]byte("after:" + strconv.FormatInt(seq, 10)))
}

func parseToken(tok string) (int64, bool) {
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return 0, false
	}
	v, ok := strings.CutPrefix(string(b), "after:")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(v, 10, 64)
	return n, err == nil
}

func faultMessage(code string) string {
	switch code {
	case "RequestLimitExceeded":
		return "Request limit exceeded."
	case "InternalError":
		return "An internal error has occurred."
	}
	return "Injected fault."
}

func requestID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// XML shapes. Element names are what the SDK's ec2query deserializers read.

type describeResponse struct {
	XMLName      xml.Name         `xml:"DescribeInstancesResponse"`
	Xmlns        string           `xml:"xmlns,attr"`
	RequestID    string           `xml:"requestId"`
	Reservations []xmlReservation `xml:"reservationSet>item"`
	NextToken    string           `xml:"nextToken,omitempty"`
}

type runResponse struct {
	XMLName       xml.Name      `xml:"RunInstancesResponse"`
	Xmlns         string        `xml:"xmlns,attr"`
	RequestID     string        `xml:"requestId"`
	ReservationID string        `xml:"reservationId"`
	OwnerID       string        `xml:"ownerId"`
	Instances     []xmlInstance `xml:"instancesSet>item"`
}

type createTagsResponse struct {
	XMLName   xml.Name `xml:"CreateTagsResponse"`
	Xmlns     string   `xml:"xmlns,attr"`
	RequestID string   `xml:"requestId"`
	Return    bool     `xml:"return"`
}

type xmlReservation struct {
	ReservationID string        `xml:"reservationId"`
	OwnerID       string        `xml:"ownerId"`
	Instances     []xmlInstance `xml:"instancesSet>item"`
	seq           int64
}

type xmlInstance struct {
	InstanceID   string          `xml:"instanceId"`
	InstanceType string          `xml:"instanceType,omitempty"`
	LaunchTime   string          `xml:"launchTime"`
	State        xmlState        `xml:"instanceState"`
	StateReason  *xmlStateReason `xml:"stateReason,omitempty"`
	Reason       string          `xml:"reason"`
	Tags         []xmlTag        `xml:"tagSet>item,omitempty"`
}

type xmlState struct {
	Code int32  `xml:"code"`
	Name string `xml:"name"`
}

type xmlStateReason struct {
	Code    string `xml:"code"`
	Message string `xml:"message"`
}

type xmlTag struct {
	Key   string `xml:"key"`
	Value string `xml:"value"`
}

type terminateResponse struct {
	XMLName   xml.Name         `xml:"TerminateInstancesResponse"`
	Xmlns     string           `xml:"xmlns,attr"`
	RequestID string           `xml:"requestId"`
	Instances []xmlStateChange `xml:"instancesSet>item"`
}

type xmlStateChange struct {
	InstanceID    string   `xml:"instanceId"`
	CurrentState  xmlState `xml:"currentState"`
	PreviousState xmlState `xml:"previousState"`
}

type xmlErrorResponse struct {
	XMLName   xml.Name `xml:"Response"`
	Code      string   `xml:"Errors>Error>Code"`
	Message   string   `xml:"Errors>Error>Message"`
	RequestID string   `xml:"RequestID"`
}

func toXML(inst Instance) xmlInstance {
	x := xmlInstance{
		InstanceID:   inst.ID,
		InstanceType: inst.InstanceType,
		LaunchTime:   inst.LaunchTime.UTC().Format("2006-01-02T15:04:05.000Z"),
		State:        xmlState{Code: inst.State.Code(), Name: string(inst.State)},
	}
	if inst.StateReason.Code != "" {
		x.StateReason = &xmlStateReason{Code: inst.StateReason.Code, Message: inst.StateReason.Message}
		x.Reason = inst.StateReason.Message
	}
	keys := make([]string, 0, len(inst.Tags))
	for k := range inst.Tags {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		x.Tags = append(x.Tags, xmlTag{Key: k, Value: inst.Tags[k]})
	}
	return x
}

func writeError(w http.ResponseWriter, reqID string, e *apiError) {
	writeXML(w, e.status, xmlErrorResponse{Code: e.code, Message: e.message, RequestID: reqID})
}

func writeXML(w http.ResponseWriter, status int, body any) {
	out, err := xml.Marshal(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(xml.Header))
	_, _ = w.Write(out)
}
