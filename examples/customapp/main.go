// Command customapp is a Go CDK app of its own that deploys Reaper with
// non-default settings next to its own resources: here the role of a
// provider's instances, which gets the exit-line agent policy. Synthesize it
// from the repository root with
//
//	cdk synth --app 'go run ./examples/customapp'
package main

import (
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/jsii-runtime-go"

	"github.com/reaper-k8s/reaper/infra/reapercdk"
	"github.com/reaper-k8s/reaper/pkg/model"
)

func main() {
	defer jsii.Close()
	app := awscdk.NewApp(nil)
	newStack(app, reapercdk.DefaultBuildDir)
	app.Synth(nil)
}

// newStack builds the app's stack; buildDir holds the function bundles.
func newStack(app awscdk.App, buildDir string) (awscdk.Stack, *reapercdk.Reaper) {
	stack := awscdk.NewStack(app, jsii.String("GpuPods"), nil)
	noTerminateOnStop := false
	r := reapercdk.New(stack, "Reaper", &reapercdk.Props{
		KubeconfigSecretArn: "arn:aws:secretsmanager:eu-west-1:123456789012:secret:gpu-pods/kubeconfig-AbCdEf",
		// Outside EKS the cluster's name is the provider's choice: the value
		// of the cluster tag on the instances it launches for this cluster.
		ClusterName:      "gpu-pods",
		BuildDir:         buildDir,
		TableName:        "gpu-pods-ledger",
		ExitLogGroupName: "/gpu-pods/exits",
		ExitWait:         5 * time.Minute,
		OrphanGrace:      30 * time.Minute,
		TerminateStopped: &noTerminateOnStop,
		DryRun:           true,
		Tags: model.TagKeys{
			Managed:      "gpu-pods.example.com/managed",
			Cluster:      "gpu-pods.example.com/cluster",
			PodNamespace: "gpu-pods.example.com/namespace",
			PodName:      "gpu-pods.example.com/pod",
			PodUID:       "gpu-pods.example.com/uid",
		},
		MemoryMB:    512,
		SweepRate:   5 * time.Minute,
		AlarmEmail:  "gpu-oncall@example.com",
		LogLevel:    "debug",
		MaxEventAge: 3 * time.Hour,
		// The sweep runs every five minutes, so a termination it retries
		// can come that late without anything being wrong.
		MetricsNamespace:      "GpuPods/Reaper",
		TerminateLatencyAlarm: 5 * time.Minute,
	})

	// The provider launches its instances with this role: the CloudWatch
	// agent ships exit lines with the policy the construct exports.
	awsiam.NewRole(stack, jsii.String("NodeRole"), &awsiam.RoleProps{
		AssumedBy:       awsiam.NewServicePrincipal(jsii.String("ec2.amazonaws.com"), nil),
		ManagedPolicies: &[]awsiam.IManagedPolicy{r.AgentPolicy},
	})
	return stack, r
}
