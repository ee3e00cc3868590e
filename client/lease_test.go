package client_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/localcluster"
)

// awaitLoad waits until the bank load has gone on after what the test did:
// more transfers and total checks than it had made so far (not a speed
// goal: on a loaded machine it takes longer).
func awaitLoad(t *testing.T, ctx context.Context, load *bankLoad) {
	t.Helper()
	transfers, checks := load.transfers.Load(), load.checks.Load()
	for load.transfers.Load() < transfers+10 || load.checks.Load() < checks+2 {
		if ctx.Err() != nil {
			t.Fatalf("the load stopped: %d transfers and %d checks, as before", load.transfers.Load(), load.checks.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// servingNode returns the node whose replica of range id serves it under
// its lease, or 0.
func servingNode(c *localcluster.Cluster, id uint64) uint64 {
	for _, n := range c.NodeIDs() {
		if r := c.Node(n).Range(id); r != nil && r.Status().GetLeader() {
			return n
		}
	}
	return 0
}

// TestLeaseTransferUnderLoad hands range 10's lease around its replicas
// while clients transfer money (DESIGN.md §12): each successor's lease
// starts before its predecessor's would have ended (no wait for it to run
// out), the successor serves, every total read is right, and transfers to
// a node that is not a replica, or to the holder itself, change nothing.
func TestLeaseTransferUnderLoad(t *testing.T) {
	c, db := startCluster(t, localcluster.Options{RebalanceInterval: -1})
	ctx := ctxT(t, 120*time.Second)
	fund(t, ctx, db)
	load := startBankLoad(t, ctx, c)
	key := account(0) // in range 10, [, m)
	waitServing := func() uint64 {
		for {
			if n := servingNode(c, 10); n != 0 {
				return n
			}
			if ctx.Err() != nil {
				t.Fatal("range 10 has no serving leaseholder")
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	for i := 0; i < 6; i++ {
		time.Sleep(300 * time.Millisecond)
		from := waitServing()
		old := c.Node(from).Range(10).Status().GetLease()
		to := from%3 + 1
		began := time.Now()
		_, start, err := db.AdminTransferLease(ctx, key, to)
		if err != nil {
			t.Fatalf("transfer %d from node %d to %d: %v", i, from, to, err)
		}
		if start > old.GetEnd() {
			t.Fatalf("the new lease starts at epoch %d, after the old one's end %d: the transfer waited it out", start, old.GetEnd())
		}
		if got := waitServing(); got != to {
			t.Fatalf("after the transfer to node %d, node %d serves range 10", to, got)
		}
		t.Logf("lease of range 10: node %d -> %d, serving after %v (new lease from epoch %d, the old one ran to %d)",
			from, to, time.Since(began).Round(time.Millisecond), start, old.GetEnd())
	}
	holder := waitServing()
	for _, bad := range []uint64{holder, 99} {
		_, _, err := db.AdminTransferLease(ctx, key, bad)
		if !errors.Is(err, client.ErrLeaseTarget) {
			t.Errorf("transfer to node %d = %v; want ErrLeaseTarget", bad, err)
		}
		if want := "already holds the lease"; bad == holder && (err == nil || !strings.Contains(err.Error(), want)) {
			t.Errorf("transfer to the holder, node %d = %v; want it to say it %s", bad, err, want)
		}
	}
	if got := waitServing(); got != holder {
		t.Errorf("a refused transfer moved the lease from node %d to %d", holder, got)
	}
	awaitLoad(t, ctx, load)
	load.stop()
	if sum, err := total(ctx, db); err != nil || sum != accounts*initialBalance {
		t.Fatalf("final total %d, %v", sum, err)
	}
	t.Logf("%d transfers, %d total checks", load.transfers.Load(), load.checks.Load())
}

// With a global epoch service, the successor of a transferred lease starts
// its highest epoch at its predecessor's — a global epoch, not the lease's
// first local epoch (which is far larger): a write there is versioned at a
// global epoch, so a strong snapshot begun after it commits sees it, and so
// does one in the other data region.
func TestLeaseTransferVersionsInGlobalEpochs(t *testing.T) {
	c := localcluster.StartT(t, "../examples/three-regions.yaml", localcluster.Options{RebalanceInterval: -1})
	ctx := ctxT(t, 60*time.Second)
	east, west := eastWest(t, c)
	key := []byte("apple") // range 100, us-east1
	put := func(v string) {
		t.Helper()
		if err := east.Update(ctx, func(ctx context.Context, tx *client.Txn) error { return tx.Put(ctx, key, []byte(v)) }); err != nil {
			t.Fatal(err)
		}
	}
	put("before")
	for i := 0; i < 3; i++ {
		from := servingNode(c, 100)
		for from == 0 {
			time.Sleep(10 * time.Millisecond)
			from = servingNode(c, 100)
		}
		to := from%3 + 1 // nodes 1-3 are us-east1's
		if _, _, err := east.AdminTransferLease(ctx, key, to); err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("after transfer %d", i)
		put(want)
		for _, db := range []*client.DB{east, west} {
			var got []byte
			if _, err := db.View(ctx, client.Strong, func(ctx context.Context, s *client.Snapshot) error {
				var err error
				got, _, err = s.Get(ctx, key)
				return err
			}); err != nil {
				t.Fatal(err)
			}
			if string(got) != want {
				t.Fatalf("a strong snapshot after the write under node %d's transferred lease read %q; want %q", to, got, want)
			}
		}
	}
}
