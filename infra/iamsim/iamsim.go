// Package iamsim asks an IAM policy evaluator concrete questions about the
// policies a Reaper stack deploys and the docs give: may this principal do
// this action on this resource, with these tags and context? The evaluator
// is @cloud-copilot/iam-simulate (Node.js), pinned by tools/node and
// installed by hack/setup.sh, which exports REAPER_IAM_SIMULATE; Ask runs it
// once for a list of questions.
//
// The templates' policies come from a synthesized CloudFormation template
// (Principals, ManagedPolicies), their references resolved for one account
// and region (Env). What the evaluator cannot answer, because the template
// does not show it (an AWS managed policy attached to a role), is
// infra/iamcheck's.
package iamsim

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// The evaluator's decisions.
const (
	Allowed          = "Allowed"
	ImplicitlyDenied = "ImplicitlyDenied"
	ExplicitlyDenied = "ExplicitlyDenied"
	// Denied, as a Question's Want, accepts either denial.
	Denied = "Denied"
)

// Policy is one policy document with a name the answers cite.
type Policy struct {
	Name     string         `json:"name"`
	Document map[string]any `json:"policy"`
}

// Question is one request to evaluate and the decision it must get.
type Question struct {
	// Name says what is asked, for the failure message.
	Name string `json:"-"`
	// Principal is the caller's ARN (a role's, for its sessions). Ask sets
	// aws:PrincipalArn and aws:PrincipalAccount from it, which the
	// evaluator does not derive itself.
	Principal string `json:"principal"`
	Action    string `json:"action"`
	// Resource is one ARN, no pattern.
	Resource string `json:"resource"`
	// Account owns the resource (default: the principal's).
	Account string `json:"account"`
	// Context holds the request's condition keys: strings, or lists of
	// strings for multivalued keys (aws:TagKeys).
	Context map[string]any `json:"context"`
	// Identity are the principal's identity policies; SCPs the service
	// control policies over its account (FullAWSAccess is added).
	Identity []Policy `json:"identity"`
	SCPs     []Policy `json:"scps"`
	// Want is Allowed, Denied (either denial), ImplicitlyDenied or
	// ExplicitlyDenied. Ignored when Discover is set.
	Want string `json:"-"`
	// Discover asks instead under which conditions the request is
	// allowed: the keys of Context are known, every other key (an
	// instance's tags) may take any value. WantConditions is the answer
	// it must get, as Answer.Conditions writes it: "never", "always", or
	// the conditions on the unknown keys.
	Discover       bool   `json:"discover,omitempty"`
	WantConditions string `json:"-"`
	// Absent are keys a Discover question knows the request lacks (such
	// as ec2:CreateAction, after launch). The evaluator takes a Null
	// condition on a key it does not know to hold: Discover answers leave
	// such conditions out, which concrete questions must ask about.
	Absent []string `json:"absent,omitempty"`
}

// Answer is the evaluator's answer to one question.
type Answer struct {
	Decision string `json:"decision"`
	// AllowedBy and DeniedBy are the statements that matched, as
	// "<policy>:<Sid>".
	AllowedBy []string `json:"allowedBy"`
	DeniedBy  []string `json:"deniedBy"`
	// Conditions, for a Discover question, are the conditions under which
	// the request is allowed: "never", "always", a condition
	// "<key> <operator> [values]", or conditions sorted and joined by and
	// or or, in parentheses.
	Conditions string `json:"conditions"`
	// Error is the evaluator's refusal of the question (an invalid policy,
	// an action or resource type it does not know, a context key the
	// action does not take).
	Error string `json:"error"`
}

func (a Answer) String() string {
	if a.Error != "" {
		return "error: " + a.Error
	}
	s := fmt.Sprintf("%s (allowed by %v, denied by %v)", a.Decision, a.AllowedBy, a.DeniedBy)
	if a.Conditions != "" {
		s += " when " + a.Conditions
	}
	return s
}

