package iamsim

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Env is where a template is deployed, for resolving its references:
// the partition, region and account, and the stack's name, from which
// CloudFormation generates the names of resources that have none.
type Env struct {
	Partition, Region, Account, Stack string
}

// TestEnv is the account and region the tests evaluate templates in.
func TestEnv(stack string) Env {
	return Env{Partition: "aws", Region: "eu-west-1", Account: "123456789012", Stack: stack}
}

// Principal is one role, user or group of a template with every identity
// policy the template gives it.
type Principal struct {
	// LogicalID is its id in the template; ARN the one it gets deployed in
	// Env.
	LogicalID, ARN string
	Policies       []Policy
}

// Principals returns the template's roles, users and groups by logical
// id, each with its inline policies, the AWS::IAM::Policy and
// AWS::IAM::ManagedPolicy resources that name it, and the template's
// managed policies it attaches, every reference resolved in env. Managed
// policies the template does not hold are not among them (iamcheck reports
// those). It fails on a reference it cannot resolve.
func Principals(tmpl map[string]any, env Env) (map[string]Principal, error) {
	resources, _ := tmpl["Resources"].(map[string]any)
	r := resolver{env: env, resources: resources}
	out := map[string]Principal{}
	for _, id := range sortedKeys(resources) {
		res, _ := resources[id].(map[string]any)
		switch res["Type"] {
		case "AWS::IAM::Role", "AWS::IAM::User", "AWS::IAM::Group":
			arn, err := r.attribute(id, "Arn")
			if err != nil {
				return nil, err
			}
			p := Principal{LogicalID: id, ARN: arn}
			props, _ := res["Properties"].(map[string]any)
			inline, _ := props["Policies"].([]any)
			for i, pol := range inline {
				pol, _ := pol.(map[string]any)
				doc, err := r.document(pol["PolicyDocument"])
				if err != nil {
					return nil, fmt.Errorf("%s inline policy %d: %v", id, i, err)
				}
				p.Policies = append(p.Policies, Policy{Name: fmt.Sprintf("%s/%v", id, pol["PolicyName"]), Document: doc})
			}
			out[id] = p
		}
	}
	// Policies that name their principals, and managed policies attached
	// by reference.
	for _, id := range sortedKeys(resources) {
		res, _ := resources[id].(map[string]any)
		props, _ := res["Properties"].(map[string]any)
		switch res["Type"] {
		case "AWS::IAM::Policy", "AWS::IAM::ManagedPolicy":
			doc, err := r.document(props["PolicyDocument"])
			if err != nil {
				return nil, fmt.Errorf("%s: %v", id, err)
			}
			for _, key := range []string{"Roles", "Users", "Groups"} {
				list, _ := props[key].([]any)
				for _, ref := range list {
					pid := refID(ref)
					p, ok := out[pid]
					if !ok {
						return nil, fmt.Errorf("%s names %v, which is no principal of the template", id, ref)
					}
					p.Policies = append(p.Policies, Policy{Name: id, Document: doc})
					out[pid] = p
				}
			}
		}
	}
	for pid, p := range out {
		res, _ := resources[pid].(map[string]any)
		props, _ := res["Properties"].(map[string]any)
		arns, _ := props["ManagedPolicyArns"].([]any)
		for _, arn := range arns {
			mp, _ := resources[refID(arn)].(map[string]any)
			if mp["Type"] != "AWS::IAM::ManagedPolicy" {
				continue // outside the template: iamcheck's
			}
			mprops, _ := mp["Properties"].(map[string]any)
			doc, err := r.document(mprops["PolicyDocument"])
			if err != nil {
				return nil, fmt.Errorf("%s: %v", refID(arn), err)
			}
			p.Policies = append(p.Policies, Policy{Name: refID(arn), Document: doc})
		}
		out[pid] = p
	}
	return out, nil
}

