package cdktest

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/jsii-runtime-go"
	"github.com/cdklabs/cdk-nag-go/cdknag/v2"
)

// NagReport is what cdk-nag's AwsSolutions pack says about a stack.
type NagReport struct {
	// Findings are the errors and warnings no suppression covers, each
	// "<construct path>: <message>". A stack passes the review when there
	// are none.
	Findings []string
	// Suppressed are the findings the code suppresses, sorted by String.
	Suppressed []NagSuppressed
}

// NagSuppressed is one suppressed finding.
type NagSuppressed struct {
	// Rule is the rule's id (AwsSolutions-IAM5); Finding the finding's,
	// for rules that have them (IAM5: the wildcard resource).
	Rule, Finding string
	// Path is the resource's construct path.
	Path   string
	Reason string
}

// String is "<rule>[<finding>] <path>", without "[<finding>]" when the
// rule has none.
func (s NagSuppressed) String() string {
	id := s.Rule
	if s.Finding != "" {
		id += "[" + s.Finding + "]"
	}
	return id + " " + s.Path
}

var (
	// nagRule starts every message of the pack: a rule's, or the one for a
	// rule that could not evaluate a resource.
	nagRule       = regexp.MustCompile(`^(AwsSolutions-\w+|CdkNagValidationFailure)`)
	nagSuppressed = regexp.MustCompile(`^CdkNagSuppression(?:\[(.*?)\])?: (\S+) was triggered but suppressed\. Provided reason: "(.*)"$`)
)

// Nag runs the AwsSolutions pack on stack, synthesizes its app and collects
// the pack's messages. It must be the first synthesis of the app: an app
// synthesizes once, and a pack added after that never runs. The report
// lists the suppressed findings too, so a test that expects some also
// proves the pack ran.
func Nag(t testing.TB, stack awscdk.Stack) NagReport {
	t.Helper()
	var app awscdk.Stage
	Must(t, func() {
		awscdk.Aspects_Of(stack).Add(cdknag.NewAwsSolutionsChecks(&cdknag.NagPackProps{
			LogIgnores: jsii.Bool(true),
			Verbose:    jsii.Bool(true),
			Reports:    jsii.Bool(false),
		}), &awscdk.AspectOptions{Priority: awscdk.AspectPriority_READONLY()})
		app = awscdk.App_Of(stack)
	})
	outdir := *app.Outdir()
	if err := synth(app); err != nil {
		// An error annotation fails the synthesis; the validation report
		// lists them.
		findings, rerr := validationReport(outdir)
		if rerr != nil || len(findings) == 0 {
			t.Fatalf("synthesis: %v (validation report: %v)", err, rerr)
		}
		return NagReport{Findings: findings}
	}
	metadata, err := stackMetadata(outdir, *stack.ArtifactId())
	if err != nil {
		t.Fatal(err)
	}
	var r NagReport
	for path, entries := range metadata {
		path = strings.TrimPrefix(path, "/")
		for _, e := range entries {
			msg, _ := e.Data.(string)
			msg = strings.TrimSpace(msg)
			switch {
			case e.Type == "aws:cdk:info":
				if m := nagSuppressed.FindStringSubmatch(msg); m != nil {
					r.Suppressed = append(r.Suppressed, NagSuppressed{Rule: m[2], Finding: m[1], Path: path, Reason: m[3]})
				}
			case (e.Type == "aws:cdk:error" || e.Type == "aws:cdk:warning") && nagRule.MatchString(msg):
				r.Findings = append(r.Findings, path+": "+msg)
			}
		}
	}
	sort.Strings(r.Findings)
	sort.Slice(r.Suppressed, func(i, j int) bool { return r.Suppressed[i].String() < r.Suppressed[j].String() })
	return r
}

// metadataEntry is one entry of a construct's metadata in the assembly.
type metadataEntry struct {
	Type string `json:"type"`
	Data any    `json:"data"`
}

// stackMetadata returns the metadata of the stack artifact by construct
// path: from the manifest and from the file it may keep them in instead.
func stackMetadata(outdir, artifactID string) (map[string][]metadataEntry, error) {
	raw, err := os.ReadFile(filepath.Join(outdir, "manifest.json"))
	if err != nil {
		return nil, err
	}
	var manifest struct {
		Artifacts map[string]struct {
			Metadata               map[string][]metadataEntry `json:"metadata"`
			AdditionalMetadataFile string                     `json:"additionalMetadataFile"`
		} `json:"artifacts"`
	}
	if err := json.Unmarshal(raw, &manifest); err != nil {
		return nil, err
	}
	artifact, ok := manifest.Artifacts[artifactID]
	if !ok {
		return nil, fmt.Errorf("no artifact %s in the cloud assembly", artifactID)
	}
	out := artifact.Metadata
	if out == nil {
		out = map[string][]metadataEntry{}
	}
	if artifact.AdditionalMetadataFile != "" {
		raw, err := os.ReadFile(filepath.Join(outdir, artifact.AdditionalMetadataFile))
		if err != nil {
			return nil, err
		}
		var more map[string][]metadataEntry
		if err := json.Unmarshal(raw, &more); err != nil {
			return nil, err
		}
		for path, entries := range more {
			out[path] = append(out[path], entries...)
		}
	}
	return out, nil
}

