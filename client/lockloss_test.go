package client_test

import (
	"context"
	"crypto/rand"
	"errors"
	"testing"
	"time"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/localcluster"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// lostLocksScenario: t1 reads k, then loses its read lock (loseLocks), t2
// updates k, then t1 writes k from what it read. t1 must not commit: that
// would lose t2's update.
func lostLocksScenario(t *testing.T, opts localcluster.Options, loseLocks func(c *localcluster.Cluster)) {
	c, db := startCluster(t, opts)
	ctx := ctxT(t, 30*time.Second)
	k := []byte("acct")
	if err := db.Update(ctx, func(ctx context.Context, tx *client.Txn) error {
		return tx.Put(ctx, k, []byte("100"))
	}); err != nil {
		t.Fatal(err)
	}
	t1 := db.Begin()
	if v, _, err := t1.Get(ctx, k); err != nil || string(v) != "100" {
		t.Fatalf("t1 read %q %v", v, err)
	}
	loseLocks(c)
	if err := db.Update(ctx, func(ctx context.Context, tx *client.Txn) error {
		return tx.Put(ctx, k, []byte("150"))
	}); err != nil {
		t.Fatalf("t2: %v", err)
	}
	err := t1.Put(ctx, k, []byte("90"))
	if err == nil {
		_, err = t1.Commit(ctx)
	}
	// ErrConflict when a step finds the locks gone, ErrAborted when a
	// heartbeat found it first: either way nothing was committed.
	if !errors.Is(err, client.ErrConflict) && !errors.Is(err, client.ErrAborted) {
		t.Fatalf("t1, whose read lock was lost, ended with %v; want ErrConflict or ErrAborted (a lost update otherwise)", err)
	}
}

func TestLockLossAcrossLeaseChangeAborts(t *testing.T) {
	lostLocksScenario(t, localcluster.Options{}, func(c *localcluster.Cluster) {
		if err := c.StopNode(c.Leader(10)); err != nil {
			t.Fatal(err)
		}
	})
}

// TestSilentCoordinatorLosesItsLocks takes a lock the way a coordinator would
// and then goes silent (no operation, no heartbeat): after orphan_after the
// leader drops it, another transaction updates the key, and the silent
// transaction's commit is refused — it would lose that update otherwise.
func TestSilentCoordinatorLosesItsLocks(t *testing.T) {
	c, db := startCluster(t, localcluster.Options{OrphanAfter: 300 * time.Millisecond})
	ctx := ctxT(t, 30*time.Second)
	k := []byte("acct")
	rc, meta, lock := lockedAcct(t, ctx, c, db, k)
	time.Sleep(time.Second) // silent past orphan_after
	if err := db.Update(ctx, func(ctx context.Context, tx *client.Txn) error {
		return tx.Put(ctx, k, []byte("150"))
	}); err != nil {
		t.Fatalf("update after the silent transaction's bound: %v", err)
	}
	_, err := rc.CommitOnePhase(ctx, &pb.OnePhaseRequest{RangeId: 10, Txn: meta, LockCount: 1, Incarnation: lock.GetIncarnation(),
		Writes: []*pb.Write{{Key: k, Value: []byte("90")}}})
	if status.Code(err) != codes.Aborted {
		t.Fatalf("commit of the silent transaction = %v; want Aborted (its locks are gone)", err)
	}
}

// TestWaitingIsNotSilence speaks the wire protocol, so neither transaction
// heartbeats: the older takes j, then waits for k, which the younger holds.
// The silent younger is resolved after orphan_after and the older gets k; the
// older, silent as long but waiting all along, keeps j — its lock on k comes
// back under the incarnation it took j under.
func TestWaitingIsNotSilence(t *testing.T) {
	c, db := startCluster(t, localcluster.Options{OrphanAfter: 300 * time.Millisecond})
	ctx := ctxT(t, 30*time.Second)
	if err := db.Update(ctx, func(ctx context.Context, tx *client.Txn) error { return tx.Put(ctx, []byte("k"), []byte("0")) }); err != nil {
		t.Fatal(err)
	}
	rc, older := rawTxn(t, c)
	_, younger := rawTxn(t, c)
	j, err := rc.Lock(ctx, &pb.LockRequest{RangeId: 10, Txn: older, Key: []byte("j")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rc.Lock(ctx, &pb.LockRequest{RangeId: 10, Txn: younger, Key: []byte("k")}); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	k, err := rc.Lock(ctx, &pb.LockRequest{RangeId: 10, Txn: older, Key: []byte("k")})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the older transaction waited %v for k", time.Since(began).Round(time.Millisecond))
	if k.GetIncarnation() != j.GetIncarnation() {
		t.Fatalf("the older transaction's locks were dropped while it waited (incarnation %d, then %d)", j.GetIncarnation(), k.GetIncarnation())
	}
}

// lockedAcct writes k = 100, then locks k exclusively for a fresh
// transaction over the wire (so it sends no heartbeats) and returns it.
func lockedAcct(t *testing.T, ctx context.Context, c *localcluster.Cluster, db *client.DB, k []byte) (pb.RangeClient, *pb.TxnMeta, *pb.LockResponse) {
	t.Helper()
	if err := db.Update(ctx, func(ctx context.Context, tx *client.Txn) error { return tx.Put(ctx, k, []byte("100")) }); err != nil {
		t.Fatal(err)
	}
	rc, meta := rawTxn(t, c)
	lock, err := rc.Lock(ctx, &pb.LockRequest{RangeId: 10, Txn: meta, Key: k})
	if err != nil {
		t.Fatal(err)
	}
	return rc, meta, lock
}

// rawTxn returns a Range client of range 10's leader and a fresh
// transaction's metadata, for tests that speak the wire protocol directly
// (and so send no heartbeats).
func rawTxn(t *testing.T, c *localcluster.Cluster) (pb.RangeClient, *pb.TxnMeta) {
	t.Helper()
	id := make([]byte, 16)
	_, _ = rand.Read(id)
	meta := &pb.TxnMeta{Id: id, Priority: uint64(time.Now().UnixNano()), TxnStateGroup: 2}
	conn, err := c.Dialer("us-east1").Conn(c.Leader(10))
	if err != nil {
		t.Fatal(err)
	}
	return pb.NewRangeClient(conn), meta
}

// TestPrepareWhoseCallerGaveUpIsResolved prepares with a deadline shorter than
// the (delayed) Raft round, so the caller gives up while the prepare still
// applies. The record must not outlive its locks: it is resolved (aborted),
// the key stays writable afterwards, and a failover does not wedge the range.
func TestPrepareWhoseCallerGaveUpIsResolved(t *testing.T) {
	c, db := startCluster(t, localcluster.Options{OrphanAfter: 300 * time.Millisecond})
	ctx := ctxT(t, 60*time.Second)
	k := []byte("acct")
	rc, meta, lock := lockedAcct(t, ctx, c, db, k)
	c.Net.SetExtraDelay(30 * time.Millisecond)
	pctx, cancel := context.WithTimeout(ctx, 45*time.Millisecond)
	_, err := rc.Prepare(pctx, &pb.PrepareRequest{RangeId: 10, Txn: meta, LockCount: 1, Incarnation: lock.GetIncarnation(),
		Writes: []*pb.Write{{Key: k, Value: []byte("stranded")}}})
	cancel()
	t.Logf("prepare with a short deadline: %v", err)
	time.Sleep(300 * time.Millisecond)
	c.Net.SetExtraDelay(0)

	// Resolution (abort: no commit was recorded) frees the key.
	if err := db.Update(ctxT(t, 10*time.Second), func(ctx context.Context, tx *client.Txn) error {
		return tx.Put(ctx, k, []byte("200"))
	}); err != nil {
		t.Fatalf("write after the abandoned prepare: %v", err)
	}
	if err := c.StopNode(c.Leader(10)); err != nil {
		t.Fatal(err)
	}
	var v []byte
	if err := db.Update(ctxT(t, 10*time.Second), func(ctx context.Context, tx *client.Txn) error {
		v, _, err = tx.Get(ctx, k)
		return err
	}); err != nil || string(v) != "200" {
		t.Fatalf("read after failover = %q, %v; want 200", v, err)
	}
}
