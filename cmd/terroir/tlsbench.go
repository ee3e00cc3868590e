package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/spf13/cobra"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/latency"
	"github.com/terroir-db/terroir/internal/localcluster"
	"github.com/terroir-db/terroir/internal/ycsb"
)

// benchTLSCmd measures what mutual TLS costs the commit path (issue 13's
// bound: at most 10% of regional write P50): the same regional write
// transactions on a cluster with TLS and on one without, in alternating
// rounds of one run, so the machine's drift falls on both alike.
func benchTLSCmd() *cobra.Command {
	var f benchFlags
	var rounds, clients int
	cmd := &cobra.Command{
		Use:   "tls",
		Short: "Regional write P50/P99 with mutual TLS and without, alternating rounds in one run",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			modes := []struct {
				name     string
				insecure bool
			}{{"mutual TLS", false}, {"plaintext", true}}
			hists := map[string]*latency.Histogram{}
			fails := map[string]int{}
			for r := range rounds {
				for i := range modes {
					m := modes[(i+r)%2] // alternate which goes first
					h, n, err := tlsRound(&f, m.insecure, clients)
					if err != nil {
						return fmt.Errorf("%s, round %d: %w", m.name, r+1, err)
					}
					if hists[m.name] == nil {
						hists[m.name] = latency.New()
					}
					hists[m.name].Merge(h)
					fails[m.name] += n
				}
			}
			total := time.Duration(rounds) * f.duration
			printHeader()
			for _, m := range modes {
				printRow(fmt.Sprintf("regional write, %s, %d client(s)", m.name, clients), hists[m.name], total, fails[m.name])
			}
			tlsP50, plainP50 := hists["mutual TLS"].Quantile(50), hists["plaintext"].Quantile(50)
			fmt.Printf("TLS / plaintext write P50: %.3f (bound: at most 1.10)\n", float64(tlsP50)/float64(max(plainP50, 1)))
			return nil
		},
	}
	f.register(cmd)
	_ = cmd.Flags().MarkHidden("insecure") // the benchmark runs both
	cmd.Flags().IntVar(&rounds, "rounds", 3, "rounds; each runs both clusters for --duration")
	cmd.Flags().IntVar(&clients, "clients", 1, "concurrent writers")
	return cmd
}

// tlsRound starts a fresh embedded cluster (with TLS unless insecure), warms
// it for a second and measures write transactions of random keys homed in
// its first region for f.duration.
func tlsRound(f *benchFlags, insecure bool, clients int) (*latency.Histogram, int, error) {
	top, err := loadTopology(f.config)
	if err != nil {
		return nil, 0, err
	}
	c, err := localcluster.Start(top, localcluster.Options{Insecure: insecure})
	if err != nil {
		return nil, 0, err
	}
	defer c.Close()
	region := c.Topology.Regions[0]
	keys, err := ycsb.RegionKeys(c.Topology, region)
	if err != nil {
		return nil, 0, err
	}
	db, err := c.Client(region)
	if err != nil {
		return nil, 0, err
	}
	write := func(ctx context.Context) error {
		return db.Update(ctx, func(ctx context.Context, tx *client.Txn) error {
			return tx.Put(ctx, keys.Key(rand.Uint64N(1000)), []byte("v"))
		})
	}
	runFor(time.Second, clients, write) // elections, leases, connections
	h, n := runFor(f.duration, clients, write)
	return h, n, nil
}
