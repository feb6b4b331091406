package iamsim

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// docPolicy is the first JSON block after the heading in a page of docs/,
// with the placeholders replaced.
func docPolicy(t *testing.T, page, heading string, placeholders map[string]string) Policy {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("../../docs", page))
	if err != nil {
		t.Fatal(err)
	}
	text := string(raw)
	i := strings.Index(text, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("%s: no heading %q", page, heading)
	}
	start := strings.Index(text[i:], "```json\n")
	if start < 0 {
		t.Fatalf("%s: no JSON block after %q", page, heading)
	}
	block := text[i+start+len("```json\n"):]
	block = block[:strings.Index(block, "```")]
	for k, v := range placeholders {
		block = strings.ReplaceAll(block, k, v)
	}
	var doc map[string]any
	if err := json.Unmarshal([]byte(block), &doc); err != nil {
		t.Fatalf("%s, %s: %v\n%s", page, heading, err, block)
	}
	return Policy{Name: page, Document: doc}
}

// The provider's policy of docs/provider.md for the cluster prod, and the
// SCP of docs/security.md, with the names the docs use.
var (
	env          = TestEnv("Reaper-prod")
	providerRole = "arn:aws:iam::123456789012:role/my-vk-provider"
	reconciler   = "arn:aws:iam::123456789012:role/Reaper-prod-ReaperReconcilerRole5F6AB4C1-ABCDEF123456"
	admin        = "arn:aws:iam::123456789012:role/admin"
	allowAll     = Policy{Name: "AdministratorAccess", Document: map[string]any{"Version": "2012-10-17", "Statement": []any{
		map[string]any{"Effect": "Allow", "Action": "*", "Resource": "*"}}}}
	uid = "6f1c3a52-0e6b-4a8e-9d7c-2b1f0a9e8d71"
)

func providerPolicy(t *testing.T) Policy {
	return docPolicy(t, "provider.md", "## The provider's IAM", map[string]string{
		"REGION": env.Region, "ACCOUNT": env.Account, "CLUSTER": "prod", "LEDGER_TABLE": "reaper-ledger", "INSTANCE_ROLE": "provider-instance-role",
	})
}

func scp(t *testing.T) Policy {
	return docPolicy(t, "security.md", "## What other principals must not be allowed", nil)
}

// tags is a CreateTags request's condition keys for tags of these keys
// and values.
func tags(kv ...string) map[string]any {
	ctx := map[string]any{}
	var keys []string
	for i := 0; i+1 < len(kv); i += 2 {
		keys = append(keys, kv[i])
		ctx["aws:RequestTag/"+kv[i]] = kv[i+1]
	}
	ctx["aws:TagKeys"] = keys
	return ctx
}

// The instances the provider's questions are about.
var (
	// ownWithout is the cluster's managed instance launched without the
	// cluster identity tag; ownWith one launched with it.
	ownWithout = Instance{ID: "i-0000000000000001a", Tags: map[string]string{"reaper.io/managed": "true", "reaper.io/cluster": "prod"}}
	ownWith    = Instance{ID: "i-0000000000000001b", Tags: map[string]string{"reaper.io/managed": "true", "reaper.io/cluster": "prod", "reaper.io/cluster-uid": "0d9b3f3e-aaaa-4bbb-8ccc-000000000000"}}
	// fromBefore is a managed instance from before clusters: no cluster
	// tag.
	fromBefore = Instance{ID: "i-0000000000000001c", Tags: map[string]string{"reaper.io/managed": "true"}}
	otherOne   = Instance{ID: "i-0000000000000001d", Tags: map[string]string{"reaper.io/managed": "true", "reaper.io/cluster": "staging"}}
	unmanaged  = Instance{ID: "i-0000000000000001e", Tags: map[string]string{"Name": "build-box"}}
	launching  = Instance{ID: "i-0000000000000001f", Tags: map[string]string{}}
)

