package iamcheck

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestUnreadable(t *testing.T) {
	var tmpl map[string]any
	err := json.Unmarshal([]byte(`{"Resources":{
		"Role":{"Type":"AWS::IAM::Role","Properties":{
			"Policies":[{"PolicyName":"inline","PolicyDocument":{"Statement":{"Effect":"Allow","Action":"s3:GetObject","Resource":"*"}}}],
			"ManagedPolicyArns":[
				{"Fn::Join":["",["arn:",{"Ref":"AWS::Partition"},":iam::aws:policy/service-role/AWSLambdaBasicExecutionRole"]]},
				"arn:aws:iam::123456789012:policy/outside",
				{"Ref":"Managed"}]}},
		"User":{"Type":"AWS::IAM::User","Properties":{"Policies":[{"PolicyName":"odd","PolicyDocument":{"Fn::If":["C",{},{}]}}]}},
		"Managed":{"Type":"AWS::IAM::ManagedPolicy","Properties":{"PolicyDocument":{"Statement":[
			{"Effect":"Allow","Action":"ec2:TerminateInstances","Resource":"*"}]}}},
		"Empty":{"Type":"AWS::IAM::Policy","Properties":{"PolicyDocument":{}}},
		"Queue":{"Type":"AWS::SQS::Queue","Properties":{}}}}`), &tmpl)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range Unreadable(tmpl) {
		got = append(got, f.String())
	}
	want := []string{
		"Empty: policy document without readable statements",
		`Role: attaches managed policy {"Fn::Join":["",["arn:",{"Ref":"AWS::Partition"},":iam::aws:policy/service-role/AWSLambdaBasicExecutionRole"]]}, whose grants the template does not show`,
		`Role: attaches managed policy "arn:aws:iam::123456789012:policy/outside", whose grants the template does not show`,
		"User: policy document without readable statements",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("findings\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
