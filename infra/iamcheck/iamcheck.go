// Package iamcheck inspects a synthesized CloudFormation template for IAM
// grants that would let anything terminate EC2 instances the Reaper
// deployment does not own, and lists who may terminate at all. It works on the template JSON alone, so any
// stack's tests can run it (assertions.Template.ToJSON, or a
// cdk.out/*.template.json file).
package iamcheck

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
)

// Finding is one grant the check rejects.
type Finding struct {
	// Resource is the logical id of the policy, role, user or group.
	Resource string
	// Statement is the statement's index in its document (-1 for a managed
	// policy attachment); Sid its id, if any.
	Statement int
	Sid       string
	Reason    string
}

func (f Finding) String() string {
	where := f.Resource
	if f.Statement >= 0 {
		where += fmt.Sprintf(" statement %d", f.Statement)
	}
	if f.Sid != "" {
		where += " (" + f.Sid + ")"
	}
	return where + ": " + f.Reason
}

// TerminateAction is the action that must never be granted unguarded.
const TerminateAction = "ec2:TerminateInstances"

// AllowedManagedPolicies are AWS managed policies a role may attach: their
// content is known not to include TerminateAction. Any other AWS managed
// policy is reported, since the template cannot show what it grants.
var AllowedManagedPolicies = map[string]bool{
	"service-role/AWSLambdaBasicExecutionRole":     true,
	"service-role/AWSLambdaVPCAccessExecutionRole": true,
}

// Owner is what a terminate grant must require of an instance's tags for
// it to be the deployment's own: ManagedKey = "true" and ClusterKey =
// Cluster. The managed tag alone is not enough: deployments for other
// clusters in the account tag their instances managed too.
type Owner struct {
	ManagedKey, ClusterKey, Cluster string
}

// UnguardedTerminations returns every Allow statement in the template's IAM
// policies (AWS::IAM::Policy, AWS::IAM::ManagedPolicy and the inline
// policies of roles, users and groups) that grants ec2:TerminateInstances,
// whether by name or by a wildcard such as ec2:* or *, or by NotAction,
// without both conditions StringEquals aws:ResourceTag/<ManagedKey> = "true"
// and aws:ResourceTag/<ClusterKey> = <Cluster>. Attachments of managed
// policies it cannot read are reported too.
func UnguardedTerminations(template map[string]any, owner Owner) []Finding {
	var out []Finding
	walk(template, func(id string, i int, st map[string]any, _ []string) {
		sid, _ := st["Sid"].(string)
		finding := func(format string, a ...any) {
			out = append(out, Finding{Resource: id, Statement: i, Sid: sid, Reason: fmt.Sprintf(format, a...)})
		}
		grants, err := grantsTerminate(st)
		switch {
		case err != nil:
			finding("%v", err)
		case grants && !guarded(st["Condition"], owner):
			finding("allows %s without the conditions StringEquals aws:ResourceTag/%s = \"true\" and aws:ResourceTag/%s = %q (Action %s, Condition %s)",
				TerminateAction, owner.ManagedKey, owner.ClusterKey, owner.Cluster, compact(firstOf(st, "Action", "NotAction")), compact(st["Condition"]))
		}
	}, func(f Finding) { out = append(out, f) })
	return out
}

// Grant is a statement that may grant TerminateAction, guarded or not.
type Grant struct {
	// Resource, Statement and Sid say where it is, as in Finding.
	// Statement -1 is an attachment of a managed policy the template does
	// not show, or a document without readable statements: either may
	// grant it.
	Resource  string
	Statement int
	Sid       string
	// Principals are the logical ids of the template's roles, users and
	// groups it applies to, sorted.
	Principals []string
}

func (g Grant) String() string {
	return Finding{Resource: g.Resource, Statement: g.Statement, Sid: g.Sid,
		Reason: "may grant " + TerminateAction + " to [" + strings.Join(g.Principals, " ") + "]"}.String()
}

// TerminateGrants returns every Allow statement in the template's IAM
// policies that grants ec2:TerminateInstances (by name, by a wildcard or by
// NotAction), whatever its conditions, or that cannot be evaluated, and
// every attachment of a managed policy the template does not show (but
// those AllowedManagedPolicies lists). UnguardedTerminations says whether
// the grants are confined to the deployment's instances; TerminateGrants
// says who holds them.
func TerminateGrants(template map[string]any) []Grant {
	var out []Grant
	walk(template, func(id string, i int, st map[string]any, principals []string) {
		if grants, err := grantsTerminate(st); grants || err != nil {
			sid, _ := st["Sid"].(string)
			out = append(out, Grant{Resource: id, Statement: i, Sid: sid, Principals: principals})
		}
	}, func(f Finding) {
		out = append(out, Grant{Resource: f.Resource, Statement: f.Statement, Principals: []string{f.Resource}})
	})
	return out
}

