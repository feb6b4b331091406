package doctor

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/cloudformation"
	cfntypes "github.com/aws/aws-sdk-go-v2/service/cloudformation/types"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	lambdatypes "github.com/aws/aws-sdk-go-v2/service/lambda/types"
	"github.com/aws/smithy-go"

	"github.com/reaper-k8s/reaper/pkg/config"
	"github.com/reaper-k8s/reaper/pkg/metrics"
)

// The stack's outputs, as the CDK app (infra/app) names them. The doctor
// reads the last three; all of them missing one means the stack is not
// what this checkout deploys.
const (
	outputExitLogGroup    = "ExitLogGroup"
	outputFailureQueue    = "FailureQueueUrl"
	outputDeadLetterQueue = "DeadLetterQueueUrl"
)

// Outputs are every output of the CDK app's stack (infra/app/main.go).
var Outputs = []string{
	"LedgerTable", outputExitLogGroup, "AgentPolicyArn", outputFailureQueue, "WorkQueueUrl",
	outputDeadLetterQueue, "DashboardName", "SweeperRoleArn", "ReconcilerRoleArn",
}

// ConstructID is the id of the Reaper construct in the CDK app's stack
// (infra/app/main.go): the first part of its resources' logical ids.
const ConstructID = "Reaper"

// FunctionIDs are the construct ids of the four functions in the Reaper
// construct (infra/reapercdk), by function name.
var FunctionIDs = map[string]string{
	metrics.FunctionExitRecorder: "ExitRecorder",
	metrics.FunctionStateChange:  "StateChange",
	metrics.FunctionSweeper:      "Sweeper",
	metrics.FunctionReconciler:   "Reconciler",
}

// functionNames are the functions in the order the doctor reports them:
// the way an exit passes them.
var functionNames = []string{metrics.FunctionExitRecorder, metrics.FunctionStateChange, metrics.FunctionSweeper, metrics.FunctionReconciler}

// StackNamePrefix starts the CDK app's default stack name.
const StackNamePrefix = "Reaper"

// DefaultStackName is the name the CDK app gives the stack of a cluster
// unless told otherwise (its stackName knob): "Reaper-<cluster>", every
// character CloudFormation does not allow in a stack name a hyphen, at most
// 128 characters.
func DefaultStackName(cluster string) string {
	name := StackNamePrefix + "-" + strings.Map(func(r rune) rune {
		if r < utf8.RuneSelf && (unicode.IsLetter(r) || unicode.IsDigit(r)) {
			return r
		}
		return '-'
	}, cluster)
	return name[:min(len(name), 128)]
}

// deployFix is how to repair anything the stack should have made.
const deployFix = "deploy the stack again from this checkout (cdk deploy with the context it was deployed with; see the deploy guide)"

// function is one of the deployment's functions, as Lambda describes it.
type function struct {
	name string // Lambda's name for it
	arn  string
	env  map[string]string
}

func (r *run) checkStack(ctx context.Context) {
	check := "stack " + r.opts.StackName
	out, err := r.cfn.DescribeStacks(ctx, &cloudformation.DescribeStacksInput{StackName: aws.String(r.opts.StackName)})
	var ae smithy.APIError
	switch {
	case errors.As(err, &ae) && ae.ErrorCode() == "ValidationError" && strings.Contains(ae.ErrorMessage(), "does not exist"):
		r.add(check, Fail, "no such stack in this account and region",
			"name the stack with -stack (the default is "+StackNamePrefix+"-<cluster>), check AWS_REGION, or deploy it: see the deploy guide")
		return
	case err != nil:
		r.add(check, Fail, "cannot read it: "+err.Error(), "the operator's credentials need cloudformation:DescribeStacks and cloudformation:ListStackResources")
		return
	case len(out.Stacks) != 1:
		r.add(check, Fail, fmt.Sprintf("CloudFormation returned %d stacks", len(out.Stacks)), "name exactly one stack with -stack")
		return
	}
	st := out.Stacks[0]
	r.outputs = map[string]string{}
	for _, o := range st.Outputs {
		r.outputs[aws.ToString(o.OutputKey)] = aws.ToString(o.OutputValue)
	}
	var missing []string
	for _, name := range Outputs {
		if r.outputs[name] == "" {
			missing = append(missing, name)
		}
	}
	status := string(st.StackStatus)
	switch {
	case len(missing) > 0:
		r.add(check, Fail, fmt.Sprintf("%s, but without the outputs %s", status, strings.Join(missing, ", ")),
			"the stack was not deployed from this version of infra/app: "+deployFix)
	case strings.HasSuffix(status, "_IN_PROGRESS"):
		r.add(check, Warn, status+": an operation is under way", "run the doctor again once it has completed")
	case status == string(cfntypes.StackStatusUpdateRollbackComplete):
		r.add(check, Warn, status+": the last update was rolled back, so the stack runs the version before it",
			"read why in the stack's events (aws cloudformation describe-stack-events --stack-name "+r.opts.StackName+"), then "+deployFix)
	case strings.HasSuffix(status, "_FAILED") || strings.Contains(status, "ROLLBACK") || strings.HasPrefix(status, "DELETE_"):
		r.add(check, Fail, status, "read why in the stack's events (aws cloudformation describe-stack-events --stack-name "+r.opts.StackName+"), then "+deployFix)
	default:
		r.add(check, Pass, fmt.Sprintf("%s, all %d outputs", status, len(Outputs)), "")
	}
}

