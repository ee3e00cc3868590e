package client_test

import (
	"slices"
	"testing"
	"time"

	"github.com/terroir-db/terroir/internal/admin"
	"github.com/terroir-db/terroir/internal/localcluster"
)

// TestReplicaGCDropsLeftBehindReplicas: node 3 is stopped while a range's
// replica and the txn-state group's replica move off it to a joined node,
// so it never learns of either removal. Restarted, it hosts both as
// zombies; the replica GC (internal/node/replicagc.go) finds newer
// configurations on the other nodes and drops them, and keeps every
// replica the changes did not touch. With the GC off the zombies stay (see
// the mutation run in the closing note).
func TestReplicaGCDropsLeftBehindReplicas(t *testing.T) {
	c := localcluster.StartT(t, threeNodesFile(t, ""), localcluster.Options{RebalanceInterval: -1, ReplicaGCInterval: 300 * time.Millisecond})
	db, err := c.Client("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 90*time.Second)
	fund(t, ctx, db)
	if err := c.JoinNode(4, "us-east1"); err != nil {
		t.Fatal(err)
	}
	if err := c.StopNode(3); err != nil {
		t.Fatal(err)
	}
	awaitRows(t, ctx, c, "node 3 down, node 4 live", func(rows map[uint64]admin.NodeRow) bool { return !rows[3].Live && rows[4].Live })

	const moved, kept = 10, 11 // ranges
	const txnGroup = 2
	if ri, err := db.AdminMoveReplica(ctx, account(0), 3, 4); err != nil || slices.Contains(ri.Replicas, 3) {
		t.Fatalf("moving range %d's replica off stopped node 3 = %+v, %v", moved, ri, err)
	}
	if voters, err := admin.MoveGroupReplica(ctx, c.Dialer("us-east1"), c.Topology, txnGroup, 3, 4); err != nil || slices.Contains(voters, 3) {
		t.Fatalf("moving group %d's replica off stopped node 3 = %v, %v", txnGroup, voters, err)
	}

	if err := c.RestartNode(3); err != nil {
		t.Fatal(err)
	}
	n3 := c.Node(3)
	if n3.Range(moved) == nil || n3.Group(txnGroup) == nil {
		t.Fatalf("restarted node 3 does not host the moved replicas (range %v, group %v): the test has no zombies to collect", n3.Range(moved) != nil, n3.Group(txnGroup) != nil)
	}
	began := time.Now()
	for n3.Range(moved) != nil || n3.Group(txnGroup) != nil {
		if ctx.Err() != nil {
			t.Fatalf("node 3 still hosts the replicas a move left behind: range %d %v, group %d %v",
				moved, n3.Range(moved) != nil, txnGroup, n3.Group(txnGroup) != nil)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("zombies dropped %v after the restart", time.Since(began).Round(time.Millisecond))

	// What no change touched stays, and keeps serving.
	time.Sleep(time.Second) // a few more GC rounds
	if n3.Range(kept) == nil {
		t.Errorf("the replica GC dropped node 3's replica of range %d, which still names it", kept)
	}
	for _, g := range []uint64{1, 3} {
		if n3.Group(g) == nil {
			t.Errorf("the replica GC dropped node 3's replica of group %d, which still names it", g)
		}
	}
	if sum, err := total(ctx, db); err != nil || sum != accounts*initialBalance {
		t.Errorf("total %d, %v after the GC", sum, err)
	}
	for _, g := range n3.Status(ctx).GetGroups() {
		if g.GetGroupId() == txnGroup || g.GetGroupId() == moved {
			t.Errorf("node 3's status still reports group %d", g.GetGroupId())
		}
	}
}
