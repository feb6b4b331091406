// Package doctorlab builds, in the lab, a healthy Reaper deployment for
// `reaper doctor` to check: the stack (internal/cfnserver), its four
// functions (internal/lambdaserver), the exit log group with its
// subscription filter and an exit line (internal/logsserver), the queues
// (internal/sqsserver), a running instance with every launch tag, the
// exit token's hash among them (internal/ec2server), and, on the real apiserver, deploy/*.yaml applied
// and the provider's virtual node. Tests then break one piece at a time.
package doctorlab

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"

	"github.com/reaper-k8s/reaper/internal/cfnserver"
	"github.com/reaper-k8s/reaper/internal/ec2server"
	"github.com/reaper-k8s/reaper/internal/labstack"
	"github.com/reaper-k8s/reaper/internal/lambdaserver"
	"github.com/reaper-k8s/reaper/internal/logsserver"
	"github.com/reaper-k8s/reaper/pkg/exitline"
	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/model"
)

// The deployment's names.
const (
	// StackName is the stack's name: the CDK app's default for the lab's
	// cluster.
	StackName = "Reaper-" + labstack.Cluster
	// ProviderNode is the provider's virtual node, labelled as
	// virtual-kubelet labels its nodes.
	ProviderNode = "reaper-virtual-node"
	// ExitLogGroup is the stack's exit log group.
	ExitLogGroup = "/reaper/" + labstack.Cluster + "/exits"
	// ExitFilter is the name of its subscription filter.
	ExitFilter = "reaper-exits"
)

// FunctionLogicalIDs are the logical ids CDK gives the functions, by name.
var FunctionLogicalIDs = map[string]string{
	metrics.FunctionExitRecorder: "ReaperExitRecorder4F2C1B7A",
	metrics.FunctionStateChange:  "ReaperStateChange0D9E8A21",
	metrics.FunctionSweeper:      "ReaperSweeperB3C5E6F0",
	metrics.FunctionReconciler:   "ReaperReconciler77A1C2D3",
}

// Lab is a healthy deployment on a local stack.
type Lab struct {
	Stack  *labstack.Stack
	CFN    *cfnserver.Server
	Lambda *lambdaserver.Server
	Logs   *logsserver.Server

	// Outputs are the stack's outputs.
	Outputs map[string]string
	// Functions are the deployed functions, by function name.
	Functions map[string]lambdaserver.Function
	// Manifests are the objects of deploy/*.yaml, as applied.
	Manifests []k8sruntime.Object
	// ClusterUID is the UID of the cluster's kube-system namespace.
	ClusterUID string
	// Instance is the running instance of a Pod, with every launch tag.
	Instance ec2server.Instance
}

