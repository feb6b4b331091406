package reaper

import (
	"context"
	"log/slog"
	"time"

	"github.com/reaper-k8s/reaper/pkg/instances"
	"github.com/reaper-k8s/reaper/pkg/ledger"
	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/model"
	"github.com/reaper-k8s/reaper/pkg/podstatus"
	"github.com/reaper-k8s/reaper/pkg/workqueue"
)

// claim is what a message says of an instance: the Pod it runs and, for
// an exit line, the hash of the exit token the line carried ("" none).
type claim struct {
	pod       model.PodRef
	tokenHash string
}

// trust is the one check of a claim: "" believes it, anything else is the
// reason it is not believed. While EC2 describes the instance (ec2), its
// launch tags decide: managed, this cluster, the same Pod namespace, name
// and UID, and, when the instance carries an exit-token hash, the same
// hash: only its own host knows the token, so no other host can speak for
// its Pod. Once EC2 no longer knows it, a record checked against those
// tags while it did (rec) backs a claim of the Pod it names, with the
// token whose hash the record kept from the tags, if it kept one: the exit
// of a Pod whose lookups failed until EC2 forgot its instance still
// counts, and the token still holds.
func trust(c claim, ec2 *instances.Instance, rec *ledger.Record) string {
	if ec2 == nil {
		switch {
		case rec == nil || rec.Pod.UID == "" || rec.Pod != c.pod:
			return model.ReasonInstanceUnknown
		case rec.ExitTokenHash != "" && c.tokenHash != rec.ExitTokenHash:
			return model.ReasonTokenMismatch
		}
		return ""
	}
	switch {
	case !ec2.Managed:
		return model.ReasonNotManaged
	case !ec2.Owned:
		return model.ReasonOtherCluster
	case ec2.Pod.UID == "":
		return model.ReasonNoPodTags
	case ec2.Pod != c.pod:
		return model.ReasonPodMismatch
	case ec2.ExitTokenHash != "" && c.tokenHash != ec2.ExitTokenHash:
		return model.ReasonTokenMismatch
	}
	return ""
}

// claimOf is an exit message's claim.
func claimOf(c workqueue.ExitClaim) claim { return claim{pod: c.Pod, tokenHash: c.TokenHash} }

// believe returns what Reaper may act on in rec, given the instance as EC2
// describes it (nil: EC2 no longer knows it). A nil view acts on nothing,
// for reason. A record is the Pod its instance's tags name (trust): an
// exit recorded for another Pod is dropped from the view (reason says so)
// and the instance's own end (gone, lost) still decides the real Pod's
// status.
func believe(rec ledger.Record, ec2 *instances.Instance) (view *ledger.Record, reason string) {
	if ec2 == nil {
		// Terminated instances leave EC2's answers after about an hour; a
		// record checked when it was written still stands.
		return &rec, ""
	}
	// The record's exit was checked, its token too, when it was recorded.
	if reason := trust(claim{pod: ec2.Pod, tokenHash: ec2.ExitTokenHash}, ec2, nil); reason != "" {
		return nil, reason
	}
	if rec.Pod != ec2.Pod {
		if len(rec.Runs()) > 0 {
			reason = model.ReasonPodMismatch
		}
		rec.Pod, rec.Exits, rec.LegacyExit = ec2.Pod, nil, nil
	}
	return &rec, reason
}

// mayBeOrphan is the one orphan check: an owned instance running (or
// pending) for a Pod its tags name, with neither its record ending it
// (that Pod written ended by its checked exits, or the host's word that
// it ended, podstatus.HostSaysEnded) nor a refusal
// of EC2 to terminate it less than RefusalBackoff before now. Whether its
// Pod still lives decides. The sweeper asks before it queues the instance
// and the reconciler again before it terminates it, each with its own read
// of the Pod: a message on the queue proves nothing.
func mayBeOrphan(inst instances.Instance, rec *ledger.Record, now time.Time) bool {
	if !inst.Owned || inst.Pod.UID == "" || (inst.State != model.StateRunning && inst.State != model.StatePending) {
		return false
	}
	if rec == nil {
		return true
	}
	ended := rec.Pod == inst.Pod &&
		((rec.PodEnded != nil && *rec.PodEnded) || podstatus.HostSaysEnded(rec.Runs()))
	refused := rec.TerminateRefused != nil && now.Before(rec.TerminateRefused.At.Add(RefusalBackoff))
	return !ended && !refused
}

// sameCluster keeps the instances launched for the cluster Reaper reaches:
// their cluster identity tag equals the identity of the apiserver (the
// UID of its kube-system namespace). A Pod missing from another cluster
// says nothing of an instance's Pod: a kubeconfig or EKS name pointing at
// the wrong or a recreated cluster would otherwise make every instance an
// orphan. The others are counted and logged; without the identity nothing
// is kept (fail closed).
func (r *Reaper) sameCluster(ctx context.Context, insts []instances.Instance) (keep []instances.Instance, foreign int, err error) {
	identity, err := r.Pods.ClusterIdentity(ctx)
	if err != nil {
		return nil, 0, err
	}
	var others []instances.Instance
	for _, inst := range insts {
		if inst.ClusterUID != "" && inst.ClusterUID == identity {
			keep = append(keep, inst)
		} else {
			others = append(others, inst)
		}
	}
	if len(others) > 0 {
		r.Metrics.Count(metrics.ClusterIdentityMismatch, len(others))
		r.Log.LogAttrs(ctx, slog.LevelError, "cluster identity mismatch: not treated as orphans",
			slog.Int("instances", len(others)), slog.String("apiserverIdentity", identity),
			slog.String("example", others[0].ID), slog.String("exampleTag", others[0].ClusterUID))
	}
	return keep, len(others), nil
}
