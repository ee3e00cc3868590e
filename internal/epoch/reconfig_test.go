package epoch_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/terroir-db/terroir/internal/localcluster"
)

// setVoters changes group's configuration at its leader, retrying until the
// leader has applied one whose voters are want (a change Raft dropped, or
// one proposed to a replica that lost leadership, is proposed again).
func setVoters(t *testing.T, c *localcluster.Cluster, group uint64, want []uint64, changes ...*raftpb.ConfChangeSingle) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		l := c.Leader(group)
		if l == 0 {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		g := c.Node(l).Group(group)
		voters, _, joint := g.Members()
		slices.Sort(voters)
		if !joint && slices.Equal(voters, want) {
			return
		}
		if !joint {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, _ = g.ProposeConfChange(ctx, &raftpb.ConfChangeV2{Changes: changes}, nil)
			cancel()
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("group %d did not reach voters %v in 20 s", group, want)
}

func change(typ raftpb.ConfChangeType, node uint64) *raftpb.ConfChangeSingle {
	return &raftpb.ConfChangeSingle{Type: typ.Enum(), NodeId: proto.Uint64(node)}
}

// Epoch reads stay monotonic while the epoch group's configuration changes
// under them (DESIGN.md §12): a voter removed (it keeps its stale replica
// and answers under its old configuration), added back as a learner and
// promoted in a joint change that removes another voter (the leader among
// them, in turn). The readers started from the bootstrap voters and follow
// the configurations the replies name.
func TestMonotonicAcrossConfigurationChanges(t *testing.T) {
	c := startCluster(t)
	const group = 1
	waitLeader(t, c, group)

	h := &history{}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var lastErr error // under h.mu
	for client := 0; client < 2; client++ {
		r, err := c.EpochReader("us-east1")
		if err != nil {
			t.Fatal(err)
		}
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					rctx, cancel := context.WithTimeout(ctx, time.Second)
					start := time.Now()
					e, err := r.Read(rctx)
					end := time.Now()
					cancel()
					if err != nil {
						if !errors.Is(err, context.Canceled) {
							h.mu.Lock()
							h.fails++
							lastErr = err
							h.mu.Unlock()
						}
						continue
					}
					h.add(read{start, end, e})
				}
			}()
		}
	}
	epochNow := func() uint64 {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.newest
	}
	waitAdvance := func(what string) {
		t.Helper()
		from, since := epochNow(), time.Now()
		for epochNow() < from+10 || time.Since(since) < 200*time.Millisecond {
			if time.Since(since) > 10*time.Second {
				h.mu.Lock()
				err := lastErr
				h.mu.Unlock()
				t.Fatalf("after %s the epoch read did not advance 10 times in 10 s (stuck at %d; last error %v)", what, epochNow(), err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitAdvance("start")
	voters := []uint64{1, 2, 3}
	for round := 0; round < 3; round++ {
		// Take out the leader in round 0, followers after.
		out := voters[2]
		if round == 0 {
			out = c.Leader(group)
		}
		keep := slices.DeleteFunc(slices.Clone(voters), func(n uint64) bool { return n == out })
		setVoters(t, c, group, keep, change(raftpb.ConfChangeRemoveNode, out))
		waitAdvance("removing a voter")
		setVoters(t, c, group, keep, change(raftpb.ConfChangeAddLearnerNode, out))
		waitAdvance("adding it back as a learner")
		// Promote it and remove another voter in one joint change.
		gone := keep[0]
		next := []uint64{keep[1], out}
		slices.Sort(next)
		setVoters(t, c, group, next, change(raftpb.ConfChangeAddNode, out), change(raftpb.ConfChangeRemoveNode, gone))
		waitAdvance("a joint change")
		voters = append(slices.Clone(next), gone)
		slices.Sort(voters)
		setVoters(t, c, group, voters, change(raftpb.ConfChangeAddNode, gone))
		waitAdvance("adding the removed voter back")
		voters = []uint64{next[0], next[1], gone}
	}
	stop()
	wg.Wait()
	if len(h.reads) < 100 {
		t.Fatalf("only %d reads completed", len(h.reads))
	}
	checkMonotonic(t, h.reads)
	t.Logf("%d reads checked, %d failed, final epoch %d", len(h.reads), h.fails, h.newest)
}
