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
	// ExitTokenHash is the exit-token tag's value (model.ExitTokenHash of
	// the launch's exit token), "" when the instance has none: then no
	// line for it needs a token.
	ExitTokenHash string
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
// tokens would come later is not done but Left with ErrNoTokens. waited,
// when not nil, is told each wait. Without Pace a Fleet calls at once and
// leaves throttling to the SDK's retries.
func (f *Fleet) Pace(budget model.Budget, waited func(time.Duration)) *Fleet {
	f.pacer = newPacer(budget, waited)
	return f
}

// SharedBy says that work a paced Fleet leaves (ShareSpent) comes back to
// any of n Fleets paced alike, as deferred work comes back to any of the
// reconcilers that run at once: it is spread over the n shares' refill,
// not this one's alone, so that no share stays idle while another's work
// waits. A Fleet that takes back work the others left finds its own share
// short for a while and leaves some again, which comes back when the n
// shares have refilled for it.
func (f *Fleet) SharedBy(n int) *Fleet {
	if f.pacer != nil {
		f.pacer.sharedBy = max(n, 1)
	}
	return f
}

// EC2 accepts at most this many values in one filter; instance-id filters
// are used instead of InstanceIds because unknown ids then simply do not
// match instead of failing the whole call.
const describeChunk = 200

// Described is what a Describe learned.
type Described struct {
	// Found are the instances EC2 described.
	Found map[string]Instance
	// Left are the ids EC2 was not asked about or did not answer for, each
	// with why: its chunk's error, or, for want of tokens before the
	// deadline or EC2 refusing (RequestLimitExceeded) until then, an error
	// for which errors.Is(err, ErrNoTokens) holds; a context deadline is
	// reported as an error wrapping context.DeadlineExceeded (not
	// ErrNoTokens).
	Left map[string]error
}

// Describe describes the instances ids, describeChunk at a time, in order.
// Instances EC2 does not know (never existed, or terminated long ago) are
// neither Found nor Left. A chunk that fails costs its own ids only: they
// are Left with its error and the next chunk is asked. When there are no
// tokens for the next chunk before the deadline, EC2 keeps refusing, or
// the context ends, that chunk and every one after it are Left with that
// error: asking again before the deadline cannot do better.
//
// EC2's filtered answers are eventually consistent: an id absent from one
// is asked for again by id (confirm) before it counts as unknown.
func (f *Fleet) Describe(ctx context.Context, ids []string) Described {
	d := Described{Found: make(map[string]Instance, len(ids)), Left: map[string]error{}}
	var absent []string
	for start := 0; start < len(ids); start += describeChunk {
		chunk := ids[start:min(start+describeChunk, len(ids))]
		// A chunk counts only when described whole: an id absent from a
		// chunk cut short is not known to be gone.
		described := make(map[string]Instance, len(chunk))
		in := &ec2.DescribeInstancesInput{Filters: []types.Filter{{Name: aws.String("instance-id"), Values: chunk}}}
		err := f.describe(ctx, in, func(i Instance) error { described[i.ID] = i; return nil })
		switch {
		case err == nil:
			maps.Copy(d.Found, described)
			for _, id := range chunk {
				if _, ok := described[id]; !ok {
					absent = append(absent, id)
				}
			}
		case errors.Is(err, ErrNoTokens) && !refused(err):
			// The share ran out: the confirmations first, then the chunks
			// left, each call when the share covers it.
			calls := slices.Collect(slices.Chunk(absent, describeChunk))
			calls = append(calls, slices.Collect(slices.Chunk(ids[start:], describeChunk))...)
			for id, spent := range f.pacer.leftDescribes(calls, time.Now()) {
				d.Left[id] = fmt.Errorf("describe instances: %w", spent)
			}
			return d
		case errors.Is(err, ErrNoTokens) || ctx.Err() != nil:
			leave(d.Left, ids[start:], err)
			leave(d.Left, absent, err)
			return d
		default:
			leave(d.Left, chunk, err)
		}
	}
	f.confirm(ctx, absent, d)
	return d
}

