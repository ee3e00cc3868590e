package main

import (
	"fmt"
	"sync"
	"time"

	"github.com/terroir-db/terroir/internal/latency"
	"github.com/terroir-db/terroir/internal/ycsb"
)

// windows reports a long run window by window (issue 17's steady state):
// every `every`, the window's throughput (operations per second) and the
// P50/P99 of every operation it completed; at the end, the last window's
// throughput against the second's (the first includes the warm-up), and
// the last five windows' mean against windows 2–6's (steadyMeans).
// With cost (the embedded cluster's), each window also prints what an
// operation of it cost: CPU, RPCs (more when a split or a lease transfer
// puts a range's leader on another node than the client's) and disk
// writes, which tell why a window is slower than another. Each window
// also prints two readings of the machine itself, which on a shared
// machine swing from minute to minute: the share of its CPU time the
// hypervisor took (machineCPU), and the CPU time a fixed piece of work
// took (speedProbe: how fast the CPUs left to it ran). The summary also
// compares the throughput per CPU left to this guest (perCPULeft), and
// per CPU left at that speed (atCPUSpeed).
type windows struct {
	name  string
	every time.Duration
	cost  func() runCost // nil: not printed

	mu    sync.Mutex
	cur   *latency.Histogram
	rates []float64 // operations per second, per window
	// stolen is the share (0–1) of the machine's CPU time the hypervisor
	// took in each window; -1 where /proc/stat gave no reading.
	stolen []float64
	// work is the median CPU time speedProbe's fixed work took in each
	// window; 0 where it took no sample.
	work []time.Duration
}

func newWindows(name string, every time.Duration, cost func() runCost) *windows {
	return &windows{name: name, every: every, cost: cost, cur: latency.New()}
}

// observe is ycsb.Config.Observe: it counts one completed operation.
func (w *windows) observe(_ ycsb.Op, d time.Duration) {
	w.mu.Lock()
	w.cur.Record(d)
	w.mu.Unlock()
}

// run prints a line every window until done is closed, then the summary.
func (w *windows) run(done <-chan struct{}) {
	t := time.NewTicker(w.every)
	defer t.Stop()
	last := time.Now()
	var lastCost runCost
	if w.cost != nil {
		lastCost = w.cost()
	}
	lastCPU, _ := readMachineCPU() // no reading: no share printed
	speed := startSpeedProbe()
	defer speed.close()
	for {
		select {
		case <-done:
			w.summary()
			return
		case now := <-t.C:
			w.mu.Lock()
			h := w.cur
			w.cur = latency.New()
			w.mu.Unlock()
			rate := float64(h.Count()) / now.Sub(last).Seconds()
			last = now
			w.rates = append(w.rates, rate)
			line := fmt.Sprintf("  %s window %d (%v): %.0f ops/s, P50 %s, P99 %s", w.name, len(w.rates), w.every,
				rate, latency.MS(h.Quantile(50)), latency.MS(h.Quantile(99)))
			stolen := -1.0
			if cpu, err := readMachineCPU(); err == nil {
				if share, ok := cpu.stolenSince(lastCPU); ok {
					stolen = share
					line += fmt.Sprintf(", CPU stolen by the hypervisor %.0f%%", 100*share)
				}
				lastCPU = cpu
			}
			w.stolen = append(w.stolen, stolen)
			work, _ := speed.take() // 0: none
			if work > 0 {
				line += fmt.Sprintf(", the fixed hash took %.2f ms of CPU", float64(work)/float64(time.Millisecond))
			}
			w.work = append(w.work, work)
			if ops := h.Count(); w.cost != nil && ops > 0 {
				c := w.cost()
				line += fmt.Sprintf("; per operation CPU %.0f µs, RPCs %.2f, disk writes %s%s; writes stalled %s", float64(c.cpu-lastCost.cpu)/float64(time.Microsecond)/float64(ops),
					(c.rpcs-lastCost.rpcs)/float64(ops), diskPerOp(lastCost, c, ops), deviceWrites(lastCost, c, ops), stalledFor(lastCost, c))
				lastCost = c
			}
			fmt.Println(line)
		}
	}
}

