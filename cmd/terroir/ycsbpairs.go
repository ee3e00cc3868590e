package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/terroir-db/terroir/internal/ycsb"
)

// pairSide is one of the two systems a paired run drives: its store, the
// keys its records go under, its server processes (pids: nil, none
// measured) and, for a running Terroir cluster, its nodes' HTTP addresses.
type pairSide struct {
	name   string
	store  ycsb.Store
	keys   ycsb.KeySpace
	pids   []int
	remote []string
}

// runPairs loads both sides' records, then runs cfg (bounded by its
// duration: its workload's OperationCount 0) on each in turn,
// pairs times, for cfg.Duration/pairs each (sides[0] first in every
// pair), with the operation sequence of pair i seeded cfg.Seed+i on both.
// Run one after the other, etcd's 20 s and then Terroir's saw different
// seconds of this machine, whose speed swings by tens of percent from one
// to the next: one build's ratio read 1.34× in one run and 1.54× in the
// next (issue 17). In alternating slices each system sees the same
// minutes. It prints each pair's throughputs and ratio (sides[1] over
// sides[0]) and their median, and returns each side's slices merged into
// one result (ycsb.Result.Merge) and, for a side with pids, the CPU time an
// operation cost over its own slices alone. Errors: a load's, a run's,
// reading the processes' CPU time.
func runPairs(ctx context.Context, pairs int, sides [2]pairSide, cfg ycsb.Config) ([2]*ycsb.Result, [2]*cpuPerOp, error) {
	var merged [2]*ycsb.Result
	var costs [2]*cpuPerOp
	w := cfg.Workload
	for _, s := range sides {
		fmt.Printf("%s: loading %d records of %d × %d B...\n", s.name, w.RecordCount, w.FieldCount, w.FieldLength)
		if err := ycsb.Load(ctx, s.store, w, s.keys, cfg.Seed); err != nil {
			return merged, costs, fmt.Errorf("%s: %w", s.name, err)
		}
	}
	slice := cfg.Duration / time.Duration(pairs)
	fmt.Printf("running workload %s on each for %s, in %d alternating slices of %s (%s first)...\n", w.Name, cfg.Duration, pairs, slice, sides[0].name)
	var remoteBefore remoteSample
	if len(sides[1].remote) > 0 {
		remoteBefore = sampleRemote(ctx, sides[1].remote)
	}
	var spent [2]cpuSample // CPU time over each side's own slices
	var ratios []float64
	for i := range pairs {
		var tp [2]float64
		for j, s := range sides {
			c := cfg
			c.Keys, c.Duration, c.Seed = s.keys, slice, cfg.Seed+uint64(i)
			res, used, err := runSlice(ctx, s, c)
			if err != nil {
				return merged, costs, fmt.Errorf("%s, pair %d: %w", s.name, i+1, err)
			}
			spent[j].servers += used.servers
			spent[j].driver += used.driver
			tp[j] = res.Throughput()
			if merged[j] == nil {
				merged[j] = res
			} else {
				merged[j].Merge(res)
			}
		}
		ratios = append(ratios, tp[1]/tp[0])
		fmt.Printf("pair %d: %s %.0f ops/s, %s %.0f ops/s: %.2f×\n", i+1, sides[0].name, tp[0], sides[1].name, tp[1], ratios[i])
	}
	slices.Sort(ratios)
	fmt.Printf("%s/%s throughput by pair: median %.2f× (%d pairs, %.2f× to %.2f×)\n",
		sides[1].name, sides[0].name, median(ratios), pairs, ratios[0], ratios[len(ratios)-1])
	if len(sides[1].remote) > 0 {
		printRemote(remoteBefore, sampleRemote(ctx, sides[1].remote), merged[1].Ops())
	}
	for j, s := range sides {
		if len(s.pids) > 0 {
			per := perOp(cpuSample{}, spent[j], len(s.pids), merged[j].Ops())
			costs[j] = &per
		}
	}
	return merged, costs, nil
}

// runSlice runs cfg on s and returns the result and the CPU time s's
// processes and the driver spent meanwhile (zero without pids).
func runSlice(ctx context.Context, s pairSide, cfg ycsb.Config) (*ycsb.Result, cpuSample, error) {
	var before cpuSample
	var err error
	if len(s.pids) > 0 {
		if before, err = sampleCPU(s.pids); err != nil {
			return nil, cpuSample{}, err
		}
	}
	res, err := ycsb.Run(ctx, s.store, cfg)
	if err != nil || len(s.pids) == 0 {
		return res, cpuSample{}, err
	}
	after, err := sampleCPU(s.pids)
	if err != nil {
		return nil, cpuSample{}, err
	}
	return res, cpuSample{servers: after.servers - before.servers, driver: after.driver - before.driver}, nil
}

// median is the middle of sorted (the mean of the two middle ones for an
// even count); 0 for none.
func median(sorted []float64) float64 {
	n := len(sorted)
	switch {
	case n == 0:
		return 0
	case n%2 == 1:
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}
