package main

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/terroir-db/terroir/internal/directory"
	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/transport"
)

// withCluster runs fn with the cluster's topology and a dialer into it.
type withCluster func(c *cobra.Command, fn func(ctx context.Context, d *transport.Dialer, top *topology.Topology) error) error

// adminGCCmd is `terroir admin gc`: the GC policy of every region
// (DESIGN.md §14).
func adminGCCmd(with withCluster) *cobra.Command {
	gc := &cobra.Command{Use: "gc", Short: "Show or change how long old versions stay readable (gc_ttl) and the protections of long snapshots"}
	gc.AddCommand(&cobra.Command{
		Use:   "show",
		Short: "Print each region's gc_ttl and the protections of backups and changefeeds",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return with(c, func(ctx context.Context, d *transport.Dialer, top *topology.Topology) error {
				dirs := directory.NewDirectories(top, d)
				w := tabwriter.NewWriter(c.OutOrStdout(), 2, 4, 2, ' ', 0)
				fmt.Fprintln(w, "region\tgc_ttl\tprotection\tepoch\tidle\tttl\tstate\tholder")
				for _, r := range dirs.Regions() {
					pol, err := dirs.Of(r).GCPolicy(ctx)
					if err != nil {
						return fmt.Errorf("%s: %w", r, err)
					}
					ttl := fmt.Sprintf("%v (topology)", top.GCTTL)
					if ms := pol.GetGcTtlMs(); ms > 0 {
						ttl = (time.Duration(ms) * time.Millisecond).String()
					}
					if len(pol.GetProtections()) == 0 {
						fmt.Fprintf(w, "%s\t%s\t-\t\t\t\t\t\n", r, ttl)
					}
					for _, s := range pol.GetProtections() {
						p, state := s.GetProtection(), "live"
						if s.GetExpired() {
							state = "expired"
						}
						fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%v\t%v\t%s\t%s\n", r, ttl, p.GetId(), p.GetEpoch(),
							time.Duration(s.GetIdleMs())*time.Millisecond, time.Duration(p.GetTtlMs())*time.Millisecond, state, p.GetDescription())
					}
				}
				return w.Flush()
			})
		},
	})
	gc.AddCommand(&cobra.Command{
		Use:   "ttl <duration|default>",
		Short: "Set every region's gc_ttl at run time (default: back to the topology file's)",
		Long: "ttl sets how long a replaced version stays readable, in every region's directory; range\n" +
			"leaders apply it within seconds. A snapshot older than the gc_ttl may fail with\n" +
			"ErrSnapshotTooOld. Below " + topology.MinGCTTL.String() + " or above a year is refused and nothing changes.",
		Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			var ttl time.Duration
			if args[0] != "default" {
				var err error
				if ttl, err = time.ParseDuration(args[0]); err != nil {
					return fmt.Errorf("%w: %q is not a duration (e.g. 4h, 90m) or \"default\"", directory.ErrBadGCTTL, args[0])
				}
				if ttl == 0 {
					return fmt.Errorf("%w: 0; say \"default\" for the topology file's", directory.ErrBadGCTTL)
				}
			}
			return with(c, func(ctx context.Context, d *transport.Dialer, top *topology.Topology) error {
				if err := directory.NewDirectories(top, d).SetGCTTL(ctx, ttl); err != nil {
					return err
				}
				if ttl == 0 {
					fmt.Fprintf(c.OutOrStdout(), "gc_ttl is the topology file's (%v) in every region\n", top.GCTTL)
				} else {
					fmt.Fprintf(c.OutOrStdout(), "gc_ttl is %v in every region\n", ttl)
				}
				return nil
			})
		},
	})
	return gc
}
