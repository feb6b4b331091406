package replay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/reaper-k8s/reaper/internal/ec2server"
	"github.com/reaper-k8s/reaper/pkg/intake"
	"github.com/reaper-k8s/reaper/pkg/model"
)

// stateSender delivers the state-change events of the burst's instances
// as EventBridge does, once per instance and state: shutting-down, then
// terminated. Those of an instance Reaper terminates are sent when its
// TerminateInstances shows in the EC2 test server's log (the server
// settles it at once); a host that powers off sends its own (send).
type stateSender struct {
	stop chan struct{}
	done chan struct{}
	sent atomic.Int64
	err  error

	mu     sync.Mutex
	queued map[stateKey]bool
	// events holds every event queued: there are at most two per instance.
	events chan stateKey
}

// stateKey is an instance and a state it reached.
type stateKey struct{ id, state string }

func (b *Burst) startStateChanges(ctx context.Context, from int, byInstance map[string]int, gone *goneSet) *stateSender {
	all := 2 * len(byInstance)
	s := &stateSender{stop: make(chan struct{}), done: make(chan struct{}), queued: map[stateKey]bool{}, events: make(chan stateKey, all)}
	var wg sync.WaitGroup
	errs := make([]error, len(b.stateSenders))
	for k, f := range b.stateSenders {
		wg.Go(func() {
			for ev := range s.events {
				payload, err := json.Marshal(StateChangeEvent(fmt.Sprintf("burst-%s-%s", ev.id, ev.state), ev.id, ev.state, time.Now().UTC().Truncate(time.Second)))
				if err == nil {
					err = invokeExpect(ctx, f, payload, func(s intake.StateSummary) bool { return s.Queued })
				}
				if err != nil {
					errs[k] = errors.Join(errs[k], err)
					continue
				}
				s.sent.Add(1)
			}
		})
	}
	stack := b.Lab.Stack
	go func() {
		defer close(s.done)
		// shuttingDown are the instances terminated whose terminated state
		// EC2 did not report yet: a host powering one off ends it when its
		// shutdown does.
		shuttingDown := map[string]bool{}
		tail := func() {
			from = terminatedSince(stack, from, byInstance, func(id string) {
				gone.add(id)
				s.send(id, model.StateShuttingDown)
				shuttingDown[id] = true
			})
			for id := range shuttingDown {
				if inst, ok := stack.EC2.Instance(id); ok && inst.State == ec2server.Terminated {
					s.send(id, model.StateTerminated)
					delete(shuttingDown, id)
				}
			}
		}
		tick := time.NewTicker(tailPoll)
		defer tick.Stop()
	loop:
		for s.count() < all {
			select {
			case <-s.stop:
				break loop
			case <-tick.C:
				tail()
			}
		}
		tail()
		close(s.events)
		wg.Wait()
		s.err = errors.Join(errs...)
	}()
	return s
}

// send queues the event of id reaching state, unless it was queued before.
// It may not be called after finish.
func (s *stateSender) send(id, state string) {
	k := stateKey{id, state}
	s.mu.Lock()
	if s.queued[k] {
		s.mu.Unlock()
		return
	}
	s.queued[k] = true
	s.mu.Unlock()
	s.events <- k
}

func (s *stateSender) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.queued)
}

// finish delivers the events queued so far and those of the terminations
// seen so far, and returns how many events were delivered.
func (s *stateSender) finish() (int, error) {
	close(s.stop)
	<-s.done
	return int(s.sent.Load()), s.err
}
