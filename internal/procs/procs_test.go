package procs

import (
	"math"
	"runtime"
	"runtime/metrics"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestPolicyRaisesOnLongWaitsAndLowersAfterQuietWindows walks the policy
// through windows' mean waits: it raises at RaiseAt, holds through a
// window between the thresholds (which resets the quiet count), lowers
// only after QuietWindows quiet windows in a row, and takes a window of
// fewer than MinWaits waits as quiet, however long they were.
func TestPolicyRaisesOnLongWaitsAndLowersAfterQuietWindows(t *testing.T) {
	const us = time.Microsecond
	p := Policy{Base: 2, Extra: 2, RaiseAt: 30 * us, LowerBelow: 10 * us, MinWaits: 100, QuietWindows: 5}
	steps := []step{
		{0, 0, 2}, {29 * us, 500, 2}, // below RaiseAt: stays at Base
		{1000 * us, 99, 2},                 // too few waits to raise
		{30 * us, 100, 4},                  // raises
		{5 * us, 500, 4}, {2 * us, 500, 4}, // quiet windows 1, 2
		{15 * us, 500, 4},                                                           // between the thresholds: not quiet, the count starts again
		{0, 0, 4}, {0, 0, 4}, {9 * us, 500, 4}, {500 * us, 50, 4}, {9 * us, 500, 2}, // 5 quiet windows in a row (one of too few waits): lowers
		{20 * us, 500, 2}, {100 * us, 500, 4}, {0, 0, 4}, {0, 0, 4}, {0, 0, 4}, {0, 0, 4}, {0, 0, 2},
	}
	walk(t, p, steps)
}

// step is one window of a walk: its mean wait and waits, and the Ps the
// policy should choose after it.
type step struct {
	wait  time.Duration
	waits uint64
	want  int
}

// walk feeds p the windows of steps in turn, from Base, and fails at the
// first whose Ps differ from its want.
func walk(t *testing.T, p Policy, steps []step) {
	t.Helper()
	procs, state := p.Base, State{}
	for i, s := range steps {
		procs, state = p.Next(procs, s.wait, s.waits, state)
		if procs != s.want {
			t.Fatalf("window %d (mean wait %v over %d waits): %d Ps; want %d", i, s.wait, s.waits, procs, s.want)
		}
	}
}

// TestPolicyProbesBaseAfterProbeAfterWindows: above Base, a policy with
// ProbeAfter lowers to Base after that many windows in a row, however
// long the waits were (a lone client's 6–9 µs, between the thresholds,
// kept the extra Ps forever without it); the probe's window raises again
// if its waits reach RaiseAt, and the count starts again from the raise.
// Lowering for quiet windows resets the count too.
func TestPolicyProbesBaseAfterProbeAfterWindows(t *testing.T) {
	const us = time.Microsecond
	p := Policy{Base: 2, Extra: 2, RaiseAt: 30 * us, LowerBelow: 6 * us, MinWaits: 100, QuietWindows: 3, ProbeAfter: 4}
	walk(t, p, []step{
		{40 * us, 500, 4},                                       // raises
		{8 * us, 2000, 4}, {9 * us, 2000, 4}, {7 * us, 2000, 4}, // between the thresholds: held
		{8 * us, 2000, 2},                    // the fourth window above Base: a probe
		{5 * us, 2000, 2}, {4 * us, 2000, 2}, // Base is enough: it stays
		{60 * us, 3000, 4}, // a load: raises
		{25 * us, 3000, 4}, {22 * us, 3000, 4}, {20 * us, 3000, 4},
		{21 * us, 3000, 2},                                                          // a probe under the load
		{70 * us, 3000, 4},                                                          // Base is not enough: back up at once
		{1 * us, 3000, 4}, {1 * us, 3000, 4}, {24 * us, 3000, 4}, {8 * us, 3000, 2}, // counted from the raise: the fourth probes
		{40 * us, 500, 4}, {1 * us, 500, 4}, {1 * us, 500, 4}, {1 * us, 500, 2}, // three quiet windows lower first
		{40 * us, 500, 4}, {9 * us, 500, 4}, {9 * us, 500, 4}, {9 * us, 500, 4}, {9 * us, 500, 2}, // and the count started again after it
	})
}

// TestPolicyWithoutExtraNeverMoves: a policy with no extra Ps keeps Base
// however long goroutines wait.
func TestPolicyWithoutExtraNeverMoves(t *testing.T) {
	p := DefaultPolicy(2, 0)
	if got, _ := p.Next(2, time.Second, 1e6, State{}); got != 2 {
		t.Errorf("Next(2, 1 s, 1e6 waits, State{}) = %d with no extra Ps; want 2", got)
	}
}

// TestMeanSinceTakesTheNewWaitsOnly: the mean of a histogram's waits since
// an earlier read counts only the waits added since, each at its bucket's
// middle, and the open-ended buckets at their finite bound.
func TestMeanSinceTakesTheNewWaitsOnly(t *testing.T) {
	h := &metrics.Float64Histogram{
		Buckets: []float64{math.Inf(-1), 0, 10e-6, 30e-6, math.Inf(1)},
		Counts:  []uint64{0, 7, 3, 1},
	}
	prev := []uint64{0, 5, 3, 0}
	// New: 2 waits in [0, 10 µs) at 5 µs, 1 in [30 µs, ∞) at 30 µs.
	mean, n := meanSince(h, prev)
	if n != 3 || mean != 40*time.Microsecond/3 {
		t.Errorf("meanSince = %v over %d waits; want %v over 3", mean, n, 40*time.Microsecond/3)
	}
	if mean, n := meanSince(h, h.Counts); n != 0 || mean != 0 {
		t.Errorf("meanSince with nothing new = %v over %d; want 0 over 0", mean, n)
	}
}

// TestControllerFollowsTheRuntimesWaits runs the controller on this
// test's own runtime: 16 goroutines that each work 50 µs between yields
// wait about 750 µs for its one base P and raise it to two; once they
// stop, it lowers back to one. Close stops its goroutine.
func TestControllerFollowsTheRuntimesWaits(t *testing.T) {
	defer goleak.VerifyNone(t)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	c := Start(Policy{Base: 1, Extra: 1, RaiseAt: 200 * time.Microsecond, LowerBelow: 50 * time.Microsecond, MinWaits: 10, QuietWindows: 2})
	defer c.Close()
	if got := runtime.GOMAXPROCS(0); got != 1 {
		t.Fatalf("after Start: GOMAXPROCS %d; want the base, 1", got)
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
					for began := time.Now(); time.Since(began) < 50*time.Microsecond; {
					}
					runtime.Gosched()
				}
			}
		}()
	}
	raised := waitFor(t, func() bool { return c.Procs() == 2 })
	close(stop)
	wg.Wait()
	if !raised {
		t.Fatalf("16 goroutines waited for a P for 5 s and the controller kept %d Ps; want 2", c.Procs())
	}
	if got := runtime.GOMAXPROCS(0); got != 2 {
		t.Fatalf("the controller says it raised to 2 Ps; the runtime has %d", got)
	}
	if !waitFor(t, func() bool { return c.Procs() == 1 }) {
		t.Fatalf("nothing waited for 5 s and the controller kept %d Ps; want 1", c.Procs())
	}
	extra := c.ExtraTime()
	// It lowers two quiet windows after a raise, give or take the
	// ticker's jitter (394 ms was seen for two 200-ms windows): at least
	// one window is sure.
	if extra < Window {
		t.Errorf("ExtraTime() = %v after a raise and a lower; want at least a window's %v", extra, Window)
	}
	time.Sleep(Window / 10)
	if again := c.ExtraTime(); again != extra {
		t.Errorf("ExtraTime() grew from %v to %v at the base", extra, again)
	}
	if r, l := c.Moves(); r < 1 || l < 1 {
		t.Errorf("Moves() = %d raises, %d lowers; want at least one of each", r, l)
	}
	c.Close()
	c.Close() // a second Close returns at once
}

// waitFor polls cond every 10 ms for up to 5 s.
func waitFor(t *testing.T, cond func() bool) bool {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return false
}
