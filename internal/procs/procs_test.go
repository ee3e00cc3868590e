package procs

import (
	"runtime"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestPolicyRaisesOnAQueueAndLowersAfterQuietWindows walks the policy
// through windows' means: it raises at RaiseAt, holds through a window
// between the thresholds (which resets the quiet count), and lowers only
// after QuietWindows quiet windows in a row.
func TestPolicyRaisesOnAQueueAndLowersAfterQuietWindows(t *testing.T) {
	p := Policy{Base: 2, Extra: 2, RaiseAt: 4, LowerBelow: 1, QuietWindows: 5}
	steps := []struct {
		runnable float64
		want     int
	}{
		{0, 2}, {3.9, 2}, // below RaiseAt: stays at Base
		{4, 4},             // raises
		{0.5, 4}, {0.2, 4}, // quiet windows 1, 2
		{1.5, 4},                                 // between the thresholds: not quiet, the count starts again
		{0, 4}, {0, 4}, {0, 4}, {0, 4}, {0.9, 2}, // 5 quiet windows in a row: lowers
		{3, 2}, {10, 4}, {0, 4}, {0, 4}, {0, 4}, {0, 4}, {0, 2},
	}
	procs, quiet := p.Base, 0
	for i, s := range steps {
		procs, quiet = p.Next(procs, s.runnable, quiet)
		if procs != s.want {
			t.Fatalf("window %d (mean %.1f): %d Ps; want %d", i, s.runnable, procs, s.want)
		}
	}
}

// TestPolicyWithoutExtraNeverMoves: a policy with no extra Ps keeps Base
// however long goroutines queue.
func TestPolicyWithoutExtraNeverMoves(t *testing.T) {
	p := DefaultPolicy(2, 0)
	if got, _ := p.Next(2, 100, 0); got != 2 {
		t.Errorf("Next(2, 100, 0) = %d with no extra Ps; want 2", got)
	}
}

// TestControllerFollowsTheRuntimesQueue runs the controller on this test's
// own runtime: goroutines that keep yielding queue on its one base P and
// raise it to two; once they stop, it lowers back to one. Close stops its
// goroutine.
func TestControllerFollowsTheRuntimesQueue(t *testing.T) {
	defer goleak.VerifyNone(t)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	c := Start(Policy{Base: 1, Extra: 1, RaiseAt: 4, LowerBelow: 1, QuietWindows: 2})
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
					runtime.Gosched()
				}
			}
		}()
	}
	raised := waitFor(t, func() bool { return c.Procs() == 2 })
	close(stop)
	wg.Wait()
	if !raised {
		t.Fatalf("16 goroutines queued for 5 s and the controller kept %d Ps; want 2", c.Procs())
	}
	if got := runtime.GOMAXPROCS(0); got != 2 {
		t.Fatalf("the controller says it raised to 2 Ps; the runtime has %d", got)
	}
	if !waitFor(t, func() bool { return c.Procs() == 1 }) {
		t.Fatalf("nothing queued for 5 s and the controller kept %d Ps; want 1", c.Procs())
	}
	extra := c.ExtraTime()
	if extra < WindowSamples*SampleEvery {
		t.Errorf("ExtraTime() = %v after a raise and a lower; want at least the quiet windows' %v", extra, 2*WindowSamples*SampleEvery)
	}
	time.Sleep(2 * SampleEvery)
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