// synth synthesizes app, returning what it panics with (jsii's way of
// reporting an error) as an error.
func synth(app awscdk.Stage) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("%v", v)
		}
	}()
	app.Synth(nil)
	return nil
}

// validationReport reads the pack's findings from the report a failed
// synthesis leaves in outdir.
func validationReport(outdir string) ([]string, error) {
	raw, err := os.ReadFile(filepath.Join(outdir, "validation-report.json"))
	if err != nil {
		return nil, err
	}
	var report struct {
		PluginReports []struct {
			Violations []struct {
				Description         string `json:"description"`
				ViolatingConstructs []struct {
					ConstructPath string `json:"constructPath"`
				} `json:"violatingConstructs"`
			} `json:"violations"`
		} `json:"pluginReports"`
	}
	if err := json.Unmarshal(raw, &report); err != nil {
		return nil, err
	}
	var out []string
	for _, p := range report.PluginReports {
		for _, v := range p.Violations {
			msg := strings.TrimSpace(v.Description)
			if !nagRule.MatchString(msg) {
				continue
			}
			for _, c := range v.ViolatingConstructs {
				out = append(out, c.ConstructPath+": "+msg)
			}
		}
	}
	sort.Strings(out)
	return out, nil
}

// NagClean runs Nag on stack and fails the test on any finding, or when the
// suppressed findings are not exactly want (see ReaperNagSuppressions): a
// new suppression is reviewed here before it is accepted, and one that no
// longer suppresses anything is removed.
func NagClean(t testing.TB, stack awscdk.Stack, want []string) NagReport {
	t.Helper()
	r := Nag(t, stack)
	for _, f := range r.Findings {
		t.Errorf("cdk-nag: %s", f)
	}
	var got []string
	for _, s := range r.Suppressed {
		got = append(got, s.String())
		if len(s.Reason) < 40 {
			t.Errorf("cdk-nag suppression %s gives no real reason: %q", s, s.Reason)
		}
	}
	sort.Strings(want)
	if !slices.Equal(got, want) {
		t.Errorf("cdk-nag suppressed\n got %q\nwant %q", got, want)
	}
	return r
}

// ReaperNagSuppressions are the findings the Reaper construct at
// <stack>/<id> suppresses, with exitLogGroup its exit log group, in a stack
// whose account and region are not known at synthesis and whose functions
// are not in a VPC (the README's "Security review (cdk-nag)"): the
// Resource "*" of the sweeper's and the reconciler's ec2:DescribeInstances,
// the reconciler's instance/* terminate grant, the agent policy's log
// streams and the failure queue's lack of a dead-letter queue (cdk-nag sees
// that the work dead-letter queue is one).
func ReaperNagSuppressions(stack, id, exitLogGroup string) []string {
	return reaperNagSuppressions(stack, id, exitLogGroup, false)
}

// ReaperNagSuppressionsInVPC are ReaperNagSuppressions for a construct
// whose functions are in a VPC: every function's Resource "*" then also
// holds Lambda's network interface actions.
func ReaperNagSuppressionsInVPC(stack, id, exitLogGroup string) []string {
	return reaperNagSuppressions(stack, id, exitLogGroup, true)
}

func reaperNagSuppressions(stack, id, exitLogGroup string, inVPC bool) []string {
	arn := func(service, resource string) string {
		return "arn:<AWS::Partition>:" + service + ":<AWS::Region>:<AWS::AccountId>:" + resource
	}
	base := stack + "/" + id + "/"
	policy := func(fn string) string { return base + fn + "Role/DefaultPolicy/Resource" }
	var out []string
	for _, fn := range []struct {
		id                   string
		describes, terminate bool
	}{
		{"ExitRecorder", false, false},
		{"StateChange", false, false},
		{"Sweeper", true, false},
		{"Reconciler", true, true},
	} {
		if fn.describes || inVPC {
			out = append(out, "AwsSolutions-IAM5[Resource::*] "+policy(fn.id))
		}
		if fn.terminate {
			out = append(out, "AwsSolutions-IAM5[Resource::"+arn("ec2", "instance/*")+"] "+policy(fn.id))
		}
	}
	return append(out,
		"AwsSolutions-IAM5[Resource::"+arn("logs", "log-group:"+exitLogGroup+":log-stream:*")+"] "+base+"AgentPolicy/Resource",
		"AwsSolutions-SQS3 "+base+"Failures/Resource")
}
