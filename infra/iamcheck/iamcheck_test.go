package iamcheck

import (
	"encoding/json"
	"strings"
	"testing"
)

var owner = Owner{ManagedKey: "reaper.io/managed", ClusterKey: "reaper.io/cluster", Cluster: "prod"}

// policy wraps statements into a template with one AWS::IAM::Policy.
func policy(t *testing.T, statements ...string) map[string]any {
	t.Helper()
	var tmpl map[string]any
	src := `{"Resources":{"P":{"Type":"AWS::IAM::Policy","Properties":{"PolicyDocument":{"Version":"2012-10-17","Statement":[` +
		strings.Join(statements, ",") + `]}}}}}`
	if err := json.Unmarshal([]byte(src), &tmpl); err != nil {
		t.Fatalf("%v in %s", err, src)
	}
	return tmpl
}

const guard = `"Condition":{"StringEquals":{"aws:ResourceTag/reaper.io/managed":"true","aws:ResourceTag/reaper.io/cluster":"prod"}}`

func TestGuardedGrantsPass(t *testing.T) {
	for name, st := range map[string]string{
		"exact action, guarded":     `{"Effect":"Allow","Action":"ec2:TerminateInstances","Resource":"*",` + guard + `}`,
		"list, guarded, ec2 key":    `{"Effect":"Allow","Action":["ec2:TerminateInstances"],"Resource":"*","Condition":{"StringEquals":{"ec2:ResourceTag/reaper.io/managed":["true"],"ec2:ResourceTag/reaper.io/cluster":["prod"]}}}`,
		"key case-insensitive":      `{"Effect":"Allow","Action":"ec2:terminateinstances","Resource":"*","Condition":{"StringEquals":{"AWS:resourcetag/reaper.io/managed":"true","aws:ResourceTag/REAPER.IO/CLUSTER":"prod"}}}`,
		"further conditions":        `{"Effect":"Allow","Action":"ec2:TerminateInstances","Resource":"*","Condition":{"StringEquals":{"aws:ResourceTag/reaper.io/managed":"true","aws:ResourceTag/reaper.io/cluster":"prod","aws:RequestedRegion":"eu-west-1"},"Bool":{"aws:SecureTransport":"true"}}}`,
		"other actions":             `{"Effect":"Allow","Action":["ec2:DescribeInstances","dynamodb:GetItem"],"Resource":"*"}`,
		"wildcard elsewhere":        `{"Effect":"Allow","Action":"ec2:Describe*","Resource":"*"}`,
		"deny wide":                 `{"Effect":"Deny","Action":"*","Resource":"*"}`,
		"not action excludes it":    `{"Effect":"Allow","NotAction":["ec2:Terminate*","ec2:Run*"],"Resource":"*"}`,
		"wildcard action, guarded":  `{"Effect":"Allow","Action":"ec2:*","Resource":"*",` + guard + `}`,
		"single statement (object)": `{"Effect":"Allow","Action":"s3:GetObject","Resource":"*"}`,
	} {
		t.Run(name, func(t *testing.T) {
			if f := UnguardedTerminations(policy(t, st), owner); len(f) != 0 {
				t.Fatalf("findings %v", f)
			}
		})
	}
}

