package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/latency"
)

func benchYCSBCmd() *cobra.Command {
	var f benchFlags
	var workload string
	var records, clients, valueSize int
	var seed uint64
	cmd := &cobra.Command{
		Use:   "ycsb",
		Short: "YCSB workload A (50% reads, 50% updates, uniform) on the embedded cluster",
		Long: `ycsb loads --records records of --value-size bytes, then runs workload A
from --clients concurrent clients for --duration: each operation is one
transaction (a read: Get then Commit; an update: Put then Commit). It prints
P50/P99 of read and update transactions and the throughput, beside this
machine's floor measured in the same run (loopback RPC round trip, fsync).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if workload != "a" && workload != "A" {
				return fmt.Errorf("--workload %q: only workload A is implemented so far", workload)
			}
			c, group, err := f.startBench()
			if err != nil {
				return err
			}
			defer c.Close()
			if len(c.Topology.Ranges()) == 0 {
				return fmt.Errorf("the topology has no ranges")
			}
			db, err := c.Client(group.Region)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			// A letter prefix spreads the keys over every range of the key space.
			key := func(i int) []byte { return []byte(fmt.Sprintf("%c-user%010d", 'a'+byte(i%26), i)) }
			value := make([]byte, valueSize)
			for i := range value {
				value[i] = byte('a' + i%26)
			}
			fmt.Printf("loading %d records of %d bytes...\n", records, valueSize)
			if err := loadYCSB(ctx, db, key, records, value); err != nil {
				return err
			}

			rtt, _, err := benchPing(c, group, time.Second)
			if err != nil {
				return err
			}
			fsync, _, err := benchFsync(c.DataDir(), time.Second)
			if err != nil {
				return err
			}

			res := runYCSBA(ctx, db, key, records, value, clients, seed, f.duration)
			reads, updates, fails := res.reads, res.updates, res.fails
			total := reads.Count() + updates.Count()
			fmt.Printf("\nYCSB-A: %d records × %d B, %d clients, %v, %d ranges, 3 replicas each\n",
				records, valueSize, clients, f.duration, len(c.Topology.Ranges()))
			printHeader()
			printRow("read transaction (Get + Commit)", reads, f.duration, fails)
			printRow("update transaction (Put + Commit)", updates, f.duration, 0)
			fmt.Printf("%-40s %9s %9s %12.0f\n", "all transactions", "", "", float64(total)/f.duration.Seconds())
			fmt.Printf("%-40s %d\n", "retried attempts (lock conflicts)", res.retries)
			printRow("floor: loopback gRPC round trip", rtt, time.Second, 0)
			printRow("floor: fsync (4 KiB)", fsync, time.Second, 0)
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().Lookup("duration").DefValue = "10s"
	_ = cmd.Flags().Set("duration", "10s")
	cmd.Flags().StringVar(&workload, "workload", "a", "YCSB core workload (a)")
	cmd.Flags().IntVar(&records, "records", 10000, "records loaded before the run")
	cmd.Flags().IntVar(&clients, "clients", 16, "concurrent clients")
	cmd.Flags().IntVar(&valueSize, "value-size", 1024, "value size in bytes")
	cmd.Flags().Uint64Var(&seed, "seed", 1, "random seed for the operation sequence")
	return cmd
}

// loadYCSB writes records keys key(0..records-1) = value, 100 per transaction.
func loadYCSB(ctx context.Context, db *client.DB, key func(int) []byte, records int, value []byte) error {
	for lo := 0; lo < records; lo += 100 {
		err := db.Update(ctx, func(ctx context.Context, tx *client.Txn) error {
			for i := lo; i < min(lo+100, records); i++ {
				if err := tx.Put(ctx, key(i), value); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("load: %w", err)
		}
	}
	return nil
}

// ycsbResult is one YCSB-A run's latencies (read and update transactions),
// failed transactions and retried attempts.
type ycsbResult struct {
	reads, updates *latency.Histogram
	fails          int
	retries        int64
}

// runYCSBA runs workload A (50% reads, 50% updates, uniform over records
// keys) from `clients` goroutines for d; each operation is one transaction.
func runYCSBA(ctx context.Context, db *client.DB, key func(int) []byte, records int, value []byte, clients int, seed uint64, d time.Duration) ycsbResult {
	res := ycsbResult{reads: latency.New(), updates: latency.New()}
	var retries atomic.Int64
	var mu sync.Mutex
	runCtx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var wg sync.WaitGroup
	for w := 0; w < clients; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			r := rand.New(rand.NewPCG(seed, uint64(w)))
			for runCtx.Err() == nil {
				k := key(r.IntN(records))
				isRead := r.IntN(2) == 0
				start := time.Now()
				octx, ocancel := context.WithTimeout(context.Background(), 10*time.Second)
				attempt := 0
				err := db.Update(octx, func(ctx context.Context, tx *client.Txn) error {
					if attempt++; attempt > 1 {
						retries.Add(1)
					}
					if isRead {
						_, _, err := tx.Get(ctx, k)
						return err
					}
					return tx.Put(ctx, k, value)
				})
				ocancel()
				if err != nil {
					mu.Lock()
					res.fails++
					mu.Unlock()
					continue
				}
				if isRead {
					res.reads.Since(start)
				} else {
					res.updates.Since(start)
				}
			}
		}(w)
	}
	wg.Wait()
	res.retries = retries.Load()
	return res
}
