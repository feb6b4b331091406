package replay

import (
	"fmt"
	"io"
	"time"
)

// Progress writes a one-line progress indicator of a demo to w (nil: none):
// each call rewrites the line, and the last one, at done == total, ends it.
type Progress struct {
	w     io.Writer
	name  string
	total int
}

// NewProgress returns the indicator of a demo name of total steps.
func NewProgress(w io.Writer, name string, total int) *Progress {
	return &Progress{w: w, name: name, total: total}
}

// Step shows done steps of the total, and what is happening now.
func (p *Progress) Step(done int, what string) {
	if p == nil || p.w == nil {
		return
	}
	fmt.Fprintf(p.w, "\r\033[K%s: %d/%d %s", p.name, done, p.total, what)
	if done == p.total {
		fmt.Fprintln(p.w)
	}
}

// Follow shows what state says on the indicator four times a second, until
// the returned stop is called, which shows the last step: the indicator
// ends there, however many steps state says are done.
func (p *Progress) Follow(state func() (done int, what string)) (stop func()) {
	quit, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-quit:
				return
			case <-tick.C:
				done, what := state()
				p.Step(min(done, p.total-1), what)
			}
		}
	}()
	return func() {
		close(quit)
		<-exited
		_, what := state()
		p.Step(p.total, what)
	}
}
