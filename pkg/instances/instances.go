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
	// Owned: managed, and the cluster tag names this deployment's cluster.
	Owned      bool
	Pod        model.PodRef
	LaunchTime time.Time
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
		page, err := p.NextPage(ctx)
		if refused(err) {
			f.pacer.describeRefused()
		}
		if err != nil {
			return fmt.Errorf("describe instances: %w", err)
		}
		for _, r := range page.Reservations {
			for _, i := range r.Instances {
				if err := fn(f.instance(i)); err != nil {
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
// The returned map holds every id decided. When the tokens run out before
// the deadline, or EC2 keeps refusing, the error is a *Deferred naming the
// ids not reached: the targets left, then the ids the lookup could not
// describe.
func (f *Fleet) Terminate(ctx context.Context, ids []string, known map[string]Instance) (map[string]Termination, error) {
	out, targets, undescribed, err := f.triage(ctx, ids, known)
	if err != nil {
		return nil, err
	}
	for len(targets) > 0 {
		n, err := f.pacer.terminateCall(ctx, len(targets))
		if err != nil {
			return out, deferRest(targets, undescribed, fmt.Errorf("terminate %d instances: %w", len(targets), err))
		}
		chunk := targets[:n]
		_, err = f.client.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: chunk})
		if refused(err) {
			f.pacer.terminateRefused()
			return out, deferRest(targets, undescribed, fmt.Errorf("terminate %d instances: %w", n, err))
		}
		if isNotFound(err) && n > 1 {
			// Some vanished since the lookup; the call is all-or-nothing, so
			// retry one by one and let each answer for itself.
			for j, id := range chunk {
				_, err := f.pacer.terminateCall(ctx, 1)
				if err == nil {
					_, err = f.client.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{id}})
					if refused(err) {
						f.pacer.terminateRefused()
					}
				}
				if forLater(err) {
					return out, deferRest(targets[j:], undescribed, fmt.Errorf("terminate %s: %w", id, err))
				}
				if err != nil && !isNotFound(err) {
					return out, fmt.Errorf("terminate %s: %w", id, err)
				}
				out[id] = Terminating
				if err != nil {
					out[id] = AlreadyGone
				}
			}
			targets = targets[n:]
			continue
		}
		if err != nil && !isNotFound(err) {
			return out, fmt.Errorf("terminate instances: %w", err)
		}
		for _, id := range chunk {
			out[id] = Terminating
			if err != nil {
				out[id] = AlreadyGone
			}
		}
		targets = targets[n:]
	}
	if undescribed != nil {
		return out, undescribed
	}
	return out, nil
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

// ReadOnly is the fleet of a dry run: it describes as Fleet does, decides
// each termination as Fleet.Terminate does, and answers WouldTerminate where
// Terminate would send TerminateInstances. It sends none, so it spends no
// terminate tokens: only what its lookup could not describe is deferred.
type ReadOnly struct {
	*Fleet
}

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

func isNotFound(err error) bool {
	var ae smithy.APIError
	return errors.As(err, &ae) && ae.ErrorCode() == "InvalidInstanceID.NotFound"
}