// Start builds the healthy deployment for the duration of the test.
func Start(t *testing.T) *Lab {
	t.Helper()
	ctx := t.Context()
	l := &Lab{
		Stack:  labstack.MustStart(t, labstack.Options{Parts: labstack.Kube | labstack.EC2 | labstack.SQS}),
		CFN:    cfnserver.New(),
		Lambda: lambdaserver.New(),
		Logs:   logsserver.New(),
	}
	t.Cleanup(l.CFN.Close)
	t.Cleanup(l.Lambda.Close)
	t.Cleanup(l.Logs.Close)

	sqsClient := sqs.NewFromConfig(l.AWSConfig(ctx))
	queue := func(name string) string {
		out, err := sqsClient.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name)})
		if err != nil {
			t.Fatal(err)
		}
		return aws.ToString(out.QueueUrl)
	}
	prefix := StackName + "-Reaper"
	l.Outputs = map[string]string{
		"LedgerTable":        prefix + "Ledger1A2B3C4D-XYZ",
		"ExitLogGroup":       ExitLogGroup,
		"AgentPolicyArn":     "arn:aws:iam::" + cfnserver.AccountID + ":policy/" + prefix + "AgentPolicy",
		"FailureQueueUrl":    queue(prefix + "Failures"),
		"WorkQueueUrl":       queue(prefix + "Work"),
		"DeadLetterQueueUrl": queue(prefix + "DeadLetters"),
		"DashboardName":      prefix + "Dashboard",
		"SweeperRoleArn":     "arn:aws:iam::" + cfnserver.AccountID + ":role/" + prefix + "SweeperRole",
		"ReconcilerRoleArn":  "arn:aws:iam::" + cfnserver.AccountID + ":role/" + prefix + "ReconcilerRole",
	}
	l.Functions = map[string]lambdaserver.Function{}
	for name := range FunctionLogicalIDs {
		env := map[string]string{
			"REAPER_TABLE": l.Outputs["LedgerTable"], "REAPER_CLUSTER": labstack.Cluster,
			"REAPER_QUEUE_URL": l.Outputs["WorkQueueUrl"], "REAPER_DRY_RUN": "false",
		}
		if name == metrics.FunctionSweeper || name == metrics.FunctionReconciler {
			env["REAPER_EKS_CLUSTER"] = labstack.Cluster
		}
		l.Functions[name] = l.Lambda.PutFunction(lambdaserver.Function{Name: prefix + name + "-AbCdEf012345", Environment: env})
	}
	l.PutStack(nil)

	l.Logs.CreateLogGroup(ExitLogGroup)
	l.PutSubscriptionFilter()

	l.Manifests = append(append(decode(t, "rbac.yaml"), decode(t, "admission.yaml")...), decode(t, "flowcontrol.yaml")...)
	for _, obj := range l.Manifests {
		l.Create(t, obj)
	}
	kube := l.Stack.Kube
	if _, err := kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name: ProviderNode, Labels: map[string]string{"type": "virtual-kubelet", corev1.LabelHostname: ProviderNode},
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ns, err := kube.CoreV1().Namespaces().Get(ctx, "kube-system", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	l.ClusterUID = string(ns.UID)

	l.Instance = l.Stack.EC2.AddInstance(ec2server.Instance{Tags: l.LaunchTags("batch", "job-1")})
	l.PutExitLine(t, l.Instance.ID, time.Now().Add(-time.Hour))
	// Neither of these is the deployment's: one of another cluster, one
	// not managed at all.
	l.Stack.EC2.AddInstance(ec2server.Instance{Tags: map[string]string{model.DefaultTagManaged: "true", model.DefaultTagCluster: "other"}})
	l.Stack.EC2.AddInstance(ec2server.Instance{Tags: map[string]string{"Name": "bastion"}})
	return l
}

// LaunchTags are the seven tags a provider writes on the instance of the
// Pod namespace/name of the lab's cluster, the exit-token tag with the hash
// of ExitToken(name).
func (l *Lab) LaunchTags(namespace, name string) map[string]string {
	return map[string]string{
		model.DefaultTagManaged: "true", model.DefaultTagCluster: labstack.Cluster, model.DefaultTagClusterUID: l.ClusterUID,
		model.DefaultTagPodNamespace: namespace, model.DefaultTagPodName: name, model.DefaultTagPodUID: "uid-" + name,
		model.DefaultTagExitToken: model.ExitTokenHash(ExitToken(name)),
	}
}

// ExitToken is the exit token of the launch of the Pod called name.
func ExitToken(name string) string { return "exit-token-of-" + name + "-0123456789abcdefghijklmnop" }

