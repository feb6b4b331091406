package iamsim

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
)

// Fleet names a deployment's instances: the tag keys that say an instance
// is managed and whose cluster it is, and the cluster.
type Fleet struct {
	ManagedKey, ClusterKey, Cluster string
}

// DefaultFleet is the fleet of a cluster with the default tag keys.
func DefaultFleet(cluster string) Fleet {
	return Fleet{ManagedKey: "reaper.io/managed", ClusterKey: "reaper.io/cluster", Cluster: cluster}
}

// Instance is an EC2 instance of env with tags, as a question's resource
// and its tag condition keys.
type Instance struct {
	ID   string
	Tags map[string]string
}

// ARN is the instance's ARN in env.
func (i Instance) ARN(env Env) string {
	return fmt.Sprintf("arn:%s:ec2:%s:%s:instance/%s", env.Partition, env.Region, env.Account, i.ID)
}

// Context is the instance's tags as condition keys, both the global
// aws:ResourceTag/ and EC2's own ec2:ResourceTag/.
func (i Instance) Context() map[string]any {
	ctx := map[string]any{}
	for k, v := range i.Tags {
		ctx["aws:ResourceTag/"+k] = v
		ctx["ec2:ResourceTag/"+k] = v
	}
	return ctx
}

// With returns a copy of the context with more keys.
func With(ctx map[string]any, more map[string]any) map[string]any {
	out := make(map[string]any, len(ctx)+len(more))
	for k, v := range ctx {
		out[k] = v
	}
	for k, v := range more {
		out[k] = v
	}
	return out
}

// Instances are the instances a fleet's questions ask about: its own, and
// every way an instance can fail to be its own.
func (f Fleet) Instances() (own Instance, others map[string]Instance) {
	own = Instance{ID: "i-0000000000000000a", Tags: map[string]string{f.ManagedKey: "true", f.ClusterKey: f.Cluster}}
	others = map[string]Instance{
		"unmanaged":             {ID: "i-0000000000000000b", Tags: map[string]string{f.ClusterKey: f.Cluster}},
		"managed=false":         {ID: "i-0000000000000000c", Tags: map[string]string{f.ManagedKey: "false", f.ClusterKey: f.Cluster}},
		"another cluster's":     {ID: "i-0000000000000000d", Tags: map[string]string{f.ManagedKey: "true", f.ClusterKey: f.Cluster + "-other"}},
		"without a cluster tag": {ID: "i-0000000000000000e", Tags: map[string]string{f.ManagedKey: "true"}},
		"untagged":              {ID: "i-0000000000000000f", Tags: map[string]string{}},
	}
	if u := upper(f.Cluster); u != f.Cluster {
		others["of the cluster's name in capitals"] = Instance{ID: "i-00000000000000010", Tags: map[string]string{f.ManagedKey: "true", f.ClusterKey: u}}
	}
	if def := DefaultFleet(f.Cluster); def.ManagedKey != f.ManagedKey || def.ClusterKey != f.ClusterKey {
		others["tagged with the default keys"] = Instance{ID: "i-00000000000000011", Tags: map[string]string{def.ManagedKey: "true", def.ClusterKey: f.Cluster}}
	}
	return own, others
}

// Owned is the condition, as Answer.Conditions writes it, under which an
// instance is the fleet's: tagged managed and with the fleet's cluster.
func (f Fleet) Owned() string {
	return All(Condition("aws:ResourceTag/"+f.ManagedKey, "StringEquals", "true"), Condition("aws:ResourceTag/"+f.ClusterKey, "StringEquals", f.Cluster))
}

// Condition is one condition as Answer.Conditions writes it.
func Condition(key, op string, values ...string) string {
	v := append([]string(nil), values...)
	sort.Strings(v)
	b, _ := json.Marshal(v)
	return key + " " + op + " " + string(b)
}

// All is conditions that must all hold, as Answer.Conditions writes them.
func All(conditions ...string) string { return group("and", conditions) }

