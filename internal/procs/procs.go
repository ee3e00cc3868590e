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
// against 17.9–18.1% with 2 (3 alternating pairs of `bench idle`); and
// with more Ps than CPUs the operating system time-slices the threads, so
// a lone client's chain of hand-offs (its request, the leader's handler,
// the Raft append, the reply) waits for a CPU at each step: one client's
// interactive write took 0.72–0.74 ms P50 with 4 Ps and 0.57–0.60 ms with
// 2 on 2 CPUs.
//
// So a Controller keeps the runtime's default (base) while goroutines wait
// little for a P, and adds extra Ps while they wait long: at the end of
// each Window it reads how long runnable goroutines waited before they ran
// (the runtime's /sched/latencies histogram, over the window) and moves by
// the window's mean wait (see Policy): it raises as soon as one window's
// mean reaches a threshold, and lowers once a second of windows stayed
// below a lower one, or every few seconds for one window to see whether
// the default is enough (a probe). The mean wait, not the count of
// runnable goroutines: a lone client's hand-offs keep one or two
// goroutines runnable at most instants, each for 2–5 µs, as many as 16
// clients' queue on a node of three processes; under 16 clients on one
// process they waited 52–122 µs with 2 Ps and 21–25 µs with 4.
package procs

import (
	"log/slog"
	"math"
	"runtime"
	"runtime/metrics"
	"sync"
	"time"
)

// Window is how often a Controller reads the runtime's scheduling waits
// and decides: 200 ms.
const Window = 200 * time.Millisecond

// latencyMetric is the runtime's histogram of the time goroutines spent
// runnable before they ran (Go 1.26; it samples one scheduling in eight).
const latencyMetric = "/sched/latencies:seconds"

// Policy decides, at the end of each window, how many Ps the runtime should
// have. It raises from Base to Base+Extra once a window of at least
// MinWaits waits had a mean wait of RaiseAt or more, and lowers back to
// Base once QuietWindows windows in a row each had a mean below LowerBelow
// (or too few waits to raise), or, to probe, once it has run ProbeAfter
// windows above Base: whether Base is enough is known only by running it,
// since the waits with the extra Ps do not tell a load that needs them
// from one that the extra Ps themselves slow down. A probe that finds the
// waits long with Base raises again at the end of its window. The gap
// between the two thresholds keeps it from swinging: with twice the Ps, a
// load whose goroutines waited RaiseAt waits about half as long.
type Policy struct {
	Base, Extra  int           // Ps: the runtime's default, and how many it may add (≥ 0)
	RaiseAt      time.Duration // a window's mean wait that raises to Base+Extra
	LowerBelow   time.Duration // a window's mean wait that counts as quiet
	MinWaits     uint64        // waits (as the runtime samples them) a window needs to raise
	QuietWindows int           // windows: how many quiet ones in a row lower to Base
	ProbeAfter   int           // windows: how many in a row above Base lower to Base for one (0: never)
}

// DefaultPolicy is the policy for a runtime whose default is base Ps, with
// extra more when busy: raise at a mean wait of 30 µs over at least 200
// sampled waits (1 000 a second), lower after 1 s (5 windows) below 6 µs,
// and probe Base after 5 s (25 windows) above it.
// On 2 CPUs under 16 clients, one process of three nodes waited 52–122 µs
// with 2 Ps (3 000–3 600 waits a window) and 21–25 µs with 4; a node of
// three `terroir start` processes 24–48 µs with 2 as the load began (it
// raised at 34–48 µs over 390–790 waits) and mostly 13–24 µs with 4 over
// 430–690, with single windows down to 3–8 µs (so the lower mark is 6 µs,
// not 10: five such windows in a row would drop a loaded node to 2 Ps).
// One client's writes waited 2–7 µs with 2 Ps, but 6–9 µs (over about
// 2 000 waits a window) with the 4 a load before it had raised: above the
// lower mark, so without the probe a lone client kept 4 Ps and its
// writes took 0.71–0.73 ms P50 against 0.64–0.66 with 2. An idle process
// of 9 nodes waited 7–23 µs with 4 over 220–300 waits a window, and kept
// 4 until the probe; after one, its waits with 2 sometimes reach 30 µs
// (many groups' timers fire together), so it runs 4 for 56–84% of the
// time, not all of it.
func DefaultPolicy(base, extra int) Policy {
	return Policy{Base: base, Extra: extra, RaiseAt: 30 * time.Microsecond, LowerBelow: 6 * time.Microsecond,
		MinWaits: 200, QuietWindows: 5, ProbeAfter: 25}
}

