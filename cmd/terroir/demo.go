package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/terroir-db/terroir/examples"
	"github.com/terroir-db/terroir/internal/latency"
	"github.com/terroir-db/terroir/internal/localcluster"
	"github.com/terroir-db/terroir/internal/topology"
)

// loadTopology reads path, or the embedded one-region example if path is empty.
func loadTopology(path string) (*topology.Topology, error) {
	if path == "" {
		return topology.Parse(examples.OneRegion)
	}
	return topology.Load(path)
}

func demoCmd() *cobra.Command {
	var configPath string
	var duration time.Duration
	var readers int
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Start a three-node cluster in this process and watch the local epoch advance",
		Long: `demo starts the cluster of the topology file (default: the embedded
examples/one-region.yaml) inside this process — real Raft groups, real Pebble
directories in a temporary directory, real gRPC on 127.0.0.1 — and shows, every
second, the region's local epoch and the latency of linearizable ReadEpoch calls
made by concurrent clients. It stops after --duration or on Ctrl-C.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			top, err := loadTopology(configPath)
			if err != nil {
				return err
			}
			groups := top.GroupsOfKind(topology.KindLocalEpoch, "")
			if len(groups) == 0 {
				return fmt.Errorf("the topology has no local epoch group")
			}
			region := groups[0].Region
			fmt.Printf("Starting %d nodes in %d region(s); local epoch every %v.\n", len(top.Nodes), len(top.Regions), top.LocalEpochInterval)
			c, err := localcluster.Start(top, localcluster.Options{})
			if err != nil {
				return err
			}
			defer c.Close()
			reader, err := c.EpochReader(region)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			ctx, cancel := context.WithTimeout(ctx, duration)
			defer cancel()

			var mu sync.Mutex
			window, total := latency.New(), latency.New()
			var wg sync.WaitGroup
			for i := 0; i < readers; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for ctx.Err() == nil {
						start := time.Now()
						if _, err := reader.Read(ctx); err != nil {
							continue
						}
						d := time.Since(start)
						mu.Lock()
						window.Record(d)
						total.Record(d)
						mu.Unlock()
						time.Sleep(time.Millisecond)
					}
				}()
			}
			fmt.Printf("%-8s %-8s %-7s %-10s %-10s %-10s\n", "time", "epoch", "leader", "reads/s", "p50", "p99")
			tick := time.NewTicker(time.Second)
			defer tick.Stop()
			began := time.Now()
			for done := false; !done; {
				select {
				case <-ctx.Done():
					done = true
				case <-tick.C:
				}
				rctx, rcancel := context.WithTimeout(context.Background(), 2*time.Second)
				e, err := reader.Read(rctx)
				rcancel()
				epochStr := fmt.Sprint(e)
				if err != nil {
					epochStr = "?"
				}
				mu.Lock()
				w := window
				window = latency.New()
				mu.Unlock()
				if done && w.Count() == 0 {
					break // the run ended right after the last line
				}
				fmt.Printf("%-8s %-8s %-7d %-10d %-10s %-10s\n", time.Since(began).Round(time.Second), epochStr,
					c.Leader(groups[0].ID), w.Count(), latency.MS(w.Quantile(50)), latency.MS(w.Quantile(99)))
			}
			wg.Wait()
			rounds, splits := reader.Stats()
			fmt.Printf("\nReadEpoch over %v from %d clients: %s\n", time.Since(began).Round(time.Millisecond), readers, total.Summary())
			fmt.Printf("Batched into %d rounds of one request per replica (%d retried after a split reply).\n", rounds, splits)
			fmt.Fprintln(os.Stderr, "demo: stopping the cluster and removing its data directory")
			return nil
		},
	}
	cmd.Flags().StringVar(&configPath, "config", "", "topology file (default: the embedded examples/one-region.yaml)")
	cmd.Flags().DurationVar(&duration, "duration", 10*time.Second, "how long to run")
	cmd.Flags().IntVar(&readers, "readers", 8, "concurrent ReadEpoch clients")
	return cmd
}
