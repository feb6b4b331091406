package main

import (
	"fmt"
	"io"
	"time"
)

// heartbeatEvery is how often a long step says it is still going.
const heartbeatEvery = 30 * time.Second

// heartbeat writes to w, every heartbeatEvery until stop is called, that
// what is still going and for how long: a first build of the functions
// takes minutes on empty caches and must not look like a hang.
func heartbeat(w io.Writer, what string) (stop func()) {
	return heartbeatEach(w, what, heartbeatEvery)
}

func heartbeatEach(w io.Writer, what string, every time.Duration) (stop func()) {
	start := time.Now()
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				fmt.Fprintf(w, "still %s: %s\n", what, time.Since(start).Round(time.Second))
			}
		}
	}()
	return func() {
		close(done)
		<-finished
	}
}
