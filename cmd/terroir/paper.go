package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/examples"
	"github.com/terroir-db/terroir/internal/latency"
	"github.com/terroir-db/terroir/internal/localcluster"
	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/ycsb"
)

func benchPaperCmd() *cobra.Command {
	var config string
	var duration time.Duration
	var records, threads int
	var seed uint64
	cmd := &cobra.Command{
		Use:   "paper",
		Short: "The paper's §6.2 run: regional YCSB-A in two regions and a strong multi-region snapshot every 100 ms",
		Long: `paper runs the experiment of the paper's §6.2 on the embedded three-region
cluster (examples/three-regions.yaml unless --config): YCSB-A (50% reads, 50%
updates, uniform) from --threads client threads in each data region on keys homed
there, while a client in us-west1 runs a strong snapshot reading one key per data
region every 100 ms. It prints the global epoch interval, the snapshots' epoch
wait and total time, and the regional transactions' latencies, beside the
paper's figures. Everything runs in one process on this machine, so the
regional latencies include CPU contention the paper's dedicated VMs did not have.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			top, err := topology.Parse(examples.ThreeRegions)
			if config != "" {
				top, err = topology.Load(config)
			}
			if err != nil {
				return err
			}
			return runPaper(cmd.Context(), top, duration, records, threads, seed)
		},
	}
	cmd.Flags().StringVar(&config, "config", "", "topology file (default: the embedded examples/three-regions.yaml)")
	cmd.Flags().DurationVar(&duration, "duration", 10*time.Second, "how long the measured run lasts")
	cmd.Flags().IntVar(&records, "records", 1000, "records per data region")
	cmd.Flags().IntVar(&threads, "threads", 5, "YCSB client threads per data region (the paper: 5)")
	cmd.Flags().Uint64Var(&seed, "seed", 1, "random seed for the operation sequence")
	return cmd
}

// dataRegions returns the regions that home ranges, in topology order.
func dataRegions(top *topology.Topology) []string {
	var out []string
	for _, r := range top.Regions {
		for _, g := range top.Ranges() {
			if g.Region == r {
				out = append(out, r)
				break
			}
		}
	}
	return out
}

func runPaper(ctx context.Context, top *topology.Topology, d time.Duration, records, threads int, seed uint64) error {
	global := top.GroupsOfKind(topology.KindGlobalEpoch, "")
	regions := dataRegions(top)
	if len(global) == 0 || len(regions) < 2 {
		return fmt.Errorf("the paper's run needs a global epoch service and two data regions")
	}
	snapRegion := regions[len(regions)-1] // us-west1: the farther from us-central1 in the paper
	c, err := localcluster.Start(top, localcluster.Options{})
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Printf("cluster: %d nodes in %v; data in %v; global epoch service in %s\n",
		len(top.Nodes), top.Regions, regions, global[0].Region)
	// YCSB-A, uniform, as the paper ran it; one 1 KiB field per record.
	w, _ := ycsb.Core("a")
	w.Distribution, w.RecordCount, w.OperationCount, w.FieldCount, w.FieldLength = ycsb.Uniform, records, 0, 1, 1024
	dbs := map[string]*client.DB{}
	keys := map[string]ycsb.KeySpace{}
	for _, r := range regions {
		if dbs[r], err = c.Client(r); err != nil {
			return err
		}
		if keys[r], err = ycsb.RegionKeys(top, r); err != nil {
			return err
		}
		fmt.Printf("loading %d records of %d bytes in %s...\n", records, w.FieldLength, r)
		if err := ycsb.Load(ctx, dbs[r], w, keys[r], seed); err != nil {
			return err
		}
	}

	runCtx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var wg sync.WaitGroup
	// The global epoch interval, from a reader in the service's region.
	intervals := latency.New()
	wg.Add(1)
	go func() {
		defer wg.Done()
		r, err := c.Reader(topology.KindGlobalEpoch, global[0].Region, global[0].Region)
		if err != nil {
			return
		}
		var last uint64
		var since time.Time
		for runCtx.Err() == nil {
			e, err := r.Read(runCtx)
			if err == nil && e != last {
				now := time.Now()
				if last != 0 {
					per := now.Sub(since) / time.Duration(e-last)
					for range e - last {
						intervals.Record(per)
					}
				}
				last, since = e, now
			}
			time.Sleep(time.Millisecond)
		}
	}()
	// The strong multi-region snapshot, every 100 ms.
	epochWait, snapTotal := latency.New(), latency.New()
	snapFails := 0
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-runCtx.Done():
				return
			case <-tick.C:
			}
			began := time.Now()
			sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
			stats, err := dbs[snapRegion].View(sctx, client.Strong, func(ctx context.Context, s *client.Snapshot) error {
				// One key per region, read in parallel: the wait for the
				// epoch at each region's leader overlaps the round trips.
				errs := make(chan error, len(regions))
				for _, r := range regions {
					go func() {
						_, _, err := s.Get(ctx, keys[r].Key(uint64(i%records)))
						errs <- err
					}()
				}
				var first error
				for range regions {
					if err := <-errs; err != nil && first == nil {
						first = err
					}
				}
				return first
			})
			scancel()
			if err != nil {
				snapFails++
				continue
			}
			snapTotal.Since(began)
			epochWait.Record(stats.EpochWait)
		}
	}()
	results := make([]*ycsb.Result, len(regions))
	errs := make([]error, len(regions))
	for i, r := range regions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = ycsb.Run(runCtx, dbs[r], ycsb.Config{Workload: w, Keys: keys[r], Clients: threads, Duration: d, Seed: seed + uint64(i)})
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}

	fmt.Printf("\nThe paper's §6.2 on this machine: %v, YCSB-A with %d threads per data region, a strong snapshot from %s every 100 ms\n\n",
		d, threads, snapRegion)
	fmt.Printf("%-40s %10s %10s %10s %8s   %s\n", "measurement", "p50", "p99", "mean", "count", "paper (DESIGN.md §9)")
	row := func(name string, h *latency.Histogram, paper string) {
		fmt.Printf("%-40s %10s %10s %10s %8d   %s\n", name, latency.MS(h.Quantile(50)), latency.MS(h.Quantile(99)),
			latency.MS(h.Mean()), h.Count(), paper)
	}
	row("global epoch interval", intervals, "P50 ~47 ms, P99 ~76 ms, mean < 55 ms")
	row("strong snapshot: waiting for the epoch", epochWait, "mean ~82 ms")
	row("strong snapshot: total", snapTotal, "mean ~107 ms")
	for i, r := range regions {
		res := results[i]
		row(r+" read transaction", res.Latency[ycsb.OpRead], "P50 214 µs (eRPC, DRAM)")
		row(r+" write transaction", res.Latency[ycsb.OpUpdate], "P50 199 µs (eRPC, DRAM)")
		fmt.Printf("%-40s %d failed, %d retried attempts\n", "", res.Failed[ycsb.OpRead]+res.Failed[ycsb.OpUpdate], res.Retries)
	}
	fmt.Printf("%-40s %d\n", "strong snapshots failed", snapFails)
	return nil
}
