package main

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/terroir-db/terroir/examples"
	"github.com/terroir-db/terroir/internal/directory"
	"github.com/terroir-db/terroir/internal/latency"
	"github.com/terroir-db/terroir/internal/localcluster"
	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/ycsb"
)

// gcSample is one window of a GC benchmark run.
type gcSample struct {
	at      time.Duration
	disk    uint64 // bytes of every node's data directory
	live    int64  // MVCC bytes (every version kept, key and value) at node 1; -1: not measured
	newest  int64  // of which each key's newest version
	p99     time.Duration
	p50     time.Duration
	opsPerS float64
}

func benchGCCmd() *cobra.Command {
	var duration, ttl, every time.Duration
	var records, clients int
	var out string
	cmd := &cobra.Command{
		Use:   "gc",
		Short: "Disk use and update latency over time, with GC and without",
		Long: `gc runs YCSB updates (uniform keys over --records records of 1 KB) for
--duration on the embedded one-region cluster twice: once with gc_ttl
--gc-ttl, once with GC off (gc_ttl of a year). Every --every it samples the
bytes of every node's data directory and the window's update P50/P99 and
throughput; in the run with GC also the live bytes, the MVCC versions one
node keeps (key and value bytes, a full scan of its data), which the run
without GC measures once, at its end. It prints both series as a table, the
live bytes against their size after the first gc_ttl, the P99 of both runs
after it, and draws the disk curves in --out/gc-disk.png (DESIGN.md §14).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			on, err := gcRun(cmd.Context(), ttl, duration, every, records, clients, true)
			if err != nil {
				return err
			}
			off, err := gcRun(cmd.Context(), directory.MaxGCTTL, duration, every, records, clients, false)
			if err != nil {
				return err
			}
			fmt.Printf("%8s | %12s %12s %9s %9s %9s | %12s %12s %9s %9s %9s\n", "t", "disk (gc)", "live (gc)", "p50", "p99", "ops/s",
				"disk (off)", "live (off)", "p50", "p99", "ops/s")
			for i := range min(len(on), len(off)) {
				a, b := on[i], off[i]
				fmt.Printf("%8v | %12s %12s %9s %9s %9.0f | %12s %12s %9s %9s %9.0f\n", a.at.Round(time.Second),
					humanBytes(a.disk), liveBytes(a.live), latency.MS(a.p50), latency.MS(a.p99), a.opsPerS,
					humanBytes(b.disk), liveBytes(b.live), latency.MS(b.p50), latency.MS(b.p99), b.opsPerS)
			}
			gcSummary(ttl, on, off)
			if err := os.MkdirAll(out, 0o755); err != nil {
				return err
			}
			path := filepath.Join(out, "gc-disk.png")
			if err := plotDisk(path, ttl, on, off); err != nil {
				return err
			}
			fmt.Printf("disk curves: %s\n", path)
			return nil
		},
	}
	cmd.Flags().DurationVar(&duration, "duration", 2*time.Minute, "how long each run writes")
	cmd.Flags().DurationVar(&ttl, "gc-ttl", 20*time.Second, "gc_ttl of the run with GC")
	cmd.Flags().DurationVar(&every, "every", 10*time.Second, "sampling interval")
	cmd.Flags().IntVar(&records, "records", 10000, "records updated")
	cmd.Flags().IntVar(&clients, "clients", 8, "concurrent clients")
	cmd.Flags().StringVar(&out, "out", "bench-gc", "directory of the PNG")
	return cmd
}

// liveBytes renders a sample's live bytes ("-": not measured).
func liveBytes(n int64) string {
	if n < 0 {
		return "-"
	}
	return humanBytes(uint64(n))
}

// gcSummary prints the live bytes of the run with GC against their size at
// the first sample past the gc_ttl, and the median window P99 of both runs
// from then on.
func gcSummary(ttl time.Duration, on, off []gcSample) {
	first := -1
	for i, s := range on {
		if s.at >= ttl && s.live >= 0 {
			first = i
			break
		}
	}
	if first < 0 {
		fmt.Println("the run with GC ended before its first gc_ttl")
		return
	}
	base, top := on[first], on[first]
	for _, s := range on[first:] {
		if s.live > top.live {
			top = s
		}
	}
	fmt.Printf("live bytes with GC: %s after the first gc_ttl (at %v; newest versions %s), at most %s after it (at %v): %.2f×\n",
		liveBytes(base.live), base.at.Round(time.Second), liveBytes(base.newest), liveBytes(top.live), top.at.Round(time.Second),
		float64(top.live)/float64(base.live))
	if last := off[len(off)-1]; last.live >= 0 {
		fmt.Printf("live bytes without GC at the end (%v): %s (newest versions %s)\n", last.at.Round(time.Second), liveBytes(last.live), liveBytes(last.newest))
	}
	p99 := func(ss []gcSample) time.Duration {
		var ds []time.Duration
		for _, s := range ss {
			ds = append(ds, s.p99)
		}
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	if len(off) > first {
		a, b := p99(on[first:]), p99(off[first:])
		fmt.Printf("update P99 after the first gc_ttl, median over windows: %s with GC, %s without (%.2f×)\n", latency.MS(a), latency.MS(b), float64(a)/float64(b))
	}
}

// gcRun runs one phase of bench gc on a fresh cluster with gc_ttl ttl;
// with live, every sample measures node 1's live bytes, else only the last.
func gcRun(ctx context.Context, ttl, duration, every time.Duration, records, clients int, live bool) ([]gcSample, error) {
	top, err := topology.Parse(examples.OneRegion)
	if err != nil {
		return nil, err
	}
	top.GCTTL = ttl
	dir, err := os.MkdirTemp("", "terroir-bench-gc-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	c, err := localcluster.Start(top, localcluster.Options{DataDir: dir})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	region := top.Regions[0]
	db, err := c.Client(region)
	if err != nil {
		return nil, err
	}
	w, err := ycsb.Core("a")
	if err != nil {
		return nil, err
	}
	w.RecordCount, w.OperationCount, w.Distribution = records, 0, ycsb.Uniform
	w.Read, w.Update = 0, 1
	keys, err := ycsb.RegionKeys(top, region)
	if err != nil {
		return nil, err
	}
	fmt.Printf("gc_ttl %v: loading %d records\n", ttl, records)
	if err := ycsb.Load(ctx, ycsb.Terroir(db), w, keys, 1); err != nil {
		return nil, err
	}
	var mu sync.Mutex
	win := latency.New()
	observe := func(_ ycsb.Op, d time.Duration) {
		mu.Lock()
		win.Record(d)
		mu.Unlock()
	}
	var samples []gcSample
	began := time.Now()
	sample := func() {
		mu.Lock()
		h := win
		win = latency.New()
		mu.Unlock()
		s := gcSample{at: time.Since(began), disk: dirBytes(dir), p50: h.Quantile(50), p99: h.Quantile(99), opsPerS: float64(h.Count()) / every.Seconds(), live: -1, newest: -1}
		if live {
			s.live, s.newest = measureLive(c)
		}
		samples = append(samples, s)
		fmt.Printf("  gc_ttl %v  %8v  disk %10s  live %10s  p99 %s  %.0f ops/s\n", ttl, s.at.Round(time.Second), humanBytes(s.disk), liveBytes(s.live), latency.MS(s.p99), s.opsPerS)
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				sample()
			}
		}
	}()
	_, err = ycsb.Run(ctx, ycsb.Terroir(db), ycsb.Config{Workload: w, Keys: keys, Clients: clients, Duration: duration, Seed: 1, Observe: observe})
	close(done)
	wg.Wait()
	if n := len(samples); n > 0 && !live {
		samples[n-1].live, samples[n-1].newest = measureLive(c)
	}
	return samples, err
}

// measureLive returns node 1's MVCC bytes and newest-version bytes (-1, -1
// if they cannot be read).
func measureLive(c *localcluster.Cluster) (live, newest int64) {
	n := c.Node(c.NodeIDs()[0])
	if n == nil {
		return -1, -1
	}
	st, err := n.DataStats()
	if err != nil {
		return -1, -1
	}
	return st.Bytes, st.NewestBytes
}

// dirBytes returns the bytes of the regular files under dir.
func dirBytes(dir string) uint64 {
	var n uint64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		if info, err := d.Info(); err == nil {
			n += uint64(info.Size())
		}
		return nil
	})
	return n
}

// plotDisk draws the disk bytes of both runs over time.
func plotDisk(path string, ttl time.Duration, on, off []gcSample) error {
	p := plot.New()
	p.Title.Text = "disk use under YCSB updates"
	p.X.Label.Text = "time (s)"
	p.Y.Label.Text = "data directories (MiB)"
	p.Add(plotter.NewGrid())
	p.Legend.Top, p.Legend.Left = true, true
	for i, run := range []struct {
		name string
		ss   []gcSample
	}{{fmt.Sprintf("gc_ttl %v", ttl), on}, {"GC off", off}} {
		xys := make(plotter.XYs, len(run.ss))
		for j, s := range run.ss {
			xys[j] = plotter.XY{X: s.at.Seconds(), Y: float64(s.disk) / (1 << 20)}
		}
		line, err := plotter.NewLine(xys)
		if err != nil {
			return err
		}
		line.Color = plotutil.Color(i)
		line.Width = vg.Points(1.5)
		p.Add(line)
		p.Legend.Add(run.name, line)
	}
	return p.Save(7*vg.Inch, 4.5*vg.Inch, path)
}
