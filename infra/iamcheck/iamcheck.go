// Package iamcheck reports what an IAM policy evaluator cannot answer
// about a synthesized CloudFormation template: grants the template does
// not show. The questions about the policies it does show (who may
// terminate which instance, tag it, write which log group) are
// infra/iamsim's, answered by an evaluator. It works on the template JSON
// alone (assertions.Template.ToJSON, or a cdk.out/*.template.json file).
package iamcheck

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
)

// Finding is one grant the template does not show.
type Finding struct {
	// Resource is the logical id of the role, user, group or policy.
	Resource string
	Reason   string
}

func (f Finding) String() string { return f.Resource + ": " + f.Reason }

// Unreadable returns every attachment, to a role, user or group of the
// template, of a managed policy the template does not hold (an AWS managed
// policy, or one of the account's), whose grants only IAM knows, and every
// policy document of the template without a list of statements. An
// evaluator given the template's policies would answer as if neither
// granted anything.
func Unreadable(template map[string]any) []Finding {
	var out []Finding
	resources, _ := template["Resources"].(map[string]any)
	inTemplate := func(v any) bool {
		m, _ := v.(map[string]any)
		id, _ := m["Ref"].(string)
		r, _ := resources[id].(map[string]any)
		return r["Type"] == "AWS::IAM::ManagedPolicy"
	}
	readable := func(id string, doc any) {
		d, _ := doc.(map[string]any)
		switch d["Statement"].(type) {
		case []any, map[string]any:
		default:
			out = append(out, Finding{Resource: id, Reason: "policy document without readable statements"})
		}
	}
	for _, id := range sortedKeys(resources) {
		res, _ := resources[id].(map[string]any)
		props, _ := res["Properties"].(map[string]any)
		switch res["Type"] {
		case "AWS::IAM::Policy", "AWS::IAM::ManagedPolicy":
			readable(id, props["PolicyDocument"])
		case "AWS::IAM::Role", "AWS::IAM::User", "AWS::IAM::Group":
			policies, _ := props["Policies"].([]any)
			for _, pol := range policies {
				pol, _ := pol.(map[string]any)
				readable(id, pol["PolicyDocument"])
			}
			arns, _ := props["ManagedPolicyArns"].([]any)
			for _, arn := range arns {
				if !inTemplate(arn) {
					out = append(out, Finding{Resource: id, Reason: fmt.Sprintf("attaches managed policy %s, whose grants the template does not show", compact(arn))})
				}
			}
		}
	}
	return out
}

func compact(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

func sortedKeys(m map[string]any) []string { return slices.Sorted(maps.Keys(m)) }
