package rangeserver

import (
	"context"
	"math"
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

// steppedEpoch is a local epoch that advances by step on every read.
type steppedEpoch struct{ e, step uint64 }

func (s *steppedEpoch) Read(context.Context) (uint64, error) { s.e += s.step; return s.e, nil }

// TestCloseReadsDoNotInflateTheEpochRate: a side close reads the local
// epoch a moment after the tick did; two reads a millisecond apart must
// not count a step of the epoch as its rate, or the tick would stop
// reusing reads and read ten times as often. Reads minRateSpan apart set
// the rate.
func TestCloseReadsDoNotInflateTheEpochRate(t *testing.T) {
	src := &steppedEpoch{e: 100, step: 1}
	r := &Replica{self: 1, cfg: Config{EpochInterval: 10 * time.Millisecond}}
	r.home.Store(&Home{Epochs: Epochs{Local: src}})
	r.sm = openSM(t, 1)
	ctx := context.Background()
	for range 3 {
		if _, err := r.readLocal(ctx, 0); err != nil {
			t.Fatal(err)
		}
	}
	if got := r.epochRead.perSec; got > 0 {
		t.Fatalf("three reads within a millisecond set a rate of %.0f epochs/s", got)
	}
	time.Sleep(minRateSpan)
	src.step = 2
	if _, err := r.readLocal(ctx, 0); err != nil {
		t.Fatal(err)
	}
	// 4 epochs since the first read, over a bit more than 50 ms: under
	// the full pace of 100/s, which is the floor.
	if got := r.epochRead.perSec; got != 100 {
		t.Fatalf("rate %.0f epochs/s after reads %v apart, want the full pace, 100", got, minRateSpan)
	}
	from := r.epochRead.at
	time.Sleep(minRateSpan)
	src.step = 15
	if _, err := r.readLocal(ctx, 0); err != nil {
		t.Fatal(err)
	}
	span := r.epochRead.at.Sub(from)
	if got, want := r.epochRead.perSec, max(15/span.Seconds(), 100); math.Abs(got-want) > 0.01 {
		t.Fatalf("rate %.2f epochs/s after 15 epochs in %v, want %.2f", got, span, want)
	}
	if r.epochRead.epoch != 120 || r.epochRead.began.After(r.epochRead.at) {
		t.Fatalf("last read %+v, want epoch 120, begun before it returned", r.epochRead)
	}
}

// TestSideTransportKeepsCloses flowing to a slow peer: while an RPC to a
// peer across the WAN is still in flight, the next closes go in RPCs of
// their own (up to sideInFlight), each carrying the newest close of every
// range queued for it; Close waits for the RPCs in flight.
func TestSideTransportKeepsClosesFlowing(t *testing.T) {
	release := make(chan struct{})
	sent := make(chan *pb.SideClosedRequest, 16)
	tr := NewSideTransport(1, time.Millisecond, func(ctx context.Context, node uint64, req *pb.SideClosedRequest) error {
		sent <- req
		select {
		case <-release: // a slow peer: the reply takes until released
		case <-ctx.Done():
		}
		return nil
	})
	closes := func(rangeID, epoch uint64) *pb.SideClosed {
		return &pb.SideClosed{RangeId: rangeID, Generation: 1, Epoch: epoch, AppliedIndex: 7}
	}
	var got []*pb.SideClosedRequest
	next := func() *pb.SideClosedRequest {
		t.Helper()
		select {
		case req := <-sent:
			got = append(got, req)
			return req
		case <-time.After(sideTimeout / 3): // well before a stuck RPC times out
			t.Fatalf("no RPC sent; sent so far %v", got)
			return nil
		}
	}
	tr.Send([]uint64{2}, closes(10, 5))
	tr.Send([]uint64{2}, closes(11, 6))
	if req := next(); len(req.GetCloses()) != 2 || req.GetFromNode() != 1 {
		t.Fatalf("the first RPC carries %v from node %d, want both ranges' closes from node 1", req.GetCloses(), req.GetFromNode())
	}
	for i := range sideInFlight - 1 {
		tr.Send([]uint64{2}, closes(10, uint64(7+2*i)))
		tr.Send([]uint64{2}, closes(10, uint64(8+2*i))) // replaces the one before it
		req := next()
		if len(req.GetCloses()) != 1 || req.GetCloses()[0].GetEpoch() != uint64(8+2*i) {
			t.Fatalf("RPC %d carries %v, want range 10's newest close, epoch %d", i+2, req.GetCloses(), 8+2*i)
		}
	}
	tr.Send([]uint64{2}, closes(10, 99))
	select {
	case req := <-sent:
		t.Fatalf("an RPC went with %d in flight: %v", sideInFlight, req.GetCloses())
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	if req := next(); req.GetCloses()[0].GetEpoch() != 99 {
		t.Fatalf("once a reply came, the queued close went as %v, want epoch 99", req.GetCloses())
	}
	tr.Close()
}