// summary prints the last full window's throughput against the second's,
// and the mean of the last steadySpan windows against that of windows 2
// to steadySpan+1 (steadyMeans).
func (w *windows) summary() {
	n := len(w.rates)
	if n >= 3 && w.rates[1] > 0 {
		fmt.Printf("  %s: window %d at %.0f ops/s is %.2f× window 2 (%.0f ops/s)%s%s\n", w.name, n, w.rates[n-1], w.rates[n-1]/w.rates[1], w.rates[1],
			perCPULeft(w.rates, w.stolen, n-1, 1, 1), atCPUSpeed(w.rates, w.stolen, w.work, n-1, 1, 1))
	}
	if first, last, ok := steadyMeans(w.rates); ok {
		fmt.Printf("  %s: windows %d–%d at %.0f ops/s on average are %.2f× windows 2–%d (%.0f ops/s)%s%s\n", w.name, n-steadySpan+1, n, last, last/first, steadySpan+1, first,
			perCPULeft(w.rates, w.stolen, n-steadySpan, 1, steadySpan), atCPUSpeed(w.rates, w.stolen, w.work, n-steadySpan, 1, steadySpan))
	}
}

// perCPULeft compares two spans of span windows, from index later and
// from index earlier (rates in operations per second, stolen the
// hypervisor's shares, as windows holds them), by their throughput per CPU
// left to this guest: the sum of rate/(1-stolen) over the later span
// against the same over the earlier. It returns the clause the summary
// prints, or "" when a window has no reading of its share.
func perCPULeft(rates, stolen []float64, later, earlier, span int) string {
	l, okL := perCPUSum(rates, stolen, nil, later, span)
	e, okE := perCPUSum(rates, stolen, nil, earlier, span)
	if !okL || !okE || e == 0 {
		return ""
	}
	return fmt.Sprintf("; the hypervisor took %.0f%% of the CPU time against %.0f%%: per CPU left to this machine, %.2f×",
		100*mean(stolen[later:later+span]), 100*mean(stolen[earlier:earlier+span]), l/e)
}

// atCPUSpeed compares two spans of span windows as perCPULeft does, each
// window's throughput per CPU left also scaled by the CPU time the probe's
// fixed work took in it (work, as windows holds it): a CPU-bound load on
// CPUs that run a third slower does a third less, and this asks whether
// the database did less than that. It returns the clause the summary
// prints, or "" when a window has no reading of its share or its speed.
func atCPUSpeed(rates, stolen []float64, work []time.Duration, later, earlier, span int) string {
	l, okL := perCPUSum(rates, stolen, work, later, span)
	e, okE := perCPUSum(rates, stolen, work, earlier, span)
	if !okL || !okE || e == 0 {
		return ""
	}
	msOf := func(from int) float64 {
		var sum time.Duration
		for _, w := range work[from : from+span] {
			sum += w
		}
		return float64(sum) / float64(span) / float64(time.Millisecond)
	}
	return fmt.Sprintf("; the fixed hash took %.2f ms of CPU against %.2f: per CPU left at its speed, %.2f×", msOf(later), msOf(earlier), l/e)
}

// perCPUSum returns the sum, over the span windows from index from, of
// each window's throughput per CPU left to this guest (rate/(1-stolen)),
// each also times its probe's CPU time in seconds unless work is nil; ok
// is false when a window has no reading of its share, or of its speed.
func perCPUSum(rates, stolen []float64, work []time.Duration, from, span int) (sum float64, ok bool) {
	for i := from; i < from+span; i++ {
		if stolen[i] < 0 || stolen[i] >= 1 || (work != nil && work[i] <= 0) {
			return 0, false
		}
		r := rates[i] / (1 - stolen[i])
		if work != nil {
			r *= work[i].Seconds()
		}
		sum += r
	}
	return sum, true
}

// steadySpan is how many windows steadyMeans averages at each end of a
// run: one window against one other moves by up to ±15% between
// neighbouring minutes on a 2-core machine (issue 17), five of them far
// less.
const steadySpan = 5

// steadyMeans returns the mean throughput of windows 2 to steadySpan+1
// (the first includes the warm-up) and of the last steadySpan windows,
// in operations per second; ok is false unless the two spans are
// disjoint and the first is above zero.
func steadyMeans(rates []float64) (first, last float64, ok bool) {
	if len(rates) < 1+2*steadySpan {
		return 0, 0, false
	}
	first, last = mean(rates[1:1+steadySpan]), mean(rates[len(rates)-steadySpan:])
	return first, last, first > 0
}

// mean returns the mean of xs, which is not empty.
func mean(xs []float64) float64 {
	sum := 0.0
	for _, x := range xs {
		sum += x
	}
	return sum / float64(len(xs))
}
