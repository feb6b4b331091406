package doctor

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatchlogs"
	logstypes "github.com/aws/aws-sdk-go-v2/service/cloudwatchlogs/types"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reaper-k8s/reaper/pkg/kube"
	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/model"
)

// maxListed caps the instance ids a result lists.
const maxListed = 10

// count says n things: "1 message", "2 messages".
func count(n int, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return strconv.Itoa(n) + " " + thing + "s"
}

// listIDs joins ids, at most maxListed of them.
func listIDs(ids []string) string {
	if len(ids) <= maxListed {
		return strings.Join(ids, ", ")
	}
	return strings.Join(ids[:maxListed], ", ") + fmt.Sprintf(" and %d more", len(ids)-maxListed)
}

// checkInstances lists the running instances marked managed and finds
// those the deployment cannot fully handle: without the cluster tag they
// are nobody's (their lines are rejected, their Pods never written); with
// the cluster tag but without the right cluster-uid tag the sweep never
// terminates them as orphans.
func (r *run) checkInstances(ctx context.Context) {
	const check = "instance tags"
	r.managedRunning = -1
	if r.cluster == "" {
		r.add(check, Skip, "the deployment's cluster is not known (no function could be read; -cluster names it)", "")
		return
	}
	r.readClusterUID(ctx)
	found, err := r.listManagedInstances(ctx)
	if err != nil {
		r.add(check, Fail, "cannot list the managed instances: "+err.Error(), "the operator's credentials need ec2:DescribeInstances")
		return
	}
	r.managedRunning = found.total - len(found.noCluster)
	r.reportLaunchTags(check, found)
}

// readClusterUID reads the UID of the cluster's kube-system namespace,
// which the instances' cluster-uid tag must equal; it stays "" when the
// cluster cannot be read, and the tag is then only checked for presence.
func (r *run) readClusterUID(ctx context.Context) {
	if r.kube == nil {
		return
	}
	if ns, err := r.kube.CoreV1().Namespaces().Get(ctx, kube.IdentityNamespace, metav1.GetOptions{}); err == nil {
		r.clusterUID = string(ns.UID)
	}
}

// managedInstances are the running managed instances of the deployment's
// cluster, and those of no cluster, by what their launch tags let the
// deployment do with them.
type managedInstances struct {
	// total counts them all; another cluster's are not counted.
	total int
	// noCluster lack the cluster tag, noUID the cluster-uid tag; wrongUID
	// carry another cluster's UID ("id (uid)"); ok are fully tagged.
	noCluster, noUID, wrongUID, ok []string
}

// listManagedInstances pages through the pending and running instances
// marked managed and sorts them by their launch tags.
func (r *run) listManagedInstances(ctx context.Context) (managedInstances, error) {
	var found managedInstances
	p := ec2.NewDescribeInstancesPaginator(r.ec2, &ec2.DescribeInstancesInput{
		Filters: []ec2types.Filter{
			{Name: aws.String("tag:" + r.tags.Managed), Values: []string{"true"}},
			{Name: aws.String("instance-state-name"), Values: []string{model.StatePending, model.StateRunning}},
		},
		MaxResults: aws.Int32(1000),
	})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return managedInstances{}, err
		}
		for _, res := range page.Reservations {
			for _, inst := range res.Instances {
				r.sortByLaunchTags(&found, inst)
			}
		}
	}
	return found, nil
}

// sortByLaunchTags adds inst to found by its cluster and cluster-uid tags.
func (r *run) sortByLaunchTags(found *managedInstances, inst ec2types.Instance) {
	tags := map[string]string{}
	for _, t := range inst.Tags {
		tags[aws.ToString(t.Key)] = aws.ToString(t.Value)
	}
	id := aws.ToString(inst.InstanceId)
	cluster, hasCluster := tags[r.tags.Cluster]
	uid, hasUID := tags[r.tags.ClusterUID]
	switch {
	case !hasCluster:
		found.noCluster = append(found.noCluster, id)
	case cluster != r.cluster:
		return // another deployment's
	case !hasUID:
		found.noUID = append(found.noUID, id)
	case r.clusterUID != "" && uid != r.clusterUID:
		found.wrongUID = append(found.wrongUID, id+" ("+uid+")")
	default:
		found.ok = append(found.ok, id)
	}
	found.total++
}

