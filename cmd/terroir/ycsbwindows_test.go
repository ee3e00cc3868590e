package main

import (
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/terroir-db/terroir/internal/latency"
)

// TestSteadyMeansComparesFiveWindowsAtEachEnd: the steady-state means
// skip the warm-up window, average five windows at each end, and need the
// two spans not to overlap.
func TestSteadyMeansComparesFiveWindowsAtEachEnd(t *testing.T) {
	for _, tc := range []struct {
		name        string
		rates       []float64
		first, last float64
		ok          bool
	}{
		{"too short for two spans", []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 0, 0, false},
		{"just long enough", []float64{100, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100}, 30, 80, true},
		{"the warm-up and the middle do not count", []float64{1e6, 3000, 3000, 3000, 3000, 3000, 1, 1, 2500, 2500, 2500, 2500, 2500}, 3000, 2500, true},
		{"nothing in the first span", []float64{5, 0, 0, 0, 0, 0, 9, 9, 9, 9, 9}, 0, 9, false},
	} {
		first, last, ok := steadyMeans(tc.rates)
		if ok != tc.ok || (ok && (first != tc.first || last != tc.last)) {
			t.Errorf("%s: steadyMeans = %v, %v, %v; want %v, %v, %v", tc.name, first, last, ok, tc.first, tc.last, tc.ok)
		}
	}
}

// TestAtCPUSpeedScalesByTheProbesWork: a window with a third less
// throughput whose CPUs took a third more CPU time for the probe's work
// did as much at their speed (3000 × 6.667 / (4000 × 5) = 1.00); steal
// still counts; a window without a reading of either claims nothing.
func TestAtCPUSpeedScalesByTheProbesWork(t *testing.T) {
	ms := func(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }
	got := atCPUSpeed([]float64{4000, 3000}, []float64{0, 0}, []time.Duration{ms(5), ms(20.0 / 3)}, 1, 0, 1)
	if !strings.Contains(got, "6.67 ms of CPU against 5.00") || !strings.Contains(got, "1.00×") {
		t.Errorf("atCPUSpeed = %q, want 6.67 against 5.00 and 1.00×", got)
	}
	got = atCPUSpeed([]float64{4000, 4000, 2000, 2000}, []float64{0, 0, 0.5, 0.5}, []time.Duration{ms(5), ms(5), ms(5), ms(5)}, 2, 0, 2)
	if !strings.Contains(got, "1.00×") {
		t.Errorf("half the CPU gone and half the rate at the same speed: %q, want 1.00×", got)
	}
	got = atCPUSpeed([]float64{4000, 3000}, []float64{0, 0}, []time.Duration{ms(5), ms(5)}, 1, 0, 1)
	if !strings.Contains(got, "0.75×") {
		t.Errorf("a quarter less at the same speed: %q, want 0.75×", got)
	}
	if got := atCPUSpeed([]float64{1, 1}, []float64{0, 0}, []time.Duration{ms(5), 0}, 1, 0, 1); got != "" {
		t.Errorf("a window without a speed: %q, want nothing", got)
	}
	if got := atCPUSpeed([]float64{1, 1}, []float64{-1, 0}, []time.Duration{ms(5), ms(5)}, 1, 0, 1); got != "" {
		t.Errorf("a window without a share: %q, want nothing", got)
	}
}

// TestSpeedProbeTimesItsWork: the probe's work takes CPU time, take
// returns the median sample once, and close stops the probe.
func TestSpeedProbeTimesItsWork(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	buf := make([]byte, speedBuf)
	one, ok := timeWork(buf)
	if !ok || one <= 0 {
		t.Fatalf("timeWork = %v, %v; want a CPU time", one, ok)
	}
	p := &speedProbe{}
	p.samples.Store(latency.New())
	for _, d := range []time.Duration{9, 1, 5} {
		p.samples.Load().Record(d * time.Millisecond)
	}
	if m, ok := p.take(); !ok || m.Round(time.Millisecond) != 5*time.Millisecond {
		t.Errorf("take = %v, %v; want the median 5 ms", m, ok)
	}
	if m, ok := p.take(); ok {
		t.Errorf("take again = %v; want no samples", m)
	}
	q := startSpeedProbe()
	q.close() // returns: the goroutine stopped
}
