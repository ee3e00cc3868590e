package client_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/localcluster"
)

// waitHosted waits until node hosts (or, with gone, no longer hosts) a
// replica of range id.
func waitHosted(t *testing.T, c *localcluster.Cluster, node, id uint64, gone bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for (c.Node(node).Range(id) == nil) != gone {
		if time.Now().After(deadline) {
			t.Fatalf("node %d: range %d hosted %v after 20 s, want %v", node, id, !gone, gone)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestNonVoterServesItsRegion: a non-voting replica of a us-east1 range
// on a us-west1 node (DESIGN.md §13) serves us-west1's strong and stale
// snapshot reads by itself, seeing every earlier commit; a split gives the
// right half one too; cutting its region off delays no commit in the home
// region, and once healed it serves the newest state again; removed, its
// node drops it. Bad changes are refused with ErrMoveTarget.
func TestNonVoterServesItsRegion(t *testing.T) {
	c := localcluster.StartT(t, "../examples/three-regions.yaml", localcluster.Options{})
	ctx := ctxT(t, 120*time.Second)
	east, west := eastWest(t, c)
	putKey(ctx, t, east, "b-nv", "0")
	r, err := east.AdminAddNonVoter(ctx, []byte("b"), 4)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(r.NonVoters, []uint64{4}) || len(r.Replicas) != 3 || slices.Contains(r.Replicas, 4) {
		t.Fatalf("after adding a non-voter on node 4: %+v", r)
	}
	waitHosted(t, c, 4, 100, false)

	if err := c.JoinNode(10, "us-east1"); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []struct {
		node   uint64
		remove bool
	}{{1, false}, {10, false}, {99, false}, {5, true}, {1, true}} { // node 10: us-east1, the home
		change := east.AdminAddNonVoter
		if bad.remove {
			change = east.AdminRemoveNonVoter
		}
		if _, err := change(ctx, []byte("b"), bad.node); !errors.Is(err, client.ErrMoveTarget) {
			t.Errorf("change (remove %v) of a non-voter on node %d: %v, want ErrMoveTarget", bad.remove, bad.node, err)
		}
	}

	if again, err := east.AdminAddNonVoter(ctx, []byte("b"), 4); err != nil || again.Generation != r.Generation {
		t.Fatalf("adding the non-voter on node 4 again: %+v, %v; want no change", again, err)
	}

	// us-west1 reads the us-east1 key from its own region: stale reads by
	// default, strong ones when followers are preferred.
	strong, stale := 0, 0
	for i := range 5 {
		want := string(rune('a' + i))
		putKey(ctx, t, east, "b-nv", want)
		west.SetFollowerReads(client.FollowerReadsPreferred)
		got, st := getIn(ctx, t, west, client.Strong, "b-nv")
		if got != want {
			t.Fatalf("round %d: a strong read in us-west1 after the commit: %q, stats %+v; want %q", i, got, st, want)
		}
		strong += st.FollowerReads
		west.SetFollowerReads(client.FollowerReadsNearest)
		if _, st := getIn(ctx, t, west, client.Strong, "b-nv"); st.FollowerReads+st.FollowerFallbacks != 0 {
			t.Fatalf("round %d: nearest policy, a strong read in us-west1: %+v, want the leader's", i, st)
		}
		_, st = getIn(ctx, t, west, client.SerializableStale, "b-nv")
		stale += st.FollowerReads
	}
	t.Logf("of 5 reads each in us-west1, the non-voter served %d strong ones (followers preferred) and %d stale ones", strong, stale)
	if strong == 0 || stale < 3 {
		t.Fatalf("the non-voter served %d strong reads and %d stale ones of 5 each", strong, stale)
	}
	west.SetFollowerReads(client.FollowerReadsPreferred)

	// A split gives the right half the same non-voter.
	left, right, err := east.AdminSplitRanges(ctx, []byte("c"))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(left.NonVoters, []uint64{4}) || !slices.Equal(right.NonVoters, []uint64{4}) {
		t.Fatalf("split halves' non-voters: %v and %v, want [4] each", left.NonVoters, right.NonVoters)
	}
	waitHosted(t, c, 4, right.ID, false)
	putKey(ctx, t, east, "c-nv", "right")
	// The new range's non-voter serves once the range's first close has
	// reached it: ask a few times, every 100 ms, for up to 3 s.
	for attempt := 0; ; attempt++ {
		got, st := getIn(ctx, t, west, client.Strong, "c-nv")
		if got != "right" {
			t.Fatalf("a strong read of the right half in us-west1: %q, want right", got)
		}
		if st.FollowerReads == 1 {
			break
		}
		if attempt == 30 {
			t.Fatalf("a strong read of the right half in us-west1 never served by its non-voter: stats %+v", st)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// A merge gives the right half the left's non-voters first.
	if _, err := east.AdminRemoveNonVoter(ctx, []byte("c"), 4); err != nil {
		t.Fatal(err)
	}
	if _, err := east.AdminAddNonVoter(ctx, []byte("c"), 5); err != nil {
		t.Fatal(err)
	}
	merged, err := east.AdminMerge(ctx, []byte("b"))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(merged.NonVoters, []uint64{4}) || string(merged.End) != "g" {
		t.Fatalf("merged: %+v, want [\"\", \"g\") with non-voter 4", merged)
	}
	waitHosted(t, c, 5, right.ID, true)

	// Cut off, the non-voter delays no commit at home.
	c.Net.CutRegion("us-west1")
	for i := range 10 {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := east.Update(cctx, func(ctx context.Context, tx *client.Txn) error { return tx.Put(ctx, []byte("b-nv"), []byte("cut")) })
		cancel()
		if err != nil {
			t.Fatalf("commit %d in us-east1 with the non-voter's region cut off: %v", i, err)
		}
	}
	c.Net.Heal()
	deadline := time.Now().Add(20 * time.Second)
	for {
		rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		var got []byte
		st, err := west.View(rctx, client.Strong, func(ctx context.Context, s *client.Snapshot) error {
			got, _, err = s.Get(ctx, []byte("b-nv"))
			return err
		})
		cancel()
		if err == nil {
			if string(got) != "cut" {
				t.Fatalf("healed: a strong read in us-west1 read %q, want cut", got)
			}
			if st.FollowerReads == 1 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("healed, the non-voter served no strong read in 20 s (last: %v, %+v)", err, st)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// The non-voter moves to node 5 behind us-west1's back: its cached
	// descriptor still names node 4, which no longer hosts the range, and
	// its reads go on to the leader until it reads the descriptor afresh.
	if _, err := east.AdminAddNonVoter(ctx, []byte("b"), 5); err != nil {
		t.Fatal(err)
	}
	if _, err := east.AdminRemoveNonVoter(ctx, []byte("b"), 4); err != nil {
		t.Fatal(err)
	}
	waitHosted(t, c, 4, 100, true)
	west.SetFollowerReads(client.FollowerReadsNearest)
	moved := 0
	for range 5 {
		_, st := getIn(ctx, t, west, client.SerializableStale, "b-nv")
		moved += st.FollowerReads
	}
	if moved < 3 {
		t.Fatalf("after the non-voter moved to node 5, it served %d of 5 stale reads in us-west1", moved)
	}
	r, err = east.AdminRemoveNonVoter(ctx, []byte("b"), 5)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.NonVoters) != 0 {
		t.Fatalf("after removing the non-voter: %+v", r)
	}
	waitHosted(t, c, 5, r.ID, true)
	if _, st := getIn(ctx, t, west, client.SerializableStale, "b-nv"); st.FollowerReads != 0 {
		t.Fatalf("a stale read in us-west1 after the non-voter left: %+v, want the leader's", st)
	}
}