// reportLaunchTags fails check with every kind of missing or wrong launch
// tag found, or passes it.
func (r *run) reportLaunchTags(check string, found managedInstances) {
	keys := r.tags
	var problems []string
	if len(found.noCluster) > 0 {
		problems = append(problems, fmt.Sprintf("%s lack %s: no deployment owns them, so their exit lines are rejected and their Pods never written", listIDs(found.noCluster), keys.Cluster))
	}
	if len(found.noUID) > 0 {
		problems = append(problems, fmt.Sprintf("%s lack %s: the sweep never terminates them as orphans", listIDs(found.noUID), keys.ClusterUID))
	}
	if len(found.wrongUID) > 0 {
		problems = append(problems, fmt.Sprintf("%s carry a %s that is not this cluster's (%s): the sweep never terminates them as orphans", listIDs(found.wrongUID), keys.ClusterUID, r.clusterUID))
	}
	switch {
	case len(problems) > 0:
		r.add(check, Fail, strings.Join(problems, "; "), r.launchTagsFix())
	case found.total == 0:
		r.add(check, Pass, "no managed instance of cluster "+r.cluster+" runs", "")
	default:
		r.add(check, Pass, fmt.Sprintf("%s of cluster %s, each with %s and %s", count(len(found.ok), "running instance"), r.cluster, keys.Cluster, keys.ClusterUID), "")
	}
}

// launchTagsFix says how to have the provider write the launch tags, and
// how to tag the instances already running.
func (r *run) launchTagsFix() string {
	uidValue := r.clusterUID
	if uidValue == "" {
		uidValue = "$(kubectl get namespace " + kube.IdentityNamespace + " -o jsonpath='{.metadata.uid}')"
	}
	return fmt.Sprintf("have the provider write every launch tag (reaper userdata -o tags -cluster %s -cluster-uid %s shows them); "+
		"tag the running ones: aws ec2 create-tags --resources <ids> --tags Key=%s,Value=%s Key=%s,Value=%s",
		r.cluster, uidValue, r.tags.Cluster, r.cluster, r.tags.ClusterUID, uidValue)
}

// checkExitLines looks for the subscription filter that hands exit lines
// to the exitrecorder, and for a recent line it would hand over.
func (r *run) checkExitLines(ctx context.Context) {
	const check = "exit lines"
	group := r.outputs[outputExitLogGroup]
	if group == "" {
		r.add(check, Skip, "the stack gives no "+outputExitLogGroup, "")
		return
	}
	out, err := r.logs.DescribeSubscriptionFilters(ctx, &cloudwatchlogs.DescribeSubscriptionFiltersInput{LogGroupName: aws.String(group)})
	var notFound *logstypes.ResourceNotFoundException
	switch {
	case errors.As(err, &notFound):
		r.add(check, Fail, "the log group "+group+" does not exist", deployFix)
		return
	case err != nil:
		r.add(check, Fail, "cannot read the subscription filters of "+group+": "+err.Error(), "the operator's credentials need logs:DescribeSubscriptionFilters and logs:FilterLogEvents")
		return
	}
	recorder := r.functions[metrics.FunctionExitRecorder].arn
	var pattern *string
	for _, f := range out.SubscriptionFilters {
		if recorder == "" || aws.ToString(f.DestinationArn) == recorder {
			pattern = f.FilterPattern
			break
		}
	}
	if pattern == nil {
		r.add(check, Fail, "no subscription filter of "+group+" hands its lines to the exitrecorder", deployFix)
		return
	}

	since := r.opts.Now().Add(-r.opts.LinesWithin)
	events, err := r.logs.FilterLogEvents(ctx, &cloudwatchlogs.FilterLogEventsInput{
		LogGroupName:  aws.String(group),
		FilterPattern: pattern,
		StartTime:     aws.Int64(since.UnixMilli()),
		Limit:         aws.Int32(1),
	})
	if err != nil {
		r.add(check, Fail, "cannot read "+group+": "+err.Error(), "the operator's credentials need logs:FilterLogEvents")
		return
	}
	window := r.opts.LinesWithin.String()
	if len(events.Events) > 0 {
		ev := events.Events[0]
		r.add(check, Pass, fmt.Sprintf("%s receives them (one from %s at %s)", group, aws.ToString(ev.LogStreamName),
			time.UnixMilli(aws.ToInt64(ev.Timestamp)).UTC().Format(time.RFC3339)), "")
		return
	}
	agentFix := "on an instance that ran a Pod to its end, check that the CloudWatch agent runs with the configuration `reaper userdata -o agent-config` renders " +
		"(log group " + group + "), that the exit log has the line, and that the instance role has the stack's AgentPolicyArn; " +
		"if no workload has ended in that time, this is expected: run the doctor again after one has"
	switch {
	case r.managedRunning < 0:
		r.add(check, Warn, fmt.Sprintf("no exit line in %s within %s, and the managed instances could not be counted", group, window), agentFix)
	case r.managedRunning == 0:
		r.add(check, Warn, fmt.Sprintf("no exit line in %s within %s, and no managed instance runs yet", group, window),
			"launch a Pod on the provider, let it end, and run the doctor again")
	default:
		r.add(check, Fail, fmt.Sprintf("no exit line in %s within %s, while %s of the cluster run", group, window, count(r.managedRunning, "managed instance")), agentFix)
	}
}

