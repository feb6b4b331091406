package reaper

import (
	"github.com/reaper-k8s/reaper/pkg/instances"
	"github.com/reaper-k8s/reaper/pkg/ledger"
	"github.com/reaper-k8s/reaper/pkg/metrics"
	"github.com/reaper-k8s/reaper/pkg/model"
)

// Why a line or a record is not believed. A host writes the exit line and
// may write into any log stream of the group (IAM cannot tie a stream to
// the writer's instance), so what a line or a record built from one says is
// checked against the instance's launch tags, which only the provider
// wrote.
const (
	// DistrustUnknown: EC2 does not know the instance, and the record was
	// never checked against its tags.
	DistrustUnknown = metrics.ReasonInstanceUnknown
	// DistrustNotManaged: the instance lacks the managed tag.
	DistrustNotManaged = metrics.ReasonNotManaged
	// DistrustOtherCluster: the instance belongs to another cluster.
	DistrustOtherCluster = metrics.ReasonOtherCluster
	// DistrustNoPodTags: the instance carries no Pod tags to compare with.
	DistrustNoPodTags = metrics.ReasonNoPodTags
	// DistrustPodMismatch: the Pod named differs from the one the tags name.
	DistrustPodMismatch = metrics.ReasonPodMismatch
)

// distrust says why a Pod claimed for an instance is not to be believed, or
// "" when the instance's launch tags agree: managed, this cluster, and the
// same Pod namespace, name and UID.
func distrust(inst instances.Instance, known bool, pod model.PodRef) string {
	switch {
	case !known:
		return DistrustUnknown
	case !inst.Managed:
		return DistrustNotManaged
	case !inst.Owned:
		return DistrustOtherCluster
	case inst.Pod.UID == "":
		return DistrustNoPodTags
	case inst.Pod != pod:
		return DistrustPodMismatch
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
			return rec, DistrustUnknown, false
		}
		return rec, "", true
	}
	if reason := distrust(inst, known, inst.Pod); reason != "" {
		return rec, reason, false
	}
	if rec.Pod != inst.Pod {
		if rec.Exit != nil {
			reason = DistrustPodMismatch
		}
		rec.Pod, rec.Exit, rec.ExitRestartCount = inst.Pod, nil, nil
	}
	rec.Unverified = false
	return rec, reason, true
}
