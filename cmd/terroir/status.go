package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/terroir-db/terroir/internal/admin"
)

func statusCmd() *cobra.Command {
	var cluster string
	var asJSON bool
	var timeout time.Duration
	var conn *connFlags
	cmd := &cobra.Command{
		Use:   "status --cluster <topology.yaml> [--json]",
		Short: "Show the cluster: nodes up or down, Raft groups and replica lag, range leases, epochs, excluded regions",
		Long: "status asks every node at once (each has 1 s to answer; one that does not is down) and prints\n" +
			"nodes (region, address, up or down, version), every Raft group (kind, leader, term, applied\n" +
			"index, each replica's lag behind the leader's commit index), range leases (holder, interval,\n" +
			"epochs left), each region's local epoch, the global epoch, each publisher's epoch and\n" +
			"freshness, and excluded regions. --json prints the same as one JSON object.",
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			cn, err := conn.dial(cluster, "") // no Reach: every node down is a status to print
			if err != nil {
				return err
			}
			defer cn.Close()
			ctx, cancel := context.WithTimeout(c.Context(), timeout)
			defer cancel()
			st, err := admin.Status(ctx, cn.d, cn.top)
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(c.OutOrStdout())
				enc.SetIndent("", "  ")
				if err := enc.Encode(st); err != nil {
					return err
				}
			} else {
				printStatus(c, st)
			}
			for _, n := range st.Nodes {
				if n.Up {
					return nil
				}
			}
			var tried []string
			for _, n := range st.Nodes {
				tried = append(tried, fmt.Sprintf("node %d at %s: %s", n.ID, n.Addr, n.Error))
			}
			return &admin.NoNodeError{Topology: cluster, Tried: tried}
		},
	}
	cmd.Flags().StringVar(&cluster, "cluster", "", "topology file of the running cluster")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON instead of tables")
	cmd.Flags().DurationVar(&timeout, "timeout", 10*time.Second, "give up after this long")
	conn = addConnFlags(cmd)
	_ = cmd.MarkFlagRequired("cluster")
	return cmd
}

func printStatus(c *cobra.Command, st *admin.ClusterStatus) {
	w := tabwriter.NewWriter(c.OutOrStdout(), 0, 4, 2, ' ', 0)
	defer w.Flush()
	fmt.Fprintln(w, "NODE\tREGION\tADDRESS\tSTATE\tVERSION / WHY DOWN")
	for _, n := range st.Nodes {
		state, detail := "up", n.Version
		if !n.Up {
			state, detail = "DOWN", n.Error
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\n", n.ID, n.Region, n.Addr, state, detail)
	}
	fmt.Fprintln(w)
	if st.GlobalEpoch > 0 {
		fmt.Fprintf(w, "global epoch %d\n", st.GlobalEpoch)
	}
	fmt.Fprintln(w, "REGION\tLOCAL EPOCH\tPUBLISHER EPOCH\tPUBLISHER FRESHNESS\tEXCLUDED")
	for _, r := range st.Regions {
		pub, fresh, excl := "-", "-", "no"
		if r.PublisherEpoch > 0 {
			pub = fmt.Sprint(r.PublisherEpoch)
		}
		if r.PublisherAgeMS > 0 {
			fresh = fmt.Sprintf("%d ms ago", r.PublisherAgeMS)
		}
		if r.Excluded {
			excl = "since " + sinceEpoch(r.ExcludedSince)
		}
		fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s\n", r.Name, r.LocalEpoch, pub, fresh, excl)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "GROUP\tKIND\tREGION\tLEADER\tTERM\tAPPLIED\tREPLICA LAG (entries)")
	for _, g := range st.Groups {
		var lags []string
		for _, r := range g.Replicas {
			lags = append(lags, fmt.Sprintf("n%d:%d", r.Node, r.Lag))
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%d\t%d\t%s\n", g.ID, g.Kind, g.Region, nodeOrNone(g.Leader), g.Term, g.Applied, strings.Join(lags, " "))
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "RANGE\tSPAN\tREGION\tLEADER\tLEASE\tEPOCHS LEFT\tCLOSED EPOCH")
	for _, r := range st.Ranges {
		left := "-"
		if r.EpochsLeft != nil {
			left = fmt.Sprint(*r.EpochsLeft)
		}
		end := r.End
		if end == "" {
			end = "∞"
		}
		fmt.Fprintf(w, "%d\t[%q, %s)\t%s\t%s\tnode %d [%d, %d)\t%s\t%d\n", r.ID, r.Start, end, r.Region, nodeOrNone(r.Leader),
			r.LeaseHolder, r.LeaseStart, r.LeaseEnd, left, r.ClosedEpoch)
	}
}

func nodeOrNone(id uint64) string {
	if id == 0 {
		return "none"
	}
	return fmt.Sprintf("node %d", id)
}

// sinceEpoch names the global epoch of an exclusion; 0 is one made before
// the epochs were recorded.
func sinceEpoch(e uint64) string {
	if e == 0 {
		return "an unrecorded epoch"
	}
	return fmt.Sprintf("epoch %d", e)
}
