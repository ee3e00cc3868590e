package client_test

import (
	"context"
	"crypto/rand"
	"testing"
	"time"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/localcluster"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/txnstate/txnstatepb"
)

// orphanAfter is the bound the cluster is configured with.
const orphanAfter = 500 * time.Millisecond

// prepareAndVanish plays a coordinator that locks and prepares a write in each
// range, then dies. It returns the transaction's ID.
func prepareAndVanish(t *testing.T, ctx context.Context, c *localcluster.Cluster, keys map[uint64][]byte) []byte {
	t.Helper()
	id := make([]byte, 16)
	_, _ = rand.Read(id)
	meta := &pb.TxnMeta{Id: id, Priority: uint64(time.Now().UnixNano()), TxnStateGroup: 2}
	d := c.Dialer("us-east1")
	for rng, key := range keys {
		var leader uint64
		for leader == 0 {
			leader = c.Leader(rng)
			time.Sleep(5 * time.Millisecond)
		}
		conn, err := d.Conn(leader)
		if err != nil {
			t.Fatal(err)
		}
		rc := pb.NewRangeClient(conn)
		var lock *pb.LockResponse
		for {
			lock, err = rc.Lock(ctx, &pb.LockRequest{RangeId: rng, Txn: meta, Key: key})
			if err == nil || ctx.Err() != nil {
				break
			}
			time.Sleep(10 * time.Millisecond) // the lease may not be active yet
		}
		if err != nil {
			t.Fatal(err)
		}
		if _, err := rc.Prepare(ctx, &pb.PrepareRequest{RangeId: rng, Txn: meta, LockCount: 1, Incarnation: lock.GetIncarnation(),
			Writes: []*pb.Write{{Key: key, Value: []byte("orphan")}}}); err != nil {
			t.Fatal(err)
		}
	}
	return id
}

// waitUnlocked waits until no range leader holds a lock and returns how long it took.
func waitUnlocked(t *testing.T, c *localcluster.Cluster, since time.Time) time.Duration {
	t.Helper()
	for {
		held := 0
		for _, id := range c.NodeIDs() {
			for _, rng := range []uint64{10, 11} {
				if r := c.Node(id).Range(rng); r != nil {
					held += r.Locks()
				}
			}
		}
		if held == 0 {
			return time.Since(since)
		}
		if time.Since(since) > 20*orphanAfter {
			t.Fatalf("%d locks still held %v after the coordinator died", held, time.Since(since))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func readKeys(t *testing.T, ctx context.Context, db *client.DB, keys map[uint64][]byte) map[string]bool {
	t.Helper()
	present := map[string]bool{}
	err := db.Update(ctx, func(ctx context.Context, tx *client.Txn) error {
		for _, k := range keys {
			_, ok, err := tx.Get(ctx, k)
			if err != nil {
				return err
			}
			present[string(k)] = ok
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return present
}

func TestCoordinatorDiesAfterPrepare(t *testing.T) {
	c, db := startCluster(t, localcluster.Options{OrphanAfter: orphanAfter})
	ctx := ctxT(t, 60*time.Second)
	keys := map[uint64][]byte{10: []byte("a-orphan"), 11: []byte("x-orphan")}
	prepareAndVanish(t, ctx, c, keys)
	took := waitUnlocked(t, c, time.Now())
	if took > orphanAfter+time.Second {
		t.Errorf("orphaned locks released after %v, bound %v + 1 s", took, orphanAfter)
	}
	for k, ok := range readKeys(t, ctx, db, keys) {
		if ok {
			t.Errorf("%s is visible: an uncommitted orphan was applied", k)
		}
	}
	t.Logf("locks of a transaction orphaned after Prepare released in %v; both participants aborted", took)
}

func TestCoordinatorDiesAfterCommitRecord(t *testing.T) {
	c, db := startCluster(t, localcluster.Options{OrphanAfter: orphanAfter})
	ctx := ctxT(t, 60*time.Second)
	keys := map[uint64][]byte{10: []byte("a-committed"), 11: []byte("x-committed")}
	id := prepareAndVanish(t, ctx, c, keys)
	ts, err := c.TxnStateClient("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	epochs, err := c.EpochReader("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	e, err := epochs.Read(ctx) // as a coordinator would, after Prepare
	if err != nil {
		t.Fatal(err)
	}
	rec, err := ts.Decide(ctx, &txnstatepb.Record{TxnId: id, Outcome: txnstatepb.Outcome_OUTCOME_COMMITTED,
		Version: &txnstatepb.VersionID{Epoch: e, Counter: 1}})
	if err != nil || rec.GetOutcome() != txnstatepb.Outcome_OUTCOME_COMMITTED {
		t.Fatalf("recording the commit: %v %v", rec, err)
	}
	took := waitUnlocked(t, c, time.Now())
	for k, ok := range readKeys(t, ctx, db, keys) {
		if !ok {
			t.Errorf("%s is missing: a committed transaction was not applied by its participant", k)
		}
	}
	t.Logf("a transaction committed but never notified was applied by both participants in %v", took)
}
