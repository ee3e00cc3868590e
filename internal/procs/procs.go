// Package procs sizes the Go runtime's processors (Ps, GOMAXPROCS) to the
// load of the process it runs in (issue 17).
//
// A P whose goroutine is in a blocking system call (Pebble's WAL writer in
// fdatasync, 0.2–0.5 ms on a small machine, and its flushes' and
// compactions' file writes) serves other goroutines again only when the
// runtime's monitor takes it back (golang/go#18236). On 2 CPUs, under 16
// clients, two such calls held every runnable goroutine: a commit's epoch
// read took 2.4–3.0 ms with 2 Ps and 0.56–0.70 ms with 4. But the extra Ps
// cost a process that is not that busy: the runtime wakes a thread to look
// for work each time a goroutine becomes runnable while a P is idle, and an
// idle three-region cluster of 9 nodes used 20.4–23.4% of a core with 4 Ps
// against 17.9–18.1% with 2 (3 alternating pairs of `bench idle`).
//
// So a Controller keeps the runtime's default (base) while goroutines seldom
// wait for a P, and adds extra Ps while they queue: it samples the count of
// runnable goroutines (runtime/metrics) every SampleEvery, and at the end
// of each window of WindowSamples samples moves by the window's mean (see
// Policy): it raises as soon as one window's mean reaches a threshold,
// and lowers once a second of windows stayed below a lower one.
package procs

import (
	"log/slog"
	"runtime"
	"runtime/metrics"
	"sync"
	"time"
)

// SampleEvery is how often a Controller reads the count of runnable
// goroutines: 10 ms.
const SampleEvery = 10 * time.Millisecond

// WindowSamples is how many samples a Controller averages before it
// decides: 20, a window of 200 ms.
const WindowSamples = 20

// runnableMetric is the runtime's count of goroutines ready to run but not
// running (an approximate gauge; Go 1.26).
const runnableMetric = "/sched/goroutines/runnable:goroutines"

// Policy decides, at the end of each window, how many Ps the runtime should
// have. It raises from Base to Base+Extra once a window's mean count of
// runnable goroutines reaches RaiseAt, and lowers back to Base once
// QuietWindows windows in a row each had a mean below LowerBelow. The gap
// between the two keeps it from swinging: with twice the Ps, a load that
// queued RaiseAt goroutines queues about half as many.
type Policy struct {
	Base, Extra  int     // Ps: the runtime's default, and how many it may add (≥ 0)
	RaiseAt      float64 // goroutines: a window's mean that raises to Base+Extra
	LowerBelow   float64 // goroutines: a window's mean that counts as quiet
	QuietWindows int     // windows: how many quiet ones in a row lower to Base
}

// DefaultPolicy is the policy for a runtime whose default is base Ps, with
// extra more when busy: raise at a mean of base/2 runnable goroutines (1 on
// 2 CPUs), lower after 1 s (5 windows) below base/4 (0.5). On 2 CPUs with 2
// Ps a node serving its share of 16 clients as one of three `terroir start`
// processes queued 0.65–2.3 goroutines, and gained from 4 Ps (throughput
// against etcd 0.83–1.00× of always-4 while a threshold of 4 kept it at 2).
// An idle cluster of 9 nodes in one process queues about as much: it ran
// the extra Ps 10%, 96% and 83% of the time in three runs of `bench idle`.
func DefaultPolicy(base, extra int) Policy {
	return Policy{Base: base, Extra: extra, RaiseAt: float64(base) / 2, LowerBelow: float64(base) / 4, QuietWindows: 5}
}

// Next returns the Ps after a window whose mean count of runnable goroutines
// was runnable, given the Ps now and how many windows in a row before it
// were quiet, with the quiet windows to carry into the next decision.
func (p Policy) Next(now int, runnable float64, quiet int) (procs, quietAfter int) {
	if now <= p.Base {
		if p.Extra > 0 && runnable >= p.RaiseAt {
			return p.Base + p.Extra, 0
		}
		return p.Base, 0
	}
	if runnable >= p.LowerBelow {
		return now, 0
	}
	if quiet+1 >= p.QuietWindows {
		return p.Base, 0
	}
	return now, quiet + 1
}

// Controller moves the runtime's Ps as its Policy says until Close. It owns
// GOMAXPROCS while it runs: a process that runs one sets it through no one
// else.
type Controller struct {
	policy Policy
	done   chan struct{}
	wg     sync.WaitGroup
	once   sync.Once

	mu             sync.Mutex
	procs          int           // under mu: the Ps it last set (Base until it raises)
	raises, lowers uint64        // under mu: how often it raised to Base+Extra and lowered back
	raisedAt       time.Time     // under mu: when it last raised, while it runs above Base (zero: at Base)
	extra          time.Duration // under mu: the time it spent above Base before that
}

// Start sets the runtime to p.Base Ps and starts a Controller that moves
// them as p says, sampling every SampleEvery. Where the runtime does not
// report runnable goroutines it sets p.Base+p.Extra and moves nothing.
func Start(p Policy) *Controller {
	c := &Controller{policy: p, done: make(chan struct{})}
	sample := []metrics.Sample{{Name: runnableMetric}}
	metrics.Read(sample)
	if sample[0].Value.Kind() != metrics.KindUint64 {
		c.set(p.Base + p.Extra)
		return c
	}
	c.set(p.Base)
	c.wg.Add(1)
	go c.run(sample)
	return c
}

// Procs returns the Ps the controller last set.
func (c *Controller) Procs() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.procs
}

// Moves returns how many times the controller raised the Ps to
// Base+Extra, and lowered them back to Base.
func (c *Controller) Moves() (raises, lowers uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.raises, c.lowers
}

// ExtraTime returns how long the controller has run the runtime above
// Base, the current stretch included.
func (c *Controller) ExtraTime() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.raisedAt.IsZero() {
		return c.extra
	}
	return c.extra + time.Since(c.raisedAt)
}

// Close stops the controller and waits for its goroutine; the Ps stay as
// they were last set. It is safe to call more than once.
func (c *Controller) Close() {
	c.once.Do(func() { close(c.done) })
	c.wg.Wait()
}

// set sets the runtime's Ps to n and keeps the account of the time spent
// above Base.
func (c *Controller) set(n int) {
	runtime.GOMAXPROCS(n)
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case n > c.policy.Base && c.raisedAt.IsZero():
		c.raisedAt = time.Now()
		c.raises++
	case n <= c.policy.Base && !c.raisedAt.IsZero():
		c.extra += time.Since(c.raisedAt)
		c.raisedAt = time.Time{}
		c.lowers++
	}
	c.procs = n
}

// run samples the runnable goroutines every SampleEvery and applies the
// policy at the end of each window.
func (c *Controller) run(sample []metrics.Sample) {
	defer c.wg.Done()
	tick := time.NewTicker(SampleEvery)
	defer tick.Stop()
	var sum uint64
	var n, quiet int
	for {
		select {
		case <-c.done:
			return
		case <-tick.C:
		}
		metrics.Read(sample)
		sum += sample[0].Value.Uint64()
		if n++; n < WindowSamples {
			continue
		}
		now := c.Procs()
		mean := float64(sum) / float64(n)
		next, q := c.policy.Next(now, mean, quiet)
		sum, n, quiet = 0, 0, q
		if next == now {
			continue
		}
		c.set(next)
		slog.Debug("procs: moved the Go runtime's processors", "from", now, "to", next, "runnable_mean", mean)
	}
}