// PutStack stores the deployment's stack with its outputs and resources,
// less the outputs and function resources named in leaveOut.
func (l *Lab) PutStack(leaveOut map[string]bool) {
	outputs := map[string]string{}
	for k, v := range l.Outputs {
		if !leaveOut[k] {
			outputs[k] = v
		}
	}
	resources := []cfnserver.Resource{
		{LogicalID: "ReaperLedger6F0BC2B4", PhysicalID: l.Outputs["LedgerTable"], Type: "AWS::DynamoDB::Table"},
		// A function of CDK's own, which is not Reaper's.
		{LogicalID: "LogRetentionaae0aa3c5b4d4f87b02d85b201efdd8aFD4BFC8A", PhysicalID: StackName + "-LogRetention", Type: "AWS::Lambda::Function"},
	}
	for name, id := range FunctionLogicalIDs {
		if !leaveOut[name] {
			resources = append(resources, cfnserver.Resource{LogicalID: id, PhysicalID: l.Functions[name].Name, Type: "AWS::Lambda::Function"})
		}
	}
	l.CFN.PutStack(cfnserver.Stack{Name: StackName, Outputs: outputs, Resources: resources})
}

// PutSubscriptionFilter puts the subscription filter that hands the exit
// lines to the exitrecorder on the exit log group.
func (l *Lab) PutSubscriptionFilter() {
	l.Logs.PutSubscriptionFilter(ExitLogGroup, logsserver.SubscriptionFilter{
		Name: ExitFilter, Pattern: fmt.Sprintf(`{ $.reaper = %q }`, exitline.Kind), DestinationARN: l.Functions[metrics.FunctionExitRecorder].ARN(),
	})
}

// PutExitLine puts an exit line of instance into the exit log group, at t.
func (l *Lab) PutExitLine(tb testing.TB, instance string, at time.Time) {
	tb.Helper()
	b, err := json.Marshal(exitline.Line{
		Reaper: exitline.Kind, V: exitline.Version, InstanceID: instance, PodNamespace: "batch", PodName: "job-1", PodUID: "uid-job-1",
		Container: "main", Token: ExitToken("job-1"), ExitCode: 0, StartedAt: at.Add(-time.Minute), FinishedAt: at,
	})
	if err != nil {
		tb.Fatal(err)
	}
	l.Logs.PutLogEvent(ExitLogGroup, logsserver.Event{Stream: instance, Time: at, Message: string(b)})
}

// AWSConfig is an SDK configuration whose clients reach the lab's AWS
// services, as AWS_ENDPOINT_URL_<SERVICE> (Env) would have them.
func (l *Lab) AWSConfig(ctx context.Context) aws.Config {
	cfg := l.Stack.AWSConfig(ctx)
	cfg.ConfigSources = append(cfg.ConfigSources, endpoints{
		"CloudFormation": l.CFN.URL(), "Lambda": l.Lambda.URL(), "CloudWatch Logs": l.Logs.URL(),
	})
	return cfg
}

type endpoints map[string]string

func (e endpoints) GetServiceBaseEndpoint(_ context.Context, sdkID string) (string, bool, error) {
	v, ok := e[sdkID]
	return v, ok, nil
}

// Env is the environment of a process that reaches the lab: the stack's,
// with the endpoints of the CloudFormation, Lambda and CloudWatch Logs
// servers, and no shared AWS files.
func (l *Lab) Env() []string {
	return append(l.Stack.Env(),
		"AWS_ENDPOINT_URL_CLOUDFORMATION="+l.CFN.URL(),
		"AWS_ENDPOINT_URL_LAMBDA="+l.Lambda.URL(),
		"AWS_ENDPOINT_URL_CLOUDWATCH_LOGS="+l.Logs.URL(),
		"AWS_CONFIG_FILE="+os.DevNull, "AWS_SHARED_CREDENTIALS_FILE="+os.DevNull,
	)
}

// Manifest returns the object of deploy/*.yaml of type T called name.
func Manifest[T interface {
	k8sruntime.Object
	GetName() string
}](tb testing.TB, l *Lab, name string) T {
	tb.Helper()
	for _, obj := range l.Manifests {
		if o, ok := obj.(T); ok && o.GetName() == name {
			return o
		}
	}
	var zero T
	tb.Fatalf("no %T %s in deploy/*.yaml", zero, name)
	return zero
}