// State is what a Policy carries from one window's decision to the next.
type State struct {
	Quiet int // windows in a row above Base whose mean wait was quiet
	Above int // windows in a row above Base
}

// Next returns the Ps after a window whose goroutines waited wait on
// average over waits sampled waits, given the Ps now and the state the
// decision before it returned, with the state to carry into the next.
func (p Policy) Next(now int, wait time.Duration, waits uint64, s State) (int, State) {
	if waits < p.MinWaits {
		wait = 0 // too few to tell: quiet
	}
	if now <= p.Base {
		if p.Extra > 0 && wait >= p.RaiseAt {
			return p.Base + p.Extra, State{}
		}
		return p.Base, State{}
	}
	above := s.Above + 1
	switch {
	case p.ProbeAfter > 0 && above >= p.ProbeAfter:
		return p.Base, State{} // a probe: the next window says whether Base is enough
	case wait >= p.LowerBelow:
		return now, State{Above: above}
	case s.Quiet+1 >= p.QuietWindows:
		return p.Base, State{}
	}
	return now, State{Quiet: s.Quiet + 1, Above: above}
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
// them as p says, deciding every Window. Where the runtime does not report
// its scheduling waits it sets p.Base+p.Extra and moves nothing.
func Start(p Policy) *Controller {
	c := &Controller{policy: p, done: make(chan struct{})}
	sample := []metrics.Sample{{Name: latencyMetric}}
	metrics.Read(sample)
	if sample[0].Value.Kind() != metrics.KindFloat64Histogram {
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

// run reads the scheduling waits every Window and applies the policy to
// the window's.
func (c *Controller) run(sample []metrics.Sample) {
	defer c.wg.Done()
	tick := time.NewTicker(Window)
	defer tick.Stop()
	prev := append([]uint64(nil), sample[0].Value.Float64Histogram().Counts...)
	var state State
	for {
		select {
		case <-c.done:
			return
		case <-tick.C:
		}
		metrics.Read(sample)
		h := sample[0].Value.Float64Histogram()
		wait, waits := meanSince(h, prev)
		prev = append(prev[:0], h.Counts...)
		now := c.Procs()
		var next int
		next, state = c.policy.Next(now, wait, waits, state)
		if next == now {
			continue
		}
		c.set(next)
		slog.Debug("procs: moved the Go runtime's processors", "from", now, "to", next, "mean_wait", wait, "waits", waits)
	}
}

// meanSince returns the mean and the count of the waits h holds beyond
// prev (h's counts at an earlier read), each wait taken at its bucket's
// middle (at a bound, for the bucket that is open on that side).
func meanSince(h *metrics.Float64Histogram, prev []uint64) (time.Duration, uint64) {
	counts, n := CountsSince(h, prev)
	if n == 0 {
		return 0, 0
	}
	var sum float64
	for i, d := range counts {
		if d == 0 {
			continue
		}
		lo, hi := h.Buckets[i], h.Buckets[i+1]
		mid := (lo + hi) / 2
		switch {
		case math.IsInf(lo, -1):
			mid = max(hi, 0)
		case math.IsInf(hi, 1):
			mid = lo
		}
		sum += float64(d) * mid
	}
	return time.Duration(sum / float64(n) * float64(time.Second)), n
}

// CountsSince returns, for each bucket of h (a cumulative runtime/metrics
// histogram, such as /sched/latencies:seconds), how many values it gained
// since prev, h's counts at an earlier read (nil: since the start), and
// their total.
func CountsSince(h *metrics.Float64Histogram, prev []uint64) (counts []uint64, total uint64) {
	counts = make([]uint64, len(h.Counts))
	for i, c := range h.Counts {
		if i < len(prev) {
			c -= prev[i]
		}
		counts[i] = c
		total += c
	}
	return counts, total
}
