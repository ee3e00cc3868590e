package main

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/terroir-db/terroir/examples"
	"github.com/terroir-db/terroir/internal/nemesis"
	"github.com/terroir-db/terroir/internal/topology"
)

// nemesisLogLines is how many of the last lines logged a campaign keeps
// for --out: a 10-minute campaign logs a few thousand at info.
const nemesisLogLines = 100_000

func nemesisCmd() *cobra.Command {
	var cfg nemesis.Config
	var path string
	var gcTTL time.Duration
	cmd := &cobra.Command{
		Use:   "nemesis",
		Short: "A randomized fault campaign on an embedded cluster, checked for strict serializability",
		Long: `nemesis starts the cluster of --topology (default: the embedded
examples/three-regions.yaml) in this process and, for --duration, runs clients
in every data region while a fault schedule strikes every 3 s. Workloads:
multi-key read-write transactions and linearizable snapshots over small key
groups; single-key registers (write, compare-and-set, reads locking or in every
per-key linearizable snapshot mode); appends to lists read in every snapshot
mode; bank transfers across regions audited by snapshots of every mode; a
changefeed applied to a copy of the accounts, checked at every resolved epoch
and, 2 s later, against the accounts read as of that epoch; long snapshots
reread while ranges collect; and a monitor reading every epoch group. Faults:
kill and restart a node or a range leader; kill a participant's leader between
prepare and commit record or between commit record and notification, with or
without the coordinator dying too; stall a coordinator there briefly, or past
the transaction-record grace; split and merge ranges, killing the leader as
they apply or merging while the left range moves a replica; pause a range's
closing of epochs; restart the whole cluster from disk; cut a region off, or
cut it, exclude it and readmit it; drop 10%, duplicate 20% or delay by 20 ms
every message. After each fault it measures how long until every data region
commits again, and how long until a transaction struck mid-commit holds no
lock. At the end it reads every key, and checks: porcupine for the key groups
(strict serializability) and registers (linearizability), the list history
(lost, aborted, phantom, diverged, fractured and stale reads), every bank
total, the epoch invariants, and that no lock outlives the load. It prints
operations, faults, recovery times and anomalies. Ranges collect old versions
below --gc-ttl (3 s) meanwhile. On an anomaly it writes the histories, the
seed and the last lines logged at info and above (log.txt, whatever
--log-level prints) to --out and exits 1; the same --seed repeats the same
choices.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if path == "" {
				cfg.Topology, err = topology.Parse(examples.ThreeRegions)
			} else {
				cfg.Topology, err = topology.Load(path)
			}
			if err != nil {
				return err
			}
			if gcTTL > 0 {
				if gcTTL < topology.MinGCTTL {
					return fmt.Errorf("--gc-ttl %v is below %v", gcTTL, topology.MinGCTTL)
				}
				cfg.Topology.GCTTL = gcTTL
			}
			// Keep the Info lines whatever --log-level prints, for --out.
			prev := slog.Default()
			cfg.Log = nemesis.NewLogRing(prev.Handler(), nemesisLogLines)
			slog.SetDefault(slog.New(cfg.Log))
			defer slog.SetDefault(prev)
			sum, err := nemesis.Run(cmd.Context(), cfg)
			if sum != nil {
				sum.Write(os.Stdout)
			}
			return err
		},
	}
	cmd.Flags().StringVar(&path, "topology", "", "topology file (default: the embedded examples/three-regions.yaml)")
	cmd.Flags().DurationVar(&cfg.Duration, "duration", time.Minute, "how long faults are injected")
	cmd.Flags().Uint64Var(&cfg.Seed, "seed", 1, "random seed of the workload and the fault schedule")
	cmd.Flags().StringSliceVar(&cfg.Faults, "faults", nil, "fault kinds to inject, comma-separated (default: all; see the list in the error for a wrong one)")
	cmd.Flags().DurationVar(&cfg.FaultEvery, "fault-every", 3*time.Second, "time between faults")
	cmd.Flags().DurationVar(&gcTTL, "gc-ttl", 3*time.Second, "the cluster's gc_ttl: short, so ranges collect old versions while the faults strike (0: the topology's)")
	cmd.Flags().StringVar(&cfg.Out, "out", "nemesis-failure", "where the histories and the seed go when a check fails")
	return cmd
}
