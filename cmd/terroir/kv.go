package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/terroir-db/terroir/client"
)

func kvCmd() *cobra.Command {
	var configPath, region, snapshot, followers string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "kv --config <topology.yaml> get|put|del|scan ...",
		Short: "Read and write keys of a running cluster, one transaction per command",
	}
	cmd.PersistentFlags().StringVar(&configPath, "config", "", "topology file of the running cluster")
	cmd.PersistentFlags().StringVar(&region, "region", "", "the client's region (default: the only region)")
	cmd.PersistentFlags().DurationVar(&timeout, "timeout", 10*time.Second, "give up after this long")
	cmd.PersistentFlags().StringVar(&snapshot, "snapshot", "", "get and scan: read in a lock-free snapshot of this mode "+
		"(strong, strong-local, linearizable, serializable, serializable-stale, regional) instead of a read-write transaction")
	cmd.PersistentFlags().StringVar(&followers, "follower-reads", "nearest", "with --snapshot: which replica serves the reads (DESIGN.md §13): "+
		"nearest (serializable ones from the nearest replica, a non-voter in this region first), preferred (strong ones too, followers before the leader), off (the leader)")
	_ = cmd.MarkPersistentFlagRequired("config")
	conn := addConnFlags(cmd)
	conn.askRegion = true

	// with runs fn with a client of the cluster and a context bounded by --timeout.
	with := func(c *cobra.Command, fn func(ctx context.Context, db *client.DB) error) error {
		return conn.withClient(c, configPath, region, timeout, func(ctx context.Context, db *client.DB, _ *clusterConn) error { return fn(ctx, db) })
	}
	// do runs fn in a retried transaction against the cluster.
	do := func(c *cobra.Command, fn func(ctx context.Context, tx *client.Txn) error) error {
		return with(c, func(ctx context.Context, db *client.DB) error { return db.Update(ctx, fn) })
	}
	// read runs fn in a snapshot of the --snapshot mode, or a read-write
	// transaction without it.
	read := func(c *cobra.Command, fn func(ctx context.Context, r kvReader) error) error {
		if snapshot == "" {
			return do(c, func(ctx context.Context, tx *client.Txn) error { return fn(ctx, tx) })
		}
		mode, err := client.ParseSnapshotMode(snapshot)
		if err != nil {
			return err
		}
		policy, err := client.ParseFollowerReads(followers)
		if err != nil {
			return err
		}
		return with(c, func(ctx context.Context, db *client.DB) error {
			db.SetFollowerReads(policy)
			stats, err := db.View(ctx, mode, func(ctx context.Context, s *client.Snapshot) error { return fn(ctx, s) })
			if err == nil {
				ran := stats.Mode.String()
				if stats.Requested != stats.Mode {
					ran += fmt.Sprintf(" (asked %v)", stats.Requested)
				}
				fmt.Fprintf(c.ErrOrStderr(), "snapshot %s at epoch %d: waited %v for the epoch, %v for locks, %d retries; %d reads served by followers, %d went on to the leader\n",
					ran, stats.Epoch, stats.EpochWait.Round(time.Microsecond), stats.LockWait.Round(time.Microsecond), stats.Retries,
					stats.FollowerReads, stats.FollowerFallbacks)
			}
			return err
		})
	}
	errNotFound := errors.New("key not found")

	get := &cobra.Command{
		Use: "get <key>", Short: "Print a key's value alone on the last line (exit 1 if absent)", Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			var value []byte
			err := read(c, func(ctx context.Context, tx kvReader) error {
				v, ok, err := tx.Get(ctx, []byte(args[0]))
				if err == nil && !ok {
					err = errNotFound
				}
				value = v
				return err
			})
			if err != nil {
				return err
			}
			fmt.Fprintln(c.OutOrStdout(), string(value))
			return nil
		},
	}
	put := &cobra.Command{
		Use: "put <key> <value>", Short: "Set a key", Args: cobra.ExactArgs(2),
		RunE: func(c *cobra.Command, args []string) error {
			return do(c, func(ctx context.Context, tx *client.Txn) error {
				return tx.Put(ctx, []byte(args[0]), []byte(args[1]))
			})
		},
	}
	del := &cobra.Command{
		Use: "del <key>", Short: "Delete a key", Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			return do(c, func(ctx context.Context, tx *client.Txn) error {
				return tx.Delete(ctx, []byte(args[0]))
			})
		},
	}
	var limit int
	scan := &cobra.Command{
		Use: "scan <lo> [<hi>]", Short: "Print key<TAB>value for lo ≤ key < hi (hi omitted: to the end)", Args: cobra.RangeArgs(1, 2),
		RunE: func(c *cobra.Command, args []string) error {
			var hi []byte
			if len(args) == 2 {
				hi = []byte(args[1])
			}
			var kvs []client.KeyValue
			err := read(c, func(ctx context.Context, tx kvReader) error {
				var err error
				kvs, err = tx.Scan(ctx, []byte(args[0]), hi, limit)
				return err
			})
			if err != nil {
				return err
			}
			for _, kv := range kvs {
				fmt.Fprintf(c.OutOrStdout(), "%s\t%s\n", kv.Key, kv.Value)
			}
			return nil
		},
	}
	scan.Flags().IntVar(&limit, "limit", 0, "at most this many pairs (0: all)")
	cmd.AddCommand(get, put, del, scan)
	return cmd
}

// kvReader is what get and scan need: a read-write transaction or a snapshot.
type kvReader interface {
	Get(ctx context.Context, key []byte) ([]byte, bool, error)
	Scan(ctx context.Context, lo, hi []byte, limit int) ([]client.KeyValue, error)
}
