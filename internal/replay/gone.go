package replay

import (
	"sync"
	"time"

	"github.com/reaper-k8s/reaper/internal/labstack"
)

// goneSet is the burst's instances seen gone so far, for the progress
// indicator.
type goneSet struct {
	mu  sync.Mutex
	ids map[string]bool
}

func (g *goneSet) add(id string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.ids[id] = true
}

func (g *goneSet) len() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.ids)
}

// tailPoll is how often the EC2 test server's log is read for terminates.
const tailPoll = 50 * time.Millisecond

// terminatedSince calls fn with each burst instance a call from index from
// on of the server's terminated (ec2server.Call.Terminated), and returns
// the index to read from next.
func terminatedSince(stack *labstack.Stack, from int, byInstance map[string]int, fn func(id string)) int {
	calls := stack.EC2.Calls()
	for _, c := range calls[min(from, len(calls)):] {
		for _, id := range c.Terminated() {
			if _, ok := byInstance[id]; ok {
				fn(id)
			}
		}
	}
	return len(calls)
}

// countGone adds the burst instances terminated so far to gone, for the
// progress indicator, until stop is closed.
func countGone(stop <-chan struct{}, stack *labstack.Stack, from int, byInstance map[string]int, gone *goneSet) {
	tick := time.NewTicker(tailPoll)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
			from = terminatedSince(stack, from, byInstance, gone.add)
		}
	}
}
