package client_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/localcluster"
)

// txnRecords returns how many transaction records the cluster's txn-state
// replicas hold, on the replica holding the most (followers may lag).
func txnRecords(t *testing.T, c *localcluster.Cluster) int {
	t.Helper()
	most := 0
	for _, id := range c.NodeIDs() {
		if n := c.Node(id); n != nil {
			got, err := n.TxnRecords()
			if err != nil {
				t.Fatal(err)
			}
			most = max(most, got)
		}
	}
	return most
}

// waitRecords waits until the cluster holds at most want transaction
// records, and fails the test after limit.
func waitRecords(t *testing.T, c *localcluster.Cluster, want int, limit time.Duration) time.Duration {
	t.Helper()
	began := time.Now()
	for {
		got := txnRecords(t, c)
		if got <= want {
			return time.Since(began)
		}
		if time.Since(began) > limit {
			t.Fatalf("%d transaction records after %v, want at most %d", got, limit, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestTxnRecordsAreForgotten (DESIGN.md §14): the record of a two-phase
// commit goes once its participants applied the outcome — at once by its
// coordinator's word, and, when the coordinator dies after its commit
// point or before it (an orphan the participants abort), by the txn-state
// leader after the grace period, which settles the commit with the
// participants first. Committed data stays, aborted data never appears.
func TestTxnRecordsAreForgotten(t *testing.T) {
	const grace = 4 * time.Second
	c, db := startCluster(t, localcluster.Options{OrphanAfter: orphanAfter, TxnRecordGrace: grace})
	ctx := ctxT(t, 90*time.Second)
	pair := func(i int) map[uint64][]byte { // "a…" in range 10, "x…" in range 11: two-phase
		return map[uint64][]byte{10: fmt.Appendf(nil, "a-rec-%03d", i), 11: fmt.Appendf(nil, "x-rec-%03d", i)}
	}
	write := func(keys map[uint64][]byte) error {
		return db.Update(ctx, func(ctx context.Context, tx *client.Txn) error {
			for _, k := range keys {
				if err := tx.Put(ctx, k, []byte("v")); err != nil {
					return err
				}
			}
			return nil
		})
	}
	const n = 40
	for i := range n {
		if err := write(pair(i)); err != nil {
			t.Fatal(err)
		}
	}
	if got := txnRecords(t, c); got == 0 {
		t.Fatal("no transaction record right after 40 two-phase commits: the test shows nothing")
	}
	// Well before the grace period: the coordinators, not the cleaner.
	took := waitRecords(t, c, 0, grace*3/4)
	t.Logf("%d two-phase commits: records forgotten by their coordinator within %v", n, took)

	// Coordinators that die: after the commit record (nobody forgets it;
	// the participants apply it as orphans), and before it (the
	// participants abort it, recording the abort).
	for i, point := range []client.CrashPoint{client.CrashAfterCommitRecord, client.CrashAfterPrepare} {
		keys := pair(n + i)
		db.SetCrashHook(func(p client.CrashPoint, _ []byte, _ []uint64) bool { return p == point })
		_ = write(keys)
		db.SetCrashHook(nil)
		deadline := time.Now().Add(20 * orphanAfter)
		for txnRecords(t, c) == 0 && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond) // the commit record, or the participants' abort
		}
		if txnRecords(t, c) == 0 {
			t.Fatalf("%v: no record left behind", point)
		}
		took := waitRecords(t, c, 0, 5*grace)
		want := point == client.CrashAfterCommitRecord
		for k, ok := range readKeys(t, ctx, db, keys) {
			if ok != want {
				t.Errorf("%v: %s visible = %v, want %v", point, k, ok, want)
			}
		}
		t.Logf("coordinator crashed %v: its record forgotten by the txn-state leader after %v", point, took)
	}
	// Nothing else went wrong: every earlier commit is readable.
	for k, ok := range readKeys(t, ctx, db, pair(7)) {
		if !ok {
			t.Errorf("%s lost", k)
		}
	}
}
