package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/terroir-db/terroir/client"
)

// feedLine is one JSON line of `terroir changefeed`: a change (key, value
// or deleted, version, region) or a resolved epoch. Keys and values that
// are not UTF-8 text are given in base64 under key_b64 and value_b64.
type feedLine struct {
	Key      *string      `json:"key,omitempty"`
	KeyB64   []byte       `json:"key_b64,omitempty"`
	Value    *string      `json:"value,omitempty"`
	ValueB64 []byte       `json:"value_b64,omitempty"`
	Deleted  bool         `json:"deleted,omitempty"`
	Version  *feedVersion `json:"version,omitempty"`
	Region   string       `json:"region,omitempty"`
	Resolved uint64       `json:"resolved,omitempty"`
}

type feedVersion struct {
	Epoch   uint64 `json:"epoch"`
	Counter uint32 `json:"counter"`
}

// text sets *s to b when b is UTF-8, else *raw.
func text(b []byte, s **string, raw *[]byte) {
	if utf8.Valid(b) {
		v := string(b)
		*s = &v
		return
	}
	*raw = b
}

func feedJSON(ev client.FeedEvent) feedLine {
	c := ev.Change
	if c == nil {
		return feedLine{Resolved: ev.Resolved}
	}
	l := feedLine{Deleted: c.Tombstone, Version: &feedVersion{Epoch: c.Version.Epoch, Counter: c.Version.Counter}, Region: c.Region}
	text(c.Key, &l.Key, &l.KeyB64)
	if !c.Tombstone {
		text(c.Value, &l.Value, &l.ValueB64)
	}
	return l
}

func changefeedCmd() *cobra.Command {
	var cluster, prefix string
	var from uint64
	var all bool
	var interval, runFor time.Duration
	var conn *connFlags
	cmd := &cobra.Command{
		Use:   "changefeed --cluster <topology.yaml> [--prefix P] [--from-epoch E | --all]",
		Short: "Stream the committed writes of a key span as JSON lines, with resolved epochs",
		Long: "changefeed prints the committed writes of the keys starting with --prefix, in version-id order\n" +
			"across every region, one JSON object per line: {\"key\", \"value\" or \"deleted\", \"version\",\n" +
			"\"region\"}, and {\"resolved\": r} once every write with an epoch up to r has been printed, so a\n" +
			"consumer that applied them holds exactly the state of a snapshot at r+1 (DESIGN.md §14).\n" +
			"It starts now, after a resolved epoch (--from-epoch, to resume), or at the oldest history\n" +
			"kept (--all); an epoch GC has collected is refused with ErrSnapshotTooOld. It runs until\n" +
			"interrupted, or for --for. While it runs, GC keeps the history it still needs.",
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if c.Flags().Changed("from-epoch") && all {
				return fmt.Errorf("--from-epoch and --all: choose one")
			}
			all = all || (c.Flags().Changed("from-epoch") && from == 0) // after epoch 0: everything
			ctx, stop := signal.NotifyContext(c.Context(), os.Interrupt)
			defer stop()
			timeout := runFor
			if timeout <= 0 {
				timeout = 100 * 365 * 24 * time.Hour
			}
			start, end := client.Prefix([]byte(prefix))
			if prefix == "" {
				start, end = nil, nil
			}
			enc := json.NewEncoder(c.OutOrStdout())
			c.SetContext(ctx)
			return conn.withClient(c, cluster, "", timeout, func(ctx context.Context, db *client.DB, _ *clusterConn) error {
				opts := client.FeedOptions{Start: start, End: end, From: from, All: all, Interval: interval,
					OnError: func(err error) { fmt.Fprintln(c.ErrOrStderr(), "changefeed: a round failed, running it again:", err) }}
				err := db.Changefeed(ctx, opts, func(ev client.FeedEvent) error { return enc.Encode(feedJSON(ev)) })
				if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) || errors.Is(err, io.EOF) {
					return nil // --for ran out, or the reader went away: a normal end
				}
				return err
			})
		},
	}
	cmd.Flags().StringVar(&cluster, "cluster", "", "topology file of the running cluster")
	cmd.Flags().StringVar(&prefix, "prefix", "", "the span: keys starting with this (default: every key)")
	cmd.Flags().Uint64Var(&from, "from-epoch", 0, "resume after this resolved epoch: print the writes of later epochs")
	cmd.Flags().BoolVar(&all, "all", false, "start at the oldest history the cluster keeps")
	cmd.Flags().DurationVar(&interval, "interval", 100*time.Millisecond, "time between two resolved epochs")
	cmd.Flags().DurationVar(&runFor, "for", 0, "stop after this long (default: run until interrupted)")
	conn = addConnFlags(cmd)
	_ = cmd.MarkFlagRequired("cluster")
	return cmd
}
