package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/terroir-db/terroir/internal/experiment"
)

func benchPaperCmd() *cobra.Command {
	f := experimentFlags{defaultDuration: 10 * time.Second}
	var out string
	cmd := &cobra.Command{
		Use:   "paper",
		Short: "The paper's §6.2 run: regional YCSB-A in two regions and a strong multi-region snapshot every 100 ms",
		Long: `paper runs the experiment of the paper's §6.2 on the embedded three-region
cluster (examples/three-regions.yaml unless --config), as demo does but
without the live view: YCSB-A (50% reads, 50% updates, uniform) from
--threads client threads in each data region on keys homed there, while a
client in the last data region (us-west1) runs a strong snapshot reading one
key per data region every 100 ms. It prints the global epoch interval, the
snapshots' epoch wait and total time, and the regional transactions'
latencies, beside the paper's figures, and with --out writes the report.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			top, err := f.topology()
			if err != nil {
				return err
			}
			cfg := f.cfg
			cfg.Topology = top
			res, err := experiment.Run(cmd.Context(), cfg, nil)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "The paper's §6.2 on this machine: %v, %d YCSB-A threads per data region, a strong snapshot from %s every 100 ms\n\n",
				cfg.Duration, cfg.Threads, res.SnapshotRegion)
			res.WriteTable(w)
			if out != "" {
				report, err := res.WriteReport(out)
				if err != nil {
					return err
				}
				fmt.Fprintf(w, "\nReport: %s\n", report)
			}
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().StringVar(&out, "out", "", "directory to write the report into (default: none)")
	return cmd
}