// ManagedPolicies returns the template's managed policies by logical id,
// resolved in env: those a stack offers for others to attach, such as the
// agent policy.
func ManagedPolicies(tmpl map[string]any, env Env) (map[string]Policy, error) {
	resources, _ := tmpl["Resources"].(map[string]any)
	r := resolver{env: env, resources: resources}
	out := map[string]Policy{}
	for _, id := range sortedKeys(resources) {
		res, _ := resources[id].(map[string]any)
		if res["Type"] != "AWS::IAM::ManagedPolicy" {
			continue
		}
		props, _ := res["Properties"].(map[string]any)
		doc, err := r.document(props["PolicyDocument"])
		if err != nil {
			return nil, fmt.Errorf("%s: %v", id, err)
		}
		out[id] = Policy{Name: id, Document: doc}
	}
	return out, nil
}

// resolver resolves the intrinsic functions a CDK template's policies use:
// Ref (of pseudo parameters and of resources), Fn::GetAtt (Arn), Fn::Join
// and Fn::Select, with the names and ARNs the resources get in env.
type resolver struct {
	env       Env
	resources map[string]any
}

func (r resolver) document(doc any) (map[string]any, error) {
	v, err := r.resolve(doc)
	if err != nil {
		return nil, err
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("policy document %v is not an object", doc)
	}
	return m, nil
}

