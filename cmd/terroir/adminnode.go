package main

import (
	"context"
	"fmt"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/terroir-db/terroir/internal/admin"
	"github.com/terroir-db/terroir/internal/directory"
	"github.com/terroir-db/terroir/internal/directory/directorypb"
	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/transport"
)

// adminNodeCmd is `terroir admin node`: the node registry (DESIGN.md §12).
func adminNodeCmd(with withCluster) *cobra.Command {
	nodeCmd := &cobra.Command{Use: "node", Short: "List the cluster's nodes, or decommission one"}
	nodeCmd.AddCommand(&cobra.Command{
		Use:   "list",
		Short: "Print every registered node: id, region, address, state, liveness, replica and lease counts",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return with(c, func(ctx context.Context, d *transport.Dialer, top *topology.Topology) error {
				rows, err := admin.Nodes(ctx, d, top)
				if err != nil {
					return err
				}
				w := tabwriter.NewWriter(c.OutOrStdout(), 2, 4, 2, ' ', 0)
				fmt.Fprintln(w, "id\tregion\taddress\tstate\tliveness\treplicas\tranges\tleases")
				for _, r := range rows {
					live := "live"
					if !r.Live {
						live = fmt.Sprintf("not live (%v)", r.SinceHeartbeat.Round(time.Millisecond))
					}
					replicas, ranges, leases := strconv.Itoa(r.Replicas), strconv.Itoa(r.Ranges), strconv.Itoa(r.Leases)
					if r.Replicas < 0 {
						replicas, ranges, leases = "-", "-", "-"
					}
					fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, r.Region, r.Addr, r.State, live, replicas, ranges, leases)
				}
				return w.Flush()
			})
		},
	})
	setState := func(state directorypb.NodeState, done string) func(c *cobra.Command, args []string) error {
		return func(c *cobra.Command, args []string) error {
			id, err := strconv.ParseUint(args[0], 10, 64)
			if err != nil || id == 0 {
				return fmt.Errorf("%w: %q is not a node id", directory.ErrUnknownNode, args[0])
			}
			return with(c, func(ctx context.Context, d *transport.Dialer, top *topology.Topology) error {
				rows, err := admin.Nodes(ctx, d, top)
				if err != nil {
					return err
				}
				for _, r := range rows {
					if r.ID != id {
						continue
					}
					if err := admin.SetNodeState(ctx, d, top, r.Region, id, state); err != nil {
						return err
					}
					fmt.Fprintf(c.OutOrStdout(), "node %d (%s) %s\n", id, r.Region, done)
					return nil
				}
				return fmt.Errorf("%w: node %d", directory.ErrUnknownNode, id)
			})
		}
	}
	nodeCmd.AddCommand(&cobra.Command{
		Use:   "decommission <id>",
		Short: "Move every replica and lease off a node, then mark it gone",
		Long: "decommission marks the node decommissioning: its region's replicate queue moves its range\n" +
			"replicas and leases to the region's other live nodes and then marks it gone (see `admin node\n" +
			"list`). It is refused, and nothing changes, when the region would keep fewer than " + strconv.Itoa(directory.MinLiveNodes) + "\n" +
			"live nodes.",
		Args: cobra.ExactArgs(1),
		RunE: setState(directorypb.NodeState_NODE_DECOMMISSIONING, "is decommissioning: its replicas and leases are moving off"),
	})
	nodeCmd.AddCommand(&cobra.Command{
		Use:   "recommission <id>",
		Short: "Take a decommissioning node back into service",
		Args:  cobra.ExactArgs(1),
		RunE:  setState(directorypb.NodeState_NODE_LIVE, "is live again"),
	})
	return nodeCmd
}
