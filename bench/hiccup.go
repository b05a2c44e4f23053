package main

import (
	"sync"
	"time"
)

// hiccups measures how late a 5 ms ticker fires in this process: the
// longest pause in which nothing here could run (a busy or descheduled
// machine, a stopped process, a long GC pause). Phases that saw a long
// one are flagged in the notes, so that a machine-wide pause is not read
// as a property of a strategy.
type hiccups struct {
	mu   sync.Mutex
	max  time.Duration
	stop chan struct{}
	done chan struct{}
}

const hiccupTick = 5 * time.Millisecond

func startHiccups() *hiccups {
	h := &hiccups{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(h.done)
		t := time.NewTicker(hiccupTick)
		defer t.Stop()
		last := time.Now()
		for {
			select {
			case <-h.stop:
				return
			case <-t.C:
				now := time.Now()
				gap := now.Sub(last) - hiccupTick
				last = now
				h.mu.Lock()
				h.max = max(h.max, gap)
				h.mu.Unlock()
			}
		}
	}()
	return h
}

// take returns the longest pause since the last take.
func (h *hiccups) take() time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.max
	h.max = 0
	return m
}

func (h *hiccups) close() {
	close(h.stop)
	<-h.done
}
