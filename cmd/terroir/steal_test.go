package main

import (
	"math"
	"strings"
	"testing"
)

// TestParseMachineCPU: the aggregate line's first eight times sum to the
// total (guest times, already in user and nice, are not added again) and
// the eighth is steal; a file whose first line is not it, or that stops
// before steal, or holds a non-number, is refused with the reason.
func TestParseMachineCPU(t *testing.T) {
	for _, tc := range []struct {
		name, data   string
		total, steal uint64
		err          string
	}{
		{"a kernel's line with guest times", "cpu  100 5 50 800 20 0 10 15 7 0\ncpu0 50 2 25 400 10 0 5 8 3 0\n", 1000, 15, ""},
		{"through steal only", "cpu 1 2 3 4 5 6 7 8\n", 36, 8, ""},
		{"a per-CPU line first", "cpu0 1 2 3 4 5 6 7 8\n", 0, 0, "not the aggregate cpu line"},
		{"no steal", "cpu 1 2 3 4 5 6 7\n", 0, 0, "has 7 times"},
		{"not a number", "cpu 1 2 x 4 5 6 7 8\n", 0, 0, `cpu time "x"`},
		{"empty", "", 0, 0, "not the aggregate cpu line"},
	} {
		m, err := parseMachineCPU([]byte(tc.data))
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: err = %v, want one containing %q", tc.name, err, tc.err)
		case tc.err == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.err == "" && (m.total != tc.total || m.steal != tc.steal):
			t.Errorf("%s: total %d steal %d, want %d and %d", tc.name, m.total, m.steal, tc.total, tc.steal)
		}
	}
}

// TestStolenSinceIsTheShareBetweenTwoReadings: the share is the steal
// between the readings over all the time between them, and there is none
// without an earlier reading or with no time between.
func TestStolenSinceIsTheShareBetweenTwoReadings(t *testing.T) {
	prev, now := machineCPU{total: 1000, steal: 100}, machineCPU{total: 3000, steal: 700}
	if share, ok := now.stolenSince(prev); !ok || share != 0.3 {
		t.Errorf("share = %v, %v; want 0.3 (600 of 2000 ticks)", share, ok)
	}
	if _, ok := now.stolenSince(machineCPU{}); ok {
		t.Error("a share from no earlier reading")
	}
	if _, ok := prev.stolenSince(prev); ok {
		t.Error("a share over no time")
	}
}

// TestPerCPULeftComparesThroughputPerGuestCPU: a window that ran at
// 0.8× the other's rate while the hypervisor took 36% of the CPU time
// against 20% did as much per CPU left (0.8 × 0.8 / 0.64 = 1.0); with no
// reading for a window nothing is claimed.
func TestPerCPULeftComparesThroughputPerGuestCPU(t *testing.T) {
	got := perCPULeft([]float64{4000, 3200}, []float64{0.2, 0.36}, 1, 0, 1)
	if !strings.Contains(got, "36% of the CPU time against 20%") || !strings.Contains(got, "1.00×") {
		t.Errorf("perCPULeft = %q, want 36%% against 20%% and 1.00×", got)
	}
	got = perCPULeft([]float64{4000, 4000, 4000, 4000}, []float64{0, 0, 0.5, 0.5}, 2, 0, 2)
	if !strings.Contains(got, "2.00×") {
		t.Errorf("half the CPU gone at the same rate: %q, want 2.00×", got)
	}
	if got := perCPULeft([]float64{1, 1}, []float64{0, -1}, 1, 0, 1); got != "" {
		t.Errorf("a window without a reading: %q, want nothing", got)
	}
	if r := 0.8 * 0.8 / 0.64; math.Abs(r-1) > 1e-9 {
		t.Fatalf("the arithmetic in this test's comment is wrong: %v", r)
	}
}