func TestUnguardedGrantsFound(t *testing.T) {
	for name, st := range map[string]string{
		"no condition":         `{"Effect":"Allow","Action":"ec2:TerminateInstances","Resource":"*"}`,
		"managed only":         `{"Effect":"Allow","Action":"ec2:TerminateInstances","Resource":"*","Condition":{"StringEquals":{"aws:ResourceTag/reaper.io/managed":"true"}}}`,
		"cluster only":         `{"Effect":"Allow","Action":"ec2:TerminateInstances","Resource":"*","Condition":{"StringEquals":{"aws:ResourceTag/reaper.io/cluster":"prod"}}}`,
		"other cluster":        `{"Effect":"Allow","Action":"ec2:TerminateInstances","Resource":"*","Condition":{"StringEquals":{"aws:ResourceTag/reaper.io/managed":"true","aws:ResourceTag/reaper.io/cluster":"staging"}}}`,
		"either cluster":       `{"Effect":"Allow","Action":"ec2:TerminateInstances","Resource":"*","Condition":{"StringEquals":{"aws:ResourceTag/reaper.io/managed":"true","aws:ResourceTag/reaper.io/cluster":["prod","staging"]}}}`,
		"cluster like":         `{"Effect":"Allow","Action":"ec2:TerminateInstances","Resource":"*","Condition":{"StringEquals":{"aws:ResourceTag/reaper.io/managed":"true"},"StringLike":{"aws:ResourceTag/reaper.io/cluster":"*"}}}`,
		"cluster value case":   `{"Effect":"Allow","Action":"ec2:TerminateInstances","Resource":"*","Condition":{"StringEquals":{"aws:ResourceTag/reaper.io/managed":"true","aws:ResourceTag/reaper.io/cluster":"PROD"}}}`,
		"wildcard, managed":    `{"Effect":"Allow","Action":"ec2:*","Resource":"*","Condition":{"StringEquals":{"aws:ResourceTag/reaper.io/managed":"true"}}}`,
		"ec2 wildcard":         `{"Effect":"Allow","Action":"ec2:*","Resource":"*"}`,
		"star":                 `{"Effect":"Allow","Action":"*","Resource":"*"}`,
		"partial wildcard":     `{"Effect":"Allow","Action":["s3:GetObject","ec2:Term*"],"Resource":"*"}`,
		"question mark":        `{"Effect":"Allow","Action":"ec2:TerminateInstance?","Resource":"*"}`,
		"not action":           `{"Effect":"Allow","NotAction":"s3:*","Resource":"*"}`,
		"wrong value":          `{"Effect":"Allow","Action":"ec2:TerminateInstances","Resource":"*","Condition":{"StringEquals":{"aws:ResourceTag/reaper.io/managed":"false"}}}`,
		"two values":           `{"Effect":"Allow","Action":"ec2:TerminateInstances","Resource":"*","Condition":{"StringEquals":{"aws:ResourceTag/reaper.io/managed":["true","false"]}}}`,
		"other tag":            `{"Effect":"Allow","Action":"ec2:TerminateInstances","Resource":"*","Condition":{"StringEquals":{"aws:ResourceTag/team":"true"}}}`,
		"like, not equals":     `{"Effect":"Allow","Action":"ec2:TerminateInstances","Resource":"*","Condition":{"StringLike":{"aws:ResourceTag/reaper.io/managed":"*"}}}`,
		"unreadable action":    `{"Effect":"Allow","Action":{"Fn::If":["C","ec2:*","s3:*"]},"Resource":"*"}`,
		"tag value case-sense": `{"Effect":"Allow","Action":"ec2:TerminateInstances","Resource":"*","Condition":{"StringEquals":{"aws:ResourceTag/reaper.io/managed":"TRUE"}}}`,
	} {
		t.Run(name, func(t *testing.T) {
			f := UnguardedTerminations(policy(t, `{"Effect":"Allow","Action":"s3:GetObject","Resource":"*"}`, st), owner)
			if len(f) != 1 || f[0].Resource != "P" || f[0].Statement != 1 {
				t.Fatalf("findings %v, want one for statement 1", f)
			}
		})
	}
}

