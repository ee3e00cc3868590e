package client_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/admin"
	"github.com/terroir-db/terroir/internal/localcluster"
	"github.com/terroir-db/terroir/internal/rangeserver/rangepb"
)

// TestReplicaGCDropsLeftBehindReplicas: node 3 is stopped while a range's
// replica and the txn-state group's replica move off it to a joined node,
// so it never learns of either removal. Restarted, it hosts both as
// zombies; the replica GC (internal/node/replicagc.go) finds newer
// configurations on the other nodes and drops them, and keeps every
// replica the changes did not touch. With the GC off the zombies stay (see
// the mutation run in the closing note).
func TestReplicaGCDropsLeftBehindReplicas(t *testing.T) {
	c, db, ctx := nodeThreeDown(t, 300*time.Millisecond)

	const moved, kept = 10, 11 // ranges
	const txnGroup = 2
	moveReplica(t, ctx, db, account(0), 3, 4)
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

// moveReplica moves the replica on node from of the range holding key to
// node to, again while the range's lease was on a stopped node (the reply
// is lost, or the range unavailable, until a new leaseholder serves).
func moveReplica(t *testing.T, ctx context.Context, db *client.DB, key []byte, from, to uint64) {
	t.Helper()
	for {
		ri, err := db.AdminMoveReplica(ctx, key, from, to)
		if err == nil && !slices.Contains(ri.Replicas, from) ||
			errors.Is(err, client.ErrMoveTarget) && strings.Contains(err.Error(), "not a replica") { // an attempt whose reply was lost moved it
			return
		}
		if !errors.Is(err, client.ErrCommitUnknown) && !errors.Is(err, client.ErrUnavailable) || ctx.Err() != nil {
			t.Fatalf("moving the replica at %q from node %d to node %d = %+v, %v", key, from, to, ri, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestReplicaGCKeepsOverlappingData: node 3, stopped, misses a split of
// range 10 at "acct-10" and both halves' moves off it; restarted, it holds
// range 10 over its old span ["", "m") as a zombie. The right half moves
// back to node 3 at once: its replica must not be filled while the zombie,
// whose removal deletes ["", "m") on node 3, is still there (the move waits
// for the replica GC to drop it). Served from node 3, every account in the
// right half is intact.
func TestReplicaGCKeepsOverlappingData(t *testing.T) {
	c, db, ctx := nodeThreeDown(t, 3*time.Second)
	_, right, err := db.AdminSplitRanges(ctx, []byte("acct-10"))
	if err != nil {
		t.Fatalf("splitting at acct-10 with node 3 down: %v", err)
	}
	moveReplica(t, ctx, db, account(0), 3, 4)
	moveReplica(t, ctx, db, []byte("acct-10"), 3, 4)

	if err := c.RestartNode(3); err != nil {
		t.Fatal(err)
	}
	n3 := c.Node(3)
	if z := n3.Range(10); z == nil || string(z.Desc().GetEndKey()) != "m" {
		t.Fatal("restarted node 3 holds no zombie of range 10 over its old span: the test proves nothing")
	}
	// Before the GC's first round (3 s after the start).
	awaitRows(t, ctx, c, "node 3 live", func(rows map[uint64]admin.NodeRow) bool { return rows[3].Live })
	moveReplica(t, ctx, db, []byte("acct-10"), 4, 3)
	if n3.Range(10) != nil {
		t.Errorf("range %d's replica came to node 3 while the zombie of range 10 overlapping it was still there", right.ID)
	}
	if _, _, err := db.AdminTransferLease(ctx, []byte("acct-10"), 3); err != nil {
		t.Fatalf("moving range %d's lease to node 3: %v", right.ID, err)
	}
	time.Sleep(4 * time.Second) // GC rounds after the move
	if sum, err := total(ctx, db); err != nil || sum != accounts*initialBalance {
		t.Errorf("total %d, %v with range %d served from node 3", sum, err, right.ID)
	}
}

// TestLeftoverLearnerRemoved: a move adds node 4 as a learner of range 11
// (24 MiB, so its snapshot streams for most of a second) and the range's
// leader is killed meanwhile, so the move fails and leaves the learner
// behind (the move is asked of the leader directly: a client would retry
// it elsewhere, and the retry removes the learner first). The new
// leaseholder removes it (replicagc.go:
// removeLeftoverLearners), and node 4 drops the replica it was left with.
// Without that, node 4 stays named as a learner and could never be marked
// gone.
func TestLeftoverLearnerRemoved(t *testing.T) {
	c := localcluster.StartT(t, threeNodesFile(t, ""), localcluster.Options{RebalanceInterval: -1, ReplicaGCInterval: 500 * time.Millisecond, Crashable: true})
	db, err := c.Client("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 120*time.Second)
	fund(t, ctx, db)
	blob := make([]byte, 1<<20-64)
	for i := range 24 {
		_, _ = rand.Read(blob)
		key := fmt.Sprintf("n-blob-%02d", i)
		retry(t, ctx, "put "+key, func() error { _, err := db.Put(ctx, []byte(key), blob); return err })
	}
	if err := c.JoinNode(4, "us-east1"); err != nil {
		t.Fatal(err)
	}
	awaitRows(t, ctx, c, "node 4 live", func(rows map[uint64]admin.NodeRow) bool { return rows[4].Live })
	const id = 11
	leader := c.Leader(id)
	from := uint64(1)
	if from == leader {
		from = 2
	}
	mctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	moved := make(chan error, 1)
	conn, err := c.Dialer("us-east1").Conn(leader)
	if err != nil {
		t.Fatal(err)
	}
	go func() { // at the leader itself: no client retries the move elsewhere
		_, err := rangepb.NewRangeClient(conn).MoveReplica(mctx, &rangepb.MoveReplicaRequest{RangeId: id, From: from, To: 4})
		moved <- err
	}()
	for !slices.Contains(c.Node(leader).Range(id).Desc().GetLearners(), 4) {
		if mctx.Err() != nil {
			t.Fatal("node 4 never became a learner")
		}
		time.Sleep(time.Millisecond)
	}
	if err := c.KillNode(leader); err != nil { // at once: its move cannot take the learner out
		t.Fatal(err)
	}
	left := func() bool {
		for _, n := range c.NodeIDs() {
			if nd := c.Node(n); n != 4 && nd != nil && nd.Range(id) != nil && slices.Contains(nd.Range(id).Desc().GetLearners(), 4) {
				return true
			}
		}
		return false
	}
	// The survivors apply the learner's addition once they learn it was
	// committed (the next leader tells them).
	for seen := time.Now().Add(5 * time.Second); !left(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(seen) {
			// The race was lost (the learner's addition had not reached
			// the survivors' logs, or the move ended first): nothing to test.
			t.Skip("the killed leader's move left no learner behind this time")
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for left() {
		if time.Now().After(deadline) {
			t.Fatalf("range %d still names node 4 as a learner: %v", id, newestDesc(c, id))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := <-moved; err == nil {
		t.Fatal("the move succeeded although its leader was killed")
	}
	d := newestDesc(c, id)
	if slices.Contains(d.GetReplicas(), 4) {
		t.Fatalf("node 4 became a voter of range %d: %v", id, d)
	}
	if err := c.RestartNode(leader); err != nil {
		t.Fatal(err)
	}
	for c.Node(4).Range(id) != nil {
		if ctx.Err() != nil {
			t.Fatalf("node 4 still hosts the replica of range %d the removed learner left", id)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if sum, err := total(ctx, db); err != nil || sum != accounts*initialBalance {
		t.Errorf("total %d, %v", sum, err)
	}
}

// nodeThreeDown starts the three-node region with the replicate queue off
// and the replica GC every gcEvery, funds the bank, joins node 4 and stops
// node 3, returning once the registry sees both.
func nodeThreeDown(t *testing.T, gcEvery time.Duration) (*localcluster.Cluster, *client.DB, context.Context) {
	t.Helper()
	c := localcluster.StartT(t, threeNodesFile(t, ""), localcluster.Options{RebalanceInterval: -1, ReplicaGCInterval: gcEvery})
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
	return c, db, ctx
}

// TestReplicaGCKeepsAJointConfigurationsOutgoingVoter: the replica GC must
// not drop a replica that the range's Raft configuration still names as a
// voter of its outgoing half. A range's descriptor leaves a moved-off
// voter out as the group enters the joint configuration, before the group
// leaves it, and until it has, the outgoing voters' quorum is needed to
// commit anything (leaving included). In CI, the GC dropped such a
// replica of range 11 whose node had not yet applied the joint change,
// while the range's third old voter was down: the group could never leave
// the joint configuration, and the range had no leader or lease again
// (TestReplaceWipedNode). Here the range's leader enters a joint
// configuration that removes voter v and stays in it (an explicit
// transition), with v starved of the log so that v's descriptor is older
// than the others'. The GC runs every 100 ms and must keep v's replica
// while the group is joint; once the leader leaves the joint
// configuration, v is out of it for good and the GC drops it.
func TestReplicaGCKeepsAJointConfigurationsOutgoingVoter(t *testing.T) {
	c := localcluster.StartT(t, threeNodesFile(t, ""), localcluster.Options{RebalanceInterval: -1, ReplicaGCInterval: 100 * time.Millisecond})
	db, err := c.Client("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 60*time.Second)
	fund(t, ctx, db)
	const id = 11
	leader := c.Leader(id)
	for ; leader == 0; leader = c.Leader(id) {
		if ctx.Err() != nil {
			t.Fatalf("range %d has no leader", id)
		}
		time.Sleep(10 * time.Millisecond)
	}
	v := leader%3 + 1
	keep := slices.DeleteFunc([]uint64{1, 2, 3}, func(n uint64) bool { return n == v })
	payload, err := proto.Marshal(&rangepb.ReplicasChange{Replicas: keep})
	if err != nil {
		t.Fatal(err)
	}
	c.Net.StarveLog(v)
	rg := c.Node(leader).Group(id)
	enter := &raftpb.ConfChangeV2{Transition: raftpb.ConfChangeTransitionJointExplicit.Enum(),
		Changes: []*raftpb.ConfChangeSingle{{Type: raftpb.ConfChangeRemoveNode.Enum(), NodeId: proto.Uint64(v)}}}
	if _, err := rg.ProposeConfChange(ctx, enter, payload); err != nil {
		t.Fatalf("entering a joint configuration that removes node %d: %v", v, err)
	}
	if _, _, joint := rg.Members(); !joint {
		t.Fatal("the group is not in a joint configuration")
	}
	if r := c.Node(v).Range(id); r == nil || !slices.Contains(r.Desc().GetReplicas(), v) {
		t.Fatalf("node %d dropped its replica or applied the change it was starved of", v)
	}
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if c.Node(v).Range(id) == nil {
			t.Fatalf("the replica GC dropped node %d's replica of range %d, a voter of the joint configuration's outgoing half", v, id)
		}
	}
	if _, err := rg.ProposeConfChange(ctx, &raftpb.ConfChangeV2{}, payload); err != nil {
		t.Fatalf("leaving the joint configuration: %v", err)
	}
	began := time.Now()
	for c.Node(v).Range(id) != nil {
		if ctx.Err() != nil {
			t.Fatalf("node %d still hosts range %d after the group left the joint configuration without it", v, id)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("node %d's replica dropped %v after the group left the joint configuration", v, time.Since(began).Round(time.Millisecond))
	c.Net.Heal()
	if sum, err := total(ctx, db); err != nil || sum != accounts*initialBalance {
		t.Errorf("total %d, %v", sum, err)
	}
}
