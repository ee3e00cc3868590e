package main

import "testing"

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
