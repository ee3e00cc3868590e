package main

import (
	"context"
	"fmt"
	"time"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/epoch"
	"github.com/terroir-db/terroir/internal/experiment"
	"github.com/terroir-db/terroir/internal/latency"
	"github.com/terroir-db/terroir/internal/localcluster"
	"github.com/terroir-db/terroir/internal/raftgroup"
	"github.com/terroir-db/terroir/internal/topology"
)

// floor is what this machine cannot go below, measured on the embedded
// cluster in the run that quotes it (issue 17): P50s in ns.
type floor struct {
	rtt, fsync, raft, epochRead time.Duration
}

// write is a single-client write transaction's floor: two client → leader
// round trips and one 3-replica Raft commit.
func (f floor) write() time.Duration { return 2*f.rtt + f.raft }

// read is a single-client read transaction's floor: two round trips and one
// epoch read.
func (f floor) read() time.Duration { return 2*f.rtt + f.epochRead }

// measureFloor measures, for d each, the loopback round trip (a message
// each way on the Multiplex stream, as a client's calls travel) to group's
// leader, a 4 KiB write + fsync, one Raft commit of a no-op in group (3
// replicas, one proposer) and one linearizable read of region's local epoch.
func measureFloor(c *localcluster.Cluster, group topology.Group, d time.Duration) (floor, error) {
	var f floor
	h, err := experiment.MeasurePing(c, group, d)
	if err != nil {
		return f, err
	}
	f.rtt = h.Quantile(50)
	if h, err = experiment.MeasureFsync(c.DataDir(), d); err != nil {
		return f, err
	}
	f.fsync = h.Quantile(50)
	h, fails := runFor(d, 1, func(ctx context.Context) error {
		n := c.Node(c.Leader(group.ID))
		if n == nil || n.Group(group.ID) == nil {
			return raftgroup.ErrNotLeader
		}
		_, err := n.Group(group.ID).Propose(ctx, epoch.EncodeNop())
		return err
	})
	if h.Count() == 0 {
		return f, fmt.Errorf("no Raft commit in group %d within %s (%d failed)", group.ID, d, fails)
	}
	f.raft = h.Quantile(50)
	r, err := c.EpochReader(group.Region)
	if err != nil {
		return f, err
	}
	h, fails = runFor(d, 1, func(ctx context.Context) error {
		_, err := r.Read(ctx)
		return err
	})
	if h.Count() == 0 {
		return f, fmt.Errorf("no epoch read in %s within %s (%d failed)", group.Region, d, fails)
	}
	f.epochRead = h.Quantile(50)
	return f, nil
}

// printFloor prints f.
func printFloor(f floor) {
	fmt.Printf("floor on this machine (P50, same run): loopback round trip %s, fsync (4 KiB) %s, 3-replica Raft commit %s, local epoch read %s\n",
		latency.MS(f.rtt), latency.MS(f.fsync), latency.MS(f.raft), latency.MS(f.epochRead))
}

// singleClient runs, from one client for d each, single-key transactions
// on keys of keys (one round trip: DB.Put, DB.Get) and the same as
// interactive transactions (Begin, Put or Get, Commit), and prints each
// P50 against its floor (issue 17: a write within 1.5 × write(), a read
// within 2 × read()), and the mean time its commits spent in each stage at
// the range leader (terroir_commit_stage_seconds on c's nodes).
func singleClient(ctx context.Context, c *localcluster.Cluster, db *client.DB, key func(i int) []byte, f floor, d time.Duration) error {
	value := make([]byte, 100)
	i := 0
	next := func() []byte { i++; return key(i) }
	type run struct {
		name   string
		bound  time.Duration
		factor float64
		op     func(ctx context.Context) error
	}
	runs := []run{
		{"write, one round trip (DB.Put)", f.write(), 1.5, func(ctx context.Context) error {
			_, err := db.Put(ctx, next(), value)
			return err
		}},
		{"write, interactive (Put, Commit)", f.write(), 1.5, func(ctx context.Context) error {
			k := next()
			return db.Update(ctx, func(ctx context.Context, tx *client.Txn) error { return tx.Put(ctx, k, value) })
		}},
		{"read, one round trip (DB.Get)", f.read(), 2, func(ctx context.Context) error {
			_, _, err := db.Get(ctx, next())
			return err
		}},
		{"read, interactive (Get, Commit)", f.read(), 2, func(ctx context.Context) error {
			k := next()
			return db.Update(ctx, func(ctx context.Context, tx *client.Txn) error {
				_, _, err := tx.Get(ctx, k)
				return err
			})
		}},
	}
	fmt.Printf("single client, one region (P50 against the floor measured above):\n")
	for _, r := range runs {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		before := sampleCost(c).stages
		h, fails := runFor(d, 1, r.op)
		after := sampleCost(c).stages
		if h.Count() == 0 {
			return fmt.Errorf("%s: no transaction succeeded in %s (%d failed)", r.name, d, fails)
		}
		p50 := h.Quantile(50)
		verdict := "within"
		if float64(p50) > r.factor*float64(r.bound) {
			verdict = "over"
		}
		fmt.Printf("  %-34s P50 %s P99 %s = %.2f × floor %s (%s the %.1f× target)%s\n", r.name,
			latency.MS(p50), latency.MS(h.Quantile(99)), float64(p50)/float64(r.bound), latency.MS(r.bound), verdict, r.factor, atLeader(stageMeans(before, after)))
	}
	return nil
}

// atLeader introduces a single client's stage means (stageMeans), if any.
func atLeader(means string) string {
	if means == "" {
		return ""
	}
	return "; at the range leader, mean ms:" + means
}
