package replay

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/reaper-k8s/reaper/internal/ec2server"
)

// podWrittenTag is the REAPER_TAG_POD_WRITTEN of the bursts whose hosts
// wait for Reaper's tag.
const podWrittenTag = "reaper.io:pod-written"

// 400 Pods end at once beside the ledger-first provider (vkprovider.Run,
// polling every second), on hosts that power themselves off 3 – 7 s after
// their line's delivery, with REAPER_POWER_OFF_GRACE: many instances go
// before Reaper's write reaches their Pod, and the provider, which reads
// the ledger before it looks at the instance, never writes a status of its
// own. Every Pod ends with its exit's truth.
func TestBurstProviderLedgerFirst(t *testing.T) {
	res := runBurst(t, "reaper-provider-ledger", BurstOptions{
		Exits: hostsExits, Scale: hostsScale, StateChanges: true, Hosts: productionHosts(21), Provider: LedgerFirst,
		Lab: LabOptions{Env: []string{"REAPER_POWER_OFF_GRACE=" + hostsGrace.String()}},
	}, nil)
	wantProviderBurst(t, res)
}

// 400 Pods end at once beside a provider that derives their status from
// the instance state alone (vkprovider.RunStatusFromInstance, polling every
// second), on hosts that power off only 3 – 7 s after they see Reaper's
// Pod-written tag on their instance (REAPER_TAG_POD_WRITTEN), with
// REAPER_POWER_OFF_GRACE: no instance goes before Reaper has written its
// Pod, so the provider never ends one as InstanceGone. With hosts that
// power off after their line's delivery instead, the same provider ends
// many Pods as InstanceGone.
func TestBurstProviderStatusFromInstance(t *testing.T) {
	hosts := productionHosts(21)
	hosts.AfterPodWritten = podWrittenTag
	res := runBurst(t, "reaper-provider-state", BurstOptions{
		Exits: hostsExits, Scale: hostsScale, StateChanges: true, Hosts: hosts, Provider: StatusFromInstance,
		Lab: LabOptions{Env: []string{"REAPER_POWER_OFF_GRACE=" + hostsGrace.String()}},
	}, nil)
	wantProviderBurst(t, res)
	for _, p := range res.Pods {
		if p.PoweredOff.IsZero() {
			continue
		}
		if p.TagSeen.IsZero() || p.Terminal.IsZero() || p.PoweredOff.Before(p.TagSeen) || p.PoweredOff.Before(p.Terminal) {
			t.Errorf("host of %s powered off at %s: tag seen at %s, Pod terminal at %s; want after both",
				p.Name, stamp(p.PoweredOff), stamp(p.TagSeen), stamp(p.Terminal))
		}
	}
}

// wantProviderBurst checks a burst beside a provider on hosts that power
// themselves off: every Pod ends with its exit's truth and nothing else
// wrote it, nothing failed or was refused (Reaper's requests or the
// provider's), the provider adopted the instances rather than launching
// any, every instance is gone, and Reaper's TerminateInstances name little
// more than the hosts that never power off (TestBurstHostsPowerOff's
// bound).
func wantProviderBurst(t *testing.T, res *BurstResult) {
	t.Helper()
	wantAllEnded(t, res)
	if len(res.WrongPods) > 0 {
		var wrong []string
		for _, p := range res.Pods {
			if p.Wrong {
				wrong = append(wrong, fmt.Sprintf("%s (exit %d: %s, %s, %d)", p.Name, p.ExitCode, p.Phase, p.Reason, p.ExitSeen))
			}
		}
		t.Errorf("%d Pods did not end with their exit's truth: %s", len(res.WrongPods), strings.Join(wrong, "; "))
	}
	for _, refused := range []map[string]int{res.Refused, res.ProviderRefused} {
		for action, n := range refused {
			if n > 0 {
				t.Errorf("%d %s requests refused (Reaper's %v, the provider's %v)", n, action, res.Refused, res.ProviderRefused)
			}
		}
	}
	if n := res.ProviderEC2["RunInstances"]; n > 0 || res.ProviderEC2["DescribeInstances"] == 0 {
		t.Errorf("provider's EC2 requests %v: want no launch, and its polling", res.ProviderEC2)
	}
	if running := res.StillRunning(); len(running) > 0 {
		t.Errorf("%d instances still running at the end: %v", len(running), running)
	}
	if res.StateEvents != 2*res.Exits {
		t.Errorf("%d state-change events delivered, want %d", res.StateEvents, 2*res.Exits)
	}
	never, early := 0, 0
	for _, p := range res.Pods {
		if !p.PowersOff {
			never++
		}
		if !p.PoweredOff.IsZero() && p.PoweredOff.Before(p.Terminal) {
			early++
		}
	}
	if res.PoweredOff == 0 {
		t.Fatal("no host powered off: the test proves nothing")
	}
	if limit := never + res.Exits*5/100; res.TerminateNamed > limit {
		t.Errorf("%d instances named in TerminateInstances, want at most %d: %d hosts never power off, %d powered off",
			res.TerminateNamed, limit, never, res.PoweredOff)
	}
	all, _ := res.AllGone()
	lat := res.PodLatencies()
	t.Logf("provider %s: %d exits, %d hosts never power off: %d powered off (%d before their Pod was seen terminal), %d instances named in TerminateInstances; "+
		"every instance gone %v after the first delivery (delivering took %v); Pods terminal p50 %v p99 %v; %d wrong; "+
		"Reaper's EC2 %v, refused %v; the provider's EC2 %v, refused %v, DynamoDB %v; %d invocations, batch sizes %v",
		res.Provider, res.Exits, never, res.PoweredOff, early, res.TerminateNamed, all, res.Delivering, lat[len(lat)/2], lat[len(lat)*99/100],
		len(res.WrongPods), res.EC2, res.Refused, res.ProviderEC2, res.ProviderRefused, res.ProviderDynamo, res.Invocations, res.BatchSizes)
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return t.Format(time.StampMilli)
}

