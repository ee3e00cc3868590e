package client_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/localcluster"
)

// orphanAfter is the bound the cluster is configured with.
const orphanAfter = 500 * time.Millisecond

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

// TestCoordinatorCrashes: a real two-range commit whose coordinator dies at
// each crash point, sometimes with one participant's leader killed at the same
// moment. The participants resolve it through the state store within the
// orphan bound: aborted when it died before the commit record, applied when
// it died after.
func TestCoordinatorCrashes(t *testing.T) {
	c, db := startCluster(t, localcluster.Options{OrphanAfter: orphanAfter})
	ctx := ctxT(t, 120*time.Second)
	for i, tc := range []struct {
		point      client.CrashPoint
		killLeader bool
	}{{client.CrashAfterPrepare, false}, {client.CrashAfterCommitRecord, false}, {client.CrashAfterPrepare, true}, {client.CrashAfterCommitRecord, true}} {
		keys := map[uint64][]byte{10: fmt.Appendf(nil, "a-crash-%d", i), 11: fmt.Appendf(nil, "x-crash-%d", i)}
		var killed uint64
		var seen []uint64
		db.SetCrashHook(func(p client.CrashPoint, _ []byte, ranges []uint64) bool {
			if p != tc.point {
				return false
			}
			seen = ranges
			if tc.killLeader {
				if killed = c.Leader(10); killed != 0 {
					if err := c.StopNode(killed); err != nil {
						t.Error(err)
					}
				}
			}
			return true
		})
		err := db.Update(ctx, func(ctx context.Context, tx *client.Txn) error {
			for _, k := range keys {
				if err := tx.Put(ctx, k, []byte("v")); err != nil {
					return err
				}
			}
			return nil
		})
		db.SetCrashHook(nil)
		crashed := time.Now()
		if !errors.Is(err, client.ErrCommitUnknown) {
			t.Fatalf("%v: commit returned %v, want ErrCommitUnknown", tc.point, err)
		}
		if len(seen) != 2 {
			t.Fatalf("%v: hook saw ranges %v, want both", tc.point, seen)
		}
		if killed != 0 {
			if err := c.RestartNode(killed); err != nil {
				t.Fatal(err)
			}
		}
		took := waitUnlocked(t, c, crashed)
		want := tc.point == client.CrashAfterCommitRecord
		for k, ok := range readKeys(t, ctx, db, keys) {
			if ok != want {
				t.Errorf("%v (leader killed: %v): %s visible = %v, want %v", tc.point, killed != 0, k, ok, want)
			}
		}
		t.Logf("coordinator crashed %v (leader %d killed): locks released in %v, applied = %v", tc.point, killed, took, want)
	}
}

// TestReadAfterCommitRecordAcrossLeaderDeath: a transaction's coordinator
// dies right after its commit record, and the leader of one of its ranges
// dies with it. A transaction begun after that, reading and writing the same
// key at the new leader, must see the first one's write (the commit record
// came first in real time) without anyone telling the participants: the new
// leader re-locks the prepared transaction and resolves it.
func TestReadAfterCommitRecordAcrossLeaderDeath(t *testing.T) {
	c, db := startCluster(t, localcluster.Options{OrphanAfter: orphanAfter, Crashable: true})
	ctx := ctxT(t, 60*time.Second)
	a, x := []byte("a-prepared"), []byte("x-prepared")
	var killed uint64
	db.SetCrashHook(func(p client.CrashPoint, _ []byte, _ []uint64) bool {
		if p != client.CrashAfterCommitRecord {
			return false
		}
		if killed = c.Leader(10); killed != 0 {
			if err := c.KillNode(killed); err != nil {
				t.Error(err)
			}
		}
		return true
	})
	err := db.Update(ctx, func(ctx context.Context, tx *client.Txn) error {
		if err := tx.Put(ctx, a, []byte("t1")); err != nil {
			return err
		}
		return tx.Put(ctx, x, []byte("t1"))
	})
	db.SetCrashHook(nil)
	if !errors.Is(err, client.ErrCommitUnknown) || killed == 0 {
		t.Fatalf("commit = %v, leader killed = %d; want ErrCommitUnknown and a kill", err, killed)
	}
	var read string
	if err := db.Update(ctx, func(ctx context.Context, tx *client.Txn) error {
		v, _, err := tx.Get(ctx, a)
		read = string(v)
		if err != nil {
			return err
		}
		return tx.Put(ctx, a, append(v, "+t2"...))
	}); err != nil {
		t.Fatal(err)
	}
	if read != "t1" {
		t.Fatalf("a transaction after the commit record read %q at the new leader, want the committed %q", read, "t1")
	}
	if err := c.RestartNode(killed); err != nil {
		t.Fatal(err)
	}
}

// TestBackToBackLeaseTransfersResolveTheOrphanTheyWaitFor: a transaction's
// coordinator dies after prepare, and the leader of one of its ranges is
// then asked, again and again with no pause, to hand its lease over, as a
// replica change asks a neighbour's leaseholder (leadNeighbour). Each
// transfer waits for the prepared transaction to settle, and only the
// leader's tick settles an orphan: it must keep doing so while a transfer
// is under way, so the orphan is aborted and a transfer goes through.
func TestBackToBackLeaseTransfersResolveTheOrphanTheyWaitFor(t *testing.T) {
	c, db := startCluster(t, localcluster.Options{OrphanAfter: orphanAfter})
	ctx := ctxT(t, 60*time.Second)
	db.SetCrashHook(func(p client.CrashPoint, _ []byte, _ []uint64) bool { return p == client.CrashAfterPrepare })
	err := db.Update(ctx, func(ctx context.Context, tx *client.Txn) error {
		if err := tx.Put(ctx, []byte("a-orphan"), []byte("v")); err != nil {
			return err
		}
		return tx.Put(ctx, []byte("x-orphan"), []byte("v"))
	})
	db.SetCrashHook(nil)
	crashed := time.Now()
	if !errors.Is(err, client.ErrCommitUnknown) {
		t.Fatalf("commit returned %v, want ErrCommitUnknown", err)
	}
	from := c.Leader(10)
	if from == 0 {
		t.Fatal("range 10 has no leader")
	}
	rep := c.Node(from).Range(10)
	var to uint64
	for _, id := range rep.Desc().GetReplicas() {
		if id != from {
			to = id
			break
		}
	}
	bound := 20 * orphanAfter
	var last error
	for {
		if _, last = rep.TransferLease(ctx, to, false); last == nil {
			break
		}
		if time.Since(crashed) > bound {
			t.Fatalf("range 10's lease did not move from node %d to node %d within %v of the coordinator's death: %v", from, to, bound, last)
		}
	}
	took := waitUnlocked(t, c, crashed)
	for k, ok := range readKeys(t, ctx, db, map[uint64][]byte{10: []byte("a-orphan"), 11: []byte("x-orphan")}) {
		if ok {
			t.Errorf("%s is visible: the orphan prepared and never recorded its commit, so it must abort", k)
		}
	}
	t.Logf("lease moved and locks released %v after the coordinator died", took)
}