// logicalID matches the logical id CDK gives the function with construct
// id id inside the Reaper construct: the path's ids, then a hash of the
// whole path.
func logicalID(id string) *regexp.Regexp {
	return regexp.MustCompile(`^` + ConstructID + id + `[0-9A-F]{8}$`)
}

func (r *run) checkFunctions(ctx context.Context) {
	r.functions = map[string]function{}
	if r.outputs == nil {
		for _, name := range functionNames {
			r.add("function "+name, Skip, "the stack could not be read", "")
		}
		return
	}
	physical := map[string]string{}
	p := cloudformation.NewListStackResourcesPaginator(r.cfn, &cloudformation.ListStackResourcesInput{StackName: aws.String(r.opts.StackName)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			for _, name := range functionNames {
				r.add("function "+name, Fail, "cannot list the stack's resources: "+err.Error(), "the operator's credentials need cloudformation:ListStackResources")
			}
			return
		}
		for _, res := range page.StackResourceSummaries {
			if aws.ToString(res.ResourceType) != "AWS::Lambda::Function" {
				continue
			}
			for name, id := range FunctionIDs {
				if logicalID(id).MatchString(aws.ToString(res.LogicalResourceId)) {
					physical[name] = aws.ToString(res.PhysicalResourceId)
				}
			}
		}
	}
	for _, name := range functionNames {
		r.checkFunction(ctx, name, physical[name])
	}
	// The later checks read the deployment's settings from the functions:
	// the reconciler's, which has them all, or any other one.
	for _, name := range []string{metrics.FunctionReconciler, metrics.FunctionSweeper, metrics.FunctionStateChange, metrics.FunctionExitRecorder} {
		fn, ok := r.functions[name]
		if !ok {
			continue
		}
		if cfg, err := config.Read(mapEnv(fn.env), config.Needs{}); err == nil {
			r.cluster, r.tags = cfg.Cluster, cfg.Tags
			return
		}
	}
}

func (r *run) checkFunction(ctx context.Context, name, physical string) {
	check := "function " + name
	if physical == "" {
		r.add(check, Fail, "the stack has no such function", deployFix)
		return
	}
	out, err := r.lambda.GetFunction(ctx, &lambda.GetFunctionInput{FunctionName: aws.String(physical)})
	var notFound *lambdatypes.ResourceNotFoundException
	switch {
	case errors.As(err, &notFound):
		r.add(check, Fail, physical+" is in the stack but not in Lambda (deleted by hand?)", deployFix)
		return
	case err != nil:
		r.add(check, Fail, "cannot read "+physical+": "+err.Error(), "the operator's credentials need lambda:GetFunction")
		return
	}
	c := out.Configuration
	fn := function{name: physical, arn: aws.ToString(c.FunctionArn)}
	if c.Environment != nil {
		fn.env = c.Environment.Variables
	}
	cfg, cfgErr := config.Read(mapEnv(fn.env), config.Needs{})
	switch {
	case c.State != lambdatypes.StateActive:
		r.add(check, Fail, fmt.Sprintf("%s is %s: %s", physical, c.State, aws.ToString(c.StateReason)),
			"see why in the Lambda console or aws lambda get-function --function-name "+physical+"; then "+deployFix)
	case c.LastUpdateStatus == lambdatypes.LastUpdateStatusFailed:
		r.add(check, Fail, fmt.Sprintf("%s: its last update failed: %s", physical, aws.ToString(c.LastUpdateStatusReason)), deployFix)
	case cfgErr != nil:
		r.add(check, Fail, physical+" would fail at start: "+cfgErr.Error(), deployFix)
	case r.opts.Cluster != "" && cfg.Cluster != r.opts.Cluster:
		r.add(check, Fail, fmt.Sprintf("%s serves cluster %q, not %q", physical, cfg.Cluster, r.opts.Cluster),
			"name the stack of cluster "+r.opts.Cluster+" with -stack, or leave -cluster out")
	default:
		r.add(check, Pass, fmt.Sprintf("%s, %s, cluster %s", physical, c.State, cfg.Cluster), "")
	}
	r.functions[name] = fn
}

// mapEnv is a getenv over a function's environment.
func mapEnv(env map[string]string) func(string) string {
	return func(k string) string { return env[k] }
}
