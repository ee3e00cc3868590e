package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/terroir-db/terroir/examples"
	"github.com/terroir-db/terroir/internal/localcluster"
	"github.com/terroir-db/terroir/internal/topology"
)

// idleTarget is the most an idle three-region cluster may use (issue 17):
// 20% of one core.
const idleTarget = 0.20

func benchIdleCmd() *cobra.Command {
	var config string
	var warmup, duration time.Duration
	var insecure bool
	var top int
	cmd := &cobra.Command{
		Use:   "idle",
		Short: "What an idle cluster costs: CPU (% of one core), Raft proposals, log syncs, RPCs and Raft messages per second, with no load",
		Long: `idle starts the embedded cluster of --config (default: the demo's
examples/three-regions.yaml), lets it settle for --warmup, then measures for
--duration with no client load: the process's CPU time as a share of one
core (the target is at most 20%), and, summed over the nodes, the Raft
proposals, log syncs, RPCs served and Raft messages sent (heartbeats and
their replies apart) per second, the RPCs by method. Epochs,
leases, closed epochs and heartbeats are all it does.`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			t, err := topology.Parse(examples.ThreeRegions)
			if config != "" {
				t, err = topology.Load(config)
			}
			if err != nil {
				return err
			}
			if duration <= 0 || warmup < 0 {
				return errors.New("--duration must be positive and --warmup not negative")
			}
			c, err := localcluster.Start(t, localcluster.Options{Insecure: insecure})
			if err != nil {
				return err
			}
			defer c.Close()
			time.Sleep(warmup)
			before := sampleCost(c)
			began := time.Now()
			time.Sleep(duration)
			after := sampleCost(c)
			secs := time.Since(began).Seconds()
			share := (after.cpu - before.cpu).Seconds() / secs
			verdict := "within"
			if share > idleTarget {
				verdict = "over"
			}
			fmt.Printf("idle cluster of %d nodes, %s: CPU %.1f%% of one core (%s the %.0f%% target); extra Go processors %s\n",
				len(t.Nodes), time.Duration(secs*float64(time.Second)).Round(time.Millisecond), 100*share, verdict, 100*idleTarget,
				extraShare(before, after))
			fmt.Printf("per second: Raft proposals %.0f, log syncs %.0f, RPCs served %.0f, Raft messages %.0f (heartbeats and their replies %.0f)\n",
				(after.proposals-before.proposals)/secs, (after.syncs-before.syncs)/secs, (after.rpcs-before.rpcs)/secs,
				(after.raftMsgs-before.raftMsgs)/secs, (after.heartbeats-before.heartbeats)/secs)
			for _, r := range busiest(before.byMethod, after.byMethod, secs, top) {
				fmt.Printf("  %-32s %8.0f/s\n", r.method, r.n)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&config, "config", "", "topology file (default: the embedded examples/three-regions.yaml)")
	cmd.Flags().DurationVar(&warmup, "warmup", 3*time.Second, "how long the cluster settles before the measurement")
	cmd.Flags().DurationVar(&duration, "duration", 10*time.Second, "how long the measurement lasts")
	cmd.Flags().BoolVar(&insecure, "insecure", false, "run the embedded cluster without TLS (default: mutual TLS, as a deployment runs)")
	cmd.Flags().IntVar(&top, "top", 8, "how many RPC methods to list, busiest first")
	return cmd
}