// deadLetterFix is what to do about messages in the dead-letter queue.
func deadLetterFix(url, arn string) string {
	return "each message is work the reconciler failed every attempt at: read them and why " +
		"(aws sqs receive-message --queue-url " + url + " --attribute-names All --message-attribute-names All --max-number-of-messages 10) " +
		"and the reconciler's logs; once the cause is fixed, move them back to the work queue: aws sqs start-message-move-task --source-arn " + arn
}

// failureQueueFix is what to do about messages in the failure queue.
func failureQueueFix(url, _ string) string {
	return "each message is an event a function failed every retry of: read them " +
		"(aws sqs receive-message --queue-url " + url + " --max-number-of-messages 10) and the function's logs; " +
		"the sweep redoes what they concerned, so once the cause is fixed, empty the queue: aws sqs purge-queue --queue-url " + url
}

// checkQueue reads how many messages wait in the queue the stack output
// names: none should.
func (r *run) checkQueue(ctx context.Context, check, output string, fix func(url, arn string) string) {
	url := r.outputs[output]
	if url == "" {
		r.add(check, Skip, "the stack gives no "+output, "")
		return
	}
	out, err := r.sqs.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
		QueueUrl: aws.String(url),
		AttributeNames: []sqstypes.QueueAttributeName{
			sqstypes.QueueAttributeNameApproximateNumberOfMessages, sqstypes.QueueAttributeNameApproximateNumberOfMessagesNotVisible,
			sqstypes.QueueAttributeNameQueueArn,
		},
	})
	var noQueue *sqstypes.QueueDoesNotExist
	switch {
	case errors.As(err, &noQueue):
		r.add(check, Fail, url+" does not exist", deployFix)
		return
	case err != nil:
		r.add(check, Fail, "cannot read "+url+": "+err.Error(), "the operator's credentials need sqs:GetQueueAttributes")
		return
	}
	n := 0
	for _, a := range []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameApproximateNumberOfMessages, sqstypes.QueueAttributeNameApproximateNumberOfMessagesNotVisible} {
		v, err := strconv.Atoi(out.Attributes[string(a)])
		if err != nil {
			r.add(check, Fail, fmt.Sprintf("%s: %s is %q, not a count", url, a, out.Attributes[string(a)]), "")
			return
		}
		n += v
	}
	if n > 0 {
		r.add(check, Fail, fmt.Sprintf("%s in %s", count(n, "message"), url), fix(url, out.Attributes[string(sqstypes.QueueAttributeNameQueueArn)]))
		return
	}
	r.add(check, Pass, "empty", "")
}
