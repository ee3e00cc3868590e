package raftgroup_test

import (
	"context"
	"testing"
	"time"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/localcluster"
	"github.com/terroir-db/terroir/internal/node"
)

// rangeGroup is the range [a, m) of examples/one-region.yaml.
const rangeGroup = 10

// heartbeatsDue returns how many heartbeats node n's leaders have had due:
// sent, or elided because the follower had an append (heartbeat.go).
func heartbeatsDue(t *testing.T, n *node.Node) float64 {
	t.Helper()
	mfs, err := n.Gather()
	if err != nil {
		t.Fatal(err)
	}
	due := 0.0
	for _, mf := range mfs {
		switch mf.GetName() {
		case "terroir_raft_heartbeats_elided_total":
			due += mf.GetMetric()[0].GetCounter().GetValue()
		case "terroir_raft_messages_sent_total":
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "type" && l.GetValue() == "MsgHeartbeat" {
						due += m.GetCounter().GetValue()
					}
				}
			}
		}
	}
	return due
}

// startOneRegion starts examples/one-region.yaml (plaintext, no
// rebalancing, so leaders stay put) and returns it, a client of us-east1
// and a context that ends in 2 minutes or with the test. It skips in
// -short mode.
func startOneRegion(t *testing.T) (*localcluster.Cluster, *client.DB, context.Context) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	c := localcluster.StartT(t, "../../examples/one-region.yaml", localcluster.Options{RebalanceInterval: -1, Insecure: true})
	db, err := c.Client("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return c, db, ctx
}

// waitIdle waits until every replica of group on the cluster's running
// nodes runs at the idle pace (idle.go), for at most 10 s.
func waitIdle(t *testing.T, c *localcluster.Cluster, group uint64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !c.Idle(group) {
		if time.Now().After(deadline) {
			t.Fatalf("group %d: not every replica idle after 10 s without a write", group)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// An idle group's replicas slow their Raft clocks (idle.go): with no
// writes, every replica of a range comes to the idle pace, and its leader
// heartbeats about a third as often as a range that is written; a write
// wakes the range at once and commits as fast as on a range at full pace;
// and when an idle range's leader dies, its followers elect another within
// the idle election timeout, and writes commit again.
func TestIdleGroupsSlowTheirRaftClocks(t *testing.T) {
	c, db, ctx := startOneRegion(t)
	if _, err := db.Put(ctx, []byte("a"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	waitIdle(t, c, rangeGroup)

	// The heartbeats the idle leader's clock made due over 3 s, against
	// the same leader's while a writer keeps its range at full pace. The
	// node's other groups count in both. window reports false if the
	// range was not idle throughout (write false) or at full pace
	// throughout (write true): a lease renewal, every few seconds at the
	// idle epoch pace, wakes an idle range for a second.
	leaderID := c.Leader(rangeGroup)
	leader := c.Node(leaderID)
	window := func(write bool) (float64, bool) {
		wctx, wcancel := context.WithTimeout(ctx, 3*time.Second)
		defer wcancel()
		before := heartbeatsDue(t, leader)
		for {
			if write {
				_, _ = db.Put(wctx, []byte("b"), []byte("v"))
			}
			if c.Idle(rangeGroup) == write {
				return 0, false
			}
			select {
			case <-wctx.Done():
				return heartbeatsDue(t, leader) - before, true
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	var idle, busy float64
	for try, ok := 1, false; !ok; try++ {
		if try > 5 {
			t.Fatalf("range %d never stayed idle for 3 s in 5 tries", rangeGroup)
		}
		waitIdle(t, c, rangeGroup)
		idle, ok = window(false)
	}
	if b, ok := window(true); ok {
		busy = b
	} else {
		t.Fatalf("range %d idled while it was written", rangeGroup)
	}
	t.Logf("heartbeats due at node %d in 3 s: %.0f with range %d idle, %.0f while it is written", leaderID, idle, rangeGroup, busy)
	if idle >= busy*0.85 {
		t.Errorf("heartbeats due in 3 s: %.0f with range %d idle, want well below the %.0f while it is written", idle, rangeGroup, busy)
	}

	// A write to an idle range wakes it and commits.
	waitIdle(t, c, rangeGroup)
	start := time.Now()
	if _, err := db.Put(ctx, []byte("c"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	t.Logf("a write to the idle range committed in %v", time.Since(start))
	// The write commits once one follower has its entry; the other wakes
	// when its own append arrives, which on a loaded machine (CI's -race
	// suite) can be after the client has its answer. Heartbeats wake no
	// replica (wakes), and none is due this soon at the idle pace.
	committed := time.Now()
	for _, id := range c.NodeIDs() {
		for c.Node(id).Group(rangeGroup).Status().Idle {
			if time.Since(committed) > 250*time.Millisecond {
				t.Errorf("node %d's replica of range %d still idle 250 ms after a write committed", id, rangeGroup)
				break
			}
			time.Sleep(time.Millisecond)
		}
	}

	// The idle range's leader dies: a follower takes over and writes commit.
	waitIdle(t, c, rangeGroup)
	dead := c.Leader(rangeGroup)
	if err := c.KillNode(dead); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	for {
		l := c.Leader(rangeGroup)
		if l != 0 && l != dead {
			break
		}
		if time.Since(start) > 5*time.Second {
			t.Fatalf("no new leader of idle range %d within 5 s of its leader's death", rangeGroup)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("a new leader of the idle range within %v of its leader's death", time.Since(start))
	if _, err := db.Put(ctx, []byte("d"), []byte("v")); err != nil {
		t.Fatalf("a write after the idle range's leader died: %v", err)
	}
}
