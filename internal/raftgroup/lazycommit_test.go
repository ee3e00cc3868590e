package raftgroup_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/terroir-db/terroir/internal/node"
)

// coalescedAppends returns how many commit-only appends node n's leaders
// held and then dropped for a newer append (commitappend.go).
func coalescedAppends(t *testing.T, n *node.Node) float64 {
	t.Helper()
	mfs, err := n.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "terroir_raft_commit_appends_coalesced_total" {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatal("no terroir_raft_commit_appends_coalesced_total")
	return 0
}

// A range is LazyCommit (commitappend.go): under concurrent writers its
// leader drops commit-only appends that the next append supersedes, and
// once the writes stop every follower still applies all that was
// committed (within a second here; the hold's end itself is
// TestCommitOnlyAppendsWaitForTheNextAppend's).
func TestARangesFollowersLearnCommitsFromTheNextAppend(t *testing.T) {
	c, db, ctx := startOneRegion(t)
	if _, err := db.Put(ctx, []byte("a"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	leaderID := c.Leader(rangeGroup)
	before := coalescedAppends(t, c.Node(leaderID))
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Go(func() {
			for i := range 25 {
				if _, err := db.Put(ctx, fmt.Appendf(nil, "b%d-%d", w, i), []byte("v")); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if c.Leader(rangeGroup) != leaderID {
		t.Skip("the range's leader moved during the writes")
	}
	if n := coalescedAppends(t, c.Node(leaderID)) - before; n == 0 {
		t.Fatal("200 writes from 8 writers: no commit-only append coalesced")
	}
	committed := c.Node(leaderID).Group(rangeGroup).Applied()
	wctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	for _, id := range c.NodeIDs() {
		g := c.Node(id).Group(rangeGroup)
		for g.Applied() < committed {
			select {
			case <-wctx.Done():
				t.Fatalf("node %d applied up to %d, 1 s after the leader applied %d", id, g.Applied(), committed)
			case <-time.After(time.Millisecond):
			}
		}
	}
}
