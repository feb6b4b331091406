package instances_test

import (
	"testing"

	"github.com/reaper-k8s/reaper/internal/ec2server"
	"github.com/reaper-k8s/reaper/pkg/model"
)

// What the launch tags say reaches Reaper's view of the instance through
// the SDK's DescribeInstances, under the deployment's keys: the Pod, the
// cluster and its identity, and the exit token's hash, which is "" on an
// instance launched without one.
func TestDescribeReadsTheLaunchTags(t *testing.T) {
	fleet, srv, _ := newFleet(t, 1, 0)
	keys := model.DefaultTagKeys()
	pod := model.PodRef{Namespace: "ml", Name: "train-0", UID: "6b9a1c2e-0000-4000-8000-000000000001"}
	hash := model.ExitTokenHash("0f1e2d3c4b5a69788796a5b4c3d2e1f0")
	tagged := srv.AddInstance(ec2server.Instance{Tags: map[string]string{
		keys.Managed: "true", keys.Cluster: cluster, keys.ClusterUID: "3f2a9c1e-7b4d-4e8f-9a6b-1c2d3e4f5a6b",
		keys.PodNamespace: pod.Namespace, keys.PodName: pod.Name, keys.PodUID: pod.UID, keys.ExitToken: hash,
	}}).ID
	untokened := srv.AddInstance(ec2server.Instance{Tags: map[string]string{keys.Managed: "true", keys.Cluster: cluster}}).ID

	d := fleet.Describe(t.Context(), []string{tagged, untokened})
	got := d.Found[tagged]
	if !got.Owned || got.Pod != pod || got.ClusterUID != "3f2a9c1e-7b4d-4e8f-9a6b-1c2d3e4f5a6b" || got.ExitTokenHash != hash {
		t.Errorf("tagged instance read as %+v", got)
	}
	if h := d.Found[untokened].ExitTokenHash; !d.Found[untokened].Owned || h != "" {
		t.Errorf("instance without the exit-token tag read with hash %q", h)
	}
}
