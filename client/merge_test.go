package client_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/admin"
	"github.com/terroir-db/terroir/internal/localcluster"
	"github.com/terroir-db/terroir/internal/rangeserver/rangepb"
)

// TestSplitIntoEightAndMergeBackUnderLoad splits both ranges of
// examples/one-region.yaml into eight, then merges them back into two,
// while clients transfer money between accounts on every range (DESIGN.md
// §11): every locking and every snapshot read of all accounts sees the
// initial total, no transfer fails for good, bad merges are typed errors
// that change nothing, and a node killed and restarted afterwards hosts the
// two ranges with all the data.
func TestSplitIntoEightAndMergeBackUnderLoad(t *testing.T) {
	c, db := startCluster(t, localcluster.Options{Crashable: true})
	ctx := ctxT(t, 150*time.Second)
	fund(t, ctx, db)
	load := startBankLoad(t, ctx, c)
	for _, k := range []string{"acct-04", "x-acct-05", "acct-10", "x-acct-13", "acct-16", "x-acct-17"} {
		time.Sleep(300 * time.Millisecond)
		if err := db.AdminSplit(ctx, []byte(k)); err != nil {
			t.Fatalf("split at %s: %v", k, err)
		}
	}
	if n := rangeCount(c, 8); n != 8 {
		t.Fatalf("%d ranges after the splits; want 8", n)
	}
	// Merge back: the range holding "" absorbs its right neighbours until
	// it ends at m, and the one holding m until it ends the key space.
	merges := 0
	for _, side := range []struct{ key, end string }{{"", "m"}, {"m", ""}} {
		for {
			time.Sleep(300 * time.Millisecond)
			began := time.Now()
			r, err := db.AdminMerge(ctx, []byte(side.key))
			if err != nil {
				t.Fatalf("merge at %q: %v", side.key, err)
			}
			merges++
			t.Logf("merged into range %d [%q, %q) in %v (%d transfers so far)", r.ID, r.Start, r.End,
				time.Since(began).Round(time.Millisecond), load.transfers.Load())
			if bytes.Equal(r.End, []byte(side.end)) {
				break
			}
		}
	}
	time.Sleep(500 * time.Millisecond)
	load.stop()
	t.Logf("%d transfers, %d total checks across 6 splits and %d merges", load.transfers.Load(), load.checks.Load(), merges)
	if merges != 6 {
		t.Errorf("%d merges; want 6", merges)
	}
	if n := rangeCount(c, 2); n != 2 {
		t.Fatalf("%d ranges after the merges; want 2", n)
	}
	if sum, err := total(ctx, db); err != nil || sum != accounts*initialBalance {
		t.Fatalf("final total %d, %v", sum, err)
	}

	// Bad input: merging the last range is refused, and nothing changes.
	if _, err := db.AdminMerge(ctx, []byte("x-acct-05")); !errors.Is(err, client.ErrMergeLast) {
		t.Errorf("merging the last range = %v; want ErrMergeLast", err)
	}
	if _, err := db.AdminMerge(ctx, make([]byte, 5000)); !errors.Is(err, client.ErrKeyTooLarge) {
		t.Errorf("merge at a 5000-byte key = %v; want ErrKeyTooLarge", err)
	}
	if n := rangeCount(c, 2); n != 2 {
		t.Fatalf("%d ranges after the refused merges; want 2", n)
	}
	restartHostsEveryRange(t, ctx, c, db, 2)
}

