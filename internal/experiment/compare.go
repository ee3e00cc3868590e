package experiment

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/latency"
	"github.com/terroir-db/terroir/internal/localcluster"
	"github.com/terroir-db/terroir/internal/ycsb"
)

// Mode is one commit mode `bench compare` measures.
type Mode struct {
	// Name labels the mode in the table.
	Name string
	// Regional runs on the same topology without its global epoch service
	// and publishers: the lower bound of a regional transaction.
	Regional bool
	// Commit is the commit mode the clients use (zero: the protocol).
	Commit client.CommitMode
}

// Modes returns the four modes of the comparison, Terroir first: the
// protocol; regional-only (global epoch off); naive (every commit reads the
// global epoch service across the WAN: the paper's §3 problem); commit-wait
// (writers wait out a clock uncertainty of `uncertainty` before acknowledging
// and releasing their locks, as Spanner does).
func Modes(uncertainty time.Duration) []Mode {
	return []Mode{
		{Name: "terroir"},
		{Name: "regional-only", Regional: true},
		{Name: "naive", Commit: client.CommitMode{Naive: true}},
		{Name: fmt.Sprintf("commit-wait %v", uncertainty), Commit: client.CommitMode{CommitWait: uncertainty}},
	}
}

// ModeResult is one mode's figures, per data region.
type ModeResult struct {
	Mode Mode
	// Reads and Writes are the latencies of read and update transactions,
	// per data region (Comparison.Regions order).
	Reads, Writes []*latency.Histogram
	// Txns counts completed transactions per data region.
	Txns []int64
	// Elapsed is the mode's total running time over its rounds.
	Elapsed time.Duration
}

// Comparison is a finished `bench compare`.
type Comparison struct {
	// Config is the run's configuration (Duration per mode).
	Config Config
	// Regions are the data regions.
	Regions []string
	// Modes are the results, in the order the modes were given.
	Modes []*ModeResult
}

// Compare runs the same YCSB-A load (cfg.Threads per data region, cfg.Records
// records each) in every mode for cfg.Duration each, in rounds of `round`:
// each round runs every mode once, in the order given, so that the
// machine's drift falls on all alike. Regional-only needs the global epoch
// off, so it runs on a second cluster of the same nodes and ranges, started
// and loaded beside the first and idle while the others run (and the first
// idle while it does): run after the first, its figures came from other
// minutes of this machine, whose speed swings by tens of percent from one
// to the next (issue 17), and terroir's write P50 read 1.10×, 1.36× and
// 1.22× regional-only's in three runs of one build. With cfg.DataDir set,
// the second cluster's nodes keep their data in its "regional-only"
// subdirectory.
func Compare(ctx context.Context, cfg Config, modes []Mode, round time.Duration) (*Comparison, error) {
	regions := DataRegions(cfg.Topology)
	if len(regions) == 0 {
		return nil, errors.New("experiment: the topology has no data region")
	}
	cmp := &Comparison{Config: cfg, Regions: regions}
	var clusters [2]*loaded // by clusterOf: the full topology's, and regional-only's
	for _, m := range modes {
		mr := &ModeResult{Mode: m, Txns: make([]int64, len(regions))}
		for range regions {
			mr.Reads, mr.Writes = append(mr.Reads, latency.New()), append(mr.Writes, latency.New())
		}
		cmp.Modes = append(cmp.Modes, mr)
	}
	for k := range clusters {
		if !slices.ContainsFunc(modes, func(m Mode) bool { return clusterOf(m) == k }) {
			continue
		}
		kcfg := cfg
		if k == 1 {
			kcfg.Topology = cfg.Topology.WithoutGlobalEpoch()
			if cfg.DataDir != "" {
				kcfg.DataDir = filepath.Join(cfg.DataDir, "regional-only")
			}
		}
		c, err := localcluster.Start(kcfg.Topology, localcluster.Options{DataDir: kcfg.DataDir, Keep: kcfg.Keep})
		if err != nil {
			return nil, err
		}
		defer c.Close()
		if clusters[k], err = load(ctx, c, kcfg, regions); err != nil {
			return nil, err
		}
	}
	err := eachTurn(cfg.Duration, round, len(modes), func(turn, j int, d time.Duration) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		return runTurn(ctx, cfg, clusters[clusterOf(modes[j])], cmp.Modes[j], turn, d)
	})
	if err != nil {
		return nil, err
	}
	return cmp, nil
}

