package epoch_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/terroir-db/terroir/internal/admin"
)

// Epoch reads stay monotonic while the epoch group's replicas move, one
// joint configuration change at a time (DESIGN.md §12), to three nodes
// that joined, the leader's among them: readers started from the
// topology's replicas follow the configurations the replies name, and one
// started once none of those hosts the group finds it.
func TestMonotonicAcrossConfigurationChanges(t *testing.T) {
	c := startCluster(t)
	const group = 1
	waitLeader(t, c, group)

	h := &history{}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	readContinuously(t, ctx, c, h, 2, 4, &wg)
	waitAdvance := func(what string) { t.Helper(); h.waitAdvance(t, what, 200*time.Millisecond) }
	waitAdvance("start")
	for _, id := range []uint64{4, 5, 6} {
		if err := c.JoinNode(id, "us-east1"); err != nil {
			t.Fatal(err)
		}
	}
	d := c.Dialer("us-east1")
	originals := []uint64{1, 2, 3}
	for i, to := range []uint64{4, 5, 6} {
		from := originals[0]
		if l := c.Leader(group); i == 1 && slices.Contains(originals, l) {
			from = l // the leader's, which hands leadership on first
		}
		originals = slices.DeleteFunc(originals, func(n uint64) bool { return n == from })
		mctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		voters, err := admin.MoveGroupReplica(mctx, d, c.Topology, group, from, to)
		cancel()
		if err != nil {
			t.Fatalf("moving the epoch group's replica %d → %d: %v", from, to, err)
		}
		t.Logf("moved %d → %d: voters %v", from, to, voters)
		waitAdvance(fmt.Sprintf("moving %d → %d", from, to))
	}
	// None of the topology's replicas hosts the group now: a reader that
	// starts from them finds it.
	fresh, err := c.EpochReader("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	start := time.Now()
	e, err := fresh.Read(rctx)
	cancel()
	if err != nil {
		t.Fatalf("a reader starting from the topology's replicas: %v", err)
	}
	h.add(read{start, time.Now(), e})
	waitAdvance("all moved")
	stop()
	wg.Wait()
	if len(h.reads) < 100 {
		t.Fatalf("only %d reads completed", len(h.reads))
	}
	checkMonotonic(t, h.reads)
	t.Logf("%d reads checked, %d failed, final epoch %d", len(h.reads), h.fails, h.newest)
}
