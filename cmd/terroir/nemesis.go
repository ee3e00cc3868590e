package main

import (
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/terroir-db/terroir/examples"
	"github.com/terroir-db/terroir/internal/nemesis"
	"github.com/terroir-db/terroir/internal/topology"
)

func nemesisCmd() *cobra.Command {
	var cfg nemesis.Config
	var path string
	cmd := &cobra.Command{
		Use:   "nemesis",
		Short: "A randomized fault campaign on an embedded cluster, checked for strict serializability",
		Long: `nemesis starts the cluster of --topology (default: the embedded
examples/three-regions.yaml) in this process and, for --duration, runs clients
in every data region — multi-key read-write transactions and linearizable
snapshots over small key groups, bank transfers across regions, a snapshot
audit of the bank's total every second — while a fault schedule every 3 s
kills and restarts a node or a range leader, restarts the whole cluster from
disk, cuts a region off (and sometimes excludes it and readmits it), drops 10%
of messages or delays them all. After each fault it measures how long until every
data region commits again. At the end it checks the history with porcupine
(strict serializability, including a final read of every key, so a lost
acknowledged write fails it) and prints operations, faults, recovery times and
anomalies. On an anomaly it writes the histories and the seed to --out and
exits 1; the same --seed repeats the same choices.`,
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
	cmd.Flags().StringVar(&cfg.Out, "out", "nemesis-failure", "where the histories and the seed go when a check fails")
	return cmd
}
