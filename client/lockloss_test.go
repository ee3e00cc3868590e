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
	if !errors.Is(err, client.ErrConflict) {
		t.Fatalf("t1, whose read lock was lost, ended with %v; want ErrConflict (a lost update otherwise)", err)
	}
}

func TestLockLossAcrossLeaseChangeAborts(t *testing.T) {
	lostLocksScenario(t, localcluster.Options{}, func(c *localcluster.Cluster) {
		if err := c.StopNode(c.Leader(10)); err != nil {
			t.Fatal(err)
		}
	})
}

func TestLockLossToIdleReaperAborts(t *testing.T) {
	lostLocksScenario(t, localcluster.Options{OrphanAfter: 300 * time.Millisecond}, func(*localcluster.Cluster) {
		time.Sleep(time.Second) // think time past OrphanAfter: the leader drops t1
	})
}

// TestPrepareWhoseCallerGaveUpIsResolved prepares with a deadline shorter than
// the (delayed) Raft round, so the caller gives up while the prepare still
// applies. The record must not outlive its locks: it is resolved (aborted),
// the key stays writable afterwards, and a failover does not wedge the range.
func TestPrepareWhoseCallerGaveUpIsResolved(t *testing.T) {
	c, db := startCluster(t, localcluster.Options{OrphanAfter: 300 * time.Millisecond})
	ctx := ctxT(t, 60*time.Second)
	k := []byte("acct")
	if err := db.Update(ctx, func(ctx context.Context, tx *client.Txn) error { return tx.Put(ctx, k, []byte("100")) }); err != nil {
		t.Fatal(err)
	}
	id := make([]byte, 16)
	_, _ = rand.Read(id)
	meta := &pb.TxnMeta{Id: id, Priority: uint64(time.Now().UnixNano()), TxnStateGroup: 2}
	leader := c.Leader(10)
	conn, err := c.Dialer("us-east1").Conn(leader)
	if err != nil {
		t.Fatal(err)
	}
	rc := pb.NewRangeClient(conn)
	lock, err := rc.Lock(ctx, &pb.LockRequest{RangeId: 10, Txn: meta, Key: k})
	if err != nil {
		t.Fatal(err)
	}
	c.Net.SetExtraDelay(30 * time.Millisecond)
	pctx, cancel := context.WithTimeout(ctx, 45*time.Millisecond)
	_, err = rc.Prepare(pctx, &pb.PrepareRequest{RangeId: 10, Txn: meta, LockCount: 1, Incarnation: lock.GetIncarnation(),
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
