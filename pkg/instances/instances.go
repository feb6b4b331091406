// Package instances is Reaper's view of EC2: which instances it owns, what
// state they are in, and terminating them. An instance is a deployment's
// only when it carries the managed tag and the deployment's cluster tag;
// only those are ever terminated (the deployed IAM policy enforces the same).
package instances

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"

	"github.com/reaper-k8s/reaper/pkg/model"
)

// Instance is what Reaper needs to know of an EC2 instance: its state and
// what its launch tags say.
type Instance struct {
	ID    string
	State string
	// Managed: the managed tag says "true".
	Managed bool
	// Cluster is the cluster tag's value.
	Cluster string
	// ClusterUID is the cluster identity tag's value: the UID of the
	// kube-system namespace of the cluster the provider launched it for.
	ClusterUID string
	// Owned: managed, and the cluster tag names this deployment's cluster.
	Owned      bool
	Pod        model.PodRef
	LaunchTime time.Time
	// DescribedAt is when the DescribeInstances call that answered this
	// was sent: EC2's state is at least that fresh.
	DescribedAt time.Time
}

// Fleet reads and terminates one deployment's instances through the EC2 API.
type Fleet struct {
	client  *ec2.Client
	keys    model.TagKeys
	cluster string
	pacer   *pacer
}

// NewFleet returns the Fleet of the instances tagged for cluster.
func NewFleet(client *ec2.Client, keys model.TagKeys, cluster string) *Fleet {
	return &Fleet{client: client, keys: keys, cluster: cluster}
}

// Pace makes the Fleet spend at most budget's tokens: each call waits for
// its tokens, a TerminateInstances names as many instances as the tokens
// that come before its context's deadline cover, and the work whose
// tokens would come later is not done but returned as Deferred. waited,
// when not nil, is told each wait. Without Pace a Fleet calls at once and
// leaves throttling to the SDK's retries.
func (f *Fleet) Pace(budget model.Budget, waited func(time.Duration)) *Fleet {
	f.pacer = newPacer(budget, waited)
	return f
}

// EC2 accepts at most this many values in one filter; instance-id filters
// are used instead of InstanceIds because unknown ids then simply do not
// match instead of failing the whole call.
const describeChunk = 200

// Describe returns the instances among ids that EC2 knows, describing
// them describeChunk at a time, in order. Instances it does not know (never
// existed, or terminated long ago) are absent. When the tokens for the
// next call would come after the deadline, or EC2 keeps refusing it, the
// instances found so far come with a *Deferred naming the ids not
// described.
func (f *Fleet) Describe(ctx context.Context, ids []string) (map[string]Instance, error) {
	found := make(map[string]Instance, len(ids))
	for start := 0; start < len(ids); start += describeChunk {
		chunk := ids[start:min(start+describeChunk, len(ids))]
		// A chunk counts only when described whole: an id absent from a
		// chunk cut short is not known to be gone.
		described := make(map[string]Instance, len(chunk))
		in := &ec2.DescribeInstancesInput{Filters: []types.Filter{{Name: aws.String("instance-id"), Values: chunk}}}
		err := f.describe(ctx, in, func(i Instance) error { described[i.ID] = i; return nil })
		if forLater(err) {
			return found, &Deferred{IDs: slices.Clone(ids[start:]), Cause: err}
		}
		if err != nil {
			return nil, err
		}
		maps.Copy(found, described)
	}
	return found, nil
}

// ListOwned calls fn for every instance this deployment owns (the managed
// and the cluster tag), in any state (terminated ones stay visible for about
// an hour), a page at a time.
func (f *Fleet) ListOwned(ctx context.Context, fn func(Instance) error) error {
	return f.describe(ctx, &ec2.DescribeInstancesInput{
		Filters: []types.Filter{
			{Name: aws.String("tag:" + f.keys.Managed), Values: []string{"true"}},
			{Name: aws.String("tag:" + f.keys.Cluster), Values: []string{f.cluster}},
		},
		MaxResults: aws.Int32(1000),
	}, fn)
}