// AnyOf is conditions of which one must hold, as Answer.Conditions
// writes them.
func AnyOf(conditions ...string) string { return group("or", conditions) }

func group(op string, conditions []string) string {
	c := append([]string(nil), conditions...)
	sort.Strings(c)
	if len(c) == 1 {
		return c[0]
	}
	return "(" + strings.Join(c, " "+op+" ") + ")"
}

// TerminateQuestions ask, of every principal, under which tags it may
// terminate an instance (only terminator may, and only when the instance
// is the fleet's), then about the fleet's own instance and each instance
// that is not the fleet's.
func TerminateQuestions(principals map[string]Principal, terminator string, f Fleet, env Env) []Question {
	own, others := f.Instances()
	var qs []Question
	for _, id := range principalIDs(principals) {
		p := principals[id]
		want, when := Denied, "never"
		if id == terminator {
			want, when = Allowed, f.Owned()
		}
		qs = append(qs, Question{
			Name: id + " terminates an instance, whatever its tags", Principal: p.ARN, Action: "ec2:TerminateInstances",
			Resource: Instance{ID: "i-00000000000000099"}.ARN(env), Identity: p.Policies, Discover: true, WantConditions: when,
		})
		qs = append(qs, Question{
			Name: id + " terminates the fleet's own instance", Principal: p.ARN, Action: "ec2:TerminateInstances",
			Resource: own.ARN(env), Context: own.Context(), Identity: p.Policies, Want: want,
		})
		for _, what := range sortedNames(others) {
			i := others[what]
			qs = append(qs, Question{
				Name: id + " terminates an instance " + what, Principal: p.ARN, Action: "ec2:TerminateInstances",
				Resource: i.ARN(env), Context: i.Context(), Identity: p.Policies, Want: Denied,
			})
		}
	}
	return qs
}

// TagQuestions ask, of every principal, whether it may put tags on the
// fleet's running instances: only tagger may, and only the key podWritten
// (if not empty), on the fleet's own instances.
func TagQuestions(principals map[string]Principal, tagger, podWritten string, f Fleet, env Env) []Question {
	own, others := f.Instances()
	tag := func(key string) map[string]any {
		return map[string]any{"aws:TagKeys": []string{key}, "aws:RequestTag/" + key: "2026-12-06T10:00:00Z"}
	}
	var qs []Question
	for _, id := range principalIDs(principals) {
		p := principals[id]
		if podWritten != "" {
			want, when := Denied, "never"
			if id == tagger {
				want, when = Allowed, f.Owned()
			}
			// The keys are known: a ForAllValues condition holds for a
			// request without aws:TagKeys, which CreateTags always has.
			qs = append(qs, Question{
				Name: id + " tags an instance " + podWritten + ", whatever its tags", Principal: p.ARN, Action: "ec2:CreateTags",
				Resource: Instance{ID: "i-00000000000000099"}.ARN(env), Context: tag(podWritten), Identity: p.Policies, Discover: true, WantConditions: when,
			})
			qs = append(qs, Question{
				Name: id + " tags the fleet's own instance " + podWritten, Principal: p.ARN, Action: "ec2:CreateTags",
				Resource: own.ARN(env), Context: With(own.Context(), tag(podWritten)), Identity: p.Policies, Want: want,
			})
			both := map[string]any{"aws:TagKeys": []string{podWritten, f.ManagedKey}, "aws:RequestTag/" + podWritten: "2026-12-06T10:00:00Z", "aws:RequestTag/" + f.ManagedKey: "true"}
			qs = append(qs, Question{
				Name: id + " tags the fleet's own instance " + podWritten + " and " + f.ManagedKey + " at once", Principal: p.ARN, Action: "ec2:CreateTags",
				Resource: own.ARN(env), Context: With(own.Context(), both), Identity: p.Policies, Want: Denied,
			})
			for _, what := range sortedNames(others) {
				i := others[what]
				qs = append(qs, Question{
					Name: id + " tags an instance " + what + " " + podWritten, Principal: p.ARN, Action: "ec2:CreateTags",
					Resource: i.ARN(env), Context: With(i.Context(), tag(podWritten)), Identity: p.Policies, Want: Denied,
				})
			}
		}
		for _, key := range []string{f.ManagedKey, f.ClusterKey, "Name"} {
			qs = append(qs, Question{
				Name: id + " tags an instance " + key + ", whatever its tags", Principal: p.ARN, Action: "ec2:CreateTags",
				Resource: Instance{ID: "i-00000000000000099"}.ARN(env), Context: tag(key), Identity: p.Policies, Discover: true, WantConditions: "never",
			})
			qs = append(qs, Question{
				Name: id + " tags the fleet's own instance " + key, Principal: p.ARN, Action: "ec2:CreateTags",
				Resource: own.ARN(env), Context: With(own.Context(), tag(key)), Identity: p.Policies, Want: Denied,
			})
		}
		qs = append(qs, Question{
			Name: id + " deletes a tag of the fleet's own instance", Principal: p.ARN, Action: "ec2:DeleteTags",
			Resource: own.ARN(env), Context: With(own.Context(), map[string]any{"aws:TagKeys": []string{f.ClusterKey}}), Identity: p.Policies, Want: Denied,
		})
	}
	return qs
}