// confirm asks EC2 by id for the ids a filtered answer left out, a chunk
// at a time: those it describes are Found; those its InvalidInstanceID.NotFound
// names it does not know, and the call is made again without them. An id
// that cannot be confirmed (the call failed, or no tokens) is Left, never
// taken for unknown; when a call fails so, the rest of its chunk is Left
// with it.
//
// One id EC2 would not take (InvalidInstanceID.Malformed: EC2 takes "i-"
// and 8 or 17 hex digits, model.ValidInstanceID) fails the call for every
// id it names, where a filter simply does not match it. It costs itself
// only: the ids the error message names are answered unknown, as no
// instance can have them, and the call is made again without them; when
// the message names none, the call is split in halves until each
// malformed id is asked alone and answered unknown.
func (f *Fleet) confirm(ctx context.Context, absent []string, d Described) {
	for chunk := range slices.Chunk(absent, describeChunk) {
		// calls are the calls still to make for the chunk, in order; a
		// failed call's ids come back as smaller calls.
		calls := [][]string{slices.Clone(chunk)}
		for len(calls) > 0 {
			ask := calls[0]
			calls = calls[1:]
			err := f.describe(ctx, &ec2.DescribeInstancesInput{InstanceIds: ask}, func(i Instance) error { d.Found[i.ID] = i; return nil })
			if err == nil {
				continue
			}
			var ae smithy.APIError
			code := ""
			if errors.As(err, &ae) {
				code = ae.ErrorCode()
			}
			switch code {
			case "InvalidInstanceID.NotFound":
				unknown := instanceIDInText.FindAllString(ae.ErrorMessage(), -1)
				if rest := slices.DeleteFunc(slices.Clone(ask), func(id string) bool { return slices.Contains(unknown, id) }); len(rest) < len(ask) {
					if len(rest) > 0 {
						calls = append([][]string{rest}, calls...)
					}
					continue
				}
				// The message names none of them: none is confirmed.
			case "InvalidInstanceID.Malformed":
				calls = append(splitMalformed(ask, ae.ErrorMessage()), calls...)
				continue
			}
			leave(d.Left, slices.Concat(ask, slices.Concat(calls...)), err)
			break
		}
	}
}

// anyInstanceIDInText finds what an error message quotes as an instance
// id, of any length: EC2's InvalidInstanceID.Malformed quotes the id it
// would not take.
var anyInstanceIDInText = regexp.MustCompile(`i-[0-9a-zA-Z]+`)

// splitMalformed returns the calls left to make after a by-id call of ask
// failed with InvalidInstanceID.Malformed: ask without the ids the message
// names, those being answered unknown (no call of their own), or, when it
// names none, ask's two halves. A call of one id is answered unknown.
func splitMalformed(ask []string, message string) [][]string {
	if len(ask) == 1 {
		return nil
	}
	named := anyInstanceIDInText.FindAllString(message, -1)
	rest := slices.DeleteFunc(slices.Clone(ask), func(id string) bool { return slices.Contains(named, id) })
	switch {
	case len(rest) == 0:
		return nil
	case len(rest) < len(ask):
		return [][]string{rest}
	}
	return [][]string{ask[:len(ask)/2], ask[len(ask)/2:]}
}

