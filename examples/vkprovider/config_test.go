package vkprovider

import (
	"fmt"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
)

// validConfig is a configuration Run accepts.
func validConfig() Config {
	return Config{
		NodeName: NodePrefix + "node", Cluster: "prod", Kube: fake.NewClientset(), EC2: ec2.New(ec2.Options{}),
		ImageID: "ami-0123456789abcdef0", InstanceProfile: "arn:aws:iam::123456789012:instance-profile/reaper/reaper-host",
		SubnetIDs:        []string{"subnet-0a1b2c3d4e5f60718", "subnet-1a2b3c4d"},
		SecurityGroupIDs: []string{"sg-0123456789abcdef0"},
	}
}

// The launch settings are checked before anything starts, every problem
// at once; the instance profile is required, the network optional.
func TestConfigValidate(t *testing.T) {
	ok := []func(*Config){
		func(*Config) {},
		func(c *Config) { c.InstanceProfile = "reaper-host" },
		func(c *Config) { c.InstanceProfile = "arn:aws:iam::123456789012:instance-profile/reaper-host" },
		func(c *Config) { c.InstanceProfile = "arn:aws-us-gov:iam::123456789012:instance-profile/reaper-host" },
		func(c *Config) { c.SubnetIDs, c.SecurityGroupIDs = nil, nil },
	}
	for i, tweak := range ok {
		cfg := validConfig()
		tweak(&cfg)
		if err := cfg.validate(); err != nil {
			t.Errorf("valid configuration %d: %v", i, err)
		}
	}

	cfg := validConfig()
	cfg.InstanceProfile = ""
	if err := cfg.validate(); err == nil || !strings.Contains(err.Error(), "InstanceProfile is required") {
		t.Errorf("no instance profile: %v", err)
	}

	cfg = validConfig()
	cfg.NodeName = "node"
	cfg.ImageID = ""
	cfg.InstanceProfile = "arn:aws:iam::123456789012:role/reaper-host"
	cfg.SubnetIDs = []string{"subnet-0a1b2c3d4e5f60718", "vpc-0a1b2c3d", "subnet-0a1b2c3d4e5f60718"}
	cfg.SecurityGroupIDs = []string{"default"}
	for range maxSecurityGroups {
		cfg.SecurityGroupIDs = append(cfg.SecurityGroupIDs, fmt.Sprintf("sg-%08x", len(cfg.SecurityGroupIDs)))
	}
	err := cfg.validate()
	for _, want := range []string{
		`node name "node"`, "ImageID is required", `InstanceProfile "arn:aws:iam::123456789012:role/reaper-host" is neither`,
		`SubnetIDs: "vpc-0a1b2c3d" is not an id`, "SubnetIDs: subnet-0a1b2c3d4e5f60718 is named twice",
		`SecurityGroupIDs: "default" is not an id`, "SecurityGroupIDs: 17, more than the 16",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("validate: %v\nwant it to say %q", err, want)
		}
	}
}

// A Pod's subnet depends on its UID alone, so a retried launch names the
// same one, and the Pods spread over every subnet.
func TestSubnetOf(t *testing.T) {
	cfg := validConfig()
	cfg.SubnetIDs = []string{"subnet-00000001", "subnet-00000002", "subnet-00000003"}
	used := map[string]int{}
	for i := range 300 {
		uid := types.UID(fmt.Sprintf("6f1c2a8e-3b4d-4e5f-8a9b-%012d", i))
		s := aws.ToString(cfg.subnetOf(uid))
		if again := aws.ToString(cfg.subnetOf(uid)); again != s {
			t.Fatalf("%s: subnet %s, then %s", uid, s, again)
		}
		used[s]++
	}
	for _, s := range cfg.SubnetIDs {
		if used[s] < 50 {
			t.Errorf("subnets used %v: want each of the 3 for about 100 of 300 Pods", used)
			break
		}
	}
	cfg.SubnetIDs = nil
	if s := cfg.subnetOf("6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b"); s != nil {
		t.Errorf("no subnets: %q, want none named", *s)
	}
}

// The instance profile goes to RunInstances by ARN or by name, as given.
func TestInstanceProfile(t *testing.T) {
	cfg := validConfig()
	if p := cfg.instanceProfile(); aws.ToString(p.Arn) != cfg.InstanceProfile || p.Name != nil {
		t.Errorf("by ARN: %+v", p)
	}
	cfg.InstanceProfile = "reaper-host"
	if p := cfg.instanceProfile(); aws.ToString(p.Name) != "reaper-host" || p.Arn != nil {
		t.Errorf("by name: %+v", p)
	}
}
