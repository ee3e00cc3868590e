package main

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// delayedProfile is a CPU profile or an execution trace written to f from
// after a delay until stop (an empty file if the run ended first).
type delayedProfile struct {
	f       *os.File
	end     func()
	timer   *time.Timer
	mu      sync.Mutex
	started bool
	stopped bool
}

// startProfileAfter calls begin(f) after d (at once for d ≤ 0); stop then
// calls end: pprof.StartCPUProfile and StopCPUProfile, or trace.Start and
// Stop.
func startProfileAfter(f *os.File, d time.Duration, begin func(io.Writer) error, end func()) *delayedProfile {
	p := &delayedProfile{f: f, end: end}
	p.timer = time.AfterFunc(max(d, 0), func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.stopped {
			return
		}
		if err := begin(f); err != nil {
			fmt.Fprintf(os.Stderr, "bench: the profile for %s did not start: %v\n", f.Name(), err)
			return
		}
		p.started = true
	})
	return p
}

// stop ends the profile (or keeps it from starting) and closes its file.
func (p *delayedProfile) stop() {
	p.timer.Stop()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopped = true
	if p.started {
		p.end()
	}
	_ = p.f.Close()
}