// walk calls statement for every Allow statement of the template's IAM
// policies, with the principals the policy applies to, and unreadable for
// what it cannot evaluate: a document without statements, or an
// attachment of a managed policy outside the template that
// AllowedManagedPolicies does not list.
func walk(template map[string]any, statement func(id string, i int, st map[string]any, principals []string), unreadable func(Finding)) {
	resources, _ := template["Resources"].(map[string]any)
	ref := func(v any) string {
		m, _ := v.(map[string]any)
		id, _ := m["Ref"].(string)
		return id
	}
	inTemplate := func(v any) bool {
		r, _ := resources[ref(v)].(map[string]any)
		return r["Type"] == "AWS::IAM::ManagedPolicy"
	}
	// attachedBy lists, for each managed policy of the template, the
	// principals that attach it by reference.
	attachedBy := map[string][]string{}
	for _, id := range sortedKeys(resources) {
		res, _ := resources[id].(map[string]any)
		props, _ := res["Properties"].(map[string]any)
		arns, _ := props["ManagedPolicyArns"].([]any)
		for _, arn := range arns {
			if inTemplate(arn) {
				attachedBy[ref(arn)] = append(attachedBy[ref(arn)], id)
			}
		}
	}
	document := func(id string, doc any, principals []string) {
		sort.Strings(principals)
		principals = slices.Compact(principals)
		d, _ := doc.(map[string]any)
		var statements []any
		switch s := d["Statement"].(type) {
		case []any:
			statements = s
		case map[string]any:
			statements = []any{s}
		default:
			unreadable(Finding{Resource: id, Statement: -1, Reason: "policy document without readable statements"})
			return
		}
		for i, s := range statements {
			if st, _ := s.(map[string]any); st["Effect"] == "Allow" {
				statement(id, i, st, principals)
			}
		}
	}
	for _, id := range sortedKeys(resources) {
		res, _ := resources[id].(map[string]any)
		props, _ := res["Properties"].(map[string]any)
		switch res["Type"] {
		case "AWS::IAM::Policy", "AWS::IAM::ManagedPolicy":
			principals := append([]string(nil), attachedBy[id]...)
			for _, key := range []string{"Roles", "Users", "Groups"} {
				list, _ := props[key].([]any)
				for _, p := range list {
					if r := ref(p); r != "" {
						principals = append(principals, r)
					}
				}
			}
			document(id, props["PolicyDocument"], principals)
		case "AWS::IAM::Role", "AWS::IAM::User", "AWS::IAM::Group":
			policies, _ := props["Policies"].([]any)
			for _, pol := range policies {
				pol, _ := pol.(map[string]any)
				document(id, pol["PolicyDocument"], []string{id})
			}
			arns, _ := props["ManagedPolicyArns"].([]any)
			for _, arn := range arns {
				if inTemplate(arn) {
					continue // read as its own resource
				}
				if name, ok := awsManagedName(arn); !ok || !AllowedManagedPolicies[name] {
					unreadable(Finding{Resource: id, Statement: -1,
						Reason: fmt.Sprintf("attaches managed policy %s, whose grants the template does not show", compact(arn))})
				}
			}
		}
	}
}

// grantsTerminate reports whether an Allow statement's Action (or
// NotAction) covers TerminateAction.
func grantsTerminate(st map[string]any) (bool, error) {
	if a, ok := st["Action"]; ok {
		return matchesAny(a)
	}
	if na, ok := st["NotAction"]; ok {
		excluded, err := matchesAny(na)
		return !excluded, err
	}
	return false, fmt.Errorf("statement has neither Action nor NotAction")
}

func matchesAny(v any) (bool, error) {
	patterns, ok := strs(v)
	if !ok {
		return false, fmt.Errorf("action %s is not a list of strings; cannot evaluate it", compact(v))
	}
	for _, p := range patterns {
		if wildcard(p).MatchString(TerminateAction) {
			return true, nil
		}
	}
	return false, nil
}

// wildcard compiles an IAM action pattern: * and ?, case-insensitive.
func wildcard(pattern string) *regexp.Regexp {
	q := regexp.QuoteMeta(pattern)
	q = strings.ReplaceAll(q, `\*`, `.*`)
	q = strings.ReplaceAll(q, `\?`, `.`)
	return regexp.MustCompile(`(?i)^` + q + `$`)
}

// guarded reports whether the condition requires both ownership tags on
// the instance: the managed tag "true" and the cluster tag the cluster's
// name. Conditions are ANDed, so others beside them only narrow the grant.
func guarded(condition any, owner Owner) bool {
	c, _ := condition.(map[string]any)
	eq, _ := c["StringEquals"].(map[string]any)
	return requires(eq, owner.ManagedKey, "true") && requires(eq, owner.ClusterKey, owner.Cluster)
}

// requires reports whether a StringEquals block pins the instance tag to
// exactly that value. Condition keys are case-insensitive; tag values are
// not.
func requires(eq map[string]any, tagKey, want string) bool {
	for key, value := range eq {
		if !strings.EqualFold(key, "aws:ResourceTag/"+tagKey) && !strings.EqualFold(key, "ec2:ResourceTag/"+tagKey) {
			continue
		}
		values, ok := strs(value)
		if ok && len(values) == 1 && values[0] == want {
			return true
		}
	}
	return false
}

func awsManagedName(arn any) (string, bool) {
	s := compact(arn)
	_, name, ok := strings.Cut(s, ":iam::aws:policy/")
	if !ok {
		return "", false
	}
	return strings.TrimRight(name, `"]}`), true
}

func strs(v any) ([]string, bool) {
	switch v := v.(type) {
	case string:
		return []string{v}, true
	case []any:
		out := make([]string, 0, len(v))
		for _, e := range v {
			s, ok := e.(string)
			if !ok {
				return nil, false
			}
			out = append(out, s)
		}
		return out, true
	}
	return nil, false
}

func firstOf(m map[string]any, keys ...string) any {
	for _, k := range keys {
		if v, ok := m[k]; ok {
			return v
		}
	}
	return nil
}

func compact(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