// AgentQuestions ask whether a host whose instance role has policy may
// write exit lines to the exit log group group, and nothing else: no other
// log group (another cluster's, one whose name starts alike, Reaper's own
// functions'), no reading or listing the streams, no EC2.
func AgentQuestions(policy Policy, group string, env Env) []Question {
	role := fmt.Sprintf("arn:%s:iam::%s:role/provider-instance-role", env.Partition, env.Account)
	stream := func(g string) string {
		return fmt.Sprintf("arn:%s:logs:%s:%s:log-group:%s:log-stream:i-0123456789abcdef0", env.Partition, env.Region, env.Account, g)
	}
	groupArn := func(g string) string {
		return fmt.Sprintf("arn:%s:logs:%s:%s:log-group:%s", env.Partition, env.Region, env.Account, g)
	}
	q := func(name, action, resource, want string) Question {
		return Question{Name: "a host " + name, Principal: role, Action: action, Resource: resource, Identity: []Policy{policy}, Want: want}
	}
	own, _ := DefaultFleet("any").Instances()
	return []Question{
		q("creates its stream in its cluster's exit log group", "logs:CreateLogStream", stream(group), Allowed),
		q("puts exit lines in its cluster's exit log group", "logs:PutLogEvents", stream(group), Allowed),
		q("puts lines in another cluster's exit log group", "logs:PutLogEvents", stream("/reaper/other/exits"), Denied),
		q("puts lines in a log group whose name starts alike", "logs:PutLogEvents", stream(group+"-old"), Denied),
		q("puts lines in a function's log group", "logs:PutLogEvents", stream("/aws/lambda/Reaper-reconciler"), Denied),
		q("creates a stream in another log group", "logs:CreateLogStream", stream("/reaper/other/exits"), Denied),
		q("lists the streams of its exit log group", "logs:DescribeLogStreams", groupArn(group), Denied),
		q("reads another host's stream", "logs:GetLogEvents", stream(group), Denied),
		q("searches the exit log group", "logs:FilterLogEvents", groupArn(group), Denied),
		q("deletes its stream", "logs:DeleteLogStream", stream(group), Denied),
		{Name: "a host tags an instance", Principal: role, Action: "ec2:CreateTags", Resource: own.ARN(env),
			Context: With(own.Context(), map[string]any{"aws:TagKeys": []string{"reaper.io/pod-written"}}), Identity: []Policy{policy}, Want: Denied},
		{Name: "a host terminates an instance", Principal: role, Action: "ec2:TerminateInstances", Resource: own.ARN(env),
			Context: own.Context(), Identity: []Policy{policy}, Want: Denied},
	}
}

