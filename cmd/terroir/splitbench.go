package main

import (
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/terroir-db/terroir/examples"
	"github.com/terroir-db/terroir/internal/latency"
	"github.com/terroir-db/terroir/internal/localcluster"
	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/ycsb"
)

func benchSplitCmd() *cobra.Command {
	var configPath string
	var duration time.Duration
	var records, clients int
	var splitQPS float64
	cmd := &cobra.Command{
		Use:   "split",
		Short: "YCSB-A on a cluster that starts with one range, while it splits by load",
		Long: `split starts the embedded cluster of --config (default: examples/one-range.yaml,
one region and a single range), loads --records records and runs YCSB-A with
uniform keys from --clients clients for --duration. Ranges split by themselves
once they serve more than split_qps requests per second (--split-qps overrides
the topology's). It prints, per 1 s window, the throughput, P50/P99 latency and
the number of ranges; then the time until the range count settled, the
throughput before the first split and over the last 5 s, and the P99 of the
operations in flight when a split applied beside the P99 of all of them.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			top, err := topology.Parse(examples.OneRange)
			if configPath != "" {
				top, err = topology.Load(configPath)
			}
			if err != nil {
				return err
			}
			if cmd.Flags().Changed("split-qps") {
				top.SplitQPS = splitQPS
			}
			c, err := localcluster.Start(top, localcluster.Options{})
			if err != nil {
				return err
			}
			defer c.Close()
			region := top.Regions[0]
			db, err := c.Client(region)
			if err != nil {
				return err
			}
			w, err := ycsb.Core("a")
			if err != nil {
				return err
			}
			w.RecordCount, w.OperationCount, w.Distribution = records, 0, ycsb.Uniform
			keys, err := ycsb.RegionKeys(top, region)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			fmt.Printf("loading %d records into one range; splitting by load above %.0f requests/s\n", records, top.SplitQPS)
			if err := ycsb.Load(ctx, ycsb.Terroir(db), w, keys, 1); err != nil {
				return err
			}
			rec := newSplitRecorder(c, c.NodeIDs()[0])
			stop := rec.watch()
			cfg := ycsb.Config{Workload: w, Keys: keys, Clients: clients, Duration: duration, Seed: 1, Observe: rec.observe}
			res, err := ycsb.Run(ctx, ycsb.Terroir(db), cfg)
			stop()
			if err != nil {
				return err
			}
			rec.report(res)
			return nil
		},
	}
	cmd.Flags().StringVar(&configPath, "config", "", "topology file (default: the embedded examples/one-range.yaml)")
	cmd.Flags().DurationVar(&duration, "duration", 30*time.Second, "how long the load runs")
	cmd.Flags().IntVar(&records, "records", 2000, "records loaded before the run")
	cmd.Flags().IntVar(&clients, "clients", 16, "concurrent client threads")
	cmd.Flags().Float64Var(&splitQPS, "split-qps", 0, "split a range above this many requests per second (default: the topology's)")
	return cmd
}

// splitRecorder follows one node's range count and every operation's
// interval during `bench split`.
type splitRecorder struct {
	c     *localcluster.Cluster
	node  uint64
	start time.Time

	mu     sync.Mutex
	ops    []opSpan    // every operation: end and latency
	splits []time.Time // when the range count rose
	counts []int       // range count at the end of each 1 s window
}

type opSpan struct {
	end time.Time
	d   time.Duration
}

func newSplitRecorder(c *localcluster.Cluster, node uint64) *splitRecorder {
	return &splitRecorder{c: c, node: node, start: time.Now()}
}

func (s *splitRecorder) ranges() int {
	if n := s.c.Node(s.node); n != nil {
		return len(n.RangeIDs())
	}
	return 0
}

// watch polls the range count every 5 ms (a split is timed to within that)
// until the returned function is called.
func (s *splitRecorder) watch() (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		last, window := s.ranges(), s.start.Add(time.Second)
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case now := <-t.C:
				n := s.ranges()
				s.mu.Lock()
				if n > last {
					s.splits = append(s.splits, now)
				}
				for !now.Before(window) {
					s.counts = append(s.counts, n)
					window = window.Add(time.Second)
				}
				s.mu.Unlock()
				last = n
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

func (s *splitRecorder) observe(_ ycsb.Op, d time.Duration) {
	now := time.Now()
	s.mu.Lock()
	s.ops = append(s.ops, opSpan{end: now, d: d})
	s.mu.Unlock()
}

// report prints the per-window table and the summary.
func (s *splitRecorder) report(res *ycsb.Result) {
	s.mu.Lock()
	defer s.mu.Unlock()
	windows := int(res.Elapsed/time.Second) + 1
	perWindow := make([]*latency.Histogram, windows)
	for i := range perWindow {
		perWindow[i] = latency.New()
	}
	all, overlapped := latency.New(), latency.New()
	sort.Slice(s.splits, func(i, j int) bool { return s.splits[i].Before(s.splits[j]) })
	for _, op := range s.ops {
		i := int(op.end.Sub(s.start) / time.Second)
		if i >= 0 && i < windows {
			perWindow[i].Record(op.d)
		}
		all.Record(op.d)
		began := op.end.Add(-op.d)
		j := sort.Search(len(s.splits), func(j int) bool { return !s.splits[j].Before(began) })
		if j < len(s.splits) && !s.splits[j].After(op.end) {
			overlapped.Record(op.d)
		}
	}
	fmt.Printf("\n| second | ops/s | P50 ms | P99 ms | ranges |\n|---|---|---|---|---|\n")
	for i, h := range perWindow {
		if h.Count() == 0 {
			continue
		}
		n := 0
		if i < len(s.counts) {
			n = s.counts[i]
		} else if len(s.counts) > 0 {
			n = s.counts[len(s.counts)-1]
		}
		fmt.Printf("| %d | %d | %s | %s | %d |\n", i+1, h.Count(), latency.MS(h.Quantile(50)), latency.MS(h.Quantile(99)), n)
	}
	fmt.Println()
	if len(s.splits) == 0 {
		fmt.Println("no split happened: the load stayed under split_qps")
		return
	}
	first, last := s.splits[0].Sub(s.start), s.splits[len(s.splits)-1].Sub(s.start)
	before := rate(s.ops, s.start, s.start.Add(first))
	end := s.start.Add(res.Elapsed)
	after := rate(s.ops, end.Add(-5*time.Second), end)
	fmt.Printf("splits: %d (1 range → %d); first at %.1f s, range count settled at %.1f s\n", len(s.splits), 1+len(s.splits), first.Seconds(), last.Seconds())
	fmt.Printf("throughput: %.0f ops/s before the first split, %.0f ops/s over the last 5 s\n", before, after)
	fmt.Printf("latency P99: %s over all %d operations, %s over the %d in flight when a split applied\n",
		latency.MS(all.Quantile(99)), all.Count(), latency.MS(overlapped.Quantile(99)), overlapped.Count())
}

// rate is the operations per second that ended in [from, to).
func rate(ops []opSpan, from, to time.Time) float64 {
	if !to.After(from) {
		return 0
	}
	n := 0
	for _, op := range ops {
		if !op.end.Before(from) && op.end.Before(to) {
			n++
		}
	}
	return float64(n) / to.Sub(from).Seconds()
}