func (f *Fleet) describe(ctx context.Context, in *ec2.DescribeInstancesInput, fn func(Instance) error) error {
	p := ec2.NewDescribeInstancesPaginator(f.client, in)
	for p.HasMorePages() {
		if err := f.pacer.describeCall(ctx); err != nil {
			return fmt.Errorf("describe instances: %w", err)
		}
		sent := time.Now()
		page, err := p.NextPage(ctx)
		if refused(err) {
			f.pacer.describeRefused()
		}
		if err != nil {
			return fmt.Errorf("describe instances: %w", err)
		}
		for _, r := range page.Reservations {
			for _, i := range r.Instances {
				inst := f.instance(i)
				inst.DescribedAt = sent
				if err := fn(inst); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func (f *Fleet) instance(i types.Instance) Instance {
	out := Instance{ID: aws.ToString(i.InstanceId), LaunchTime: aws.ToTime(i.LaunchTime)}
	if i.State != nil {
		out.State = string(i.State.Name)
	}
	for _, t := range i.Tags {
		v := aws.ToString(t.Value)
		switch aws.ToString(t.Key) {
		case f.keys.Managed:
			out.Managed = v == "true"
		case f.keys.Cluster:
			out.Cluster = v
		case f.keys.ClusterUID:
			out.ClusterUID = v
		case f.keys.PodNamespace:
			out.Pod.Namespace = v
		case f.keys.PodName:
			out.Pod.Name = v
		case f.keys.PodUID:
			out.Pod.UID = v
		}
	}
	out.Owned = out.Managed && out.Cluster == f.cluster
	return out
}

// Termination is what Terminate did with one instance. Every one means the
// step is done.
type Termination string

const (
	// Terminating: TerminateInstances accepted it.
	Terminating Termination = "terminating"
	// AlreadyGone: it was shutting down or terminated, or EC2 does not know it.
	AlreadyGone Termination = "already-gone"
	// NotOwned: it lacks the managed tag or belongs to another cluster;
	// Reaper never terminates it.
	NotOwned Termination = "not-owned"
	// WouldTerminate: a dry run (ReadOnly) decided to terminate it.
	WouldTerminate Termination = "would-terminate"
)

// TerminateInstances takes at most this many ids a call.
const terminateChunk = 1000

// Terminate ends the owned instances among ids with one tag lookup and as
// few TerminateInstances calls as its tokens allow, at most 1,000 ids each,
// in the order given. Instances already gone count as done. Known
// instances can be passed to skip the lookup.
//
// TerminateInstances is all-or-nothing: one instance it will not end
// (termination protection, a policy, an id that vanished) fails the call
// for all. Such an error costs those instances only: the ids its message
// names are answered and the rest sent again; when it names none, the call
// is split in halves until each refusal stands alone. Instances EC2 refused
// are answered Refused and listed, with EC2's error code, in the
// *Refusals the error holds.
//
// The returned map holds every id decided. When the tokens run out before
// the deadline, or EC2 keeps refusing, the error holds a *Deferred naming
// the ids not reached: the targets left, then the ids the lookup could not
// describe.
func (f *Fleet) Terminate(ctx context.Context, ids []string, known map[string]Instance) (map[string]Termination, error) {
	out, targets, undescribed, err := f.triage(ctx, ids, known)
	if err != nil {
		return nil, err
	}
	refusals := Refusals{}
	// groups are the calls still to make, in order; a failed call's
	// instances come back as smaller groups.
	groups := [][]string{}
	if len(targets) > 0 {
		groups = append(groups, targets)
	}
	rest := func() []string { return slices.Concat(groups...) }
	for len(groups) > 0 {
		group := groups[0]
		n, err := f.pacer.terminateCall(ctx, len(group))
		if err != nil {
			return out, refusals.join(deferRest(rest(), undescribed, fmt.Errorf("terminate %d instances: %w", len(rest()), err)))
		}
		call := group[:n]
		if n < len(group) {
			groups[0] = group[n:]
		} else {
			groups = groups[1:]
		}
		_, err = f.client.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: call})
		var ae smithy.APIError
		switch {
		case err == nil:
			for _, id := range call {
				out[id] = Terminating
			}
		case refused(err):
			f.pacer.terminateRefused()
			groups = append([][]string{call}, groups...)
			return out, refusals.join(deferRest(rest(), undescribed, fmt.Errorf("terminate %d instances: %w", n, err)))
		case errors.As(err, &ae) && concernsInstances(ae.ErrorCode()):
			groups = append(isolate(call, ae, out, refusals), groups...)
		default:
			groups = append([][]string{call}, groups...)
			return out, refusals.join(fmt.Errorf("terminate %d instances: %w", len(rest()), err))
		}
	}
	if undescribed != nil {
		return out, refusals.join(undescribed)
	}
	return out, refusals.join(nil)
}

// Refused: TerminateInstances will not end it (termination protection, or
// a policy); the caller reports it and stops asking for a while.
const Refused Termination = "refused"

// Refusals are the instances TerminateInstances refused, with EC2's error
// code for each ("OperationNotPermitted": termination protection).
type Refusals map[string]string

func (r Refusals) Error() string {
	return fmt.Sprintf("EC2 refused to terminate %d instances: %v", len(r), map[string]string(r))
}

// join is err with the refusals, if any.
func (r Refusals) join(err error) error {
	if len(r) == 0 {
		return err
	}
	return errors.Join(r, err)
}

// concernsInstances says whether an error code of TerminateInstances is
// about some of the call's instances rather than the call: the others may
// be terminated without them.
func concernsInstances(code string) bool {
	switch code {
	case "InvalidInstanceID.NotFound", "OperationNotPermitted", "UnauthorizedOperation", "IncorrectInstanceState":
		return true
	}
	return false
}

var instanceIDInText = regexp.MustCompile(`i-[0-9a-f]{8,17}`)

// isolate answers the instances of a failed call that its error concerns
// and returns the calls left to make: the call without the ids the error
// message names, or, when it names none, the call's two halves. A call of
// one instance is answered.
func isolate(call []string, ae smithy.APIError, out map[string]Termination, refusals Refusals) [][]string {
	answer := func(id string) {
		if ae.ErrorCode() == "InvalidInstanceID.NotFound" {
			out[id] = AlreadyGone
			return
		}
		out[id], refusals[id] = Refused, ae.ErrorCode()
	}
	if len(call) == 1 {
		answer(call[0])
		return nil
	}
	named := map[string]bool{}
	for _, id := range instanceIDInText.FindAllString(ae.ErrorMessage(), -1) {
		if slices.Contains(call, id) {
			named[id] = true
		}
	}
	if len(named) == 0 {
		return [][]string{call[:len(call)/2], call[len(call)/2:]}
	}
	var left []string
	for _, id := range call {
		if named[id] {
			answer(id)
		} else {
			left = append(left, id)
		}
	}
	if len(left) == 0 {
		return nil
	}
	return [][]string{left}
}

// deferRest is the error of a Terminate that did not reach targets, nor
// the ids its lookup left undescribed.
func deferRest(targets []string, undescribed *Deferred, cause error) error {
	if !forLater(cause) {
		return cause
	}
	d := &Deferred{IDs: slices.Clone(targets), Cause: cause}
	if undescribed != nil {
		d.IDs = append(d.IDs, undescribed.IDs...)
		d.Cause = errors.Join(cause, undescribed.Cause)
	}
	return d
}

// triage answers for the ids that need no TerminateInstances (gone, or not
// this deployment's) and returns the others as targets, in order. When the
// lookup could not describe every id, undescribed names the rest, which
// are neither answered nor targets.
func (f *Fleet) triage(ctx context.Context, ids []string, known map[string]Instance) (out map[string]Termination, targets []string, undescribed *Deferred, err error) {
	if known == nil {
		if known, err = f.Describe(ctx, ids); err != nil && !errors.As(err, &undescribed) {
			return nil, nil, nil, err
		}
	}
	var later map[string]bool
	if undescribed != nil {
		later = make(map[string]bool, len(undescribed.IDs))
		for _, id := range undescribed.IDs {
			later[id] = true
		}
	}
	out = make(map[string]Termination, len(ids))
	for _, id := range ids {
		i, ok := known[id]
		switch {
		case later[id]:
		case !ok || model.IsEnding(i.State):
			out[id] = AlreadyGone
		case !i.Owned:
			out[id] = NotOwned
		default:
			targets = append(targets, id)
		}
	}
	return out, targets, undescribed, nil
}

// CreateTags takes at most this many resource ids a call.
const tagChunk = 1000

// Tag puts the tag key=value on the instances ids, at most tagChunk ids a
// CreateTags call, each call waiting for its token. Tagging twice is
// harmless: the value is replaced. When a call fails, or its token would
// come after ctx's deadline, the ids not tagged come back with the error.
func (f *Fleet) Tag(ctx context.Context, ids []string, key, value string) ([]string, error) {
	tags := []types.Tag{{Key: aws.String(key), Value: aws.String(value)}}
	for start := 0; start < len(ids); start += tagChunk {
		chunk := ids[start:min(start+tagChunk, len(ids))]
		err := f.pacer.tagCall(ctx)
		if err == nil {
			_, err = f.client.CreateTags(ctx, &ec2.CreateTagsInput{Resources: chunk, Tags: tags})
			if refused(err) {
				f.pacer.tagRefused()
			}
		}
		if err != nil {
			return slices.Clone(ids[start:]), fmt.Errorf("tag %d instances %s=%s: %w", len(ids)-start, key, value, err)
		}
	}
	return nil, nil
}

// ReadOnly is the fleet of a dry run: it describes as Fleet does, decides
// each termination as Fleet.Terminate does, and answers WouldTerminate where
// Terminate would send TerminateInstances. It sends none, so it spends no
// terminate tokens: only what its lookup could not describe is deferred.
type ReadOnly struct {
	*Fleet
}

// Tag tags nothing: a dry run changes nothing in EC2.
func (f ReadOnly) Tag(context.Context, []string, string, string) ([]string, error) { return nil, nil }

// Terminate decides and terminates nothing.
func (f ReadOnly) Terminate(ctx context.Context, ids []string, known map[string]Instance) (map[string]Termination, error) {
	out, targets, undescribed, err := f.triage(ctx, ids, known)
	if err != nil {
		return nil, err
	}
	for _, id := range targets {
		out[id] = WouldTerminate
	}
	if undescribed != nil {
		return out, undescribed
	}
	return out, nil
}

// refused reports whether EC2 kept refusing a call until the SDK gave up:
// a RequestLimitExceeded that outlasted its retries, or the deadline
// reached while it waited to retry.
func refused(err error) bool {
	var ae smithy.APIError
	if errors.As(err, &ae) && ae.ErrorCode() == "RequestLimitExceeded" {
		return true
	}
	var canceled *aws.RequestCanceledError
	return errors.As(err, &canceled) && errors.Is(canceled.Err, context.DeadlineExceeded)
}

// forLater reports whether err leaves a call's work for later rather than
// failing it: its tokens would have come after the deadline, or EC2 kept
// refusing it.
func forLater(err error) bool {
	return errors.Is(err, ErrNoTokens) || refused(err)
}