// TestProviderPolicy evaluates the provider's policy that docs/provider.md
// gives, under the SCP that docs/security.md gives: it tags at launch, and
// afterwards only adds a missing cluster identity to the cluster's managed
// instances, or a missing cluster tag of its own cluster to managed
// instances from before clusters, never replacing a value, never another
// key; it terminates only the cluster's managed instances.
func TestProviderPolicy(t *testing.T) {
	identity := []Policy{providerPolicy(t)}
	scps := []Policy{scp(t)}
	q := func(name, action string, i Instance, ctx map[string]any, want string) Question {
		return Question{Name: "the provider " + name, Principal: providerRole, Action: action, Resource: i.ARN(env),
			Context: With(i.Context(), ctx), Identity: identity, SCPs: scps, Want: want}
	}
	atLaunch := With(tags("reaper.io/managed", "true", "reaper.io/cluster", "prod", "reaper.io/cluster-uid", uid,
		"reaper.io/pod-namespace", "default", "reaper.io/pod-name", "job-1", "reaper.io/pod-uid", "4b0e6f7c-1111-4222-8333-444444444444",
		"reaper.io/exit-token-sha256", strings.Repeat("ab", 32)), map[string]any{"ec2:CreateAction": "RunInstances"})
	qs := []Question{
		q("tags an instance at launch", "ec2:CreateTags", launching, atLaunch, Allowed),
		q("adds the cluster identity an instance lacks", "ec2:CreateTags", ownWithout, tags("reaper.io/cluster-uid", uid), Allowed),
		q("replaces an instance's cluster identity", "ec2:CreateTags", ownWith, tags("reaper.io/cluster-uid", uid), Denied),
		q("adds the cluster identity to another cluster's instance", "ec2:CreateTags", otherOne, tags("reaper.io/cluster-uid", uid), Denied),
		q("adds the cluster identity to an unmanaged instance", "ec2:CreateTags", unmanaged, tags("reaper.io/cluster-uid", uid), Denied),
		q("adds the cluster identity to an instance from before clusters", "ec2:CreateTags", fromBefore, tags("reaper.io/cluster-uid", uid), Denied),
		q("adds the cluster identity and another key at once", "ec2:CreateTags", ownWithout, tags("reaper.io/cluster-uid", uid, "reaper.io/managed", "true"), Denied),
		q("adds its cluster to an instance from before clusters", "ec2:CreateTags", fromBefore, tags("reaper.io/cluster", "prod"), Allowed),
		q("adds another cluster to an instance from before clusters", "ec2:CreateTags", fromBefore, tags("reaper.io/cluster", "staging"), Denied),
		q("moves another cluster's instance to its own", "ec2:CreateTags", otherOne, tags("reaper.io/cluster", "prod"), Denied),
		q("adds a cluster to an unmanaged instance", "ec2:CreateTags", unmanaged, tags("reaper.io/cluster", "prod"), Denied),
		q("tags a running instance managed", "ec2:CreateTags", unmanaged, tags("reaper.io/managed", "true"), Denied),
		q("changes a running instance's Pod", "ec2:CreateTags", ownWith, tags("reaper.io/pod-uid", "4b0e6f7c-1111-4222-8333-555555555555"), Denied),
		q("puts the Pod-written tag", "ec2:CreateTags", ownWith, tags("reaper.io:pod-written", "2026-12-06T10:00:00Z"), Denied),
		q("deletes the cluster identity", "ec2:DeleteTags", ownWith, map[string]any{"aws:TagKeys": []string{"reaper.io/cluster-uid"}}, Denied),
		q("terminates its cluster's instance", "ec2:TerminateInstances", ownWith, nil, Allowed),
		q("terminates another cluster's instance", "ec2:TerminateInstances", otherOne, nil, Denied),
		q("terminates an unmanaged instance", "ec2:TerminateInstances", unmanaged, nil, Denied),
		// Whatever the instance's tags, after launch: never the managed
		// tag. (The evaluator's answers for the additions would leave out
		// their Null conditions on the instance's tags: the questions above
		// ask about those.)
		{Name: "the provider changes the managed tag after launch, whatever the instance's tags", Principal: providerRole, Action: "ec2:CreateTags",
			Resource: launching.ARN(env), Context: tags("reaper.io/managed", "true"), Identity: identity, SCPs: scps,
			Discover: true, Absent: []string{"ec2:CreateAction"}, WantConditions: "never"},
	}
	// The docs' create-tags commands, each as the instance it is for is
	// tagged: the runbook's on an instance without the cluster identity,
	// the upgrade's on an instance from before clusters.
	commands := 0
	command := regexp.MustCompile(`aws ec2 create-tags [^\n]*--tags Key=([^,\s]+),Value=("[^\n]*"|\S+)`)
	for _, page := range []string{"operate.md", "deploy.md"} {
		raw, err := os.ReadFile(filepath.Join("../../docs", page))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range command.FindAllStringSubmatch(string(raw), -1) {
			commands++
			key, value := m[1], m[2]
			if strings.HasPrefix(value, `"$(`) {
				value = uid
			}
			on := map[string]Instance{"reaper.io/cluster-uid": ownWithout, "reaper.io/cluster": fromBefore}[key]
			if on.ID == "" {
				t.Errorf("%s: %s: a create-tags command for %s, which no one may add after launch", page, m[0], key)
				continue
			}
			qs = append(qs, q("runs "+page+"'s create-tags of "+key, "ec2:CreateTags", on, tags(key, value), Allowed))
		}
	}
	if commands != 2 {
		t.Errorf("%d create-tags commands in operate.md and deploy.md, want 2 (ClusterIdentityMismatch, the upgrade)", commands)
	}
	Ask(t, qs)
}

