package vkprovider_test

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// The host settings the end-to-end provider launches with: the instance
// profile whose role ships the exit lines, two subnets, two security
// groups.
var (
	hostProfile        = "arn:aws:iam::123456789012:instance-profile/reaper/reaper-host"
	hostSubnets        = []string{"subnet-0a1b2c3d4e5f60718", "subnet-0f1e2d3c4b5a69788"}
	hostSecurityGroups = []string{"sg-0123456789abcdef0", "sg-00aa11bb"}
)

// wantHostLaunch checks the RunInstances that launched the Pod's instance,
// as the EC2 test server received it from the SDK: it names the instance
// profile, one of the subnets, and every security group.
func wantHostLaunch(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	for _, c := range lab.Stack.EC2.Calls() {
		if c.Action != "RunInstances" || c.Params.Get("ClientToken") != string(pod.UID) {
			continue
		}
		p := c.Params
		groups := []string{p.Get("SecurityGroupId.1"), p.Get("SecurityGroupId.2"), p.Get("SecurityGroupId.3")}
		if p.Get("IamInstanceProfile.Arn") != hostProfile || p.Has("IamInstanceProfile.Name") ||
			!slices.Contains(hostSubnets, p.Get("SubnetId")) || !slices.Equal(groups, append(slices.Clone(hostSecurityGroups), "")) {
			t.Errorf("Pod %s launched with instance profile %q (by name %q), subnet %q and security groups %q; want instance profile %s, a subnet of %v and security groups %v",
				pod.Name, p.Get("IamInstanceProfile.Arn"), p.Get("IamInstanceProfile.Name"), p.Get("SubnetId"), groups, hostProfile, hostSubnets, hostSecurityGroups)
		}
		return
	}
	t.Errorf("Pod %s: no RunInstances for it", pod.Name)
}
