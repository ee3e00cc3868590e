package main

import (
	"context"
	"fmt"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/admin"
	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/transport"
)

func adminCmd() *cobra.Command {
	var configPath string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "admin --config <topology.yaml> region exclude|include|list | range split|merge|transfer-lease|move|add-non-voter|remove-non-voter|rehome|list | gc show|ttl | node list|decommission|recommission | group move | placement set|remove|list",
		Short: "Operate a running cluster",
	}
	cmd.PersistentFlags().StringVar(&configPath, "config", "", "topology file of the running cluster")
	cmd.PersistentFlags().DurationVar(&timeout, "timeout", 10*time.Second, "give up after this long")
	_ = cmd.MarkPersistentFlagRequired("config")

	conn := addConnFlags(cmd)
	// with runs fn with the cluster's topology and a dialer into it.
	with := func(c *cobra.Command, fn func(ctx context.Context, d *transport.Dialer, top *topology.Topology) error) error {
		return conn.withConn(c, configPath, "", timeout, func(ctx context.Context, cn *clusterConn) error { return fn(ctx, cn.d, cn.top) })
	}
	// withClient runs fn with a client of the cluster, as with does.
	withClient := func(c *cobra.Command, fn func(ctx context.Context, db *client.DB) error) error {
		return conn.withClient(c, configPath, "", timeout, func(ctx context.Context, db *client.DB, _ *clusterConn) error { return fn(ctx, db) })
	}
	setExcluded := func(excluded bool) func(c *cobra.Command, args []string) error {
		return func(c *cobra.Command, args []string) error {
			return with(c, func(ctx context.Context, d *transport.Dialer, top *topology.Topology) error {
				if err := admin.SetRegionExcluded(ctx, d, top, args[0], excluded); err != nil {
					return err
				}
				verb := "included in"
				if excluded {
					verb = "excluded from"
				}
				fmt.Fprintf(c.OutOrStdout(), "%s %s the global epoch service's publisher set\n", args[0], verb)
				return nil
			})
		}
	}
	region := &cobra.Command{Use: "region", Short: "Exclude a cut-off region from the global epoch, or include it again"}
	region.AddCommand(
		&cobra.Command{
			Use:   "exclude <region>",
			Short: "Let the other regions' global epoch advance without this region (it stops serving once its lease lapses)",
			Args:  cobra.ExactArgs(1), RunE: setExcluded(true),
		},
		&cobra.Command{
			Use:   "include <region>",
			Short: "Make the global epoch service wait for this region again, once it has caught up",
			Args:  cobra.ExactArgs(1), RunE: setExcluded(false),
		},
		&cobra.Command{
			Use: "list", Short: "Print each region with a publisher and whether it is excluded", Args: cobra.NoArgs,
			RunE: func(c *cobra.Command, _ []string) error {
				return with(c, func(ctx context.Context, d *transport.Dialer, top *topology.Topology) error {
					regions, e, err := admin.Regions(ctx, d, top)
					if err != nil {
						return err
					}
					fmt.Fprintf(c.OutOrStdout(), "global epoch %d\n", e)
					for _, r := range regions {
						state := "included"
						if r.Excluded {
							state = "excluded since " + sinceEpoch(r.Since)
						}
						fmt.Fprintf(c.OutOrStdout(), "%s\tpublisher %d\t%s\n", r.Region, r.Publisher, state)
					}
					return nil
				})
			},
		},
	)
	rng := &cobra.Command{Use: "range", Short: "Change the shape of ranges, or move their leases and replicas"}
	rng.AddCommand(&cobra.Command{
		Use:   "split <key>",
		Short: "Split the range holding key at key: it keeps the keys below, a new range on the same replicas takes the rest",
		Long: "split asks the range's leader to split it at key (DESIGN.md §11). Transactions in flight\n" +
			"commit or abort cleanly; nothing moves on disk. A key that is empty, larger than 4 KiB or\n" +
			"already a range boundary is refused and nothing changes.",
		Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			return withClient(c, func(ctx context.Context, db *client.DB) error {
				left, right, err := db.AdminSplitRanges(ctx, []byte(args[0]))
				if err != nil {
					return err
				}
				fmt.Fprintf(c.OutOrStdout(), "split range %d at %q:\n", left.ID, args[0])
				printRange(c, "", left)
				printRange(c, "", right)
				return nil
			})
		},
	})
	rng.AddCommand(&cobra.Command{
		Use:   "merge <key>",
		Short: "Merge the range holding key with its right neighbour, which it absorbs",
		Long: "merge asks the range's leader to absorb the range that starts where it ends (DESIGN.md §11).\n" +
			"Both must be homed in one region and on the same nodes. Transactions in flight commit or\n" +
			"abort cleanly; nothing moves on disk. Merging the last range, or ranges of different home\n" +
			"regions or nodes, is refused and nothing changes.",
		Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			return withClient(c, func(ctx context.Context, db *client.DB) error {
				r, err := db.AdminMerge(ctx, []byte(args[0]))
				if err != nil {
					return err
				}
				printRange(c, "merged into ", r)
				return nil
			})
		},
	})
	rng.AddCommand(&cobra.Command{
		Use:   "transfer-lease <key> <node>",
		Short: "Hand the lease of the range holding key to node, another of its replicas, without waiting for it to run out",
		Long: "transfer-lease asks the range's leaseholder to hand its lease and Raft leadership to node\n" +
			"(DESIGN.md §12): it stops serving, lets transactions prepared or committing there finish,\n" +
			"and grants the node the next epochs with its highest epoch. Transactions holding only\n" +
			"unreplicated locks on the range abort. A node that is not a replica of the range, or\n" +
			"that holds the lease already, is refused and nothing changes.",
		Args: cobra.ExactArgs(2),
		RunE: func(c *cobra.Command, args []string) error {
			to, err := strconv.ParseUint(args[1], 10, 64)
			if err != nil || to == 0 {
				return fmt.Errorf("node %q is not a node id (a positive whole number)", args[1])
			}
			return withClient(c, func(ctx context.Context, db *client.DB) error {
				r, start, err := db.AdminTransferLease(ctx, []byte(args[0]), to)
				if err != nil {
					return err
				}
				fmt.Fprintf(c.OutOrStdout(), "node %d holds range %d's lease from local epoch %d\n", to, r.ID, start)
				return nil
			})
		},
	})
	rng.AddCommand(&cobra.Command{
		Use:   "move <key> <from-node> <to-node>",
		Short: "Move the replica of the range holding key from one node to another of its region",
		Long: "move asks the range's leaseholder to move its replica on from-node to to-node (DESIGN.md §12):\n" +
			"to-node joins as a learner, catches up by a snapshot streamed from a consistent storage\n" +
			"snapshot (rate-limited), and is promoted as from-node's replica is removed, in one joint\n" +
			"configuration change: the range keeps three voters throughout. A leaseholder's replica\n" +
			"hands its lease to another replica first. A from-node that is not a replica, or a\n" +
			"to-node that is one, is unknown, down or in another region, is refused and nothing changes.",
		Args: cobra.ExactArgs(3),
		RunE: func(c *cobra.Command, args []string) error {
			var ids [2]uint64
			for i, a := range args[1:] {
				id, err := strconv.ParseUint(a, 10, 64)
				if err != nil || id == 0 {
					return fmt.Errorf("node %q is not a node id (a positive whole number)", a)
				}
				ids[i] = id
			}
			return withClient(c, func(ctx context.Context, db *client.DB) error {
				r, err := db.AdminMoveReplica(ctx, []byte(args[0]), ids[0], ids[1])
				if err != nil {
					return err
				}
				printRange(c, "moved: ", r)
				return nil
			})
		},
	})
	for _, remove := range []bool{false, true} {
		use, short, long := "add-non-voter <key> <node>", "Add a non-voting replica of the range holding key on a node of any region",
			"add-non-voter asks the range's leaseholder to add a non-voting replica on node (DESIGN.md §13): a\n"+
				"learner that stays one, in any region, caught up by a snapshot streamed across the WAN.\n"+
				"It serves snapshot reads (strong, serializable) of clients in its region from its closed\n"+
				"epoch, with no call to the home region. A node that hosts the range already is refused."
		if remove {
			use, short, long = "remove-non-voter <key> <node>", "Remove the range's non-voting replica on a node",
				"remove-non-voter removes the non-voting replica on node of the range holding key, and the\n"+
					"node drops it. A node that hosts no non-voter of the range is refused."
		}
		rng.AddCommand(&cobra.Command{
			Use: use, Short: short, Long: long,
			Args: cobra.ExactArgs(2),
			RunE: func(c *cobra.Command, args []string) error {
				id, err := strconv.ParseUint(args[1], 10, 64)
				if err != nil || id == 0 {
					return fmt.Errorf("node %q is not a node id (a positive whole number)", args[1])
				}
				return withClient(c, func(ctx context.Context, db *client.DB) error {
					change, verb := db.AdminAddNonVoter, "added: "
					if remove {
						change, verb = db.AdminRemoveNonVoter, "removed: "
					}
					r, err := change(ctx, []byte(args[0]), id)
					if err != nil {
						return err
					}
					printRange(c, verb, r)
					return nil
				})
			},
		})
	}
	rng.AddCommand(&cobra.Command{
		Use:   "rehome <key> <region>",
		Short: "Move the home of the range holding key to another region",
		Long: "rehome moves the range holding key to region (DESIGN.md §13): nodes there join as non-voting\n" +
			"replicas and catch up while the range serves on; the leaseholder then stops, lets prepared\n" +
			"transactions be decided, ends its lease by a Raft entry recording the rehome barrier, and the\n" +
			"region's replicas become the voters. Its writes then commit at that region's latency.",
		Args: cobra.ExactArgs(2),
		RunE: func(c *cobra.Command, args []string) error {
			return withClient(c, func(ctx context.Context, db *client.DB) error {
				r, barrier, err := db.AdminRehome(ctx, []byte(args[0]), args[1])
				if err != nil {
					return err
				}
				printRange(c, fmt.Sprintf("rehomed (barrier at global epoch %d): ", barrier), r)
				return nil
			})
		},
	})
	rng.AddCommand(&cobra.Command{
		Use:   "list",
		Short: "Print every range: id, span, home region, replicas, leaseholder, lease, closed epoch, generation, size, load",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return with(c, func(ctx context.Context, d *transport.Dialer, top *topology.Topology) error {
				ranges, down, err := admin.Ranges(ctx, d, top)
				if err != nil && len(ranges) == 0 {
					return err
				}
				w := tabwriter.NewWriter(c.OutOrStdout(), 2, 4, 2, ' ', 0)
				fmt.Fprintln(w, "id\tspan\tregion\treplicas\tleaseholder\tlease\tclosed\tgeneration\tsize\tload")
				for _, r := range ranges {
					d, l := r.GetRangeDescriptor(), r.GetLease()
					load := "-"
					if r.GetLeader() {
						load = fmt.Sprintf("%.0f/s", r.GetQps())
					}
					replicas := fmt.Sprint(d.GetReplicas())
					if nv := d.GetNonVoters(); len(nv) > 0 {
						replicas += fmt.Sprintf("+non-voters%v", nv)
					}
					fmt.Fprintf(w, "%d\t[%q, %q)\t%s\t%s\t%d\t[%d, %d]\t%d\t%d\t%s\t%s\n", d.GetRangeId(), d.GetStartKey(), d.GetEndKey(),
						d.GetRegion(), replicas, l.GetHolder(), l.GetStart(), l.GetEnd(), r.GetClosedEpoch(), d.GetGeneration(), humanBytes(r.GetSizeBytes()), load)
				}
				if err := w.Flush(); err != nil {
					return err
				}
				if len(down) > 0 {
					fmt.Fprintf(c.OutOrStdout(), "nodes not answering: %v\n", down)
				}
				return nil
			})
		},
	})
	cmd.AddCommand(region, rng, adminGCCmd(with), adminNodeCmd(with), adminGroupCmd(with), adminPlacementCmd(withClient))
	return cmd
}

// printRange prints one range's descriptor on a line, after prefix.
func printRange(c *cobra.Command, prefix string, r client.RangeInfo) {
	nv := ""
	if len(r.NonVoters) > 0 {
		nv = fmt.Sprintf("\tnon-voters %v", r.NonVoters)
	}
	fmt.Fprintf(c.OutOrStdout(), "%srange %d\t[%q, %q)\t%s\treplicas %v%s\tgeneration %d\n", prefix, r.ID, r.Start, r.End, r.Region, r.Replicas, nv, r.Generation)
}

// coordinatorRegion is a region an operator's client can run from: the first
// with a local epoch and a transaction state store.

func coordinatorRegion(top *topology.Topology) string {
	for _, r := range top.Regions {
		if len(top.GroupsOfKind(topology.KindLocalEpoch, r)) > 0 && len(top.GroupsOfKind(topology.KindTxnState, r)) > 0 {
			return r
		}
	}
	return top.Regions[0]
}

// humanBytes renders n bytes as B, KiB, MiB or GiB.
func humanBytes(n uint64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
