// Package cdktest helps test stacks that contain the Reaper construct:
// placeholder function bundles, synthesis and CDK assertions that report
// failures through testing.T instead of panicking.
package cdktest

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/jsii-runtime-go"

	"github.com/reaper-k8s/reaper/infra/reapercdk"
)

// fakeBuildDir creates a directory with a placeholder build/<name>/bootstrap
// for every function, so stacks synthesize without `make build`. The caller
// removes it.
func fakeBuildDir() (string, error) {
	dir, err := os.MkdirTemp("", "reaper-build-")
	if err != nil {
		return "", err
	}
	for _, name := range reapercdk.FunctionNames() {
		if err := os.MkdirAll(filepath.Join(dir, name), 0o755); err != nil {
			return "", err
		}
		// Distinct content per function gives each its own asset hash, as
		// real binaries would.
		if err := os.WriteFile(filepath.Join(dir, name, "bootstrap"), []byte("#!/bin/sh\n# placeholder "+name+"\n"), 0o755); err != nil {
			return "", err
		}
	}
	return dir, nil
}

// buildDir is the directory Main made.
var buildDir string

// Main runs a package's tests for its TestMain: it makes a build directory
// of placeholder bootstraps (fakeBuildDir) for BuildDir, runs the tests,
// closes jsii's runtime, removes the directory and exits with the tests'
// code.
func Main(m *testing.M) {
	dir, err := fakeBuildDir()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	buildDir = dir
	code := m.Run()
	jsii.Close()
	os.RemoveAll(dir)
	os.Exit(code)
}

// BuildDir is the build directory Main made, for the construct's BuildDir
// or the app's buildDir context: stacks synthesize without `make build`.
func BuildDir() string { return buildDir }

// NewApp returns an app with the context of the nearest cdk.json (in the
// working directory or a parent; feature flags included) plus ctx, so that
// tests synthesize what `cdk synth` would. It synthesizes into a temporary
// directory the test removes.
func NewApp(t testing.TB, ctx map[string]any) awscdk.App {
	t.Helper()
	file, err := findUp("cdk.json")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Context          map[string]any `json:"context"`
		VersionReporting *bool          `json:"versionReporting"`
	}
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	merged := cfg.Context
	if merged == nil {
		merged = map[string]any{}
	}
	for k, v := range ctx {
		merged[k] = v
	}
	var app awscdk.App
	Must(t, func() {
		app = awscdk.NewApp(&awscdk.AppProps{Context: &merged, AnalyticsReporting: cfg.VersionReporting, Outdir: jsii.String(t.TempDir())})
	})
	return app
}

// findUp finds name in the working directory or the nearest parent.
func findUp(name string) (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		p := filepath.Join(dir, name)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New(name + " not found in the working directory or its parents")
		}
		dir = parent
	}
}

// Must runs f and turns a panic (how jsii reports CDK errors and failed
// assertions) into a test failure.
func Must(t testing.TB, f func()) {
	t.Helper()
	failed := true
	defer func() {
		if failed {
			t.Fatalf("%v", recover())
		}
	}()
	f()
	failed = false
}

// Template synthesizes the stack's template.
func Template(t testing.TB, stack awscdk.Stack) assertions.Template {
	t.Helper()
	var tmpl assertions.Template
	Must(t, func() { tmpl = assertions.Template_FromStack(stack, nil) })
	return tmpl
}

// JSON is the template as decoded JSON.
func JSON(t testing.TB, tmpl assertions.Template) map[string]any {
	t.Helper()
	var m map[string]any
	Must(t, func() { m = *tmpl.ToJSON() })
	return m
}

// Resources returns the template's resources of a type by logical id.
func Resources(tmpl map[string]any, typ string) map[string]map[string]any {
	out := map[string]map[string]any{}
	all, _ := tmpl["Resources"].(map[string]any)
	for id, r := range all {
		r, _ := r.(map[string]any)
		if r["Type"] == typ {
			out[id] = r
		}
	}
	return out
}

// Props returns a resource's Properties.
func Props(resource map[string]any) map[string]any {
	p, _ := resource["Properties"].(map[string]any)
	return p
}