// clusterOf returns the cluster Compare runs m on: 1, the topology without
// its global epoch, for regional-only; 0, the full topology, otherwise.
func clusterOf(m Mode) int {
	if m.Regional {
		return 1
	}
	return 0
}

// eachTurn calls run for every turn of n modes, each running `total` in
// turns of at most round: turn 0 of modes 0 to n-1, then turn 1 of each,
// and so on, the last turn shorter when round does not divide total. It
// stops at run's first error and returns it.
func eachTurn(total, round time.Duration, n int, run func(turn, mode int, d time.Duration) error) error {
	for turn := 0; time.Duration(turn)*round < total; turn++ {
		d := min(round, total-time.Duration(turn)*round)
		for j := range n {
			if err := run(turn, j, d); err != nil {
				return err
			}
		}
	}
	return nil
}

// runTurn runs mode mr's turn number `turn` on the loaded cluster ld for d:
// cfg.Threads clients in each data region, recording into mr.
func runTurn(ctx context.Context, cfg Config, ld *loaded, mr *ModeResult, turn int, d time.Duration) error {
	var runs errgroup.Group
	for i := range ld.dbs {
		ld.dbs[i].SetCommitMode(mr.Mode.Commit)
		runs.Go(func() error {
			res, err := ycsb.Run(ctx, ld.stores[i], ycsb.Config{Workload: ld.workload, Keys: ld.keys[i], Clients: cfg.Threads,
				Duration: d, Seed: cfg.Seed + uint64(turn*len(ld.dbs)+i),
				Observe: func(op ycsb.Op, d time.Duration) {
					if op == ycsb.OpRead {
						mr.Reads[i].Record(d)
					} else {
						mr.Writes[i].Record(d)
					}
				}})
			if err == nil {
				mr.Txns[i] += res.Ops()
			}
			return err
		})
	}
	if err := runs.Wait(); err != nil {
		return err
	}
	mr.Elapsed += d
	return nil
}

// WriteTable prints each mode's regional read and write P50/P99 and
// throughput per data region, with its ratio to the first mode (Terroir).
func (cmp *Comparison) WriteTable(w io.Writer) {
	base := cmp.Modes[0]
	fmt.Fprintf(w, "%-22s %-10s %9s %9s %9s %9s %9s   %s\n", "mode", "region", "read p50", "read p99", "write p50", "write p99", "txn/s",
		"× "+base.Mode.Name+" (read p50, write p50, txn/s)")
	for _, mr := range cmp.Modes {
		for i, region := range cmp.Regions {
			rate := float64(mr.Txns[i]) / mr.Elapsed.Seconds()
			baseRate := float64(base.Txns[i]) / base.Elapsed.Seconds()
			fmt.Fprintf(w, "%-22s %-10s %9s %9s %9s %9s %9.0f   %.2f× %.2f× %.2f×\n", mr.Mode.Name, region,
				ms(mr.Reads[i].Quantile(50)), ms(mr.Reads[i].Quantile(99)), ms(mr.Writes[i].Quantile(50)), ms(mr.Writes[i].Quantile(99)), rate,
				ratio(mr.Reads[i].Quantile(50), base.Reads[i].Quantile(50)), ratio(mr.Writes[i].Quantile(50), base.Writes[i].Quantile(50)),
				rate/baseRate)
		}
	}
	fmt.Fprintln(w, "latencies in ms; each mode ran", cmp.Config.Duration, "with", cmp.Config.Threads, "YCSB-A threads per data region")
}

func ratio(a, b time.Duration) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}
