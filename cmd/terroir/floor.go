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

// floorProbe takes one sample of each part of the floor a transaction
// is held against: a round trip to a replica of the group's region (a
// Ping on the Multiplex stream, as a client's calls travel), one Raft
// commit of a no-op in the group (3 replicas, proposed at its leader),
// and one linearizable read of the region's local epoch.
type floorProbe struct {
	ping, raft, epochRead func(ctx context.Context) error
}

// newFloorProbe returns the probe of group's floor on c. Errors: the
// dialer's and the epoch reader's.
func newFloorProbe(c *localcluster.Cluster, group topology.Group) (floorProbe, error) {
	var p floorProbe
	ping, err := experiment.Pinger(c, group.Region, group)
	if err != nil {
		return p, err
	}
	r, err := c.EpochReader(group.Region)
	if err != nil {
		return p, err
	}
	p.ping = ping
	p.raft = func(ctx context.Context) error {
		n := c.Node(c.Leader(group.ID))
		if n == nil || n.Group(group.ID) == nil {
			return raftgroup.ErrNotLeader
		}
		_, err := n.Group(group.ID).Propose(ctx, epoch.EncodeNop())
		return err
	}
	p.epochRead = func(ctx context.Context) error {
		_, err := r.Read(ctx)
		return err
	}
	return p, nil
}

// measureFloor measures, for d each, the parts of p's floor one after the
// other, and a 4 KiB write + fsync in c's data directory.
func measureFloor(c *localcluster.Cluster, p floorProbe, d time.Duration) (floor, error) {
	var f floor
	p50 := func(part string, op func(ctx context.Context) error) (time.Duration, error) {
		h, fails := runFor(d, 1, op)
		if h.Count() == 0 {
			return 0, fmt.Errorf("no %s within %s (%d failed)", part, d, fails)
		}
		return h.Quantile(50), nil
	}
	var err error
	if f.rtt, err = p50("round trip", p.ping); err != nil {
		return f, err
	}
	h, err := experiment.MeasureFsync(c.DataDir(), d)
	if err != nil {
		return f, err
	}
	f.fsync = h.Quantile(50)
	if f.raft, err = p50("Raft commit", p.raft); err != nil {
		return f, err
	}
	f.epochRead, err = p50("epoch read", p.epochRead)
	return f, err
}

// pairedRun runs op from one client for d, in slices of pairSlice each
// followed by a slice of each part of the floor (p: a round trip, a Raft
// commit, an epoch read, pairSlice/3 each), so that the transactions and
// the floor they are held against see the same seconds of the machine.
// Measured seconds apart, on this machine whose fsyncs and scheduling
// swing by tens of percent from one second to the next, the same build's
// DB.Put measured 1.10× its floor in one run and 1.82× in the next
// (issue 17). Slices, rather than one sample of each in turn: sampled in
// turn, each began while the one before was still at work (the epoch
// group's followers applying the no-op), and DB.Get's P50 rose from
// 0.06–0.07 ms to 0.16–0.19 ms.
// It returns the transactions' latencies, the floor's P50s (fsync unset),
// and how many transactions failed (not counted). Errors: a part of the
// floor with no sample.
func pairedRun(d time.Duration, op func(ctx context.Context) error, p floorProbe) (*latency.Histogram, floor, int, error) {
	h, rtt, raft, epochRead := latency.New(), latency.New(), latency.New(), latency.New()
	fails := 0
	for end := time.Now().Add(d); time.Now().Before(end); {
		fails += timedFor(h, op, pairSlice)
		timedFor(rtt, p.ping, pairSlice/3)
		timedFor(raft, p.raft, pairSlice/3)
		timedFor(epochRead, p.epochRead, pairSlice/3)
	}
	for _, part := range []struct {
		name string
		h    *latency.Histogram
	}{{"round trip", rtt}, {"Raft commit", raft}, {"epoch read", epochRead}} {
		if part.h.Count() == 0 {
			return h, floor{}, fails, fmt.Errorf("no %s of the floor succeeded between the transactions", part.name)
		}
	}
	return h, floor{rtt: rtt.Quantile(50), raft: raft.Quantile(50), epochRead: epochRead.Quantile(50)}, fails, nil
}

