package reaper

import (
	"context"
	"log/slog"
	"time"

	"github.com/reaper-k8s/reaper/pkg/instances"
	"github.com/reaper-k8s/reaper/pkg/ledger"
	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/model"
)

// distrust says why a Pod claimed for an instance is not to be believed, or
// "" when the instance's launch tags agree: managed, this cluster, and the
// same Pod namespace, name and UID.
func distrust(inst instances.Instance, known bool, pod model.PodRef) string {
	switch {
	case !known:
		return model.ReasonInstanceUnknown
	case !inst.Managed:
		return model.ReasonNotManaged
	case !inst.Owned:
		return model.ReasonOtherCluster
	case inst.Pod.UID == "":
		return model.ReasonNoPodTags
	case inst.Pod != pod:
		return model.ReasonPodMismatch
	}
	return ""
}

// believe returns what Reaper may act on in a record, given the instance as
// EC2 describes it (known=false: EC2 no longer knows it). ok=false: act on
// nothing, for reason. An exit whose Pod disagrees with the tags is dropped
// from the view (reason says so, ok stays true) and the tags name the Pod:
// the instance's own end (gone, lost) still decides the real Pod's status.
func believe(rec ledger.Record, inst instances.Instance, known bool) (view ledger.Record, reason string, ok bool) {
	if !known {
		// Terminated instances leave EC2's answers after about an hour; a
		// record checked when it was written still stands.
		if rec.Unverified {
			return rec, model.ReasonInstanceUnknown, false
		}
		return rec, "", true
	}
	if reason := distrust(inst, known, inst.Pod); reason != "" {
		return rec, reason, false
	}
	if rec.Pod != inst.Pod {
		if rec.Exit != nil {
			reason = model.ReasonPodMismatch
		}
		rec.Pod, rec.Exit = inst.Pod, nil
	}
	rec.Unverified = false
	return rec, reason, true
}

// endedByRecord says whether rec ends inst by itself: a terminal exit of
// the Pod inst's tags name, checked against them when it was recorded. An
// exit kept for another Pod, or one an older version recorded unchecked,
// shields nothing from orphan cleanup.
func endedByRecord(rec ledger.Record, ok bool, inst instances.Instance) bool {
	return ok && rec.Exit != nil && rec.Exit.Terminal() && !rec.Unverified && rec.Pod == inst.Pod
}

// mayBeOrphan says whether inst may be an orphan: running (or pending) with
// neither its record ending it nor a recent refusal of EC2 to terminate it.
// Whether its Pod still lives decides. The sweeper asks before it queues
// the instance and the reconciler again before it terminates it, each with
// its own read of the Pod: a message on the queue proves nothing.
func mayBeOrphan(inst instances.Instance, rec ledger.Record, ok bool, now time.Time) bool {
	return (inst.State == model.StateRunning || inst.State == model.StatePending) &&
		!endedByRecord(rec, ok, inst) && !refusedLately(rec, ok, now)
}

// refusedLately says whether EC2 refused to terminate the instance less
// than RefusalBackoff before now.
func refusedLately(rec ledger.Record, ok bool, now time.Time) bool {
	return ok && rec.TerminateRefused != nil && now.Before(rec.TerminateRefused.At.Add(RefusalBackoff))
}

// sameCluster keeps the instances launched for the cluster Reaper reaches:
// their cluster identity tag equals the identity of the apiserver (the
// UID of its kube-system namespace). A Pod missing from another cluster
// says nothing of an instance's Pod: a kubeconfig or EKS name pointing at
// the wrong or a recreated cluster would otherwise make every instance an
// orphan. The others are counted and logged; without the identity nothing
// is kept (fail closed).
func (r *Reaper) sameCluster(ctx context.Context, insts []instances.Instance) ([]instances.Instance, int, error) {
	identity, err := r.Pods.ClusterIdentity(ctx)
	if err != nil {
		return nil, 0, err
	}
	var (
		keep    []instances.Instance
		foreign []instances.Instance
	)
	for _, inst := range insts {
		if inst.ClusterUID != "" && inst.ClusterUID == identity {
			keep = append(keep, inst)
		} else {
			foreign = append(foreign, inst)
		}
	}
	if len(foreign) > 0 {
		r.Metrics.Count(metrics.ClusterIdentityMismatch, len(foreign))
		r.Log.LogAttrs(ctx, slog.LevelError, "cluster identity mismatch: not treated as orphans",
			slog.Int("instances", len(foreign)), slog.String("apiserverIdentity", identity),
			slog.String("example", foreign[0].ID), slog.String("exampleTag", foreign[0].ClusterUID))
	}
	return keep, len(foreign), nil
}
