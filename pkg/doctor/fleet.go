package doctor

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
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
	r.tokens = &found.tokens
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
	// tokens sorts the instances of the cluster by their exit-token tag.
	tokens tokenTags
}

// tokenTags are the running instances of the cluster by their exit-token
// tag, as the deployment reads it (model.TagKeys.ExitToken).
type tokenTags struct {
	// total counts them all.
	total int
	// tagged carry the deployment's key with a hash; malformed carry it
	// with a value no token hashes to ("id (value)").
	tagged, malformed []string
	// otherKey lack the deployment's key but carry one named like an
	// exit-token tag ("id (key)"); hashLike lack both but carry a tag
	// whose value has the hash's form, 64 lower-case hex digits.
	otherKey, hashLike []string
	// keys are the keys of otherKey, then of hashLike, without repeats.
	keys []string
}

// exitTokenKeySuffix ends the default exit-token tag key
// (model.DefaultTagExitToken): a key that ends with it, whatever its
// prefix, is a provider's exit-token tag.
const exitTokenKeySuffix = "exit-token-sha256"

// sort adds the instance id with tags to t.
func (t *tokenTags) sort(id string, tags map[string]string, key string) {
	t.total++
	if v, ok := tags[key]; ok {
		if model.ValidExitTokenHash(v) {
			t.tagged = append(t.tagged, id)
		} else {
			t.malformed = append(t.malformed, fmt.Sprintf("%s (%.80q)", id, v))
		}
		return
	}
	var named, hashed string
	for _, k := range slices.Sorted(maps.Keys(tags)) {
		switch lower := strings.ToLower(k); {
		case named == "" && (strings.HasSuffix(lower, exitTokenKeySuffix) || strings.Contains(lower, "exit-token") || strings.Contains(lower, "exittoken")):
			named = k
		case hashed == "" && model.ValidExitTokenHash(tags[k]):
			hashed = k
		}
	}
	switch {
	case named != "":
		t.otherKey = append(t.otherKey, id+" ("+named+")")
		t.addKey(named)
	case hashed != "":
		t.hashLike = append(t.hashLike, id+" ("+hashed+")")
		t.addKey(hashed)
	}
}

func (t *tokenTags) addKey(k string) {
	if !slices.Contains(t.keys, k) {
		t.keys = append(t.keys, k)
	}
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

// sortByLaunchTags adds inst to found by its cluster and cluster-uid tags,
// and an instance of the cluster by its exit-token tag too.
func (r *run) sortByLaunchTags(found *managedInstances, inst ec2types.Instance) {
	tags := map[string]string{}
	for _, t := range inst.Tags {
		tags[aws.ToString(t.Key)] = aws.ToString(t.Value)
	}
	id := aws.ToString(inst.InstanceId)
	cluster, hasCluster := tags[r.tags.Cluster]
	uid, hasUID := tags[r.tags.ClusterUID]
	if hasCluster && cluster == r.cluster {
		found.tokens.sort(id, tags, r.tags.ExitToken)
	}
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

// checkExitTokens reports whether the running instances of the cluster
// carry the exit-token tag under the key the deployment reads
// (REAPER_TAG_EXIT_TOKEN): a provider that writes the hash under another
// key gets no token check at all, silently, since an instance without the
// tag is believed on its other tags (the reconciler counts such lines as
// ExitTokensUnexpected). It fails for an exit-token tag under another key
// or with a value no token hashes to; it warns for a hash-like tag under
// another key, and when no instance carries the tag (instances launched
// without a token are allowed, but then one host can end another's Pod);
// it passes when some carry it, whatever the others do.
func (r *run) checkExitTokens() {
	const check = "exit-token tag"
	key := r.tags.ExitToken
	if r.tokens == nil {
		r.add(check, Skip, "the managed instances could not be listed", "")
		return
	}
	t := *r.tokens
	var fails []string
	if len(t.otherKey) > 0 {
		fails = append(fails, fmt.Sprintf("%s carry an exit-token tag under another key than %s, the one the deployment reads: no exit token of theirs is checked", listIDs(t.otherKey), key))
	}
	if len(t.malformed) > 0 {
		fails = append(fails, fmt.Sprintf("%s carry a %s that is not a SHA-256 in lower-case hex: every exit line of theirs is refused (token-mismatch)", listIDs(t.malformed), key))
	}
	switch {
	case len(fails) > 0:
		r.add(check, Fail, strings.Join(fails, "; "), r.exitTokenFix(t.keys))
	case len(t.hashLike) > 0:
		r.add(check, Warn, fmt.Sprintf("%s carry no %s but a tag whose value looks like a SHA-256: if it is their exit-token hash, no exit token of theirs is checked", listIDs(t.hashLike), key),
			r.exitTokenFix(t.keys))
	case t.total == 0:
		r.add(check, Pass, "no managed instance of cluster "+r.cluster+" runs", "")
	case len(t.tagged) == 0:
		r.add(check, Warn, fmt.Sprintf("none of the %s of cluster %s carries %s: no exit token is checked, so a host can end another instance's Pod by naming it", count(t.total, "running instance"), r.cluster, key),
			"launch every instance with an exit token: userdata.Launch and reaper userdata -o launch draw one and write its hash under "+key+
				"; a provider that writes it under another key: have it write "+key+" (reaper userdata -tag-key-exit-token), or deploy the stack with -c tagExitToken=<its key>")
	case len(t.tagged) < t.total:
		r.add(check, Pass, fmt.Sprintf("%d of the %s of cluster %s carry %s; the other %d were launched without an exit token", len(t.tagged), count(t.total, "running instance"), r.cluster, key, t.total-len(t.tagged)), "")
	default:
		r.add(check, Pass, fmt.Sprintf("%s of cluster %s, each with %s", count(t.total, "running instance"), r.cluster, key), "")
	}
}

// exitTokenFix says how to make the provider's exit-token tag key and the
// deployment's agree, given the keys the provider used instead.
func (r *run) exitTokenFix(keys []string) string {
	other := "<its key>"
	if len(keys) > 0 {
		other = keys[0]
	}
	return fmt.Sprintf("have the provider write the exit token's hash (model.ExitTokenHash: the SHA-256 of the token in lower-case hex) under %s, as userdata.Launch and reaper userdata -o launch do "+
		"(-tag-key-exit-token names another key), or, if %s is the key you mean, deploy the stack with -c tagExitToken=%s, which sets the reconciler's REAPER_TAG_EXIT_TOKEN",
		r.tags.ExitToken, other, other)
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
