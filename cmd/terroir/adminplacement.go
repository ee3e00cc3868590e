package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/terroir-db/terroir/client"
)

// withDB runs fn with a client of the running cluster.
type withDB func(c *cobra.Command, fn func(ctx context.Context, db *client.DB) error) error

// adminPlacementCmd is `terroir admin placement`: the operator's placement
// rules (DESIGN.md §13).
func adminPlacementCmd(withClient withDB) *cobra.Command {
	cmd := &cobra.Command{Use: "placement", Short: "Declare where key spans live: homed in a region, by row, or global"}
	var home string
	var byRow, global bool
	set := &cobra.Command{
		Use:   "set <prefix> (--home <region> | --by-row | --global --home <region>)",
		Short: "Set the placement rule of the keys that start with prefix",
		Long: "set declares where the keys that start with prefix live (DESIGN.md §13), replacing the rule\n" +
			"with the same prefix:\n" +
			"  --home R           every key is homed in region R (REGIONAL BY TABLE);\n" +
			"  --by-row           each key's first component after the prefix, up to '/', names its home\n" +
			"                     region: <prefix>us-east1/42 (REGIONAL BY ROW); a write of a key whose\n" +
			"                     component is not a region with data is refused;\n" +
			"  --global --home R  homed in R, with a non-voting replica in every other region serving\n" +
			"                     snapshot reads there (GLOBAL).\n" +
			"Rules never overlap: a prefix of another rule's prefix, or one extending it, is refused.\n" +
			"`placement list` shows whether the ranges already match each rule.",
		Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			r := client.PlacementRule{Prefix: []byte(args[0]), Home: home}
			switch {
			case byRow && (global || home != ""):
				return errors.New("--by-row takes neither --home nor --global: each key names its region")
			case byRow:
				r.Kind = client.PlacementByRow
			case home == "":
				return errors.New("say where: --home <region>, --by-row, or --global --home <region>")
			case global:
				r.Kind = client.PlacementGlobal
			}
			return withClient(c, func(ctx context.Context, db *client.DB) error {
				if err := db.SetPlacement(ctx, r); err != nil {
					return err
				}
				fmt.Fprintf(c.OutOrStdout(), "placement %q: %s\n", r.Prefix, describeRule(r))
				return nil
			})
		},
	}
	set.Flags().StringVar(&home, "home", "", "the home region")
	set.Flags().BoolVar(&byRow, "by-row", false, "each key's first component after the prefix names its home region")
	set.Flags().BoolVar(&global, "global", false, "homed in --home, with a non-voting replica in every other region")
	remove := &cobra.Command{
		Use:   "remove <prefix>",
		Short: "Remove the placement rule with prefix (the data stays where it is)",
		Args:  cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			return withClient(c, func(ctx context.Context, db *client.DB) error {
				if err := db.RemovePlacement(ctx, []byte(args[0])); err != nil {
					return err
				}
				fmt.Fprintf(c.OutOrStdout(), "placement %q removed\n", args[0])
				return nil
			})
		},
	}
	list := &cobra.Command{
		Use:   "list",
		Short: "Print the placement rules and whether the ranges match each",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return withClient(c, func(ctx context.Context, db *client.DB) error {
				sts, err := db.Placements(ctx)
				if err != nil {
					return err
				}
				w := tabwriter.NewWriter(c.OutOrStdout(), 2, 4, 2, ' ', 0)
				fmt.Fprintln(w, "prefix\tplacement\tdata")
				for _, st := range sts {
					data := "matches"
					if len(st.Problems) > 0 {
						data = strings.Join(st.Problems, "; ")
					}
					fmt.Fprintf(w, "%q\t%s\t%s\n", st.Rule.Prefix, describeRule(st.Rule), data)
				}
				return w.Flush()
			})
		},
	}
	cmd.AddCommand(set, remove, list)
	return cmd
}

// describeRule renders a rule as the CLI's flags say it.
func describeRule(r client.PlacementRule) string {
	switch r.Kind {
	case client.PlacementByRow:
		return "by row"
	case client.PlacementGlobal:
		return "global, home " + r.Home
	}
	return "home " + r.Home
}
