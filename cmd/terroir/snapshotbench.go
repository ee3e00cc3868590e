package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/admin"
	"github.com/terroir-db/terroir/internal/topology"
)

func benchSnapshotCmd() *cobra.Command {
	var sizeFlag, valueFlag string
	var keep bool
	cmd := &cobra.Command{
		Use:   "snapshot",
		Short: "Fill one range to --size, then move a replica of it to a node that joins, and measure that node's memory",
		Long: `snapshot starts three nodes of one region as terroir start processes (split_size
off), writes --size bytes of values into one range, starts a fourth node with
terroir start --join, and moves a replica of the range to it: the new replica
catches up by a Raft snapshot streamed from a Pebble snapshot in chunks
(DESIGN.md §12). It prints the time the move took, the snapshot bytes sent,
and the resident memory of the receiving node before the move and at its
peak (sampled every 20 ms), and of the sending one.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			size, err := topology.ParseSize(sizeFlag)
			if err != nil {
				return fmt.Errorf("--size: %w", err)
			}
			valueSize, err := topology.ParseSize(valueFlag)
			if err != nil {
				return fmt.Errorf("--value-size: %w", err)
			}
			if valueSize > client.MaxValueSize || size < valueSize {
				return fmt.Errorf("--value-size must be at most %d B, and --size at least one value", client.MaxValueSize)
			}
			return runSnapshotBench(cmd.Context(), size, int(valueSize), keep)
		},
	}
	cmd.Flags().StringVar(&sizeFlag, "size", "256MiB", "bytes of values to write into the range (e.g. 1GiB)")
	cmd.Flags().StringVar(&valueFlag, "value-size", "64KiB", "bytes per value (at most 1MiB)")
	cmd.Flags().BoolVar(&keep, "keep", false, "keep the nodes' data directories and logs, and print where")
	return cmd
}

func runSnapshotBench(ctx context.Context, size uint64, valueSize int, keep bool) error {
	p, err := newProcCluster("snapshot", 4, func(addrs []string) string {
		yaml := "local_epoch_interval: 10ms\nraft_tick: 10ms\nsplit_size: off\nsplit_qps: off\nmerge_size: off\nrebalance_interval: off\nregions: [" + benchRegion + "]\nnodes:\n"
		for i := range 3 {
			yaml += fmt.Sprintf("  - {id: %d, region: %s, addr: %q}\n", i+1, benchRegion, addrs[i])
		}
		return yaml + "groups:\n" +
			"  - {id: 1, kind: local-epoch, region: " + benchRegion + ", replicas: [1, 2, 3]}\n" +
			"  - {id: 2, kind: txn-state, region: " + benchRegion + ", replicas: [1, 2, 3]}\n" +
			"  - {id: 3, kind: directory, region: " + benchRegion + ", replicas: [1, 2, 3]}\n" +
			"  - {id: 10, kind: range, region: " + benchRegion + ", start: \"\", end: \"m\", replicas: [1, 2, 3]}\n" +
			"  - {id: 11, kind: range, region: " + benchRegion + ", start: \"m\", replicas: [1, 2, 3]}\n"
	})
	if err != nil {
		return err
	}
	defer p.close(keep)
	db, d, err := p.startFile()
	if err != nil {
		return err
	}
	defer d.Close()
	defer db.Close()

	// Fill range 10 ([, m)): 8 writers, 8 values per transaction.
	const writers, perTxn = 8, 8
	values := int(size / uint64(valueSize))
	fmt.Printf("writing %s in %d values of %s into range 10\n", humanBytes(size), values, humanBytes(uint64(valueSize)))
	began := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			val := make([]byte, valueSize)
			for i := range val {
				val[i] = byte(i*7 + w)
			}
			for {
				first := int(next.Add(perTxn)) - perTxn
				if first >= values {
					return
				}
				err := db.Update(ctx, func(ctx context.Context, tx *client.Txn) error {
					for i := first; i < min(first+perTxn, values); i++ {
						if err := tx.Put(ctx, []byte(fmt.Sprintf("a/%09d", i)), val); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					errs[w] = err
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	fmt.Printf("written in %.1f s (%.1f MiB/s)\n", time.Since(began).Seconds(), float64(size)/(1<<20)/time.Since(began).Seconds())

	if err := p.start(4, true); err != nil {
		return err
	}
	time.Sleep(2 * time.Second) // registered and heartbeating: live
	idle := p.rss(4)
	// The leaseholder (Raft leadership follows it) streams the snapshot; a
	// follower's replica moves, so the leaseholder keeps serving.
	sender := uint64(0)
	if reports, _, err := admin.Ranges(ctx, d, p.top); err == nil {
		for _, r := range reports {
			if r.GetRangeDescriptor().GetRangeId() == 10 && r.GetLeader() {
				sender = r.GetNode()
			}
		}
	}
	from := uint64(3)
	if sender == 3 {
		from = 2
	}
	var peak, senderPeak atomic.Uint64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				peak.Store(max(peak.Load(), p.rss(4)))
				if s := sender; s != 0 {
					senderPeak.Store(max(senderPeak.Load(), p.rss(s)))
				}
			}
		}
	}()
	moveBegan := time.Now()
	mctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
	moved, err := db.AdminMoveReplica(mctx, []byte("a/"), from, 4)
	cancel()
	took := time.Since(moveBegan)
	close(stop)
	<-sampled
	if err != nil {
		return fmt.Errorf("moving range 10's replica from node %d to node 4: %w", from, err)
	}
	fmt.Printf("moved range %d's replica from node %d to node 4 in %.1f s; replicas now %v\n", moved.ID, from, took.Seconds(), moved.Replicas)
	sent := p.snapshotBytes()
	fmt.Printf("snapshot bytes sent: %s (%.1f MiB/s)\n", humanBytes(sent), float64(sent)/(1<<20)/took.Seconds())
	fmt.Printf("receiving node 4: resident %s before the move, peak %s during it (+%s)\n", humanBytes(idle), humanBytes(peak.Load()),
		humanBytes(peak.Load()-min(idle, peak.Load())))
	if s := sender; s != 0 {
		fmt.Printf("sending node %d: peak resident %s during the move\n", s, humanBytes(senderPeak.Load()))
	}
	return nil
}
