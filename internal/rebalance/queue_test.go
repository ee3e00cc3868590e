package rebalance

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/terroir-db/terroir/internal/directory/directorypb"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
)

// fakeCluster applies the queue's steps to a View, except moves of the
// ranges in stuck, which wait until their context ends (a range whose
// leader is cut off, a snapshot that streams slowly).
type fakeCluster struct {
	mu    sync.Mutex
	v     View
	stuck map[string]bool // range start key → its moves hang
	moves []string        // start keys moved, in order (stuck ones too)
}

func (f *fakeCluster) Leads() bool { return true }

func (f *fakeCluster) View(context.Context) (View, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v := f.v
	v.Ranges = nil
	for _, d := range f.v.Ranges {
		c := rng(d.GetRangeId(), string(d.GetStartKey()), d.GetReplicas()...)
		v.Ranges = append(v.Ranges, c)
	}
	v.Leases = map[uint64]uint64{}
	for k, h := range f.v.Leases {
		v.Leases[k] = h
	}
	v.Groups = slices.Clone(f.v.Groups)
	return v, nil
}

func (f *fakeCluster) step(a Action) {
	f.mu.Lock()
	defer f.mu.Unlock()
	apply(&f.v, []Action{a})
}

func (f *fakeCluster) MoveReplica(ctx context.Context, key []byte, from, to uint64) error {
	f.mu.Lock()
	f.moves = append(f.moves, string(key))
	stuck := f.stuck[string(key)]
	d := f.v.Ranges[slices.IndexFunc(f.v.Ranges, func(d *pb.RangeDescriptor) bool { return string(d.GetStartKey()) == string(key) })]
	f.mu.Unlock()
	if stuck {
		<-ctx.Done()
		return ctx.Err()
	}
	f.step(Action{Kind: Move, Range: d, From: from, To: to})
	return nil
}

func (f *fakeCluster) TransferLease(_ context.Context, key []byte, to uint64, _ bool) error {
	f.mu.Lock()
	d := f.v.Ranges[slices.IndexFunc(f.v.Ranges, func(d *pb.RangeDescriptor) bool { return string(d.GetStartKey()) == string(key) })]
	f.mu.Unlock()
	f.step(Action{Kind: Transfer, Range: d, To: to})
	return nil
}

func (f *fakeCluster) MoveGroupReplica(_ context.Context, group, from, to uint64) error {
	f.step(Action{Kind: MoveGroup, Group: group, From: from, To: to})
	return nil
}

func (f *fakeCluster) MoveNonVoter(_ context.Context, _ []byte, from, to uint64) error {
	f.step(Action{Kind: MoveNonVoter, From: from, To: to})
	return nil
}

func (f *fakeCluster) Split(_ context.Context, key []byte) error {
	f.step(Action{Kind: Split, Key: key})
	return nil
}

func (f *fakeCluster) AddNonVoter(_ context.Context, _ []byte, to uint64) error {
	f.step(Action{Kind: AddNonVoter, To: to})
	return nil
}

func (f *fakeCluster) Rehome(_ context.Context, _ []byte, region string) error {
	f.step(Action{Kind: Rehome, Home: region})
	return nil
}

func (f *fakeCluster) MarkGone(_ context.Context, id uint64) error {
	f.step(Action{Kind: Gone, From: id})
	return nil
}

func (f *fakeCluster) state(id uint64) directorypb.NodeState {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, l := range f.v.Nodes {
		if l.GetNode().GetId() == id {
			return l.GetNode().GetState()
		}
	}
	return directorypb.NodeState_NODE_GONE
}