// TestSCP evaluates the SCP of docs/security.md over principals whose own
// policies allow everything: only the provider tags at launch or adds
// the cluster tags, only the reconciler puts the Pod-written tag, nobody
// changes or deletes another reaper.io tag.
func TestSCP(t *testing.T) {
	scps := []Policy{scp(t)}
	q := func(who, principal, name, action string, i Instance, ctx map[string]any, want string) Question {
		return Question{Name: who + " " + name, Principal: principal, Action: action, Resource: i.ARN(env),
			Context: With(i.Context(), ctx), Identity: []Policy{allowAll}, SCPs: scps, Want: want}
	}
	launch := With(tags("reaper.io/managed", "true", "reaper.io/cluster", "prod"), map[string]any{"ec2:CreateAction": "RunInstances"})
	podWritten := tags("reaper.io:pod-written", "2026-12-06T10:00:00Z")
	qs := []Question{
		q("an administrator", admin, "tags an instance at launch", "ec2:CreateTags", launching, launch, Allowed),
		q("an administrator", admin, "adds a missing cluster identity", "ec2:CreateTags", ownWithout, tags("reaper.io/cluster-uid", uid), ExplicitlyDenied),
		q("an administrator", admin, "tags an unmanaged instance managed", "ec2:CreateTags", unmanaged, tags("reaper.io/managed", "true"), ExplicitlyDenied),
		q("an administrator", admin, "tags a managed instance foreign", "ec2:CreateTags", ownWith, tags("reaper.io/cluster", "staging"), ExplicitlyDenied),
		q("an administrator", admin, "puts the Pod-written tag", "ec2:CreateTags", ownWith, podWritten, ExplicitlyDenied),
		q("an administrator", admin, "tags an instance Name", "ec2:CreateTags", ownWith, tags("Name", "x"), Allowed),
		q("an administrator", admin, "deletes the managed tag", "ec2:DeleteTags", ownWith, map[string]any{"aws:TagKeys": []string{"reaper.io/managed"}}, ExplicitlyDenied),
		q("an administrator", admin, "deletes every tag of a managed instance", "ec2:DeleteTags", ownWith, nil, ExplicitlyDenied),
		q("an administrator", admin, "deletes every tag of an unmanaged instance", "ec2:DeleteTags", unmanaged, nil, Allowed),
		q("an administrator", admin, "deletes the Name tag of a managed instance", "ec2:DeleteTags", ownWith, map[string]any{"aws:TagKeys": []string{"Name"}}, Allowed),
		q("the provider", providerRole, "tags an instance at launch", "ec2:CreateTags", launching, launch, Allowed),
		q("the provider", providerRole, "adds a cluster identity", "ec2:CreateTags", ownWithout, tags("reaper.io/cluster-uid", uid), Allowed),
		q("the provider", providerRole, "adds a cluster", "ec2:CreateTags", fromBefore, tags("reaper.io/cluster", "prod"), Allowed),
		q("the provider", providerRole, "tags a running instance managed", "ec2:CreateTags", unmanaged, tags("reaper.io/managed", "true"), ExplicitlyDenied),
		q("the provider", providerRole, "adds a cluster identity with another reaper.io key", "ec2:CreateTags", ownWithout, tags("reaper.io/cluster-uid", uid, "reaper.io/pod-uid", "x"), ExplicitlyDenied),
		q("the provider", providerRole, "puts the Pod-written tag", "ec2:CreateTags", ownWith, podWritten, ExplicitlyDenied),
		q("the provider", providerRole, "deletes the cluster identity", "ec2:DeleteTags", ownWith, map[string]any{"aws:TagKeys": []string{"reaper.io/cluster-uid"}}, ExplicitlyDenied),
		q("the reconciler", reconciler, "puts the Pod-written tag", "ec2:CreateTags", ownWith, podWritten, Allowed),
		q("the reconciler", reconciler, "tags an instance managed", "ec2:CreateTags", unmanaged, tags("reaper.io/managed", "true"), ExplicitlyDenied),
		q("the reconciler", reconciler, "adds a cluster identity", "ec2:CreateTags", ownWithout, tags("reaper.io/cluster-uid", uid), ExplicitlyDenied),
		q("the reconciler", reconciler, "deletes the Pod-written tag", "ec2:DeleteTags", ownWith, map[string]any{"aws:TagKeys": []string{"reaper.io:pod-written"}}, ExplicitlyDenied),
	}
	Ask(t, qs)
}
