package main

import (
	"context"
	"fmt"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/terroir-db/terroir/internal/admin"
	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/transport"
)

// adminGroupCmd is `terroir admin group`: the replicas of the epoch,
// transaction-state and directory groups (DESIGN.md §12).
func adminGroupCmd(with withCluster) *cobra.Command {
	groupCmd := &cobra.Command{Use: "group", Short: "Move the replicas of epoch, transaction-state and directory groups"}
	groupCmd.AddCommand(&cobra.Command{
		Use:   "move <group-id> <from-node> <to-node>",
		Short: "Move a non-range group's replica from one node to another of its region",
		Long: "move asks the group's leader to move its replica on from-node to to-node (DESIGN.md §12), as\n" +
			"range move does for a range: to-node joins as a learner, catches up by a snapshot, and is\n" +
			"promoted as from-node's replica is removed, in one joint configuration change. A leader's own\n" +
			"replica hands leadership on first. A range, an unknown group, a from-node that is not a voter,\n" +
			"or a to-node that is one or is in another region, is refused and nothing changes.",
		Args: cobra.ExactArgs(3),
		RunE: func(c *cobra.Command, args []string) error {
			var ids [3]uint64
			for i, a := range args {
				id, err := strconv.ParseUint(a, 10, 64)
				if err != nil || id == 0 {
					return fmt.Errorf("%w: %q is not an id (a positive whole number)", admin.ErrBadGroupMove, a)
				}
				ids[i] = id
			}
			return with(c, func(ctx context.Context, d *transport.Dialer, top *topology.Topology) error {
				voters, err := admin.MoveGroupReplica(ctx, d, top, ids[0], ids[1], ids[2])
				if err != nil {
					return err
				}
				fmt.Fprintf(c.OutOrStdout(), "moved: group %d's voters are now %v\n", ids[0], voters)
				return nil
			})
		},
	})
	return groupCmd
}