// Meets reports whether the answer is what q asks for: the decision
// q.Want or, for a Discover question, the conditions q.WantConditions.
func (a Answer) Meets(q Question) bool {
	if a.Error != "" {
		return false
	}
	if q.Discover {
		return a.Conditions == q.WantConditions
	}
	want := q.Want
	if want == Denied {
		return a.Decision == ImplicitlyDenied || a.Decision == ExplicitlyDenied
	}
	return a.Decision == want
}

//go:embed simulate.cjs
var script []byte

// Evaluate answers the questions, in order.
func Evaluate(qs []Question) ([]Answer, error) {
	dir := os.Getenv("REAPER_IAM_SIMULATE")
	if dir == "" {
		return nil, fmt.Errorf(`REAPER_IAM_SIMULATE is not set: run eval "$(hack/setup.sh)" first (it installs @cloud-copilot/iam-simulate)`)
	}
	if _, err := os.Stat(filepath.Join(dir, "package.json")); err != nil {
		return nil, fmt.Errorf(`REAPER_IAM_SIMULATE=%s: %v: run eval "$(hack/setup.sh)" again`, dir, err)
	}
	for i := range qs {
		q := &qs[i]
		account := accountOf(q.Principal)
		if q.Account == "" {
			q.Account = account
		}
		ctx := map[string]any{"aws:PrincipalArn": q.Principal, "aws:PrincipalAccount": account}
		for k, v := range q.Context {
			ctx[k] = v
		}
		q.Context = ctx
		if q.Identity == nil {
			q.Identity = []Policy{}
		}
	}
	in, err := json.Marshal(qs)
	if err != nil {
		return nil, err
	}
	tmp, err := os.CreateTemp("", "iamsim-*.cjs")
	if err != nil {
		return nil, err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(script); err != nil {
		tmp.Close()
		return nil, err
	}
	if err := tmp.Close(); err != nil {
		return nil, err
	}
	cmd := exec.Command("node", tmp.Name())
	cmd.Stdin = bytes.NewReader(in)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("node %s: %v\n%s", filepath.Base(tmp.Name()), err, stderr.String())
	}
	var answers []Answer
	if err := json.Unmarshal(stdout.Bytes(), &answers); err != nil {
		return nil, fmt.Errorf("the evaluator's answers: %v\n%s", err, stdout.String())
	}
	if len(answers) != len(qs) {
		return nil, fmt.Errorf("%d answers to %d questions", len(answers), len(qs))
	}
	return answers, nil
}

// Ask evaluates the questions and fails the test for each whose answer is
// not the decision it wants.
func Ask(t testing.TB, qs []Question) []Answer {
	t.Helper()
	if len(qs) == 0 {
		t.Fatal("iamsim.Ask: no questions")
	}
	answers, err := Evaluate(qs)
	if err != nil {
		t.Fatal(err)
	}
	for i, q := range qs {
		if answers[i].Meets(q) {
			continue
		}
		want := q.Want
		if q.Discover {
			want = "allowed when " + q.WantConditions
		}
		t.Errorf("%s: %s %s on %s with %s: %s, want %s", q.Name, shortArn(q.Principal), q.Action, q.Resource, compact(q.Context), answers[i], want)
	}
	return answers
}

// accountOf is the account of an ARN ("" if it has none).
func accountOf(arn string) string {
	parts := strings.SplitN(arn, ":", 6)
	if len(parts) < 6 {
		return ""
	}
	return parts[4]
}

func shortArn(arn string) string {
	if i := strings.LastIndex(arn, ":"); i >= 0 {
		return arn[i+1:]
	}
	return arn
}

// compact is the context without the keys Evaluate adds, as sorted JSON.
func compact(ctx map[string]any) string {
	keys := make([]string, 0, len(ctx))
	for k := range ctx {
		if k != "aws:PrincipalArn" && k != "aws:PrincipalAccount" {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString("{")
	for i, k := range keys {
		if i > 0 {
			b.WriteString(" ")
		}
		v, _ := json.Marshal(ctx[k])
		fmt.Fprintf(&b, "%s=%s", k, v)
	}
	b.WriteString("}")
	return b.String()
}
