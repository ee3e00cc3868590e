package rangeserver

import (
	"context"
	"testing"
	"time"

	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
)

// TestSideCloseTrustedOnceItsIndexApplied: a side-transported close raises
// the closed epoch only once the replica has applied its index at its
// generation; a close of another generation, or a pending one a split,
// merge or replica change overtook, raises nothing; an older close is
// ignored, and none lowers the closed epoch the log stored. A read waiting
// for the epoch wakes when the close becomes trusted.
func TestSideCloseTrustedOnceItsIndexApplied(t *testing.T) {
	sm := openSM(t, 1)
	apply(t, sm, leaseCmd(1, 5, 100, 1, 0), closedCmd(12, 5))
	sm.PostApply(2)
	if c := sm.ClosedEpoch(); c != 12 {
		t.Fatalf("closed epoch %d after the logged close, want 12", c)
	}
	gen := sm.Descriptor().GetGeneration()

	sm.receiveSide(&pb.SideClosed{RangeId: 10, Generation: gen, Epoch: 20, AppliedIndex: 5}, 3)
	if c := sm.ClosedEpoch(); c != 12 {
		t.Fatalf("closed epoch %d before the side close's index 5 applied (applied 3), want 12", c)
	}
	woke := make(chan bool, 1)
	go func() { woke <- sm.waitClosed(context.Background(), 20, 5*time.Second) }()
	time.Sleep(20 * time.Millisecond)
	sm.PostApply(5)
	if c := sm.ClosedEpoch(); c != 20 {
		t.Fatalf("closed epoch %d once index 5 applied, want 20", c)
	}
	if !<-woke {
		t.Fatal("a read waiting for epoch 20 did not wake when the side close was trusted")
	}
	sm.receiveSide(&pb.SideClosed{RangeId: 10, Generation: gen, Epoch: 18, AppliedIndex: 5}, 5)
	sm.receiveSide(&pb.SideClosed{RangeId: 10, Generation: gen + 1, Epoch: 30, AppliedIndex: 5}, 5)
	sm.receiveSide(&pb.SideClosed{RangeId: 10, Generation: gen - 1, Epoch: 30, AppliedIndex: 5}, 5)
	if c := sm.ClosedEpoch(); c != 20 {
		t.Fatalf("closed epoch %d after an older close and two of other generations, want 20", c)
	}
	// Already applied: trusted at once.
	sm.receiveSide(&pb.SideClosed{RangeId: 10, Generation: gen, Epoch: 22, AppliedIndex: 4}, 5)
	if c := sm.ClosedEpoch(); c != 22 {
		t.Fatalf("closed epoch %d after a close whose index was applied, want 22", c)
	}
	// A close still pending when a split applies is void: the index it
	// names is reached at another generation.
	sm.receiveSide(&pb.SideClosed{RangeId: 10, Generation: gen, Epoch: 40, AppliedIndex: 9}, 5)
	split := apply(t, sm, &pb.Command{Cmd: &pb.Command_Split{Split: &pb.SplitCmd{SplitKey: []byte("m"), RightRangeId: 11, Generation: gen}}})[0].(Applied)
	if split.Split == nil {
		t.Fatalf("split: %+v", split)
	}
	sm.PostApply(9)
	if c := sm.ClosedEpoch(); c != 22 {
		t.Fatalf("closed epoch %d: a close made before the split was trusted after it, want 22", c)
	}
	// A logged close below the side-transported one lowers nothing.
	apply(t, sm, closedCmd(15, 5))
	sm.PostApply(10)
	if c := sm.ClosedEpoch(); c != 22 {
		t.Fatalf("closed epoch %d after a lower logged close, want 22", c)
	}
}

// TestSideCloseOnlyWhereNoSuccessorCanQueue: a leader sends a side close
// only with its lease in force at the local epoch it read, and that epoch
// LeaseRenewEpochs or more before the lease's end — exactly where no other
// replica reading that epoch or an earlier one could acquire a lease or
// queue one behind it (nextLease), the argument sideclosed.go rests on.
func TestSideCloseOnlyWhereNoSuccessorCanQueue(t *testing.T) {
	const renew, leaseEpochs = 50, 100
	lease := &pb.Lease{Holder: 1, Start: 100, End: 300, Seq: 4}
	for _, tc := range []struct {
		name   string
		lease  *pb.Lease
		memEnd uint64
		e      uint64
		want   bool
	}{
		{"in force, far from the end", lease, 300, 200, true},
		{"exactly renew epochs before the end", lease, 300, 250, true},
		{"within renew epochs of the end", lease, 300, 251, false},
		{"past the end", lease, 300, 301, false},
		{"before the lease starts", lease, 300, 99, false},
		{"a transfer lowered the end in memory", lease, 201, 200, false},
		{"another holder", &pb.Lease{Holder: 2, Start: 100, End: 300, Seq: 4}, 300, 200, false},
		{"another lease of ours", &pb.Lease{Holder: 1, Start: 101, End: 300, Seq: 5}, 300, 200, false},
	} {
		got := sideAllowed(tc.lease, 1, 100, tc.memEnd, tc.e, renew)
		if got != tc.want {
			t.Errorf("%s: allowed %v, want %v", tc.name, got, tc.want)
		}
		if !got {
			continue
		}
		for read := uint64(0); read <= tc.e; read++ {
			if next := nextLease(tc.lease, 2, read, leaseEpochs, renew); next != nil {
				t.Errorf("%s: a side close is allowed at epoch %d, yet node 2 reading %d acquires %+v", tc.name, tc.e, read, next)
				break
			}
		}
	}
}
