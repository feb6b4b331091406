package iamsim

import (
	"encoding/json"
	"strings"
	"testing"
)

func template(t *testing.T, src string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(src), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestPrincipals resolves a template's references the way CloudFormation
// would in TestEnv, and gives each role every policy that names or is
// attached to it.
func TestPrincipals(t *testing.T) {
	m := template(t, `{"Resources":{
		"Table":{"Type":"AWS::DynamoDB::Table","Properties":{}},
		"Named":{"Type":"AWS::DynamoDB::Table","Properties":{"TableName":"ledger"}},
		"Role":{"Type":"AWS::IAM::Role","Properties":{
			"Policies":[{"PolicyName":"inline","PolicyDocument":{"Statement":[{"Effect":"Allow","Action":"s3:GetObject","Resource":"*"}]}}],
			"ManagedPolicyArns":[{"Ref":"Managed"},"arn:aws:iam::aws:policy/ReadOnlyAccess"]}},
		"RolePolicy":{"Type":"AWS::IAM::Policy","Properties":{"Roles":[{"Ref":"Role"}],"PolicyDocument":{"Statement":[
			{"Effect":"Allow","Action":"dynamodb:GetItem","Resource":[{"Fn::GetAtt":["Table","Arn"]},{"Fn::GetAtt":["Named","Arn"]}]},
			{"Effect":"Allow","Action":"logs:PutLogEvents","Resource":{"Fn::Join":["",["arn:",{"Ref":"AWS::Partition"},":logs:",{"Ref":"AWS::Region"},":",{"Ref":"AWS::AccountId"},":log-group:/x:*"]]}}]}}},
		"Managed":{"Type":"AWS::IAM::ManagedPolicy","Properties":{"PolicyDocument":{"Statement":[{"Effect":"Allow","Action":"sqs:SendMessage","Resource":"*"}]}}}}}`)
	ps, err := Principals(m, TestEnv("Stack"))
	if err != nil {
		t.Fatal(err)
	}
	role, ok := ps["Role"]
	if len(ps) != 1 || !ok {
		t.Fatalf("principals %v", ps)
	}
	if role.ARN != "arn:aws:iam::123456789012:role/Stack-Role-ABCDEF123456" {
		t.Errorf("role ARN %s", role.ARN)
	}
	b, _ := json.Marshal(role.Policies)
	for _, want := range []string{
		`"name":"Role/inline"`, `"name":"RolePolicy"`, `"name":"Managed"`,
		`"arn:aws:dynamodb:eu-west-1:123456789012:table/Stack-Table-ABCDEF123456"`,
		`"arn:aws:dynamodb:eu-west-1:123456789012:table/ledger"`,
		`"arn:aws:logs:eu-west-1:123456789012:log-group:/x:*"`,
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("policies lack %s: %s", want, b)
		}
	}
	if strings.Contains(string(b), "ReadOnlyAccess") {
		t.Errorf("an AWS managed policy, which the template does not show, among the policies: %s", b)
	}
	// A generated role name keeps to IAM's 64 characters.
	long := TestEnv(strings.Repeat("S", 100))
	r := resolver{env: long, resources: m["Resources"].(map[string]any)}
	if n := r.name("Role"); len(n) != 64 {
		t.Errorf("generated name %s: %d characters", n, len(n))
	}

	if _, err := Principals(template(t, `{"Resources":{"Role":{"Type":"AWS::IAM::Role","Properties":{
		"Policies":[{"PolicyName":"p","PolicyDocument":{"Statement":[{"Effect":"Allow","Action":{"Fn::If":["C","a","b"]},"Resource":"*"}]}}]}}}}`), TestEnv("S")); err == nil {
		t.Error("Fn::If resolved: want an error, not a guess")
	}
}

// TestEvaluate asks the evaluator questions whose answers are known, in
// both modes, and one it must refuse.
func TestEvaluate(t *testing.T) {
	policy := Policy{Name: "p", Document: map[string]any{"Version": "2012-10-17", "Statement": []any{map[string]any{
		"Sid": "Owned", "Effect": "Allow", "Action": "ec2:TerminateInstances", "Resource": "arn:aws:ec2:*:*:instance/*",
		"Condition": map[string]any{"StringEquals": map[string]any{"aws:ResourceTag/owner": "me"}},
	}}}}
	role := "arn:aws:iam::123456789012:role/r"
	instance := "arn:aws:ec2:eu-west-1:123456789012:instance/i-0123456789abcdef0"
	qs := []Question{
		{Name: "tagged", Principal: role, Action: "ec2:TerminateInstances", Resource: instance,
			Context: map[string]any{"aws:ResourceTag/owner": "me"}, Identity: []Policy{policy}, Want: Allowed},
		{Name: "tagged otherwise", Principal: role, Action: "ec2:TerminateInstances", Resource: instance,
			Context: map[string]any{"aws:ResourceTag/owner": "you"}, Identity: []Policy{policy}, Want: ImplicitlyDenied},
		{Name: "denied by an SCP", Principal: role, Action: "ec2:TerminateInstances", Resource: instance,
			Context: map[string]any{"aws:ResourceTag/owner": "me"}, Identity: []Policy{policy}, Want: ExplicitlyDenied,
			SCPs: []Policy{{Name: "scp", Document: map[string]any{"Version": "2012-10-17", "Statement": []any{map[string]any{
				"Sid": "NotR", "Effect": "Deny", "Action": "ec2:TerminateInstances", "Resource": "*",
				"Condition": map[string]any{"ArnLike": map[string]any{"aws:PrincipalArn": "arn:aws:iam::*:role/r"}},
			}}}}}},
		{Name: "whatever the tags", Principal: role, Action: "ec2:TerminateInstances", Resource: instance,
			Identity: []Policy{policy}, Discover: true, WantConditions: Condition("aws:ResourceTag/owner", "StringEquals", "me")},
		{Name: "without a policy", Principal: role, Action: "ec2:TerminateInstances", Resource: instance,
			Discover: true, WantConditions: "never"},
	}
	Ask(t, qs)

	answers, err := Evaluate([]Question{{Name: "no such action", Principal: role, Action: "ec2:TerminateEverything", Resource: instance, Want: Denied}})
	if err != nil {
		t.Fatal(err)
	}
	if answers[0].Error == "" || answers[0].Meets(Question{Want: Denied}) {
		t.Errorf("an unknown action: %s, want the evaluator's refusal, which meets no want", answers[0])
	}
}