func TestRolesManagedPoliciesAndOtherTagKeys(t *testing.T) {
	var tmpl map[string]any
	err := json.Unmarshal([]byte(`{"Resources":{
		"Role":{"Type":"AWS::IAM::Role","Properties":{
			"Policies":[{"PolicyName":"inline","PolicyDocument":{"Statement":{"Effect":"Allow","Action":"ec2:TerminateInstances","Resource":"*"}}}],
			"ManagedPolicyArns":[
				{"Fn::Join":["",["arn:",{"Ref":"AWS::Partition"},":iam::aws:policy/service-role/AWSLambdaBasicExecutionRole"]]},
				{"Fn::Join":["",["arn:",{"Ref":"AWS::Partition"},":iam::aws:policy/AdministratorAccess"]]},
				"arn:aws:iam::123456789012:policy/outside",
				{"Ref":"Managed"}]}},
		"Managed":{"Type":"AWS::IAM::ManagedPolicy","Properties":{"PolicyDocument":{"Statement":[
			{"Effect":"Allow","Action":"ec2:TerminateInstances","Resource":"*","Condition":{"StringEquals":{"aws:ResourceTag/example.com/owned":"true","aws:ResourceTag/example.com/cluster":"gpu"}}}]}}},
		"Queue":{"Type":"AWS::SQS::Queue","Properties":{}}}}`), &tmpl)
	if err != nil {
		t.Fatal(err)
	}
	got := UnguardedTerminations(tmpl, Owner{ManagedKey: "example.com/owned", ClusterKey: "example.com/cluster", Cluster: "gpu"})
	var reasons []string
	for _, f := range got {
		reasons = append(reasons, f.String())
	}
	joined := strings.Join(reasons, "\n")
	if len(got) != 3 || !strings.Contains(joined, "Role statement 0: allows ec2:TerminateInstances") ||
		!strings.Contains(joined, "AdministratorAccess") || !strings.Contains(joined, "policy/outside") {
		t.Fatalf("findings:\n%s", joined)
	}
	// The managed policy is guarded by its own keys and cluster, not by the
	// default keys or another cluster.
	if f := UnguardedTerminations(tmpl, owner); len(f) != 4 {
		t.Fatalf("with the default keys: %v", f)
	}
	if f := UnguardedTerminations(tmpl, Owner{ManagedKey: "example.com/owned", ClusterKey: "example.com/cluster", Cluster: "cpu"}); len(f) != 4 {
		t.Fatalf("for another cluster: %v", f)
	}
}

func TestTerminateGrants(t *testing.T) {
	var tmpl map[string]any
	err := json.Unmarshal([]byte(`{"Resources":{
		"Reconciler":{"Type":"AWS::IAM::Role","Properties":{}},
		"Sweeper":{"Type":"AWS::IAM::Role","Properties":{
			"ManagedPolicyArns":[{"Fn::Join":["",["arn:",{"Ref":"AWS::Partition"},":iam::aws:policy/service-role/AWSLambdaBasicExecutionRole"]]}]}},
		"Wide":{"Type":"AWS::IAM::Role","Properties":{
			"Policies":[{"PolicyName":"inline","PolicyDocument":{"Statement":{"Effect":"Allow","Action":"ec2:*","Resource":"*"}}}],
			"ManagedPolicyArns":["arn:aws:iam::123456789012:policy/outside",{"Ref":"Managed"}]}},
		"ReconcilerPolicy":{"Type":"AWS::IAM::Policy","Properties":{"Roles":[{"Ref":"Reconciler"}],"PolicyDocument":{"Statement":[
			{"Effect":"Allow","Action":"ec2:DescribeInstances","Resource":"*"},
			{"Sid":"Terminate","Effect":"Allow","Action":"ec2:TerminateInstances","Resource":"*",`+guard+`}]}}},
		"SweeperPolicy":{"Type":"AWS::IAM::Policy","Properties":{"Roles":[{"Ref":"Sweeper"}],"PolicyDocument":{"Statement":[
			{"Effect":"Allow","Action":"ec2:DescribeInstances","Resource":"*"},
			{"Effect":"Deny","Action":"ec2:TerminateInstances","Resource":"*"}]}}},
		"Managed":{"Type":"AWS::IAM::ManagedPolicy","Properties":{"Roles":[{"Ref":"Reconciler"}],"PolicyDocument":{"Statement":[
			{"Effect":"Allow","NotAction":"s3:*","Resource":"*"}]}}}}}`), &tmpl)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, g := range TerminateGrants(tmpl) {
		got = append(got, g.String())
	}
	want := []string{
		"Managed statement 0: may grant ec2:TerminateInstances to [Reconciler Wide]",
		"ReconcilerPolicy statement 1 (Terminate): may grant ec2:TerminateInstances to [Reconciler]",
		"Wide statement 0: may grant ec2:TerminateInstances to [Wide]",
		"Wide: may grant ec2:TerminateInstances to [Wide]",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("grants\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// Guarded or not: the reconciler's grant is guarded, the others are
	// not.
	if f := UnguardedTerminations(tmpl, owner); len(f) != 3 {
		t.Fatalf("unguarded: %v", f)
	}
}