// TestMergeAcrossRegionsIsRefused: the ranges on either side of "m" in
// examples/three-regions.yaml are homed in us-east1 and us-west1; merging
// them is a typed error and changes nothing.
func TestMergeAcrossRegionsIsRefused(t *testing.T) {
	c := localcluster.StartT(t, "../examples/three-regions.yaml", localcluster.Options{})
	db, err := c.Client("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 30*time.Second)
	if _, err := db.AdminMerge(ctx, []byte("g")); !errors.Is(err, client.ErrMergeRegions) {
		t.Fatalf("merging ranges of us-east1 and us-west1 = %v; want ErrMergeRegions", err)
	}
	if n := len(c.Node(c.NodeIDs()[0]).RangeIDs()); n != 2 { // us-east1's two ranges
		t.Fatalf("node %d hosts %d ranges after a refused merge; want 2", c.NodeIDs()[0], n)
	}
}

// rangeCount waits, up to 10 s, until every node of c that hosts ranges
// hosts want (a node removes a merged range's replica shortly after the
// merge), and returns the count of the node hosting the most.
func rangeCount(c *localcluster.Cluster, want int) int {
	return rangeCountWithin(c, want, 10*time.Second)
}

// rangeCountWithin is rangeCount, waiting up to d.
func rangeCountWithin(c *localcluster.Cluster, want int, d time.Duration) int {
	most := 0
	for deadline := time.Now().Add(d); ; time.Sleep(10 * time.Millisecond) {
		most = 0
		ok := true
		for _, id := range c.NodeIDs() {
			n := len(c.Node(id).RangeIDs())
			most, ok = max(most, n), ok && (n == want || n == 0)
		}
		if ok || time.Now().After(deadline) {
			return most
		}
	}
}

// TestNodeDownDuringAMerge: with a replica's node down, a merge is refused
// before it changes anything (it would otherwise wait for that node) and the
// ranges keep serving; once the node is back the merge goes through, and the
// node, killed as the merge applies and restarted, hosts the merged range
// with every key, serving with just one other node.
func TestNodeDownDuringAMerge(t *testing.T) {
	c, db := startCluster(t, localcluster.Options{Crashable: true})
	ctx := ctxT(t, 90*time.Second)
	if err := db.Update(ctx, func(ctx context.Context, tx *client.Txn) error {
		return errors.Join(tx.Put(ctx, []byte("b"), []byte("1")), tx.Put(ctx, []byte("d"), []byte("2")), tx.Put(ctx, []byte("x"), []byte("3")))
	}); err != nil {
		t.Fatal(err)
	}
	if err := db.AdminSplit(ctx, []byte("c")); err != nil {
		t.Fatal(err)
	}
	down := c.NodeIDs()[2]
	if err := c.KillNode(down); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 3*time.Second)
	_, err := db.AdminMerge(short, []byte("b"))
	cancel()
	// The leader refuses, and the client retries until its deadline, which
	// may cut the last attempt short: unavailable, or outcome unknown.
	if !errors.Is(err, client.ErrUnavailable) && !errors.Is(err, client.ErrCommitUnknown) {
		t.Fatalf("merge with node %d down = %v; want ErrUnavailable or ErrCommitUnknown", down, err)
	}
	if n := len(c.Node(c.NodeIDs()[0]).RangeIDs()); n != 3 {
		t.Fatalf("node %d hosts %d ranges after a refused merge; want 3", c.NodeIDs()[0], n)
	}
	read := func(key, want string) {
		t.Helper()
		var v []byte
		if err := db.Update(ctx, func(ctx context.Context, tx *client.Txn) (err error) {
			v, _, err = tx.Get(ctx, []byte(key))
			return err
		}); err != nil || string(v) != want {
			t.Fatalf("%s = %q, %v; want %s", key, v, err, want)
		}
	}
	read("d", "2") // the right-hand range still serves
	if err := c.RestartNode(down); err != nil {
		t.Fatal(err)
	}
	merged, err := db.AdminMerge(ctx, []byte("b"))
	if err != nil || string(merged.End) != "m" {
		t.Fatalf("merge after node %d came back = %+v, %v; want [\"\", m)", down, merged, err)
	}
	if err := c.KillNode(down); err != nil {
		t.Fatal(err)
	}
	if err := c.RestartNode(down); err != nil {
		t.Fatal(err)
	}
	n, deadline := 0, time.Now().Add(15*time.Second)
	for ; n != 2 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		n = len(c.Node(down).RangeIDs())
	}
	if n != 2 {
		t.Fatalf("node %d hosts %d ranges after its restart; want 2", down, n)
	}
	for _, id := range c.NodeIDs() {
		if id != down && id != c.NodeIDs()[0] {
			if err := c.StopNode(id); err != nil {
				t.Fatal(err)
			}
		}
	}
	expectValues(t, ctx, db, map[string]string{"b": "1", "d": "2", "x": "3"})
}

