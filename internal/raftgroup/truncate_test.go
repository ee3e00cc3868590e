package raftgroup_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/terroir-db/terroir/internal/node"
)

// snapshotBytesSent returns the bytes node n has streamed in Raft snapshots.
func snapshotBytesSent(t *testing.T, n *node.Node) float64 {
	t.Helper()
	mfs, err := n.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "terroir_raft_snapshot_sent_bytes_total" {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}

// A log that every follower has is truncated soon after it applies, on
// every replica, long before CompactAfter (10000 entries): its entries are
// deleted while their memtable is still unflushed, and never written to a
// table. A follower that is down holds its leader's log back, so that it
// catches up from the log, not from a snapshot, when it returns.
func TestALogEveryFollowerHasIsTruncatedSoon(t *testing.T) {
	c, db, ctx := startOneRegion(t)
	write := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			if _, err := db.Put(ctx, fmt.Appendf(nil, "c%05d", i), []byte("v")); err != nil { // range [a, m)
				t.Fatalf("put %d: %v", i, err)
			}
		}
	}
	// logLength returns node id's replica's applied index and how many
	// entries its log holds.
	logLength := func(id uint64) (applied, entries uint64) {
		n := c.Node(id)
		if n == nil || n.Group(rangeGroup) == nil {
			return 0, 0
		}
		st := n.Group(rangeGroup).Status()
		return st.Applied, st.Applied + 1 - st.FirstIndex
	}

	const writes = 1500
	write(0, writes)
	deadline := time.Now().Add(10 * time.Second)
	for _, id := range c.NodeIDs() {
		for {
			applied, entries := logLength(id)
			if applied >= writes && entries < 1000 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node %d, range %d: %d entries in the log at applied index %d after %d writes; want under 1000 (the log truncated behind what every follower has)",
					id, rangeGroup, entries, applied, writes)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	leader := c.Leader(rangeGroup)
	down := uint64(1)
	for down == leader {
		down++
	}
	if err := c.StopNode(down); err != nil {
		t.Fatal(err)
	}
	// What the down node holds is its log through the match its leader
	// recorded, not its applied index: a follower appends (and fsyncs)
	// entries before it applies them, so its applied index may trail the
	// log it returns with (CI once saw 1542 applied against a log
	// truncated to start at 1544, and the node caught up from its log).
	_, match, ok, err := c.Node(leader).Group(rangeGroup).Progress(ctx)
	if err != nil || !ok {
		t.Fatalf("progress at leader %d: ok %v, %v", leader, ok, err)
	}
	lagged := match[down]
	write(writes, 2*writes)
	applied, entries := logLength(leader)
	if first := applied + 1 - entries; first > lagged+1 {
		t.Fatalf("leader %d truncated its log to start at %d while node %d, down, had its log only through %d", leader, first, down, lagged)
	}
	var sent float64
	for _, id := range c.NodeIDs() {
		sent += snapshotBytesSent(t, c.Node(id))
	}
	if err := c.RestartNode(down); err != nil {
		t.Fatal(err)
	}
	for {
		if got, _ := logLength(down); got >= applied {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("node %d did not catch up to %d", down, applied)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var after float64
	for _, id := range c.NodeIDs() {
		after += snapshotBytesSent(t, c.Node(id))
	}
	if after != sent {
		t.Fatalf("node %d caught up by a snapshot (%v bytes sent); want from the log its leader kept", down, after-sent)
	}
}
