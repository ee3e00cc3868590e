package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/terroir-db/terroir/internal/admin"
	"github.com/terroir-db/terroir/internal/latency"
	"github.com/terroir-db/terroir/internal/ycsb"
)

func benchRebalanceCmd() *cobra.Command {
	var duration, joinAt time.Duration
	var records, clients, ranges int
	var keep bool
	cmd := &cobra.Command{
		Use:   "rebalance",
		Short: "YCSB-A on three node processes while two more join and the cluster rebalances onto them",
		Long: `rebalance starts three nodes of one region as separate terroir start processes
(plaintext, on free 127.0.0.1 ports) with --ranges ranges, loads --records
records and runs YCSB-A from --clients clients for --duration. At --join-at two
more nodes join with terroir start --join, and the region's replicate queue
moves replicas and leases onto them by itself (DESIGN.md §12). It prints,
per 1 s window, the throughput, P50/P99 and each node's replica count (of
ranges and of the epoch, txn-state and directory groups); then
the time from the joins until replica and lease counts were within one of
each other, the snapshot bytes the nodes sent, and the joiners' resident
memory: right after they joined and at its peak.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if ranges < 1 || ranges > 20 {
				return fmt.Errorf("--ranges %d: between 1 and 20", ranges)
			}
			if joinAt >= duration {
				return fmt.Errorf("--join-at %v must be before the end of --duration %v", joinAt, duration)
			}
			b, err := newRebalanceBench(ranges)
			if err != nil {
				return err
			}
			defer b.close(keep)
			return b.run(cmd.Context(), records, clients, duration, joinAt)
		},
	}
	cmd.Flags().DurationVar(&duration, "duration", 90*time.Second, "how long the load runs")
	cmd.Flags().DurationVar(&joinAt, "join-at", 5*time.Second, "when, into the load, the two nodes join")
	cmd.Flags().IntVar(&records, "records", 10000, "records loaded before the run")
	cmd.Flags().IntVar(&clients, "clients", 16, "concurrent client threads")
	cmd.Flags().IntVar(&ranges, "ranges", 6, "ranges the region starts with (1–20)")
	cmd.Flags().BoolVar(&keep, "keep", false, "keep the nodes' data directories and logs (node-<id>.log), and print where")
	return cmd
}

// rebalanceBench is the cluster of node processes.
type rebalanceBench struct{ *procCluster }

func newRebalanceBench(ranges int) (*rebalanceBench, error) {
	p, err := newProcCluster("rebalance", 5, func(addrs []string) string {
		yaml := "local_epoch_interval: 10ms\nraft_tick: 10ms\nsplit_size: off\nsplit_qps: off\nregions: [" + benchRegion + "]\nnodes:\n"
		for i := range 3 {
			yaml += fmt.Sprintf("  - {id: %d, region: %s, addr: %q}\n", i+1, benchRegion, addrs[i])
		}
		yaml += "groups:\n"
		for i, kind := range []string{"local-epoch", "txn-state", "directory"} {
			yaml += fmt.Sprintf("  - {id: %d, kind: %s, region: %s, replicas: [1, 2, 3]}\n", i+1, kind, benchRegion)
		}
		// Ranges start at "", "c", "f", ...: each holds YCSB keys under its own prefix.
		for i := range ranges {
			start, end := "", string(rune('c'+3*i))
			if i > 0 {
				start = string(rune('c' + 3*(i-1)))
			}
			if i == ranges-1 {
				yaml += fmt.Sprintf("  - {id: %d, kind: range, region: %s, start: %q, replicas: [1, 2, 3]}\n", 10+i, benchRegion, start)
			} else {
				yaml += fmt.Sprintf("  - {id: %d, kind: range, region: %s, start: %q, end: %q, replicas: [1, 2, 3]}\n", 10+i, benchRegion, start, end)
			}
		}
		return yaml
	})
	if err != nil {
		return nil, err
	}
	return &rebalanceBench{p}, nil
}

// balanceSample is the registry's replica and lease counts at one moment.
type balanceSample struct {
	at       time.Time
	replicas map[uint64]int
	leases   map[uint64]int
	balanced bool // every live node within one of the others, in replicas and in leases
}

func (b *rebalanceBench) run(ctx context.Context, records, clients int, duration, joinAt time.Duration) error {
	db, d, err := b.startFile()
	if err != nil {
		return err
	}
	defer d.Close()
	defer db.Close()
	w, err := ycsb.Core("a")
	if err != nil {
		return err
	}
	w.RecordCount, w.OperationCount = records, 0
	keys, err := ycsb.RegionKeys(b.top, benchRegion)
	if err != nil {
		return err
	}
	fmt.Printf("three nodes (processes) of %s, %d ranges; loading %d records\n", benchRegion, len(keys.Prefixes), records)
	if err := ycsb.Load(ctx, ycsb.Terroir(db), w, keys, 1); err != nil {
		return err
	}

	var mu sync.Mutex
	type opAt struct {
		end time.Time
		d   time.Duration
	}
	var ops []opAt
	start := time.Now()
	observe := func(_ ycsb.Op, dur time.Duration) {
		now := time.Now()
		mu.Lock()
		ops = append(ops, opAt{now, dur})
		mu.Unlock()
	}
	runDone := make(chan error, 1)
	var res *ycsb.Result
	go func() {
		var err error
		res, err = ycsb.Run(ctx, ycsb.Terroir(db), ycsb.Config{Workload: w, Keys: keys, Clients: clients, Duration: duration, Seed: 1, Observe: observe})
		runDone <- err
	}()

	// The joins, and the joiners' resident memory.
	var joined time.Time
	var idleRSS, peakRSS uint64
	var samples []balanceSample
	sampleEvery := time.NewTicker(250 * time.Millisecond)
	defer sampleEvery.Stop()
	joinTimer := time.After(joinAt)
	var runErr error
loop:
	for {
		select {
		case runErr = <-runDone:
			break loop
		case <-joinTimer:
			for id := uint64(4); id <= 5; id++ {
				if err := b.start(id, true); err != nil {
					return err
				}
			}
			joined = time.Now()
			for id := uint64(4); id <= 5; id++ {
				idleRSS = max(idleRSS, b.rss(id))
			}
			fmt.Printf("nodes 4 and 5 joined at %.1f s\n", joined.Sub(start).Seconds())
		case now := <-sampleEvery.C:
			for id := uint64(4); id <= 5; id++ {
				peakRSS = max(peakRSS, b.rss(id))
			}
			sctx, cancel := context.WithTimeout(ctx, time.Second)
			rows, err := admin.Nodes(sctx, d, b.top)
			cancel()
			if err != nil {
				continue
			}
			s := balanceSample{at: now, replicas: map[uint64]int{}, leases: map[uint64]int{}}
			lo, hi, llo, lhi, complete := -1, 0, -1, 0, true
			for _, r := range rows {
				if r.State != "live" || !r.Live {
					continue
				}
				if r.Replicas < 0 {
					complete = false
					continue
				}
				replicas := r.Replicas // of ranges and groups alike, as the queue balances them
				s.replicas[r.ID], s.leases[r.ID] = replicas, r.Leases
				if lo < 0 || replicas < lo {
					lo = replicas
				}
				if llo < 0 || r.Leases < llo {
					llo = r.Leases
				}
				hi, lhi = max(hi, replicas), max(lhi, r.Leases)
			}
			s.balanced = complete && len(s.replicas) == 5 && hi-lo <= 1 && lhi-llo <= 1
			samples = append(samples, s)
		}
	}
	if runErr != nil {
		return runErr
	}

	windows := int(res.Elapsed/time.Second) + 1
	per := make([]*latency.Histogram, windows)
	for i := range per {
		per[i] = latency.New()
	}
	all := latency.New()
	for _, op := range ops {
		if i := int(op.end.Sub(start) / time.Second); i >= 0 && i < windows {
			per[i].Record(op.d)
		}
		all.Record(op.d)
	}
	fmt.Printf("\n| second | ops/s | P50 ms | P99 ms | replicas per node (1..5; ranges and groups) | leases per node |\n|---|---|---|---|---|---|\n")
	for i, h := range per {
		if h.Count() == 0 {
			continue
		}
		at := start.Add(time.Duration(i+1) * time.Second)
		j := sort.Search(len(samples), func(j int) bool { return samples[j].at.After(at) })
		counts, leases := "-", "-"
		if j > 0 {
			counts, leases = perNode(samples[j-1].replicas), perNode(samples[j-1].leases)
		}
		fmt.Printf("| %d | %d | %s | %s | %s | %s |\n", i+1, h.Count(), latency.MS(h.Quantile(50)), latency.MS(h.Quantile(99)), counts, leases)
	}
	fmt.Printf("\nall operations: %d, %.0f ops/s, P50 %s, P99 %s\n", all.Count(), float64(all.Count())/res.Elapsed.Seconds(),
		latency.MS(all.Quantile(50)), latency.MS(all.Quantile(99)))
	if joined.IsZero() {
		return errors.New("the nodes never joined")
	}
	// Balanced: the first sample after the joins from which every later one is.
	balancedAt := time.Time{}
	for i := len(samples) - 1; i >= 0 && samples[i].at.After(joined); i-- {
		if !samples[i].balanced {
			break
		}
		balancedAt = samples[i].at
	}
	if balancedAt.IsZero() {
		fmt.Println("replica and lease counts were not within one of each other by the end of the run")
	} else {
		fmt.Printf("balanced (replica and lease counts within one across the 5 nodes) %.1f s after the joins\n", balancedAt.Sub(joined).Seconds())
	}
	fmt.Printf("snapshot bytes sent: %s\n", humanBytes(b.snapshotBytes()))
	fmt.Printf("joiners' resident memory: %s right after joining, peak %s\n", humanBytes(idleRSS), humanBytes(peakRSS))
	return nil
}

// perNode renders counts of nodes 1..5 ("·": not live, or not there yet).
func perNode(counts map[uint64]int) string {
	var parts []string
	for id := uint64(1); id <= 5; id++ {
		if c, ok := counts[id]; ok {
			parts = append(parts, strconv.Itoa(c))
		} else {
			parts = append(parts, "·")
		}
	}
	return strings.Join(parts, " ")
}