// Hosts that wait for Reaper's tag (Hosts.AfterPodWritten), without Reaper:
// the tag is put on by hand. A host powers off its plan's time after it
// sees the tag, and not before; one drawn never to power off does not; one
// whose instance Reaper ended first does nothing; one that waited
// TagWaitMax in vain powers off anyway.
func TestHostsWaitForTag(t *testing.T) {
	t.Parallel()
	ec2 := lab.Stack.EC2
	const (
		after = 300 * time.Millisecond
		tag   = podWrittenTag
	)
	ids := []string{hostileInstance(0x7a9, 1), hostileInstance(0x7a9, 2), hostileInstance(0x7a9, 3), hostileInstance(0x7a9, 4)}
	pods := make([]BurstPod, len(ids))
	for i, id := range ids {
		pods[i] = BurstPod{Name: fmt.Sprintf("host-%d", i), InstanceID: id}
		ec2.AddInstance(ec2server.Instance{ID: id, State: ec2server.Running})
		t.Cleanup(func() { ec2.RemoveInstance(id) })
	}
	hosts := Hosts{PowerOffMin: after, PowerOffMax: after, ShutdownTime: 100 * time.Millisecond, AfterPodWritten: tag, TagWaitMax: 3 * time.Second}.withDefaults()
	r := newHostRun(t.Context(), lab.Stack, hosts, pods, nil, &goneSet{ids: map[string]bool{}})
	t.Cleanup(r.stop)
	// Host 1 never powers off; the others do.
	for i := range r.plan {
		r.plan[i].powersOff = i != 1
		pods[i].PowersOff = r.plan[i].powersOff
	}
	start := time.Now()
	for i := range ids {
		r.delivered(i, start)
	}
	time.Sleep(time.Second)
	for i, id := range ids {
		if inst, _ := ec2.Instance(id); inst.State != ec2server.Running {
			t.Fatalf("host %d is %s before any tag", i, inst.State)
		}
	}
	// Reaper tags host 0 and 1 and terminates host 2 first; host 3 never
	// sees a tag.
	tagged := time.Now()
	for _, i := range []int{0, 1} {
		ec2.AddInstance(ec2server.Instance{ID: ids[i], State: ec2server.Running, Tags: map[string]string{tag: string(corev1.PodSucceeded)}})
	}
	ec2.SetState(ids[2], ec2server.Terminated)

	done := make(chan struct{})
	go func() {
		r.wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the hosts still wait 10 s after the tags")
	}
	if p := pods[0]; p.TagSeen.Before(tagged) || p.TagSeen.After(tagged.Add(tagPoll+100*time.Millisecond)) || p.PoweredOff.Sub(p.TagSeen) < after {
		t.Errorf("host 0: tagged at %s, saw the tag at %s, powered off at %s; want the tag seen within %v, the power-off %v after it",
			stamp(tagged), stamp(p.TagSeen), stamp(p.PoweredOff), tagPoll, after)
	}
	if p := pods[1]; !p.PoweredOff.IsZero() || !p.TagSeen.IsZero() {
		t.Errorf("host 1, drawn never to power off: saw the tag at %s, powered off at %s", stamp(p.TagSeen), stamp(p.PoweredOff))
	}
	if p := pods[2]; !p.PoweredOff.IsZero() {
		t.Errorf("host 2, terminated by Reaper, powered off at %s", stamp(p.PoweredOff))
	}
	if p := pods[3]; !p.TagSeen.IsZero() || p.PoweredOff.Sub(start) < hosts.TagWaitMax {
		t.Errorf("host 3, never tagged: saw the tag at %s, powered off at %s, want %v after its delivery", stamp(p.TagSeen), stamp(p.PoweredOff), hosts.TagWaitMax)
	}
	// A host powers off as EC2 shows it: shutting-down, then terminated.
	time.Sleep(2 * hosts.ShutdownTime)
	for i, want := range []ec2server.State{ec2server.Terminated, ec2server.Running, ec2server.Terminated, ec2server.Terminated} {
		if inst, _ := ec2.Instance(ids[i]); inst.State != want {
			t.Errorf("host %d: instance %s, want %s", i, inst.State, want)
		}
	}
}
