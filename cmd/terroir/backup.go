package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/backup"
	"github.com/terroir-db/terroir/internal/directory"
)

// progressBar draws a backup's or restore's progress on one line of w.
func progressBar(w io.Writer, verb string, began time.Time) backup.Progress {
	return func(done, total, keys int, bytes int64) {
		const width = 30
		filled := width * done / max(total, 1)
		bar := make([]byte, width)
		for i := range bar {
			bar[i] = '.'
			if i < filled {
				bar[i] = '#'
			}
		}
		secs := max(time.Since(began).Seconds(), 1e-3)
		fmt.Fprintf(w, "\r%s [%s] %d/%d ranges, %d keys, %s (%.1f MB/s)", verb, bar, done, total, keys, humanBytes(uint64(bytes)), float64(bytes)/1e6/secs)
		if done == total {
			fmt.Fprintln(w)
		}
	}
}

func backupCmd() *cobra.Command {
	var cluster, to, base string
	var timeout time.Duration
	var conn *connFlags
	cmd := &cobra.Command{
		Use:   "backup --cluster <topology.yaml> --to <dir> [--incremental-from <dir>]",
		Short: "Back up every range of every region at one Linearizable snapshot, without delaying writers",
		Long: "backup reads the whole key space in one Linearizable snapshot at epoch e (DESIGN.md §14),\n" +
			"protected from GC while it reads, and writes one SST file per range and a manifest (e, the\n" +
			"ranges, each file's SHA-256) into --to, which must not exist or be empty. The manifest is\n" +
			"written last: a backup that fails part way has none, and restore refuses it.\n" +
			"With --incremental-from it holds only what changed since that backup (full or incremental):\n" +
			"each key written since its epoch, with its newest value or its deletion. GC must not have\n" +
			"passed the base's epoch (keep gc_ttl above the time between backups); if it has, the backup\n" +
			"fails with ErrSnapshotTooOld and a full one is needed.",
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return conn.withClient(c, cluster, "", timeout, func(ctx context.Context, db *client.DB, cn *clusterConn) error {
				began := time.Now()
				dirs, bar := directory.NewDirectories(cn.top, cn.d), progressBar(c.ErrOrStderr(), "backup", began)
				var m *backup.Manifest
				var err error
				if base != "" {
					m, err = backup.TakeIncremental(ctx, db, dirs, to, base, bar)
				} else {
					m, err = backup.Take(ctx, db, dirs, to, bar)
				}
				if err != nil {
					return err
				}
				kind := "backup"
				if m.Incremental() {
					kind = fmt.Sprintf("incremental backup since epoch %d", m.Since)
				}
				fmt.Fprintf(c.OutOrStdout(), "%s at epoch %d: %d ranges, %d keys, %s in %v\n", kind, m.Epoch, len(m.Ranges), m.Keys(), humanBytes(uint64(m.Bytes())), time.Since(began).Round(time.Millisecond))
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&cluster, "cluster", "", "topology file of the running cluster")
	cmd.Flags().StringVar(&to, "to", "", "directory to write the backup into (created; must be empty)")
	cmd.Flags().StringVar(&base, "incremental-from", "", "an earlier backup's directory: back up only what changed since it")
	cmd.Flags().DurationVar(&timeout, "timeout", time.Hour, "give up after this long")
	conn = addConnFlags(cmd)
	_ = cmd.MarkFlagRequired("cluster")
	_ = cmd.MarkFlagRequired("to")
	return cmd
}

func restoreCmd() *cobra.Command {
	var cluster, from string
	var timeout time.Duration
	var conn *connFlags
	cmd := &cobra.Command{
		Use:   "restore --from <dir> --cluster <topology.yaml>",
		Short: "Restore a backup into a fresh cluster: its state becomes the backup's snapshot",
		Long: "restore checks the backup (its manifest, every file's size and SHA-256) and that the\n" +
			"cluster holds no key, and only then writes the backup's pairs. A damaged or incomplete\n" +
			"backup, or a cluster with data, is refused and nothing is written. An incremental backup is\n" +
			"restored with its whole chain (its base, the base's base, down to a full backup), each\n" +
			"checked, to the state at its epoch.",
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return conn.withClient(c, cluster, "", timeout, func(ctx context.Context, db *client.DB, _ *clusterConn) error {
				began := time.Now()
				m, err := backup.Restore(ctx, db, from, progressBar(c.ErrOrStderr(), "restore", began))
				if err != nil {
					return err
				}
				fmt.Fprintf(c.OutOrStdout(), "restored the backup at epoch %d: %d ranges, %d keys, %s in %v\n", m.Epoch, len(m.Ranges), m.Keys(), humanBytes(uint64(m.Bytes())), time.Since(began).Round(time.Millisecond))
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&cluster, "cluster", "", "topology file of the fresh cluster to restore into")
	cmd.Flags().StringVar(&from, "from", "", "directory of the backup")
	cmd.Flags().DurationVar(&timeout, "timeout", time.Hour, "give up after this long")
	conn = addConnFlags(cmd)
	_ = cmd.MarkFlagRequired("cluster")
	_ = cmd.MarkFlagRequired("from")
	return cmd
}
