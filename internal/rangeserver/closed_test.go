package rangeserver

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
)

func closedCmd(epoch, leaseStart uint64) *pb.Command {
	return &pb.Command{Cmd: &pb.Command_Closed{Closed: &pb.ClosedEpochCmd{Epoch: epoch, LeaseStart: leaseStart}}}
}

// TestClosedEpochIsTrustedOnceInTheEngine: a ClosedEpochCmd takes effect
// only under the lease it was proposed in, never lowers the closed epoch,
// and reads trust it only once its batch is in the engine (PostApply),
// since on a follower the versions it covers may apply in the same batch.
// It survives a restart, a split hands it to the right-hand range, and a
// merge keeps the smaller of the two.
func TestClosedEpochIsTrustedOnceInTheEngine(t *testing.T) {
	sm := openSM(t, 1)
	apply(t, sm, leaseCmd(1, 5, 100, 1, 0))
	if res := apply(t, sm, closedCmd(9, 4))[0].(Applied); !res.Rejected {
		t.Fatalf("a close under another lease applied: %+v", res)
	}
	apply(t, sm, onePhase("t1", 12, "k", "v"), closedCmd(12, 5))
	if c := sm.ClosedEpoch(); c != 0 {
		t.Fatalf("closed epoch %d trusted before PostApply", c)
	}
	sm.PostApply(0)
	if c := sm.ClosedEpoch(); c != 12 {
		t.Fatalf("closed epoch %d after PostApply, want 12", c)
	}
	apply(t, sm, closedCmd(10, 5))
	sm.PostApply(0)
	if c := sm.ClosedEpoch(); c != 12 {
		t.Fatalf("a lower close lowered the closed epoch to %d", c)
	}
	again, err := NewStateMachine(sm.e, &pb.RangeDescriptor{RangeId: 10, Generation: 1})
	if err != nil {
		t.Fatal(err)
	}
	if c := again.ClosedEpoch(); c != 12 {
		t.Fatalf("closed epoch after a restart %d, want 12", c)
	}
	split := apply(t, again, &pb.Command{Cmd: &pb.Command_Split{Split: &pb.SplitCmd{SplitKey: []byte("m"), RightRangeId: 11, Generation: 1}}})[0].(Applied)
	if split.Split == nil {
		t.Fatalf("split: %+v", split)
	}
	right, err := NewStateMachine(sm.e, split.Split.Right)
	if err != nil {
		t.Fatal(err)
	}
	if c := right.ClosedEpoch(); c != 12 {
		t.Fatalf("the right-hand range of a split has closed epoch %d, want 12", c)
	}
	// Merge: the right half closed less; the merged range keeps its value,
	// at once (lowering needs no wait).
	apply(t, right, closedCmd(20, 5))
	right.PostApply(0)
	apply(t, again, closedCmd(30, 5))
	again.PostApply(0)
	rd := apply(t, right, &pb.Command{Cmd: &pb.Command_Subsume{Subsume: &pb.SubsumeCmd{Generation: 2, LeaseStart: 5}}})[0].(Applied).Subsumed
	if rd == nil {
		t.Fatal("subsume rejected")
	}
	if res := apply(t, right, closedCmd(40, 5))[0].(Applied); !res.Rejected {
		t.Fatalf("a subsumed range applied a close: %+v", res)
	}
	m := apply(t, again, &pb.Command{Cmd: &pb.Command_Merge{Merge: &pb.MergeCmd{Generation: 2, LeaseStart: 5, Right: rd, RightClosedEpoch: right.ClosedEpoch()}}})[0].(Applied)
	if m.Merge == nil {
		t.Fatalf("merge: %+v", m)
	}
	if c := again.ClosedEpoch(); c != 20 {
		t.Fatalf("merged range's closed epoch %d, want the right half's 20", c)
	}
}

// TestClosedReadRefusesAboveTheClosedEpoch: a replica serves a read from
// its closed epoch c only at epochs up to c+1; asked to wait, it serves
// once a close raises c enough, and refuses when none does in time.
func TestClosedReadRefusesAboveTheClosedEpoch(t *testing.T) {
	ctx := context.Background()
	sm := openSM(t, 1)
	apply(t, sm, leaseCmd(1, 1, 100, 1, 0), closedCmd(7, 1))
	sm.PostApply(0)
	r := &Replica{sm: sm}
	if _, err := r.closedRead(ctx, 8, 0); err != nil {
		t.Fatalf("a read at the closed epoch + 1: %v", err)
	}
	if _, err := r.closedRead(ctx, 9, 0); !errors.Is(err, ErrNotClosed) {
		t.Fatalf("a read at the closed epoch + 2: %v, want ErrNotClosed", err)
	}
	if _, err := r.closedRead(ctx, 9, 20*time.Millisecond); !errors.Is(err, ErrNotClosed) {
		t.Fatalf("a read at the closed epoch + 2 with no close while it waits: %v, want ErrNotClosed", err)
	}
	done := make(chan error, 1)
	go func() {
		c, err := r.closedRead(ctx, 9, time.Minute)
		if err == nil && c != 8 {
			err = fmt.Errorf("served by closed epoch %d, want 8", c)
		}
		done <- err
	}()
	time.Sleep(10 * time.Millisecond)
	apply(t, sm, closedCmd(8, 1))
	select {
	case err := <-done:
		t.Fatalf("served before the close was in the engine: %v", err)
	case <-time.After(10 * time.Millisecond):
	}
	sm.PostApply(0)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("a read waiting for epoch 8 to close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the close did not wake the waiting read")
	}
}
