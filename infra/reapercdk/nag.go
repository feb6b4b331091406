package reapercdk

import (
	"regexp"
	"strings"

	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"
	"github.com/cdklabs/cdk-nag-go/cdknag/v2"
)

// Why the construct keeps what cdk-nag's AwsSolutions pack reports. Each
// suppression names one resource and, for IAM5, the one wildcard resource
// it accepts; the README's "Security review (cdk-nag)" lists them. The
// work queue's consumer and producer grants name the queue, and cdk-nag
// recognizes its dead-letter queue as one (SQS3): nothing to suppress.
const (
	reasonDescribeInstances = "ec2:DescribeInstances has no resource-level permissions: it takes only Resource \"*\". " +
		"It reads; the only EC2 action that changes anything, ec2:TerminateInstances, is granted separately."
	reasonNetworkInterfaces = "In a VPC, Lambda's network interface actions (ec2:CreateNetworkInterface, ec2:DescribeNetworkInterfaces) " +
		"work only on Resource \"*\", and the interfaces' ids are not known before Lambda creates them."
	reasonTerminate = "ec2:TerminateInstances (and ec2:CreateTags of the Pod-written tag, when set) cannot name the instances: the provider launches them after the deploy. " +
		"Conditions allow it only on instances tagged managed=true and with this deployment's cluster (infra/iamsim evaluates both)."
	reasonAgentStreams = "The CloudWatch agent on each managed instance creates its own log stream, named after the instance, " +
		"in the one exit-line log group; the stream names are not known in advance."
	reasonFailureQueueDLQ = "The queue is itself the dead-letter destination: of the functions' asynchronous invocations " +
		"(OnFailure) and of the EventBridge targets. A redrive from it would move events away while an operator inspects them."
)

// suppressNagFindings records the suppressions on the resources they
// concern.
func (r *Reaper) suppressNagFindings() {
	p := r.Props
	for i, fn := range r.Functions() {
		spec := functions[i]
		policy := fn.Role().Node().FindChild(jsii.String("DefaultPolicy"))
		// Only the grants the function has: a suppression that matches
		// nothing would hide a later one that should be reviewed.
		var star []string
		if spec.describes {
			star = append(star, reasonDescribeInstances)
		}
		if len(p.SubnetIDs) > 0 {
			star = append(star, reasonNetworkInterfaces)
		}
		if len(star) > 0 {
			suppress(policy, "AwsSolutions-IAM5", strings.Join(star, " "), "Resource::*")
		}
		if spec.terminates {
			suppress(policy, "AwsSolutions-IAM5", reasonTerminate, arnFinding("ec2", "instance/*"))
		}
	}
	suppress(r.AgentPolicy, "AwsSolutions-IAM5", reasonAgentStreams,
		arnFinding("logs", "log-group:"+p.ExitLogGroupName+":log-stream:*"))
	suppress(r.FailureQueue, "AwsSolutions-SQS3", reasonFailureQueueDLQ)
}

// suppress suppresses rule on the resource of c (its default child), for
// the findings in appliesTo (all, when none are given).
func suppress(c constructs.IConstruct, rule, reason string, appliesTo ...any) {
	s := &cdknag.NagPackSuppression{Id: jsii.String(rule), Reason: jsii.String(reason)}
	if len(appliesTo) > 0 {
		s.AppliesTo = &appliesTo
	}
	cdknag.NagSuppressions_AddResourceSuppressions(c, &[]*cdknag.NagPackSuppression{s}, jsii.Bool(false))
}

// arnFinding matches the IAM5 finding for the ARN of resource in service,
// in the stack's partition, region and account whether they are known at
// synthesis (literals) or not (pseudo parameters, which cdk-nag writes as
// <AWS::Region> and the like).
func arnFinding(service, resource string) *cdknag.RegexAppliesTo {
	return &cdknag.RegexAppliesTo{Regex: jsii.String(
		`/^Resource::arn:(<AWS::Partition>|[a-z-]+):` + service + `:(<AWS::Region>|[a-z0-9-]+):(<AWS::AccountId>|[0-9]+):` +
			regexp.QuoteMeta(resource) + `$/`,
	)}
}
