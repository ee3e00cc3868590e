// Package latency records operation latencies in HDR histograms and formats
// them for benchmarks and the demo. Values are recorded in microseconds, from
// 1 µs to 60 s, with 3 significant digits.
package latency

import (
	"fmt"
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Histogram is a concurrency-safe HDR histogram of durations.
type Histogram struct {
	mu sync.Mutex
	h  *hdrhistogram.Histogram
}

// New returns an empty histogram.
func New() *Histogram {
	return &Histogram{h: hdrhistogram.New(1, int64(60*time.Second/time.Microsecond), 3)}
}

// Record adds one duration (clamped to the histogram's 1 µs–60 s range).
func (h *Histogram) Record(d time.Duration) {
	us := max(int64(d/time.Microsecond), 1)
	h.mu.Lock()
	_ = h.h.RecordValue(min(us, h.h.HighestTrackableValue()))
	h.mu.Unlock()
}

// Merge adds every value of o to h.
func (h *Histogram) Merge(o *Histogram) {
	o.mu.Lock()
	snap := hdrhistogram.Import(o.h.Export())
	o.mu.Unlock()
	h.mu.Lock()
	h.h.Merge(snap)
	h.mu.Unlock()
}

// Since records the time elapsed since start.
func (h *Histogram) Since(start time.Time) { h.Record(time.Since(start)) }

// Count returns how many durations were recorded.
func (h *Histogram) Count() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.h.TotalCount()
}

// Quantile returns the q-th percentile (0–100).
func (h *Histogram) Quantile(q float64) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	return time.Duration(h.h.ValueAtQuantile(q)) * time.Microsecond
}

// Mean returns the mean duration.
func (h *Histogram) Mean() time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	return time.Duration(h.h.Mean() * float64(time.Microsecond))
}

// Summary is "n=… p50=… p99=… mean=…", durations in milliseconds with µs precision.
func (h *Histogram) Summary() string {
	return fmt.Sprintf("n=%d p50=%s p99=%s mean=%s", h.Count(), MS(h.Quantile(50)), MS(h.Quantile(99)), MS(h.Mean()))
}

// MS formats d in milliseconds with three decimals (µs resolution), e.g. "0.214ms".
func MS(d time.Duration) string { return fmt.Sprintf("%.3fms", float64(d)/float64(time.Millisecond)) }

// CDFPoint is one point of a cumulative distribution: Fraction of the
// recorded durations are at most Latency.
type CDFPoint struct {
	Latency  time.Duration
	Fraction float64
}

// CDF returns the empirical cumulative distribution, one point per
// non-empty HDR bucket (3 significant digits), or nil if nothing was recorded.
func (h *Histogram) CDF() []CDFPoint {
	h.mu.Lock()
	defer h.mu.Unlock()
	total := h.h.TotalCount()
	if total == 0 {
		return nil
	}
	var out []CDFPoint
	var seen int64
	for _, b := range h.h.Distribution() {
		if b.Count == 0 {
			continue
		}
		seen += b.Count
		out = append(out, CDFPoint{Latency: time.Duration(b.To) * time.Microsecond, Fraction: float64(seen) / float64(total)})
	}
	return out
}