// Stack describes one Reaper deployment's template for StackQuestions.
type Stack struct {
	Template map[string]any
	Env      Env
	Fleet    Fleet
	// Terminator is the logical id of the role that alone may terminate
	// the fleet's instances (the reconciler's), and put PodWritten on them
	// if that is set.
	Terminator, PodWritten string
	// AgentPolicy is the logical id of the managed policy for the hosts'
	// instance role, ExitLogGroup the exit log group it is for.
	AgentPolicy, ExitLogGroup string
}

// StackQuestions are the questions every Reaper deployment must answer as
// its design says: only the terminator may terminate, and only the
// fleet's own instances; only it may tag them, and only with PodWritten;
// a host may only write exit lines to its cluster's exit log group. The
// template's managed policies count as principals too, each as a role
// holding it alone, since a provider attaches them to its own roles.
func StackQuestions(s Stack) ([]Question, error) {
	principals, err := Principals(s.Template, s.Env)
	if err != nil {
		return nil, err
	}
	if _, ok := principals[s.Terminator]; !ok {
		return nil, fmt.Errorf("the terminator %q is no principal of the template", s.Terminator)
	}
	managed, err := ManagedPolicies(s.Template, s.Env)
	if err != nil {
		return nil, err
	}
	for id, p := range managed {
		principals["role holding "+id] = Principal{
			LogicalID: "role holding " + id,
			ARN:       fmt.Sprintf("arn:%s:iam::%s:role/holding-%s", s.Env.Partition, s.Env.Account, id),
			Policies:  []Policy{p},
		}
	}
	qs := TerminateQuestions(principals, s.Terminator, s.Fleet, s.Env)
	qs = append(qs, TagQuestions(principals, s.Terminator, s.PodWritten, s.Fleet, s.Env)...)
	if s.AgentPolicy != "" {
		agent, ok := managed[s.AgentPolicy]
		if !ok {
			return nil, fmt.Errorf("no managed policy %q in the template", s.AgentPolicy)
		}
		qs = append(qs, AgentQuestions(agent, s.ExitLogGroup, s.Env)...)
	}
	return qs, nil
}

// FunctionRole is the logical id of the role of the template's one Lambda
// function whose logical id starts with prefix.
func FunctionRole(tmpl map[string]any, prefix string) (string, error) {
	resources, _ := tmpl["Resources"].(map[string]any)
	var roles []string
	for _, id := range sortedKeys(resources) {
		res, _ := resources[id].(map[string]any)
		if res["Type"] != "AWS::Lambda::Function" || len(id) < len(prefix) || id[:len(prefix)] != prefix {
			continue
		}
		props, _ := res["Properties"].(map[string]any)
		att, _ := props["Role"].(map[string]any)["Fn::GetAtt"].([]any)
		if len(att) != 2 {
			return "", fmt.Errorf("function %s: role %v", id, props["Role"])
		}
		role, _ := att[0].(string)
		roles = append(roles, role)
	}
	if len(roles) != 1 {
		return "", fmt.Errorf("%d functions whose logical id starts with %s (roles %v), want 1", len(roles), prefix, roles)
	}
	return roles[0], nil
}

// OnlyManagedPolicy is the logical id of the template's one managed
// policy.
func OnlyManagedPolicy(tmpl map[string]any) (string, error) {
	resources, _ := tmpl["Resources"].(map[string]any)
	var ids []string
	for _, id := range sortedKeys(resources) {
		if res, _ := resources[id].(map[string]any); res["Type"] == "AWS::IAM::ManagedPolicy" {
			ids = append(ids, id)
		}
	}
	if len(ids) != 1 {
		return "", fmt.Errorf("managed policies %v, want one", ids)
	}
	return ids[0], nil
}

func principalIDs(m map[string]Principal) []string {
	ids := make([]string, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

func sortedNames(m map[string]Instance) []string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func upper(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'a' <= c && c <= 'z' {
			b[i] = c - 'a' + 'A'
		}
	}
	return string(b)
}