// deployDir is the repository's deploy/, found from this file, so tests of
// any package reach it.
func deployDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "deploy")
}

// decode reads the objects of a manifest of deploy/.
func decode(tb testing.TB, name string) []k8sruntime.Object {
	tb.Helper()
	raw, err := os.ReadFile(filepath.Join(deployDir(), name))
	if err != nil {
		tb.Fatal(err)
	}
	var objs []k8sruntime.Object
	docs := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(raw)))
	for {
		doc, err := docs.Read()
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			tb.Fatalf("%s: %v", name, err)
		}
		// A header of comments before the first "---" is a document too.
		if js, err := yaml.YAMLToJSON(doc); err != nil || string(js) == "null" {
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			tb.Fatalf("%s: %v", name, err)
		}
		objs = append(objs, obj)
	}
}

// Create creates a copy of obj, one of the kinds deploy/*.yaml holds.
func (l *Lab) Create(tb testing.TB, obj k8sruntime.Object) {
	tb.Helper()
	if err := apply(tb.Context(), l.Stack.Kube, obj.DeepCopyObject(), false); err != nil {
		tb.Fatalf("create %T: %v", obj, err)
	}
}

// Delete deletes obj, one of the kinds deploy/*.yaml holds.
func (l *Lab) Delete(tb testing.TB, obj k8sruntime.Object) {
	tb.Helper()
	if err := apply(tb.Context(), l.Stack.Kube, obj, true); err != nil && !apierrors.IsNotFound(err) {
		tb.Fatalf("delete %T: %v", obj, err)
	}
}

func apply(ctx context.Context, c kubernetes.Interface, obj k8sruntime.Object, del bool) error {
	opts, delOpts := metav1.CreateOptions{}, metav1.DeleteOptions{}
	var err error
	switch o := obj.(type) {
	case *corev1.Namespace:
		if del {
			// A namespace's deletion waits for a controller the lab does
			// not run; the tests never delete one.
			return errors.New("doctorlab: namespaces are not deleted")
		}
		_, err = c.CoreV1().Namespaces().Create(ctx, o, opts)
	case *corev1.ServiceAccount:
		if del {
			return c.CoreV1().ServiceAccounts(o.Namespace).Delete(ctx, o.Name, delOpts)
		}
		_, err = c.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, opts)
	case *rbacv1.ClusterRole:
		if del {
			return c.RbacV1().ClusterRoles().Delete(ctx, o.Name, delOpts)
		}
		_, err = c.RbacV1().ClusterRoles().Create(ctx, o, opts)
	case *rbacv1.ClusterRoleBinding:
		if del {
			return c.RbacV1().ClusterRoleBindings().Delete(ctx, o.Name, delOpts)
		}
		_, err = c.RbacV1().ClusterRoleBindings().Create(ctx, o, opts)
	case *admissionregistrationv1.ValidatingAdmissionPolicy:
		if del {
			return c.AdmissionregistrationV1().ValidatingAdmissionPolicies().Delete(ctx, o.Name, delOpts)
		}
		_, err = c.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, o, opts)
	case *admissionregistrationv1.ValidatingAdmissionPolicyBinding:
		if del {
			return c.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(ctx, o.Name, delOpts)
		}
		_, err = c.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, o, opts)
	case *flowcontrolv1.FlowSchema:
		if del {
			return c.FlowcontrolV1().FlowSchemas().Delete(ctx, o.Name, delOpts)
		}
		_, err = c.FlowcontrolV1().FlowSchemas().Create(ctx, o, opts)
	case *flowcontrolv1.PriorityLevelConfiguration:
		if del {
			return c.FlowcontrolV1().PriorityLevelConfigurations().Delete(ctx, o.Name, delOpts)
		}
		_, err = c.FlowcontrolV1().PriorityLevelConfigurations().Create(ctx, o, opts)
	default:
		return fmt.Errorf("doctorlab: unexpected object %T", obj)
	}
	return err
}