// TestQueueStepsDoNotWaitForEachOther: one range's move hangs (until the
// step's timeout); meanwhile the queue's next rounds drain the node's other
// ranges and its group replica, never start a second move of the hanging
// range, and never count more moves under way than MaxMoves. The node is
// marked gone only once the hanging range has moved too.
func TestQueueStepsDoNotWaitForEachOther(t *testing.T) {
	decom := live(4)
	decom.Node.State = directorypb.NodeState_NODE_DECOMMISSIONING
	f := &fakeCluster{
		v: View{
			Nodes:  []*directorypb.NodeLiveness{live(1), live(2), live(3), decom, live(5)},
			Ranges: []*pb.RangeDescriptor{rng(1, "a", 1, 2, 4), rng(2, "b", 1, 3, 4), rng(3, "c", 2, 3, 4), rng(4, "d", 1, 4, 5)},
			Leases: map[uint64]uint64{1: 1, 2: 1, 3: 2, 4: 1},
			Groups: []Group{{ID: 9, Voters: []uint64{1, 2, 4}, Settled: true}},
		},
		stuck: map[string]bool{"a": true},
	}
	const timeout = 2 * time.Second
	q := NewQueue(f, QueueConfig{Config: Config{MaxMoves: 2}, ActionTimeout: timeout})
	ctx := t.Context()
	began := time.Now()
	for f.state(4) != directorypb.NodeState_NODE_GONE {
		if time.Since(began) > 10*timeout {
			t.Fatalf("node 4 not gone after %v; moves %v", time.Since(began), f.moves)
		}
		q.Once(ctx)
		if st := q.Stats(); st.InFlight > 0 {
			if m := q.inFlight(time.Now()).Moves; m > 2 {
				t.Errorf("%d moves under way; MaxMoves is 2", m)
			}
		}
		if f.state(4) == directorypb.NodeState_NODE_GONE {
			break
		}
		// Before the hanging move times out, the rest is drained.
		if time.Since(began) > timeout/2 && time.Since(began) < timeout*9/10 {
			f.mu.Lock()
			v := f.v
			rest := 0
			for _, d := range v.Ranges[1:] {
				if slices.Contains(d.GetReplicas(), 4) {
					rest++
				}
			}
			if slices.Contains(v.Groups[0].Voters, 4) {
				rest++
			}
			twice := len(slices.DeleteFunc(slices.Clone(f.moves), func(k string) bool { return k != "a" })) > 1
			f.stuck = nil // its retry, after the timeout, goes through
			f.mu.Unlock()
			if rest > 0 {
				t.Fatalf("%v after the queue began, node 4 still hosts %d replicas besides the hanging range's: steps wait for each other", time.Since(began).Round(time.Millisecond), rest)
			}
			if twice {
				t.Fatalf("the hanging range's move started twice while under way: %v", f.moves)
			}
			if run := q.Stats().Running; !slices.ContainsFunc(run, func(s string) bool {
				return strings.HasPrefix(s, "move range 1 4→") && strings.Contains(s, " since ")
			}) {
				t.Fatalf("steps under way %q; want the hanging move among them, with when it began", run)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	q.Wait()
	if st := q.Stats(); st.InFlight != 0 || len(st.Running) != 0 || st.Failed[Move] != 1 || st.Done[Gone] != 1 || st.Done[MoveGroup] != 1 {
		t.Errorf("stats %+v; want nothing in flight, one failed move (the hang), one gone, one group move", st)
	}
	if got, want := q.Stats().LastFailed, "move range 1 4→"; !strings.HasPrefix(got, want) || !strings.Contains(got, context.DeadlineExceeded.Error()) {
		t.Errorf("last failed step %q; want the hanging move (%q…) and its timeout", got, want)
	}
}

// TestAMoveGetsTimeToStreamItsRange: a step that streams a range's
// snapshot (a move of a decommissioning node's replica) runs for
// ActionTimeout plus twice what streaming the range takes (twice its size
// on disk, MaxMoves streams sharing the snapshot rate); other steps, and
// ranges of unknown size, get ActionTimeout.
func TestAMoveGetsTimeToStreamItsRange(t *testing.T) {
	decom := live(4)
	decom.Node.State = directorypb.NodeState_NODE_DECOMMISSIONING
	f := &fakeCluster{
		v: View{
			Nodes:  []*directorypb.NodeLiveness{live(1), live(2), live(3), decom},
			Ranges: []*pb.RangeDescriptor{rng(1, "a", 1, 2, 4)},
			Leases: map[uint64]uint64{1: 1},
			Load:   map[uint64]Load{1: {Bytes: 256 << 10}},
		},
		stuck: map[string]bool{"a": true},
	}
	// 256 KiB on disk, 2 moves sharing 4 MiB/s: 1 MiB streamed in 0.25 s, doubled.
	q := NewQueue(f, QueueConfig{Config: Config{MaxMoves: 2}, ActionTimeout: 50 * time.Millisecond, SnapshotRate: 4 << 20})
	began := time.Now()
	if plan := q.Once(t.Context()); len(plan) != 1 || plan[0].Kind != Move {
		t.Fatalf("planned %+v, want one move", plan)
	}
	q.Wait()
	if took := time.Since(began); took < 500*time.Millisecond {
		t.Fatalf("the hanging move of a 256 KiB range ended after %v, want 550 ms", took)
	}
	for _, c := range []struct {
		a    Action
		load map[uint64]Load
		want time.Duration
	}{
		{Action{Kind: Move, Range: rng(1, "a", 1, 2, 4)}, f.v.Load, 550 * time.Millisecond},
		{Action{Kind: Move, Range: rng(1, "a", 1, 2, 4)}, nil, 50 * time.Millisecond},
		{Action{Kind: Transfer, Range: rng(1, "a", 1, 2, 4)}, f.v.Load, 50 * time.Millisecond},
		{Action{Kind: Split, Range: rng(1, "a", 1, 2, 4)}, f.v.Load, 50 * time.Millisecond},
	} {
		if got := q.stepTimeout(c.a, c.load); got != c.want {
			t.Errorf("%v with load %v: %v, want %v", c.a.Kind, c.load, got, c.want)
		}
	}
}