// pairSlice is how long pairedRun runs the transactions before it samples
// the floor again: 100 ms, hundreds of transactions.
const pairSlice = 100 * time.Millisecond

// printFloor prints f.
func printFloor(f floor) {
	fmt.Printf("floor on this machine (P50, same run): loopback round trip %s, fsync (4 KiB) %s, 3-replica Raft commit %s, local epoch read %s\n",
		latency.MS(f.rtt), latency.MS(f.fsync), latency.MS(f.raft), latency.MS(f.epochRead))
}

// singleClient runs, from one client for d each, single-key transactions
// on keys of keys (one round trip: DB.Put, DB.Get) and the same as
// interactive transactions (Begin, Put or Get, Commit), and prints each
// P50 against its floor sampled between its transactions (pairedRun;
// issue 17: a write within 1.5 × write(), a read within 2 × read()),
// against the floor f measured before them, and the mean time its
// commits spent in each stage at the range leader
// (terroir_commit_stage_seconds on c's nodes).
func singleClient(ctx context.Context, c *localcluster.Cluster, db *client.DB, key func(i int) []byte, p floorProbe, f floor, d time.Duration) error {
	value := make([]byte, 100)
	i := 0
	next := func() []byte { i++; return key(i) }
	type run struct {
		name   string
		bound  func(floor) time.Duration
		factor float64
		op     func(ctx context.Context) error
	}
	runs := []run{
		{"write, one round trip (DB.Put)", floor.write, 1.5, func(ctx context.Context) error {
			_, err := db.Put(ctx, next(), value)
			return err
		}},
		{"write, interactive (Put, Commit)", floor.write, 1.5, func(ctx context.Context) error {
			k := next()
			return db.Update(ctx, func(ctx context.Context, tx *client.Txn) error { return tx.Put(ctx, k, value) })
		}},
		{"read, one round trip (DB.Get)", floor.read, 2, func(ctx context.Context) error {
			_, _, err := db.Get(ctx, next())
			return err
		}},
		{"read, interactive (Get, Commit)", floor.read, 2, func(ctx context.Context) error {
			k := next()
			return db.Update(ctx, func(ctx context.Context, tx *client.Txn) error {
				_, _, err := tx.Get(ctx, k)
				return err
			})
		}},
	}
	fmt.Printf("single client, one region (P50 against the floor sampled between its transactions, and against the floor above):\n")
	for _, r := range runs {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		before := sampleCost(c)
		h, paired, fails, err := pairedRun(d, r.op, p)
		after := sampleCost(c)
		if err != nil {
			return fmt.Errorf("%s: %w", r.name, err)
		}
		if h.Count() == 0 {
			return fmt.Errorf("%s: no transaction succeeded in %s (%d failed)", r.name, d, fails)
		}
		p50, bound := h.Quantile(50), r.bound(paired)
		verdict := "within"
		if float64(p50) > r.factor*float64(bound) {
			verdict = "over"
		}
		fmt.Printf("  %-34s P50 %s P99 %s = %.2f × floor %s (%s the %.1f× target; %.2f × the floor above)%s\n", r.name,
			latency.MS(p50), latency.MS(h.Quantile(99)), float64(p50)/float64(bound), latency.MS(bound), verdict, r.factor,
			float64(p50)/float64(r.bound(f)), atLeader(stageMeans(before.stages, after.stages), before, after))
	}
	return nil
}

// atLeader introduces a single client's stage means (stageMeans), if
// any, and says how the nodes' epoch reads between before and after split
// the epochs stage: the wait for a round to begin (a read arriving while
// one is in flight waits for it, DESIGN.md §3.1) and the round itself.
// Those reads include the leaseholders' and closed epochs' background
// ones, not the floor's (its reader is the cluster's, not a node's).
func atLeader(means string, before, after runCost) string {
	if means == "" {
		return ""
	}
	out := "; at the range leader, mean ms:" + means
	if r, ok := epochReadsBetween(before, after); ok {
		out += fmt.Sprintf("; the nodes' epoch reads waited %.3f for their round, which took %.3f", r.waitMS, r.roundMS)
	}
	if s := readysBetween(before, after); s != "" {
		out += "; per Raft Ready (every replica's, the floor's too): " + s
	}
	return out
}
