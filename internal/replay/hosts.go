package replay

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/reaper-k8s/reaper/internal/ec2server"
	"github.com/reaper-k8s/reaper/internal/labstack"
	"github.com/reaper-k8s/reaper/pkg/model"
	"github.com/reaper-k8s/reaper/pkg/userdata"
)

// Hosts model hosts that power themselves off after their exit line, as
// the default user-data's do (userdata.ShutdownWhenShipped): each host
// powers off a random time from PowerOffMin to PowerOffMax after its exit
// line is delivered, except a NeverPowerOff part of them, which stay on
// until Reaper terminates them. Powering off is what EC2 shows of it: the
// instance is shutting-down at once and terminated ShutdownTime later (on
// the EC2 test server, SetState; a host that finds its instance no longer
// running, because Reaper terminated it first, does nothing). With
// StateChanges, EventBridge's event follows each of the two states.
//
// With AfterPodWritten a host that powers off waits for Reaper's tag on its
// instance first, and powers off PowerOffMin to PowerOffMax after it saw it.
//
// The draws come from a generator seeded with Seed, one draw per exit in
// the order of the exits: the same seed and number of exits power off the
// same hosts at the same offsets from their deliveries (or their tags).
type Hosts struct {
	// PowerOffMin and PowerOffMax bound a host's power-off after its
	// delivery (defaults 3 s and 7 s).
	PowerOffMin, PowerOffMax time.Duration
	// NeverPowerOff is the part of the hosts, from 0 to 1, that never power
	// off: round(NeverPowerOff·Exits) of them, picked at random.
	NeverPowerOff float64
	// ShutdownTime is how long a host that powers off stays shutting-down
	// before EC2 reports it terminated (default 1 s). The EC2 test server
	// settles Reaper's terminations at once.
	ShutdownTime time.Duration
	// LineAgeMin and LineAgeMax bound how long before its delivery each exit
	// line was written, its finishedAt: CloudWatch Logs delivers a line a
	// moment after the agent ships it (default 0, delivered as written).
	// Without Hosts a line's finishedAt is when its Pod was created.
	LineAgeMin, LineAgeMax time.Duration
	Seed                   uint64
	// AfterPodWritten, when not empty, is the tag key Reaper puts on an
	// instance once it has written its Pod's terminal status
	// (REAPER_TAG_POD_WRITTEN, which NewBurst then gives the functions): a
	// host that powers off does so PowerOffMin – PowerOffMax after it first
	// sees that tag on its instance instead of after its line's delivery.
	// It reads its tags as a real host reads them through the instance
	// metadata; here from the EC2 test server's instance, every tagPoll
	// (one loop over every host still waiting). A host whose instance is
	// no longer running before it sees the tag (Reaper terminated it) does
	// nothing. Hosts drawn never to power off never do.
	AfterPodWritten string
	// TagWaitMax is how long a host waits for the tag before it powers off
	// anyway, as a real host gives up waiting after its shutdown delay
	// (default userdata.DefaultShutdownDelay, 10 min, as deployed hosts
	// wait: a host that gives up before Reaper has written its Pod hands
	// the Pod to a provider that reads the instance's state).
	TagWaitMax time.Duration
}

// tagPoll is how often the hosts waiting for Reaper's tag read their
// instances' tags.
const tagPoll = 200 * time.Millisecond

func (h Hosts) withDefaults() Hosts {
	if h.PowerOffMin == 0 && h.PowerOffMax == 0 {
		h.PowerOffMin, h.PowerOffMax = 3*time.Second, 7*time.Second
	}
	if h.ShutdownTime == 0 {
		h.ShutdownTime = time.Second
	}
	if h.TagWaitMax == 0 {
		h.TagWaitMax = userdata.DefaultShutdownDelay
	}
	return h
}

func (h Hosts) check() error {
	if h.PowerOffMin < 0 || h.PowerOffMax < h.PowerOffMin || h.LineAgeMin < 0 || h.LineAgeMax < h.LineAgeMin ||
		h.ShutdownTime < 0 || h.NeverPowerOff < 0 || h.NeverPowerOff > 1 || h.TagWaitMax < 0 {
		return fmt.Errorf("burst: hosts %+v: want 0 ≤ min ≤ max for the power-off and the line age, a shutdown time and a wait for the tag of at least 0 and a part never powering off in [0, 1]", h)
	}
	return nil
}

// hostPlan is what one host will do.
type hostPlan struct {
	powersOff bool
	// after is how long after the delivery it powers off; lineAge how long
	// before the delivery its exit line was written.
	after, lineAge time.Duration
}

// plan draws what each of n hosts will do.
func (h Hosts) plan(n int) []hostPlan {
	rng := rand.New(rand.NewPCG(h.Seed, 0x6057))
	out := make([]hostPlan, n)
	never := int(math.Round(h.NeverPowerOff * float64(n)))
	for k, i := range rng.Perm(n) {
		out[i].powersOff = k >= never
	}
	between := func(lo, hi time.Duration) time.Duration {
		return lo + time.Duration(rng.Int64N(int64(hi-lo)+1))
	}
	for i := range out {
		out[i].after = between(h.PowerOffMin, h.PowerOffMax)
		out[i].lineAge = between(h.LineAgeMin, h.LineAgeMax)
	}
	return out
}