// leave records ids as left, each with err.
func leave(left map[string]error, ids []string, err error) {
	for _, id := range ids {
		left[id] = err
	}
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
		if err != nil {
			return fmt.Errorf("describe instances: %w", callError(err, f.pacer.describeRefused))
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
		case f.keys.ExitToken:
			out.ExitTokenHash = v
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
	// Refused: TerminateInstances will not end it (termination protection,
	// or a policy); the caller reports it and stops asking for a while.
	Refused Termination = "refused"
	// WouldTerminate: a dry run (ReadOnly) decided to terminate it.
	WouldTerminate Termination = "would-terminate"
)

// Terminated is what a Terminate did.
type Terminated struct {
	// Outcome is what became of each id decided (Terminating, AlreadyGone,
	// NotOwned, Refused, WouldTerminate).
	Outcome map[string]Termination
	// Refusals are EC2's error codes for the ids answered Refused
	// ("OperationNotPermitted": termination protection).
	Refusals map[string]string
	// Left are the ids not decided, each with why (same error conventions
	// as Described.Left; ids the lookup could not describe are Left with
	// the lookup's error).
	Left map[string]error
}

// TerminateInstances takes at most this many ids a call.
const terminateChunk = 1000

// Terminate ends the owned instances among ids with one tag lookup and as
// few TerminateInstances calls as its tokens allow, at most 1,000 ids each,
// in the order given. Instances already gone count as done. known are
// instances already described, to skip the lookup (nil: look them up); an
// id absent from a non-nil known is taken for one EC2 does not know.
//
// TerminateInstances is all-or-nothing: one instance it will not end
// (termination protection, a policy, an id that vanished) fails the call
// for all. Such an error costs those instances only: the ids its message
// names are answered and the rest sent again; when it names none, the call
// is split in halves until each refusal stands alone. Instances EC2 refused
// are answered Refused, with EC2's error code in Refusals.
//
// A call that fails for another reason (no tokens before the deadline, EC2
// refusing it for throttling, the deadline, an outage) leaves its ids and
// those after it Left with its error; what was decided before stays.
func (f *Fleet) Terminate(ctx context.Context, ids []string, known map[string]Instance) Terminated {
	t, targets := f.triage(ctx, ids, known)
	// groups are the calls still to make, in order; a failed call's
	// instances come back as smaller groups.
	groups := [][]string{}
	if len(targets) > 0 {
		groups = append(groups, targets)
	}
	for len(groups) > 0 {
		group := groups[0]
		n, err := f.pacer.terminateCall(ctx, len(group))
		if err != nil {
			rest := slices.Concat(groups...)
			if errors.Is(err, ErrNoTokens) {
				for id, err := range f.pacer.leftTerminates(rest, time.Now()) {
					t.Left[id] = fmt.Errorf("terminate %d instances: %w", len(rest), err)
				}
				return t
			}
			leave(t.Left, rest, fmt.Errorf("terminate %d instances: %w", len(rest), err))
			return t
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
				t.Outcome[id] = Terminating
			}
		case !refused(err) && errors.As(err, &ae) && concernsInstances(ae.ErrorCode()):
			groups = append(t.isolate(call, ae), groups...)
		default:
			err = fmt.Errorf("terminate %d instances: %w", len(call), callError(err, f.pacer.terminateRefused))
			leave(t.Left, slices.Concat(call, slices.Concat(groups...)), err)
			return t
		}
	}
	return t
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
func (t Terminated) isolate(call []string, ae smithy.APIError) [][]string {
	answer := func(id string) {
		if ae.ErrorCode() == "InvalidInstanceID.NotFound" {
			t.Outcome[id] = AlreadyGone
			return
		}
		t.Outcome[id], t.Refusals[id] = Refused, ae.ErrorCode()
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

// triage answers for the ids that need no TerminateInstances (gone, or not
// this deployment's) and returns the others as targets, in order. Without
// known, it looks the ids up; those the lookup leaves are Left with its
// error, neither answered nor targets.
func (f *Fleet) triage(ctx context.Context, ids []string, known map[string]Instance) (Terminated, []string) {
	t := Terminated{Outcome: make(map[string]Termination, len(ids)), Refusals: map[string]string{}, Left: map[string]error{}}
	if known == nil {
		d := f.Describe(ctx, ids)
		known, t.Left = d.Found, d.Left
	}
	var targets []string
	for _, id := range ids {
		if _, left := t.Left[id]; left {
			continue
		}
		i, ok := known[id]
		switch {
		case !ok || model.IsEnding(i.State):
			t.Outcome[id] = AlreadyGone
		case !i.Owned:
			t.Outcome[id] = NotOwned
		default:
			targets = append(targets, id)
		}
	}
	return t, targets
}

// CreateTags takes at most this many resource ids a call.
const tagChunk = 1000

// Tag puts the tag key=value on the instances ids, at most tagChunk ids a
// CreateTags call, each call waiting for its token. Tagging twice is
// harmless: the value is replaced. When a call fails, or its token would
// come after ctx's deadline, the ids not tagged come back with the error
// (same conventions as Described.Left).
func (f *Fleet) Tag(ctx context.Context, ids []string, key, value string) ([]string, error) {
	tags := []types.Tag{{Key: aws.String(key), Value: aws.String(value)}}
	for start := 0; start < len(ids); start += tagChunk {
		chunk := ids[start:min(start+tagChunk, len(ids))]
		err := f.pacer.tagCall(ctx)
		if err == nil {
			_, err = f.client.CreateTags(ctx, &ec2.CreateTagsInput{Resources: chunk, Tags: tags})
			if err != nil {
				err = callError(err, f.pacer.tagRefused)
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
// terminate tokens: only what its lookup could not describe is Left.
type ReadOnly struct {
	*Fleet
}

// Tag tags nothing: a dry run changes nothing in EC2.
func (f ReadOnly) Tag(context.Context, []string, string, string) ([]string, error) { return nil, nil }

// Terminate decides and terminates nothing.
func (f ReadOnly) Terminate(ctx context.Context, ids []string, known map[string]Instance) Terminated {
	t, targets := f.triage(ctx, ids, known)
	for _, id := range targets {
		t.Outcome[id] = WouldTerminate
	}
	return t
}

// refused reports whether EC2 refused a call for throttling
// (RequestLimitExceeded) until the SDK gave up retrying it. A call the
// deadline cut, even while it waited to retry a refusal, is not: backing
// off would only cost later calls their tokens.
func refused(err error) bool {
	var ae smithy.APIError
	return errors.As(err, &ae) && ae.ErrorCode() == "RequestLimitExceeded"
}

// callError is the error of a failed EC2 call as the Fleet reports it. A
// refusal (RequestLimitExceeded) calls backOff, the pacer's hook for the
// call's bucket, and is also ErrNoTokens: the account's bucket is spent,
// so the work is for later. Any other error is the SDK's as it is: a call
// the context's deadline cut, in flight or while the SDK waited to retry
// it, wraps context.DeadlineExceeded.
func callError(err error, backOff func()) error {
	if refused(err) {
		backOff()
		return fmt.Errorf("%w: %w", ErrNoTokens, err)
	}
	return err
}
