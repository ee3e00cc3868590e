package main

import (
	"hash/fnv"
	"runtime"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/terroir-db/terroir/internal/latency"
)

// speedProbe samples how fast this guest's CPUs run: the CPU time its own
// thread spends on a fixed piece of work (speedWork), every speedEvery. The
// hypervisor's steal (machineCPU) counts the time a virtual CPU was taken
// away; this catches a CPU that stays but runs slower, its core or caches
// shared with a busy neighbour. In one 21-minute YCSB-A run the process's
// CPU per operation moved between 304 and 479 µs from one minute to
// another with steal steady at 6–7% (issue 17's steady state); the probe
// tells how much of such a swing is the machine's. It costs about 0.5% of
// one core.
type speedProbe struct {
	samples atomic.Pointer[latency.Histogram] // since the last take

	stop, done chan struct{}
}

// speedWork is the probe's fixed work, in bytes: FNV-1a over 4 MiB, a
// buffer of speedBuf bytes four times over (a chain of multiplies, about
// 5.5 ms of CPU on this machine).
const speedWork = 4 << 20

// speedBuf is the size of the buffer speedWork hashes: 1 MiB, which stays
// in the core's caches, so that the probe times the core rather than
// memory.
const speedBuf = 1 << 20

// speedEvery is how often the probe samples: 1 s.
const speedEvery = time.Second

// startSpeedProbe starts sampling on a goroutine of its own, locked to its
// OS thread (the CPU clock is the thread's); close stops it.
func startSpeedProbe() *speedProbe {
	p := &speedProbe{stop: make(chan struct{}), done: make(chan struct{})}
	p.samples.Store(latency.New())
	go p.run()
	return p
}

// run takes a sample every speedEvery until close.
func (p *speedProbe) run() {
	defer close(p.done)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	buf := make([]byte, speedBuf)
	for i := range buf {
		buf[i] = byte(i)
	}
	t := time.NewTicker(speedEvery)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
		if d, ok := timeWork(buf); ok {
			p.samples.Load().Record(d)
		}
	}
}

// timeWork returns the CPU time of the calling thread (which must be
// locked to it) for speedWork bytes of FNV-1a over buf; ok is false when
// the thread's CPU clock cannot be read.
func timeWork(buf []byte) (time.Duration, bool) {
	before, ok := threadCPU()
	if !ok {
		return 0, false
	}
	h := fnv.New64a()
	for range speedWork / len(buf) {
		h.Write(buf)
	}
	after, ok := threadCPU()
	speedSink.Store(h.Sum64())
	if !ok || after <= before {
		return 0, false
	}
	return after - before, true
}

// speedSink keeps the probe's hash live, so that the compiler drops none
// of the work; atomic, as two probes may run at once.
var speedSink atomic.Uint64

// threadCPU reads the calling thread's CPU clock (CLOCK_THREAD_CPUTIME_ID:
// user + system, to the nanosecond; getrusage's per-thread times move in
// scheduler ticks).
func threadCPU() (time.Duration, bool) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0, false
	}
	return time.Duration(ts.Nano()), true
}

// take returns the median CPU time of the samples since the last take
// (to the µs, 3 significant digits: latency.Histogram) and forgets them;
// ok is false when there were none.
func (p *speedProbe) take() (time.Duration, bool) {
	h := p.samples.Swap(latency.New())
	if h.Count() == 0 {
		return 0, false
	}
	return h.Quantile(50), true
}

// close stops the probe and waits for its goroutine.
func (p *speedProbe) close() {
	close(p.stop)
	<-p.done
}
