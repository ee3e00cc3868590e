package node_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/terroir-db/terroir/internal/localcluster"
)

// TestRangeLogsTruncateEarlyWhileReplicasKeepUp: with the default
// CompactAfter (10 000 entries), a range's replicas truncate their logs
// after about a thousand entries while every replica keeps up, so the
// entries, which carry the writes' values, rarely outlive the memtable
// (issue 17). A follower that was down holds the leader's log back: it
// catches up from the log when it returns, with no snapshot streamed. It
// fails without the early truncation (the logs still start at their first
// entries) and without the leader's hold (the follower needs a snapshot).
func TestRangeLogsTruncateEarlyWhileReplicasKeepUp(t *testing.T) {
	c := localcluster.StartT(t, "../../examples/one-region.yaml", localcluster.Options{})
	db, err := c.Client("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const rangeGroup = 10 // keys below "m"
	write := func(from, to int) {
		for i := from; i < to; i++ {
			key := fmt.Sprintf("c%05d", i%100)
			if _, err := db.Put(ctx, []byte(key), []byte(key)); err != nil {
				t.Fatalf("write %d: %v", i, err)
			}
		}
	}
	logFirst := func(node uint64) uint64 { return c.Node(node).Group(rangeGroup).Status().LogFirst }
	write(0, 1600)
	for _, n := range []uint64{1, 2, 3} {
		deadline := time.Now().Add(30 * time.Second)
		for logFirst(n) < 500 {
			if time.Now().After(deadline) {
				st := c.Node(n).Group(rangeGroup).Status()
				t.Fatalf("node %d: after 1600 writes its log still starts at %d (applied %d); want it truncated early", n, st.LogFirst, st.Applied)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// Stop a follower (the client keeps writing to the leader).
	leader := c.Node(1).Group(rangeGroup).Status().Leader
	down, up := uint64(3), uint64(1)
	if leader == 3 {
		down, up = 2, 3
	} else if leader != 1 {
		up = leader
	}
	if err := c.StopNode(down); err != nil {
		t.Fatal(err)
	}
	// Under the early policy the stopped node misses 1500 entries, more
	// than eagerKeep; the leader keeps them for it (CompactAfter is far off).
	write(1600, 3100)
	if err := c.RestartNode(down); err != nil {
		t.Fatal(err)
	}
	want := c.Node(up).Group(rangeGroup).Status().Applied
	deadline := time.Now().Add(time.Minute)
	for c.Node(down).Group(rangeGroup).Status().Applied < want {
		if time.Now().After(deadline) {
			t.Fatalf("node %d applied %d of %d", down, c.Node(down).Group(rangeGroup).Status().Applied, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var sent float64
	for _, n := range []uint64{1, 2, 3} {
		if n != down {
			sent += snapshotBytesSent(t, c.Node(n).HTTPAddr())
		}
	}
	if sent != 0 {
		t.Fatalf("the other nodes streamed %v bytes of snapshots; node %d should have caught up from the leader's log", sent, down)
	}
	t.Logf("logs start at %d, %d, %d; node %d caught up to %d from the log", logFirst(1), logFirst(2), logFirst(3), down, want)
}
