package main

import (
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/terroir-db/terroir/internal/security"
)

// certCmd makes the cluster's certificates (DESIGN.md §15), laid out as
// CockroachDB's certs/ directory is.
func certCmd() *cobra.Command {
	var certsDir, caKey string
	var lifetime time.Duration
	var overwrite bool
	cmd := &cobra.Command{
		Use:   "cert create-ca | create-node <id> <region> [host...] | create-client <user>",
		Short: "Create the cluster CA and node and client certificates (ECDSA P-256)",
		Long: "cert writes into --certs-dir: ca.crt (every node and client needs it), node.crt/node.key\n" +
			"for a node, client.<user>.crt/.key for a user. The CA's key goes to --ca-key (default\n" +
			"<certs-dir>/ca.key); keep it off the nodes. The admin user (" + security.AdminUser + ") may run operator actions;\n" +
			"other users may run transactions, snapshots and changefeeds. A node reloads its files when\n" +
			"they change (within a second of its next handshake): rotate by writing new ones in place.",
	}
	fs := cmd.PersistentFlags()
	fs.StringVar(&certsDir, "certs-dir", "certs", "directory to write the certificates into")
	fs.StringVar(&caKey, "ca-key", "", "the CA's private key (default: <certs-dir>/ca.key)")
	fs.DurationVar(&lifetime, "lifetime", 0, "how long the certificate is valid (default: 10 years for the CA, 5 for the others)")
	fs.BoolVar(&overwrite, "overwrite", false, "replace existing files")
	opts := func() security.CreateOptions { return security.CreateOptions{Lifetime: lifetime, Overwrite: overwrite} }

	cmd.AddCommand(&cobra.Command{
		Use:   "create-ca",
		Short: "Create the cluster CA: ca.crt and its key",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if err := security.CreateCA(certsDir, caKey, opts()); err != nil {
				return err
			}
			fmt.Fprintf(c.OutOrStdout(), "created the CA in %s\n", certsDir)
			return nil
		},
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "create-node <node-id> <region> [host...]",
		Short: "Create node.crt and node.key for a node of a region, valid for its hosts (default localhost, 127.0.0.1)",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(c *cobra.Command, args []string) error {
			id, err := strconv.ParseUint(args[0], 10, 64)
			if err != nil || id == 0 {
				return fmt.Errorf("%w: node id %q: want a number > 0", security.ErrInvalid, args[0])
			}
			if err := security.CreateNode(certsDir, caKey, id, args[1], args[2:], opts()); err != nil {
				return err
			}
			fmt.Fprintf(c.OutOrStdout(), "created the certificate of node %d (%s) in %s\n", id, args[1], certsDir)
			return nil
		},
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "create-client <user>",
		Short: "Create client.<user>.crt and .key",
		Args:  cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			if err := security.CreateClient(certsDir, caKey, args[0], opts()); err != nil {
				return err
			}
			fmt.Fprintf(c.OutOrStdout(), "created the certificate of user %s in %s\n", args[0], certsDir)
			return nil
		},
	})
	return cmd
}