func (r resolver) resolve(v any) (any, error) {
	switch v := v.(type) {
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			var err error
			if out[i], err = r.resolve(e); err != nil {
				return nil, err
			}
		}
		return out, nil
	case map[string]any:
		if len(v) == 1 {
			for k, arg := range v {
				if strings.HasPrefix(k, "Fn::") || k == "Ref" {
					return r.intrinsic(k, arg)
				}
			}
		}
		out := make(map[string]any, len(v))
		for k, e := range v {
			var err error
			if out[k], err = r.resolve(e); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	return v, nil
}

func (r resolver) intrinsic(fn string, arg any) (any, error) {
	switch fn {
	case "Ref":
		id, _ := arg.(string)
		return r.ref(id)
	case "Fn::GetAtt":
		a, _ := arg.([]any)
		if len(a) != 2 {
			return nil, fmt.Errorf("Fn::GetAtt %v", arg)
		}
		id, _ := a[0].(string)
		attr, _ := a[1].(string)
		return r.attribute(id, attr)
	case "Fn::Join":
		a, _ := arg.([]any)
		if len(a) != 2 {
			return nil, fmt.Errorf("Fn::Join %v", arg)
		}
		sep, _ := a[0].(string)
		parts, err := r.resolve(a[1])
		if err != nil {
			return nil, err
		}
		list, _ := parts.([]any)
		strs := make([]string, len(list))
		for i, p := range list {
			s, ok := p.(string)
			if !ok {
				return nil, fmt.Errorf("Fn::Join of %v", p)
			}
			strs[i] = s
		}
		return strings.Join(strs, sep), nil
	case "Fn::Select":
		a, _ := arg.([]any)
		if len(a) != 2 {
			return nil, fmt.Errorf("Fn::Select %v", arg)
		}
		i, err := r.resolve(a[0])
		if err != nil {
			return nil, err
		}
		list, err := r.resolve(a[1])
		if err != nil {
			return nil, err
		}
		l, _ := list.([]any)
		n, ok := i.(float64)
		if s, isStr := i.(string); isStr {
			_, err := fmt.Sscan(s, &n)
			ok = err == nil
		}
		if !ok || int(n) < 0 || int(n) >= len(l) {
			return nil, fmt.Errorf("Fn::Select %v", arg)
		}
		return l[int(n)], nil
	}
	return nil, fmt.Errorf("cannot resolve %s %v", fn, arg)
}

// ref is what Ref gives: a pseudo parameter, or a resource's name (its
// ARN for a topic or managed policy, its URL for a queue).
func (r resolver) ref(id string) (string, error) {
	switch id {
	case "AWS::Partition":
		return r.env.Partition, nil
	case "AWS::Region":
		return r.env.Region, nil
	case "AWS::AccountId":
		return r.env.Account, nil
	case "AWS::URLSuffix":
		return "amazonaws.com", nil
	case "AWS::StackName":
		return r.env.Stack, nil
	}
	res, ok := r.resources[id].(map[string]any)
	if !ok {
		return "", fmt.Errorf("a Ref to %s: no such resource or parameter", id)
	}
	name := r.name(id)
	switch res["Type"] {
	case "AWS::SQS::Queue":
		return fmt.Sprintf("https://sqs.%s.amazonaws.com/%s/%s", r.env.Region, r.env.Account, name), nil
	case "AWS::SNS::Topic", "AWS::IAM::ManagedPolicy":
		return r.attribute(id, "Arn")
	}
	return name, nil
}

// attribute is Fn::GetAtt's Arn of the resource types Reaper's policies
// name.
func (r resolver) attribute(id, attr string) (string, error) {
	res, ok := r.resources[id].(map[string]any)
	if !ok || attr != "Arn" {
		return "", fmt.Errorf("Fn::GetAtt %s.%s: cannot resolve", id, attr)
	}
	e := r.env
	name := r.name(id)
	arn := func(service, region, resource string) string {
		return fmt.Sprintf("arn:%s:%s:%s:%s:%s", e.Partition, service, region, e.Account, resource)
	}
	switch res["Type"] {
	case "AWS::DynamoDB::Table":
		return arn("dynamodb", e.Region, "table/"+name), nil
	case "AWS::SQS::Queue":
		return arn("sqs", e.Region, name), nil
	case "AWS::SNS::Topic":
		return arn("sns", e.Region, name), nil
	case "AWS::Logs::LogGroup":
		return arn("logs", e.Region, "log-group:"+name+":*"), nil
	case "AWS::Lambda::Function":
		return arn("lambda", e.Region, "function:"+name), nil
	case "AWS::IAM::Role":
		return arn("iam", "", "role/"+name), nil
	case "AWS::IAM::User":
		return arn("iam", "", "user/"+name), nil
	case "AWS::IAM::Group":
		return arn("iam", "", "group/"+name), nil
	case "AWS::IAM::ManagedPolicy":
		return arn("iam", "", "policy/"+name), nil
	}
	return "", fmt.Errorf("Fn::GetAtt %s.Arn: type %v", id, res["Type"])
}

// nameProperty is the property that names a resource of each type.
var nameProperty = map[string]string{
	"AWS::DynamoDB::Table":    "TableName",
	"AWS::SQS::Queue":         "QueueName",
	"AWS::SNS::Topic":         "TopicName",
	"AWS::Logs::LogGroup":     "LogGroupName",
	"AWS::Lambda::Function":   "FunctionName",
	"AWS::IAM::Role":          "RoleName",
	"AWS::IAM::User":          "UserName",
	"AWS::IAM::Group":         "GroupName",
	"AWS::IAM::ManagedPolicy": "ManagedPolicyName",
}

// name is a resource's name: its own, or the one CloudFormation generates,
// "<stack>-<logical id>-<suffix>", the stack name and logical id cut short
// so that a role's name stays within IAM's 64 characters (the suffix is
// 12 characters, the rest is shared between the two).
func (r resolver) name(id string) string {
	res, _ := r.resources[id].(map[string]any)
	typ, _ := res["Type"].(string)
	props, _ := res["Properties"].(map[string]any)
	if n, ok := props[nameProperty[typ]].(string); ok && n != "" {
		return n
	}
	stack, logical := r.env.Stack, id
	const room = 64 - 2 - 12
	for len(stack)+len(logical) > room {
		if len(stack) >= len(logical) {
			stack = stack[:len(stack)-1]
		} else {
			logical = logical[:len(logical)-1]
		}
	}
	return stack + "-" + logical + "-ABCDEF123456"
}

func refID(v any) string {
	m, _ := v.(map[string]any)
	id, _ := m["Ref"].(string)
	return id
}

func sortedKeys(m map[string]any) []string { return slices.Sorted(maps.Keys(m)) }
