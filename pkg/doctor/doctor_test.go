package doctor_test

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reaper-k8s/reaper/internal/doctorlab"
	"github.com/reaper-k8s/reaper/internal/ec2server"
	"github.com/reaper-k8s/reaper/internal/lambdaserver"
	"github.com/reaper-k8s/reaper/pkg/doctor"
	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/model"
)

// The checks, in the order the doctor reports them.
const (
	checkStack          = "stack " + doctorlab.StackName
	checkExitRecorder   = "function exitrecorder"
	checkStateChange    = "function statechange"
	checkSweeper        = "function sweeper"
	checkReconciler     = "function reconciler"
	checkGroup          = "permissions of group reaper"
	checkServiceAccount = "permissions of ServiceAccount reaper/reaper"
	checkAdmission      = "admission policy reaper-pod-status"
	checkFlowSchema     = "FlowSchema reaper"
	checkInstances      = "instance tags"
	checkExitToken      = "exit-token tag"
	checkExitLines      = "exit lines"
	checkDeadLetters    = "dead-letter queue"
	checkFailures       = "failure queue"
)

var allChecks = []string{
	checkStack, checkExitRecorder, checkStateChange, checkSweeper, checkReconciler, checkGroup, checkServiceAccount,
	checkAdmission, checkFlowSchema, checkInstances, checkExitToken, checkExitLines, checkDeadLetters, checkFailures,
}

// want is what one check should come out as, other than Pass: its status
// and a part of its detail (and, for a warning or a failure, of its fix).
type want struct {
	status      doctor.Status
	detail, fix string
}

// expect checks that results hold every check, in order (allChecks, with
// the names renamed says: old, new), each passing but those in non, which
// come out as said there.
func expect(t *testing.T, results []doctor.Result, non map[string]want, renamed ...string) {
	t.Helper()
	names := slices.Clone(allChecks)
	for i := 0; i+1 < len(renamed); i += 2 {
		names[slices.Index(names, renamed[i])] = renamed[i+1]
	}
	var got []string
	for _, r := range results {
		got = append(got, r.Check)
	}
	if !slices.Equal(got, names) {
		t.Fatalf("checks %q\nwant %q", got, names)
	}
	for _, r := range results {
		w, ok := non[r.Check]
		if !ok {
			w = want{status: doctor.Pass}
		}
		switch {
		case r.Status != w.status:
			t.Errorf("%s: %s (%s), want %s", r.Check, r.Status, r.Detail, w.status)
		case !strings.Contains(r.Detail, w.detail):
			t.Errorf("%s: detail %q, want it to say %q", r.Check, r.Detail, w.detail)
		case (r.Status == doctor.Fail || r.Status == doctor.Warn) && (r.Fix == "" || !strings.Contains(r.Fix, w.fix)):
			t.Errorf("%s: fix %q, want it to say %q", r.Check, r.Fix, w.fix)
		}
	}
}

// result is the result of check.
func result(t *testing.T, results []doctor.Result, check string) doctor.Result {
	t.Helper()
	for _, r := range results {
		if r.Check == check {
			return r
		}
	}
	t.Fatalf("no check %s", check)
	return doctor.Result{}
}

