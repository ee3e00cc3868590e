package client_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/admin"
	"github.com/terroir-db/terroir/internal/localcluster"
)

// awaitHosting waits until node hosts group (want) or no longer does.
func awaitHosting(t *testing.T, ctx context.Context, c *localcluster.Cluster, node, group uint64, want bool) {
	t.Helper()
	for (c.Node(node).Group(group) != nil) != want {
		if ctx.Err() != nil {
			t.Fatalf("node %d hosting group %d: want %v", node, group, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The epoch, transaction-state and directory groups move like ranges
// (DESIGN.md §12) under a bank load and cross-range transactions: a joined
// node takes a replica of each (the local epoch group's from its leader,
// which hands leadership on first), the sources drop theirs, restarts keep
// the moves, and a client that knows only the topology's replicas finds a
// group whose leader is a node the topology never named. Bad moves are
// refused and change nothing.
func TestMoveNonRangeGroups(t *testing.T) {
	c := localcluster.StartT(t, threeNodesFile(t, ""), localcluster.Options{RebalanceInterval: -1})
	db, err := c.Client("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 150*time.Second)
	fund(t, ctx, db)
	load := startBankLoad(t, ctx, c)

	// Cross-range writes: both counters move together, through the
	// transaction-state group (two ranges: a two-phase commit).
	var crossed atomic.Int64
	work, stopCross := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for work.Err() == nil {
			err := db.Update(work, func(ctx context.Context, tx *client.Txn) error {
				for _, k := range []string{"b-cross", "y-cross"} {
					v, _, err := tx.Get(ctx, []byte(k))
					if err != nil {
						return err
					}
					var n uint64
					if len(v) == 8 {
						n = binary.BigEndian.Uint64(v)
					}
					if err := tx.Put(ctx, []byte(k), binary.BigEndian.AppendUint64(nil, n+1)); err != nil {
						return err
					}
				}
				return nil
			})
			if err == nil {
				crossed.Add(1)
			}
		}
	}()

	if err := c.JoinNode(4, "us-east1"); err != nil {
		t.Fatal(err)
	}
	d := c.Dialer("us-east1")
	move := func(group, from, to uint64) {
		t.Helper()
		mctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		voters, err := admin.MoveGroupReplica(mctx, d, c.Topology, group, from, to)
		if err != nil {
			t.Fatalf("moving group %d's replica %d → %d: %v", group, from, to, err)
		}
		if slices.Contains(voters, from) || !slices.Contains(voters, to) || len(voters) != 3 {
			t.Fatalf("group %d's voters after moving %d → %d: %v", group, from, to, voters)
		}
		awaitHosting(t, ctx, c, from, group, false)
		awaitHosting(t, ctx, c, to, group, true)
		t.Logf("group %d moved from node %d to node %d: voters %v", group, from, to, voters)
	}
	move(2, 3, 4)           // transaction state
	move(1, c.Leader(1), 4) // the local epoch group, from its leader
	move(3, 2, 4)           // the directory

	// Bad moves: typed errors, nothing changes.
	for _, bad := range []struct {
		name            string
		group, from, to uint64
	}{
		{"a range", 10, 1, 4},
		{"an unknown group", 99, 1, 4},
		{"from a node that is not a voter", 2, 3, 1},
		{"to a voter", 2, 1, 4},
		{"to an unknown node", 2, 1, 9},
	} {
		mctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := admin.MoveGroupReplica(mctx, d, c.Topology, bad.group, bad.from, bad.to)
		cancel()
		if !errors.Is(err, admin.ErrBadGroupMove) {
			t.Errorf("moving %s: %v; want ErrBadGroupMove", bad.name, err)
		}
	}

	// Leadership of the transaction-state group on node 4, which no
	// client's topology names: a fresh client finds it.
	for c.Leader(2) != 4 {
		if l := c.Leader(2); l != 0 {
			c.Node(l).Group(2).TransferLeadership(4)
		}
		if ctx.Err() != nil {
			t.Fatal("group 2's leadership did not move to node 4")
		}
		time.Sleep(50 * time.Millisecond)
	}
	fresh, err := c.Client("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	if err := fresh.Update(ctx, func(ctx context.Context, tx *client.Txn) error {
		for _, k := range []string{"b-fresh", "y-fresh"} {
			if err := tx.Put(ctx, []byte(k), []byte("v")); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatalf("a cross-range transaction from a fresh client: %v", err)
	}

	// Restarts keep the moves: node 4 hosts what moved to it, node 3 not
	// the group it gave away.
	for _, id := range []uint64{4, 3} {
		if err := c.StopNode(id); err != nil {
			t.Fatal(err)
		}
		if err := c.RestartNode(id); err != nil {
			t.Fatal(err)
		}
	}
	for _, g := range []uint64{1, 2, 3} {
		awaitHosting(t, ctx, c, 4, g, true)
	}
	awaitHosting(t, ctx, c, 3, 3, true)
	if c.Node(3).Group(2) != nil {
		t.Error("node 3 hosts group 2 again after a restart")
	}
	time.Sleep(time.Second) // the load runs on the moved groups

	stopCross()
	wg.Wait()
	load.stop()
	if sum, err := total(ctx, db); err != nil || sum != accounts*initialBalance {
		t.Fatalf("total after the moves %d, %v", sum, err)
	}
	var counts [2]uint64
	if _, err := db.View(ctx, client.Linearizable, func(ctx context.Context, s *client.Snapshot) error {
		for i, k := range []string{"b-cross", "y-cross"} {
			v, ok, err := s.Get(ctx, []byte(k))
			if err != nil || !ok || len(v) != 8 {
				return fmt.Errorf("reading %s: %q, %v, %v", k, v, ok, err)
			}
			counts[i] = binary.BigEndian.Uint64(v)
		}
		return nil
	}); err != nil || counts[0] != counts[1] || counts[0] < uint64(crossed.Load()) {
		t.Fatalf("cross-range counters %v (%v) after %d acknowledged transactions; want equal, at least that", counts, err, crossed.Load())
	}
	t.Logf("%d transfers, %d checks, %d cross-range transactions", load.transfers.Load(), load.checks.Load(), counts[0])
}