// TestMergeColocatesNeighbours: an operator's merge of two neighbours on
// different nodes moves the right one's replica onto the left's nodes
// first, then merges; the bank total holds throughout.
func TestMergeColocatesNeighbours(t *testing.T) {
	c := localcluster.StartT(t, threeNodesFile(t, ""), localcluster.Options{RebalanceInterval: -1})
	db, err := c.Client("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 60*time.Second)
	fund(t, ctx, db)
	if err := c.JoinNode(4, "us-east1"); err != nil {
		t.Fatal(err)
	}
	awaitRows(t, ctx, c, "node 4 live", func(rows map[uint64]admin.NodeRow) bool { return rows[4].Live })
	if ri, err := db.AdminMoveReplica(ctx, []byte("m"), 3, 4); err != nil || !slices.Contains(ri.Replicas, 4) {
		t.Fatalf("moving range 11's replica to node 4 = %+v, %v", ri, err)
	}
	load := startBankLoad(t, ctx, c)
	awaitLoad(t, ctx, load)
	merged, err := db.AdminMerge(ctx, account(0))
	if err != nil {
		t.Fatalf("merging ranges on [1 2 3] and [1 2 4]: %v", err)
	}
	got := slices.Sorted(slices.Values(merged.Replicas))
	if merged.ID != 10 || len(merged.End) != 0 || !slices.Equal(got, []uint64{1, 2, 3}) {
		t.Errorf("merged range %+v; want range 10 to the end of the key space on [1 2 3]", merged)
	}
	awaitLoad(t, ctx, load)
	load.stop()
	if sum, err := total(ctx, db); err != nil || sum != accounts*initialBalance {
		t.Errorf("total %d, %v after the merge", sum, err)
	}
}

// TestAMergeWaitsForAMoveOfItsRange: while range 10 moves a replica to a
// new node 4 (a learner receiving a snapshot of range 10's span), merges
// of range 10 with range 11 are attempted at its leader again and again.
// None may apply meanwhile: node 4 would apply it from its log on top of a
// snapshot without range 11's data, and serve range 11's keys empty. Once
// the move is done the merge goes through, and node 4, given the merged
// range's lease, reads range 11's key.
func TestAMergeWaitsForAMoveOfItsRange(t *testing.T) {
	c := localcluster.StartT(t, threeNodesFile(t, ""), localcluster.Options{RebalanceInterval: -1})
	db, err := c.Client("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 120*time.Second)
	put := func(key string, v []byte) {
		t.Helper()
		retry(t, ctx, "put "+key, func() error { _, err := db.Put(ctx, []byte(key), v); return err })
	}
	blob := make([]byte, 1<<20-64) // 32 MiB in range 10: its snapshot streams for about a second
	for i := range 32 {
		_, _ = rand.Read(blob)
		put(fmt.Sprintf("a-blob-%02d", i), blob)
	}
	put("n-register", []byte("1")) // in range 11
	if err := c.JoinNode(4, "us-east1"); err != nil {
		t.Fatal(err)
	}
	awaitRows(t, ctx, c, "node 4 live", func(rows map[uint64]admin.NodeRow) bool { return rows[4].Live })
	leader := c.Leader(10)
	from := uint64(1)
	if from == leader {
		from = 2
	}
	conn, err := c.Dialer("us-east1").Conn(leader)
	if err != nil {
		t.Fatal(err)
	}
	rc := rangepb.NewRangeClient(conn)
	moved := make(chan error, 1)
	go func() { // at the leader itself: no client retries the move elsewhere
		_, err := rc.MoveReplica(ctx, &rangepb.MoveReplicaRequest{RangeId: 10, From: from, To: 4})
		moved <- err
	}()
	for !slices.Contains(c.Node(leader).Range(10).Desc().GetLearners(), 4) {
		select {
		case err := <-moved:
			t.Fatalf("the move ended (%v) before node 4 was seen as a learner", err)
		case <-time.After(time.Millisecond):
		}
	}
	attempts, mergedDuring := 0, false
	var moveErr error
merging:
	for {
		select {
		case moveErr = <-moved:
			break merging
		default:
		}
		attempts++
		mctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := rc.AdminMerge(mctx, &rangepb.AdminMergeRequest{RangeId: 10, EndKey: []byte("m")})
		cancel()
		if err == nil {
			mergedDuring = true
			t.Logf("range 10 merged while node 4 was joining it (attempt %d): %v", attempts, newestDesc(c, 10))
			moveErr = <-moved
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if moveErr != nil { // a loaded machine: finish the move through a client
		t.Logf("the move at the leader: %v", moveErr)
		retry(t, ctx, "the move", func() error {
			if slices.Contains(newestDesc(c, 10).GetReplicas(), 4) {
				return nil
			}
			_, err := db.AdminMoveReplica(ctx, nil, from, 4)
			return err
		})
	}
	t.Logf("%d merges attempted during the move", attempts)
	if attempts == 0 {
		t.Fatal("no merge was attempted during the move")
	}
	if !mergedDuring { // colocates range 11 with range 10 first
		retry(t, ctx, "the merge after the move", func() error { _, err := db.AdminMerge(ctx, nil); return err })
	}
	retry(t, ctx, "moving the merged range's lease to node 4", func() error { _, _, err := db.AdminTransferLease(ctx, nil, 4); return err })
	var v []byte
	retry(t, ctx, "reading range 11's key", func() error {
		return db.Update(ctx, func(ctx context.Context, tx *client.Txn) (err error) {
			v, _, err = tx.Get(ctx, []byte("n-register"))
			return err
		})
	})
	if string(v) != "1" {
		t.Fatalf("range 11's key read at node 4 = %q; want 1 (merged during the move: %v)", v, mergedDuring)
	}
}

// TestAReplicaMoveBringsItsNeighboursLease: a merge subsumes the
// right-hand range where both ranges lead, and a move of the left-hand
// range's replicas leaves the two unmergeable, so a subsume that lands
// after the move strands the right-hand range's keys (nemesis seed 47,
// stop 47: a leader that took the left range over had not applied the
// subsume yet and let a move start). So before range 10 moves a replica,
// range 11's lease comes to range 10's leader, where every subsume that
// could still apply is visible or is that node's own. With range 11's
// lease on another node, a move of range 10 succeeds, range 11 then leads
// on range 10's leader, and its key is intact.
func TestAReplicaMoveBringsItsNeighboursLease(t *testing.T) {
	c := localcluster.StartT(t, threeNodesFile(t, ""), localcluster.Options{RebalanceInterval: -1})
	db, err := c.Client("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 60*time.Second)
	if _, err := db.Put(ctx, []byte("n-key"), []byte("v")); err != nil { // in range 11
		t.Fatal(err)
	}
	if err := c.JoinNode(4, "us-east1"); err != nil {
		t.Fatal(err)
	}
	awaitRows(t, ctx, c, "node 4 live", func(rows map[uint64]admin.NodeRow) bool { return rows[4].Live })
	x := c.Leader(10)
	if x == 0 {
		t.Fatal("range 10 has no leader")
	}
	away := c.Leader(11)
	if away == x || away == 0 {
		away = x%3 + 1 // another of nodes 1-3
		if _, _, err := db.AdminTransferLease(ctx, []byte("m"), away); err != nil {
			t.Fatalf("handing range 11's lease to node %d: %v", away, err)
		}
	}
	if h := c.Node(away).Range(11).LeaseHolder(); h != away {
		t.Fatalf("range 11's lease is on node %d after the transfer to node %d", h, away)
	}
	from := away // not range 10's leader, which would first hand its own lease away
	ri, err := db.AdminMoveReplica(ctx, []byte("a"), from, 4)
	if err != nil || !slices.Contains(ri.Replicas, 4) {
		t.Fatalf("moving range 10's replica from node %d to node 4 = %+v, %v", from, ri, err)
	}
	if h := c.Node(x).Range(11).LeaseHolder(); h != x {
		t.Errorf("range 11's lease is on node %d after range 10 moved a replica at node %d; want it there", h, x)
	}
	expectValues(t, ctx, db, map[string]string{"n-key": "v"})
}