// until runs the doctor until check comes out as status, and returns that
// run's results: the apiserver's RBAC authorizer sees a change to the
// roles and bindings through its informers, a moment after the write.
func until(t *testing.T, run func() []doctor.Result, check string, status doctor.Status) []doctor.Result {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		results := run()
		if result(t, results, check).Status == status || time.Now().After(deadline) {
			return results
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// setPolicyVariables sets the expressions of the admission policy's
// variables named in exprs, and returns what sets them back.
func setPolicyVariables(t *testing.T, lab *doctorlab.Lab, exprs map[string]string) (restore func()) {
	t.Helper()
	policies := lab.Stack.Kube.AdmissionregistrationV1().ValidatingAdmissionPolicies()
	update := func(exprs map[string]string) map[string]string {
		t.Helper()
		p, err := policies.Get(t.Context(), doctor.PolicyName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		old := map[string]string{}
		for i, v := range p.Spec.Variables {
			if e, ok := exprs[v.Name]; ok {
				old[v.Name], p.Spec.Variables[i].Expression = v.Expression, e
			}
		}
		if _, err := policies.Update(t.Context(), p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		return old
	}
	old := update(exprs)
	return func() { update(old) }
}

// sendMessages sends n messages to the queue at url, and returns what
// receives and deletes them all again.
func sendMessages(t *testing.T, lab *doctorlab.Lab, url string, n int) (drain func()) {
	t.Helper()
	client := sqs.NewFromConfig(lab.AWSConfig(t.Context()))
	for i := range n {
		if _, err := client.SendMessage(t.Context(), &sqs.SendMessageInput{QueueUrl: aws.String(url), MessageBody: aws.String(fmt.Sprint("message ", i))}); err != nil {
			t.Fatal(err)
		}
	}
	return func() {
		t.Helper()
		for left := n; left > 0; {
			out, err := client.ReceiveMessage(t.Context(), &sqs.ReceiveMessageInput{QueueUrl: aws.String(url), MaxNumberOfMessages: 10, WaitTimeSeconds: 1})
			if err != nil {
				t.Fatal(err)
			}
			var entries []sqstypes.DeleteMessageBatchRequestEntry
			for i, m := range out.Messages {
				entries = append(entries, sqstypes.DeleteMessageBatchRequestEntry{Id: aws.String(fmt.Sprint(i)), ReceiptHandle: m.ReceiptHandle})
			}
			if len(entries) == 0 {
				t.Fatalf("%s: %d messages never came back to be deleted", url, left)
			}
			if _, err := client.DeleteMessageBatch(t.Context(), &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(url), Entries: entries}); err != nil {
				t.Fatal(err)
			}
			left -= len(entries)
		}
	}
}

// TestDoctor runs the doctor on a healthy deployment on the local stack
// (the real apiserver with deploy/*.yaml applied, the EC2 and SQS test
// servers, and those of CloudFormation, Lambda and CloudWatch Logs), where
// every check passes, then breaks one piece at a time and sees the check
// for it, and only that one, fail (or warn) with a fix, and pass again once
// the piece is repaired.
func TestDoctor(t *testing.T) {
	lab := doctorlab.Start(t)
	ctx := t.Context()
	kube := lab.Stack.Kube
	clients := doctor.Clients{AWS: lab.AWSConfig(ctx), Kube: kube}
	healthy := doctor.Options{StackName: doctorlab.StackName}
	run := func(opts doctor.Options) []doctor.Result { return doctor.Run(ctx, clients, opts) }

	results := run(healthy)
	expect(t, results, nil)
	if t.Failed() {
		t.FailNow()
	}
	var out strings.Builder
	if err := doctor.Write(&out, results); err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(out.String(), "14 checks: 0 failed, 0 warnings, 14 passed, 0 skipped\n") || strings.Contains(out.String(), "fix:") {
		t.Errorf("healthy report:\n%s", out.String())
	}
	for _, r := range results {
		t.Logf("%s  %s: %s", r.Status, r.Check, r.Detail)
	}

	t.Run("no stack", func(t *testing.T) {
		skipped := want{status: doctor.Skip}
		expect(t, run(doctor.Options{StackName: "Reaper-elsewhere"}), map[string]want{
			"stack Reaper-elsewhere": {doctor.Fail, "no such stack", "-stack"},
			checkExitRecorder:        skipped, checkStateChange: skipped, checkSweeper: skipped, checkReconciler: skipped,
			checkInstances: skipped, checkExitToken: skipped, checkExitLines: skipped, checkDeadLetters: skipped, checkFailures: skipped,
		}, checkStack, "stack Reaper-elsewhere")
	})

	t.Run("missing output", func(t *testing.T) {
		lab.PutStack(map[string]bool{"DeadLetterQueueUrl": true})
		defer lab.PutStack(nil)
		expect(t, run(healthy), map[string]want{
			checkStack:       {doctor.Fail, "without the outputs DeadLetterQueueUrl", "deploy the stack again"},
			checkDeadLetters: {doctor.Skip, "no DeadLetterQueueUrl", ""},
		})
	})

	t.Run("missing function", func(t *testing.T) {
		lab.PutStack(map[string]bool{metrics.FunctionReconciler: true})
		defer lab.PutStack(nil)
		expect(t, run(healthy), map[string]want{checkReconciler: {doctor.Fail, "the stack has no such function", "deploy the stack again"}})
	})

	t.Run("function deleted", func(t *testing.T) {
		fn := lab.Functions[metrics.FunctionSweeper]
		lab.Lambda.DeleteFunction(fn.Name)
		defer lab.Lambda.PutFunction(fn)
		expect(t, run(healthy), map[string]want{checkSweeper: {doctor.Fail, "not in Lambda", "deploy the stack again"}})
	})

	t.Run("function failed", func(t *testing.T) {
		fn := lab.Functions[metrics.FunctionStateChange]
		broken := fn
		broken.State, broken.StateReason = "Failed", "The role defined for the function cannot be assumed by Lambda."
		lab.Lambda.PutFunction(broken)
		defer lab.Lambda.PutFunction(fn)
		expect(t, run(healthy), map[string]want{checkStateChange: {doctor.Fail, "is Failed: The role defined", "get-function"}})
	})

	t.Run("function misconfigured", func(t *testing.T) {
		fn := lab.Functions[metrics.FunctionExitRecorder]
		broken := lambdaserver.Function{Name: fn.Name, Environment: map[string]string{"REAPER_CLUSTER": "reaper-local", "REAPER_QUEUE_URL": "q", "REAPER_EXIT_WAIT": "soon"}}
		lab.Lambda.PutFunction(broken)
		defer lab.Lambda.PutFunction(fn)
		expect(t, run(healthy), map[string]want{checkExitRecorder: {doctor.Fail, "would fail at start: configuration: REAPER_EXIT_WAIT", "deploy the stack again"}})
	})

	t.Run("another cluster's stack", func(t *testing.T) {
		opts := healthy
		opts.Cluster = "prod-eu-1"
		wrong := want{doctor.Fail, `serves cluster "reaper-local", not "prod-eu-1"`, "-stack"}
		expect(t, run(opts), map[string]want{checkExitRecorder: wrong, checkStateChange: wrong, checkSweeper: wrong, checkReconciler: wrong})
	})

	t.Run("no RBAC binding", func(t *testing.T) {
		binding := doctorlab.Manifest[*rbacv1.ClusterRoleBinding](t, lab, "reaper")
		lab.Delete(t, binding)
		defer func() {
			lab.Create(t, binding)
			until(t, func() []doctor.Result { return run(healthy) }, checkServiceAccount, doctor.Pass)
		}()
		none := want{doctor.Fail, "may not get pods, list pods, patch pods/status, create events, get namespaces kube-system", "deploy/rbac.yaml"}
		expect(t, until(t, func() []doctor.Result { return run(healthy) }, checkServiceAccount, doctor.Fail), map[string]want{checkGroup: none, checkServiceAccount: none})
	})

	t.Run("a right missing", func(t *testing.T) {
		role := doctorlab.Manifest[*rbacv1.ClusterRole](t, lab, "reaper")
		narrowed := role.DeepCopy()
		narrowed.Rules = narrowed.Rules[:2] // no Events, no cluster identity
		if _, err := kube.RbacV1().ClusterRoles().Update(ctx, narrowed, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		defer func() {
			lab.Delete(t, role)
			lab.Create(t, role)
			until(t, func() []doctor.Result { return run(healthy) }, checkServiceAccount, doctor.Pass)
		}()
		some := want{doctor.Fail, "may not create events, get namespaces kube-system", "deploy/rbac.yaml"}
		expect(t, until(t, func() []doctor.Result { return run(healthy) }, checkServiceAccount, doctor.Fail), map[string]want{checkGroup: some, checkServiceAccount: some})
	})

	t.Run("no admission policy", func(t *testing.T) {
		policy := doctorlab.Manifest[*admissionregistrationv1.ValidatingAdmissionPolicy](t, lab, doctor.PolicyName)
		lab.Delete(t, policy)
		defer lab.Create(t, policy)
		expect(t, run(healthy), map[string]want{checkAdmission: {doctor.Fail, "not in the cluster", "deploy/admission.yaml"}})
	})

	t.Run("no admission binding", func(t *testing.T) {
		binding := doctorlab.Manifest[*admissionregistrationv1.ValidatingAdmissionPolicyBinding](t, lab, doctor.PolicyName)
		lab.Delete(t, binding)
		defer lab.Create(t, binding)
		expect(t, run(healthy), map[string]want{checkAdmission: {doctor.Fail, "no binding", "deploy/admission.yaml"}})
	})

	t.Run("node prefix matching no provider node", func(t *testing.T) {
		restore := setPolicyVariables(t, lab, map[string]string{"providerNodePrefix": "'vk-gpu-'"})
		defer restore()
		expect(t, run(healthy), map[string]want{checkAdmission: {doctor.Fail,
			`node prefix "vk-gpu-" matches none of the provider's Nodes (reaper-virtual-node)`,
			"helm template reaper charts/reaper --set admission.providerNodePrefix=<prefix> | kubectl apply -f -"}})
	})

	t.Run("provider label instead of a prefix", func(t *testing.T) {
		restore := setPolicyVariables(t, lab, map[string]string{"providerNodePrefix": "''", "providerLabelKey": "'example.com/provider'", "providerLabelValue": `"reaper"`})
		defer restore()
		expect(t, run(healthy), map[string]want{checkAdmission: {doctor.Fail, "no Pod on them is labelled example.com/provider=reaper", "label its Pods example.com/provider=reaper"}})

		if err := lab.Stack.EnsureNamespaces(ctx, "batch"); err != nil {
			t.Fatal(err)
		}
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "job-1", Namespace: "batch", Labels: map[string]string{"example.com/provider": "reaper"}},
			Spec:       corev1.PodSpec{NodeName: doctorlab.ProviderNode, Containers: []corev1.Container{{Name: "main", Image: "busybox"}}},
		}
		if _, err := kube.CoreV1().Pods("batch").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		expect(t, run(healthy), nil)
		if err := kube.CoreV1().Pods("batch").Delete(ctx, pod.Name, *metav1.NewDeleteOptions(0)); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("another provider's node", func(t *testing.T) {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "aci-connector", Labels: map[string]string{"type": "virtual-kubelet"}}}
		if _, err := kube.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := kube.CoreV1().Nodes().Delete(ctx, node.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}()
		expect(t, run(healthy), map[string]want{checkAdmission: {doctor.Warn, "matches reaper-virtual-node but not aci-connector", "-provider-nodes"}})
		opts := healthy
		opts.ProviderNodes = "type=virtual-kubelet,kubernetes.io/hostname=" + doctorlab.ProviderNode
		expect(t, run(opts), nil)
	})

	// Before the provider runs (deploy.md checks the deployment before
	// the provider is pointed at it, and again after), no Node matches the
	// selector: the policy cannot be judged yet, which is no failure.
	t.Run("no provider node yet", func(t *testing.T) {
		opts := healthy
		opts.ProviderNodes = "type=fargate"
		results := run(opts)
		expect(t, results, map[string]want{checkAdmission: {doctor.Warn,
			`no provider Node yet: no Node matches -provider-nodes "type=fargate", so the doctor cannot tell whether node prefix "reaper-virtual-" matches the provider's Nodes`,
			"start the provider"}})
		if fix := result(t, results, checkAdmission).Fix; !strings.Contains(fix, "kubectl get nodes --show-labels") || !strings.Contains(fix, "-provider-nodes") {
			t.Errorf("fix %q: want it to say how to find the provider's labels and pass them with -provider-nodes", fix)
		}
		if n := doctor.Failed(results); n != 0 {
			t.Errorf("%d checks failed, want none", n)
		}
	})

	t.Run("no FlowSchema", func(t *testing.T) {
		fs := doctorlab.Manifest[*flowcontrolv1.FlowSchema](t, lab, doctor.FlowSchemaName)
		lab.Delete(t, fs)
		defer lab.Create(t, fs)
		expect(t, run(healthy), map[string]want{checkFlowSchema: {doctor.Fail, "not in the cluster", "deploy/flowcontrol.yaml"}})
	})

	t.Run("FlowSchema without its priority level", func(t *testing.T) {
		level := doctorlab.Manifest[*flowcontrolv1.PriorityLevelConfiguration](t, lab, "reaper")
		lab.Delete(t, level)
		defer lab.Create(t, level)
		expect(t, run(healthy), map[string]want{checkFlowSchema: {doctor.Fail, "priority level reaper is not in the cluster", "deploy/flowcontrol.yaml"}})
	})

	t.Run("FlowSchema for other identities", func(t *testing.T) {
		opts := healthy
		opts.Identity = doctor.Identity{Group: "reaper", ServiceAccountNamespace: "reaper-system", ServiceAccount: "reaper"}
		expect(t, run(opts), map[string]want{
			checkGroup: {doctor.Pass, "", ""},
			"permissions of ServiceAccount reaper-system/reaper": {doctor.Fail, "may not get pods", "deploy/rbac.yaml"},
			checkFlowSchema: {doctor.Fail, "leave out", "deploy/flowcontrol.yaml"},
		}, checkServiceAccount, "permissions of ServiceAccount reaper-system/reaper")
	})

	t.Run("instances missing tags", func(t *testing.T) {
		tags := lab.LaunchTags("batch", "job-2")
		delete(tags, model.DefaultTagClusterUID)
		noUID := lab.Stack.EC2.AddInstance(ec2server.Instance{Tags: tags})
		tags = lab.LaunchTags("batch", "job-3")
		tags[model.DefaultTagClusterUID] = "0f0f0f0f-0000-4000-8000-000000000000"
		wrongUID := lab.Stack.EC2.AddInstance(ec2server.Instance{Tags: tags})
		tags = lab.LaunchTags("batch", "job-4")
		delete(tags, model.DefaultTagCluster)
		noCluster := lab.Stack.EC2.AddInstance(ec2server.Instance{Tags: tags})
		stopped := lab.Stack.EC2.AddInstance(ec2server.Instance{State: ec2server.Stopped, Tags: map[string]string{model.DefaultTagManaged: "true"}})
		defer func() {
			for _, id := range []string{noUID.ID, wrongUID.ID, noCluster.ID, stopped.ID} {
				lab.Stack.EC2.RemoveInstance(id)
			}
		}()
		results := run(healthy)
		expect(t, results, map[string]want{checkInstances: {doctor.Fail, noCluster.ID + " lack reaper.io/cluster:", "-cluster-uid " + lab.ClusterUID}})
		detail := result(t, results, checkInstances).Detail
		for _, part := range []string{noUID.ID + " lack reaper.io/cluster-uid", wrongUID.ID + " (0f0f0f0f-0000-4000-8000-000000000000) carry a reaper.io/cluster-uid that is not this cluster's"} {
			if !strings.Contains(detail, part) {
				t.Errorf("instance tags: %q does not say %q", detail, part)
			}
		}
		if strings.Contains(detail, stopped.ID) || strings.Contains(detail, lab.Instance.ID) {
			t.Errorf("instance tags: %q names a stopped or a well-tagged instance", detail)
		}
	})

	// The provider's exit-token tag against the key the deployment reads
	// (REAPER_TAG_EXIT_TOKEN): another key fails, a hash-like tag under an
	// unknown key and no tag at all warn, some instances without the tag
	// pass (instances launched without a token are allowed).
	withTags := func(t *testing.T, name string, edit func(tags map[string]string)) ec2server.Instance {
		t.Helper()
		tags := lab.LaunchTags("batch", name)
		edit(tags)
		inst := lab.Stack.EC2.AddInstance(ec2server.Instance{Tags: tags})
		t.Cleanup(func() { lab.Stack.EC2.RemoveInstance(inst.ID) })
		return inst
	}
	moveToken := func(key string) func(map[string]string) {
		return func(tags map[string]string) {
			tags[key] = tags[model.DefaultTagExitToken]
			delete(tags, model.DefaultTagExitToken)
		}
	}

	t.Run("exit-token tag under another key", func(t *testing.T) {
		inst := withTags(t, "job-5", moveToken("example.com/exit-token-sha256"))
		results := run(healthy)
		expect(t, results, map[string]want{checkExitToken: {doctor.Fail,
			inst.ID + " (example.com/exit-token-sha256) carry an exit-token tag under another key than reaper.io/exit-token-sha256",
			"-c tagExitToken=example.com/exit-token-sha256"}})
		if detail := result(t, results, checkExitToken).Detail; strings.Contains(detail, lab.Instance.ID) {
			t.Errorf("exit-token tag: %q names the well-tagged instance", detail)
		}
	})

	t.Run("deployment reading another exit-token key", func(t *testing.T) {
		fn := lab.Functions[metrics.FunctionReconciler]
		custom := fn
		custom.Environment = maps.Clone(fn.Environment)
		custom.Environment["REAPER_TAG_EXIT_TOKEN"] = "example.com/exit-token-sha256"
		lab.Lambda.PutFunction(custom)
		defer lab.Lambda.PutFunction(fn)
		expect(t, run(healthy), map[string]want{checkExitToken: {doctor.Fail,
			lab.Instance.ID + " (reaper.io/exit-token-sha256) carry an exit-token tag under another key than example.com/exit-token-sha256",
			"under example.com/exit-token-sha256"}})
		withTags(t, "job-6", moveToken("example.com/exit-token-sha256"))
		lab.Stack.EC2.RemoveInstance(lab.Instance.ID)
		defer lab.Stack.EC2.AddInstance(lab.Instance)
		expect(t, run(healthy), map[string]want{checkExitToken: {doctor.Pass, "1 running instance of cluster reaper-local, each with example.com/exit-token-sha256", ""}})
	})

	t.Run("hash-like tag under an unknown key", func(t *testing.T) {
		inst := withTags(t, "job-7", moveToken("provider.example.com/launch-digest"))
		expect(t, run(healthy), map[string]want{checkExitToken: {doctor.Warn,
			inst.ID + " (provider.example.com/launch-digest) carry no reaper.io/exit-token-sha256 but a tag whose value looks like a SHA-256",
			"-c tagExitToken=provider.example.com/launch-digest"}})
	})

	t.Run("malformed exit-token tag", func(t *testing.T) {
		inst := withTags(t, "job-8", func(tags map[string]string) {
			tags[model.DefaultTagExitToken] = strings.ToUpper(tags[model.DefaultTagExitToken])
		})
		expect(t, run(healthy), map[string]want{checkExitToken: {doctor.Fail, inst.ID + ` ("`, "lower-case hex"}})
	})

	t.Run("instances launched without an exit token", func(t *testing.T) {
		noToken := func(tags map[string]string) { delete(tags, model.DefaultTagExitToken) }
		withTags(t, "job-9", noToken)
		expect(t, run(healthy), map[string]want{checkExitToken: {doctor.Pass, "1 of the 2 running instances of cluster reaper-local carry reaper.io/exit-token-sha256; the other 1 were launched without an exit token", ""}})
		lab.Stack.EC2.RemoveInstance(lab.Instance.ID)
		defer lab.Stack.EC2.AddInstance(lab.Instance)
		expect(t, run(healthy), map[string]want{checkExitToken: {doctor.Warn, "none of the 1 running instance of cluster reaper-local carries reaper.io/exit-token-sha256", "userdata.Launch"}})
	})

	later := healthy
	later.Now = func() time.Time { return time.Now().Add(2 * doctor.DefaultLinesWithin) }
	t.Run("no exit lines", func(t *testing.T) {
		expect(t, run(later), map[string]want{checkExitLines: {doctor.Fail, "while 1 managed instance of the cluster run", "AgentPolicyArn"}})
	})

	t.Run("no exit lines and no instance yet", func(t *testing.T) {
		lab.Stack.EC2.RemoveInstance(lab.Instance.ID)
		defer lab.Stack.EC2.AddInstance(lab.Instance)
		expect(t, run(later), map[string]want{
			checkInstances: {doctor.Pass, "no managed instance of cluster reaper-local runs", ""},
			checkExitLines: {doctor.Warn, "no managed instance runs yet", "launch a Pod"},
		})
	})

	t.Run("no subscription filter", func(t *testing.T) {
		lab.Logs.DeleteSubscriptionFilter(doctorlab.ExitLogGroup, doctorlab.ExitFilter)
		defer lab.PutSubscriptionFilter()
		expect(t, run(healthy), map[string]want{checkExitLines: {doctor.Fail, "no subscription filter", "deploy the stack again"}})
	})

	t.Run("messages in the dead-letter queue", func(t *testing.T) {
		url := lab.Outputs["DeadLetterQueueUrl"]
		drain := sendMessages(t, lab, url, 2)
		defer drain()
		expect(t, run(healthy), map[string]want{checkDeadLetters: {doctor.Fail, "2 messages in " + url,
			"aws sqs start-message-move-task --source-arn arn:aws:sqs:us-east-1:123456789012:" + doctorlab.StackName + "-ReaperDeadLetters"}})
	})

	t.Run("messages in the failure queue", func(t *testing.T) {
		url := lab.Outputs["FailureQueueUrl"]
		drain := sendMessages(t, lab, url, 1)
		defer drain()
		expect(t, run(healthy), map[string]want{checkFailures: {doctor.Fail, "1 message in " + url, "aws sqs purge-queue --queue-url " + url}})
	})

	t.Run("cluster unreachable", func(t *testing.T) {
		unreachable := doctor.Clients{AWS: clients.AWS, KubeErr: errors.New("no configuration has been provided")}
		gone := want{doctor.Fail, "cannot reach the cluster: no configuration has been provided", "KUBECONFIG"}
		expect(t, doctor.Run(ctx, unreachable, healthy), map[string]want{checkGroup: gone, checkServiceAccount: gone, checkAdmission: gone, checkFlowSchema: gone})
	})

	// Each case repaired what it broke.
	expect(t, run(healthy), nil)
}