// Only returns the single resource of a type, failing the test otherwise.
func Only(t testing.TB, tmpl map[string]any, typ string) (string, map[string]any) {
	t.Helper()
	rs := Resources(tmpl, typ)
	if len(rs) != 1 {
		t.Fatalf("%d resources of type %s, want 1", len(rs), typ)
	}
	for id, r := range rs {
		return id, r
	}
	panic("unreachable")
}

// nameProperties are, for each resource type a Reaper stack may hold, the
// property that sets the resource's physical name and the one naming what
// that name is unique within ("" for the account and region). Types without
// a name of their own have neither.
var nameProperties = map[string]struct{ name, scope string }{
	"AWS::CDK::Metadata":              {},
	"AWS::CloudWatch::Alarm":          {"AlarmName", ""},
	"AWS::CloudWatch::CompositeAlarm": {"AlarmName", ""},
	"AWS::CloudWatch::Dashboard":      {"DashboardName", ""},
	"AWS::DynamoDB::Table":            {"TableName", ""},
	"AWS::EKS::AccessEntry":           {"PrincipalArn", "ClusterName"},
	"AWS::Events::Rule":               {"Name", "EventBusName"},
	"AWS::IAM::ManagedPolicy":         {"ManagedPolicyName", ""},
	"AWS::IAM::Policy":                {"PolicyName", "Roles"},
	"AWS::IAM::Role":                  {"RoleName", ""},
	"AWS::Lambda::EventInvokeConfig":  {},
	"AWS::Lambda::EventSourceMapping": {},
	"AWS::Lambda::Function":           {"FunctionName", ""},
	"AWS::Lambda::Permission":         {},
	"AWS::Logs::LogGroup":             {"LogGroupName", ""},
	"AWS::Logs::SubscriptionFilter":   {"FilterName", "LogGroupName"},
	"AWS::SNS::Subscription":          {},
	"AWS::SNS::Topic":                 {"TopicName", ""},
	"AWS::SNS::TopicPolicy":           {},
	"AWS::SQS::Queue":                 {"QueueName", ""},
	"AWS::SQS::QueuePolicy":           {},
}

// PhysicalNames lists what a stack named stack claims in its account and
// region by name: the stack name, each name its template sets explicitly
// (with its type, and the parent it is unique within), and each export
// name. Two stacks can be deployed side by side only if their lists do not
// meet. A reference to a resource whose name CloudFormation generates
// stands for "<stack>/<logical id>", since generated names start with the
// stack name. A resource type the table does not know fails the test, so
// that a new resource is classified before it is trusted.
func PhysicalNames(t testing.TB, stack string, tmpl map[string]any) []string {
	t.Helper()
	resources, _ := tmpl["Resources"].(map[string]any)
	var resolve func(v any) string
	resolve = func(v any) string {
		switch v := v.(type) {
		case string:
			return v
		case []any:
			parts := make([]string, len(v))
			for i, e := range v {
				parts[i] = resolve(e)
			}
			return strings.Join(parts, ",")
		case map[string]any:
			id, _ := v["Ref"].(string)
			if att, ok := v["Fn::GetAtt"].([]any); ok && len(att) == 2 {
				id, _ = att[0].(string)
			}
			if r, ok := resources[id].(map[string]any); ok {
				typ, _ := r["Type"].(string)
				if name, ok := Props(r)[nameProperties[typ].name].(string); ok {
					return name
				}
				return stack + "/" + id
			}
		}
		t.Fatalf("%s: cannot tell which name %v stands for", stack, v)
		return ""
	}
	names := []string{"stack " + stack}
	for id, r := range resources {
		r, _ := r.(map[string]any)
		typ, _ := r["Type"].(string)
		prop, known := nameProperties[typ]
		if !known {
			t.Errorf("%s: %s has type %s, whose name property cdktest does not know", stack, id, typ)
			continue
		}
		name, ok := Props(r)[prop.name]
		if prop.name == "" || !ok {
			continue
		}
		entry := typ + " " + resolve(name)
		if scope, ok := Props(r)[prop.scope]; ok {
			entry += " in " + resolve(scope)
		}
		names = append(names, entry)
	}
	outputs, _ := tmpl["Outputs"].(map[string]any)
	for _, o := range outputs {
		o, _ := o.(map[string]any)
		if export, ok := o["Export"].(map[string]any); ok {
			names = append(names, "export "+resolve(export["Name"]))
		}
	}
	sort.Strings(names)
	return names
}