// hostRun is the hosts of a burst while it runs (Hosts).
type hostRun struct {
	ctx      context.Context
	cancel   context.CancelFunc
	ec2      *ec2server.Server
	plan     []hostPlan
	pods     []BurstPod
	shutdown time.Duration
	// states, when not nil, delivers the state-change events.
	states *stateSender
	gone   *goneSet
	// wg counts the steps scheduled and not yet taken, a host waiting for
	// its tag among them.
	wg sync.WaitGroup

	// tagKey is Hosts.AfterPodWritten; waiting holds the hosts waiting for
	// it, with when each started to.
	tagKey  string
	tagWait time.Duration
	mu      sync.Mutex
	waiting map[int]time.Time
	// closed says the tag loop has stopped: no host may wait any more.
	closed bool
	// loopDone is closed when the tag loop has returned.
	loopDone chan struct{}
}

func newHostRun(ctx context.Context, stack *labstack.Stack, h Hosts, pods []BurstPod, states *stateSender, gone *goneSet) *hostRun {
	r := &hostRun{ec2: stack.EC2, plan: h.plan(len(pods)), pods: pods, shutdown: h.ShutdownTime, states: states, gone: gone,
		tagKey: h.AfterPodWritten, tagWait: h.TagWaitMax, waiting: map[int]time.Time{}, loopDone: make(chan struct{})}
	r.ctx, r.cancel = context.WithCancel(ctx)
	for i := range pods {
		pods[i].PowersOff = r.plan[i].powersOff
	}
	if r.tagKey != "" {
		go r.tagLoop()
	} else {
		close(r.loopDone)
	}
	return r
}

// delivered tells host i its exit line was delivered at: it powers off its
// plan's time later, or with a tag key its plan's time after it sees the
// tag, if it ever does.
func (r *hostRun) delivered(i int, at time.Time) {
	if !r.plan[i].powersOff {
		return
	}
	if r.tagKey == "" {
		r.later(time.Until(at.Add(r.plan[i].after)), func() { r.powerOff(i) })
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.closed {
		r.wg.Add(1)
		r.waiting[i] = at
	}
}

// tagLoop reads, every tagPoll, the instance tags of every host waiting for
// the tag: one that sees it powers off its plan's time later; one whose
// instance no longer runs has nothing left to do; one that waited tagWait
// powers off at once. When the run stops, the hosts still waiting stop
// too.
func (r *hostRun) tagLoop() {
	defer close(r.loopDone)
	tick := time.NewTicker(tagPoll)
	defer tick.Stop()
	for {
		select {
		case <-r.ctx.Done():
			r.mu.Lock()
			r.closed = true
			for i := range r.waiting {
				delete(r.waiting, i)
				r.wg.Done()
			}
			r.mu.Unlock()
			return
		case <-tick.C:
		}
		r.mu.Lock()
		waiting := make([]int, 0, len(r.waiting))
		for i := range r.waiting {
			waiting = append(waiting, i)
		}
		r.mu.Unlock()
		for _, i := range waiting {
			inst, ok := r.ec2.Instance(r.pods[i].InstanceID)
			now := time.Now()
			r.mu.Lock()
			since := r.waiting[i]
			r.mu.Unlock()
			switch {
			case !ok || inst.State != ec2server.Running:
			case inst.Tags[r.tagKey] != "":
				r.pods[i].TagSeen = now
				r.later(r.plan[i].after, func() { r.powerOff(i) })
			case now.Sub(since) >= r.tagWait:
				r.later(0, func() { r.powerOff(i) })
			default:
				continue
			}
			r.mu.Lock()
			delete(r.waiting, i)
			r.mu.Unlock()
			r.wg.Done()
		}
	}
}

// later runs step after d, unless the run was stopped by then.
func (r *hostRun) later(d time.Duration, step func()) {
	r.wg.Add(1)
	time.AfterFunc(d, func() {
		defer r.wg.Done()
		if r.ctx.Err() == nil {
			step()
		}
	})
}

// powerOff powers host i off: its instance is shutting-down at once and
// terminated a shutdown time later, each state with its event. A host
// whose instance Reaper already ended has nothing left to do.
func (r *hostRun) powerOff(i int) {
	id := r.pods[i].InstanceID
	if inst, ok := r.ec2.Instance(id); !ok || inst.State != ec2server.Running {
		return
	}
	r.ec2.SetState(id, ec2server.ShuttingDown)
	r.pods[i].PoweredOff = time.Now()
	r.gone.add(id)
	r.event(id, model.StateShuttingDown)
	r.later(r.shutdown, func() {
		r.ec2.SetState(id, ec2server.Terminated)
		r.event(id, model.StateTerminated)
	})
}

func (r *hostRun) event(id, state string) {
	if r.states != nil {
		r.states.send(id, state)
	}
}

// wait waits until every host told of its delivery has powered off, or
// found its instance ended first.
func (r *hostRun) wait() { r.wg.Wait() }

// stop cancels the steps not yet taken and waits for those under way.
func (r *hostRun) stop() {
	r.cancel()
	<-r.loopDone
	r.wg.Wait()
}
