package rangeserver

import (
	"errors"
	"testing"

	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/storage"
)

func openSM(t *testing.T, node uint64) *StateMachine {
	t.Helper()
	e, err := storage.Open(t.TempDir(), node)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	sm, err := NewStateMachine(e, 10)
	if err != nil {
		t.Fatal(err)
	}
	return sm
}

func apply(t *testing.T, sm *StateMachine, cmds ...*pb.Command) []any {
	t.Helper()
	b := sm.e.NewIndexedBatch()
	var out []any
	for i, c := range cmds {
		out = append(out, sm.Apply(b, uint64(i+1), EncodeCommand(c)))
	}
	if err := sm.e.Commit(b, true); err != nil {
		t.Fatal(err)
	}
	return out
}

func leaseCmd(holder, start, end, seq, prev uint64) *pb.Command {
	return &pb.Command{Cmd: &pb.Command_Lease{Lease: &pb.LeaseCmd{
		Lease: &pb.Lease{Holder: holder, Start: start, End: end, Seq: seq}, PrevSeq: prev}}}
}

func TestLeaseNeedsItsPredecessor(t *testing.T) {
	sm := openSM(t, 1)
	res := apply(t, sm,
		leaseCmd(1, 10, 110, 1, 0), // first lease
		leaseCmd(2, 50, 150, 1, 0), // built on the same predecessor: rejected
		leaseCmd(2, 111, 200, 2, 1),
		leaseCmd(1, 120, 220, 2, 1), // a stale renewal: rejected
	)
	granted := []bool{true, false, true, false}
	for i, r := range res {
		if r.(Applied).LeaseGranted != granted[i] {
			t.Errorf("lease command %d granted=%v, want %v", i, r.(Applied).LeaseGranted, granted[i])
		}
	}
	if l := sm.Lease(); l.GetHolder() != 2 || l.GetStart() != 111 || l.GetSeq() != 2 {
		t.Fatalf("lease = %v, want node 2's [111, 200]", l)
	}
}

func TestPrepareCommitAndSnapshot(t *testing.T) {
	sm := openSM(t, 1)
	txn := &pb.TxnMeta{Id: make([]byte, 16), Priority: 1, TxnStateGroup: 2}
	other := &pb.TxnMeta{Id: append(make([]byte, 15), 1), Priority: 2, TxnStateGroup: 2}
	apply(t, sm,
		leaseCmd(1, 1, 100, 1, 0),
		&pb.Command{Cmd: &pb.Command_Prepare{Prepare: &pb.PrepareCmd{Txn: txn, LeaseStart: 1, Writes: []*pb.Write{{Key: []byte("a"), Value: []byte("1")}}}}},
		&pb.Command{Cmd: &pb.Command_Prepare{Prepare: &pb.PrepareCmd{Txn: other, LeaseStart: 1, Writes: []*pb.Write{{Key: []byte("b"), Tombstone: true}}}}},
		&pb.Command{Cmd: &pb.Command_Commit{Commit: &pb.CommitCmd{TxnId: txn.GetId(), Version: &pb.VersionID{Epoch: 5, Counter: 1}}}},
		&pb.Command{Cmd: &pb.Command_OnePhase{OnePhase: &pb.OnePhaseCmd{TxnId: []byte("x"), LeaseStart: 1, Writes: []*pb.Write{{Key: []byte("c"), Value: []byte("3")}}, Version: &pb.VersionID{Epoch: 6, Counter: 1}}}},
	)
	// Commands evaluated under another lease have no effect.
	stale := apply(t, sm,
		&pb.Command{Cmd: &pb.Command_Prepare{Prepare: &pb.PrepareCmd{Txn: &pb.TxnMeta{Id: append(make([]byte, 15), 9)}, LeaseStart: 0, Writes: []*pb.Write{{Key: []byte("d")}}}}},
		&pb.Command{Cmd: &pb.Command_OnePhase{OnePhase: &pb.OnePhaseCmd{TxnId: []byte("y"), LeaseStart: 7, Writes: []*pb.Write{{Key: []byte("e"), Value: []byte("5")}}, Version: &pb.VersionID{Epoch: 6, Counter: 2}}}},
	)
	for i, r := range stale {
		if !r.(Applied).Rejected {
			t.Errorf("command %d under a stale lease was not rejected", i)
		}
	}
	if _, ok, _, _ := sm.e.GetMVCC(sm.DataPrefix(), []byte("e"), maxVersion); ok || sm.IsPrepared(append(make([]byte, 15), 9)) {
		t.Fatal("a command under a stale lease took effect")
	}
	if sm.IsPrepared(txn.GetId()) || !sm.IsPrepared(other.GetId()) {
		t.Fatal("prepared set wrong after commit")
	}
	snap, err := sm.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	// Another replica of the same range restores it.
	dst := openSM(t, 2)
	b := dst.e.NewIndexedBatch()
	if err := dst.Restore(b, snap); err != nil {
		t.Fatal(err)
	}
	if err := dst.e.Commit(b, true); err != nil {
		t.Fatal(err)
	}
	if v, ok, _, _ := dst.e.GetMVCC(dst.DataPrefix(), []byte("a"), maxVersion); !ok || string(v.Value) != "1" || v.ID != (storage.VersionID{Epoch: 5, Counter: 1}) {
		t.Fatalf("restored a = %q %v %v", v.Value, v.ID, ok)
	}
	if _, ok, _, _ := dst.e.GetMVCC(dst.DataPrefix(), []byte("c"), maxVersion); !ok {
		t.Fatal("restored state lost the one-phase write")
	}
	if !dst.IsPrepared(other.GetId()) || dst.Lease().GetHolder() != 1 {
		t.Fatalf("restored replica lost its prepared record or lease: %v", dst.Lease())
	}
	if err := dst.Restore(dst.e.NewIndexedBatch(), snap[:len(snap)-3]); !errors.Is(err, storage.ErrCorrupt) {
		t.Fatalf("Restore of a truncated snapshot = %v, want ErrCorrupt", err)
	}
	if res := sm.Apply(sm.e.NewIndexedBatch(), 9, []byte{0xff, 0x01}); !errors.Is(res.(error), ErrBadCommand) {
		t.Fatalf("garbage command = %v, want ErrBadCommand", res)
	}
}

func TestChooseVersion(t *testing.T) {
	for _, c := range []struct {
		epoch  uint64
		newest storage.VersionID
		want   storage.VersionID
	}{
		{7, storage.VersionID{}, storage.VersionID{Epoch: 7, Counter: 1}},
		{7, storage.VersionID{Epoch: 6, Counter: 9}, storage.VersionID{Epoch: 7, Counter: 1}},
		{7, storage.VersionID{Epoch: 7, Counter: 3}, storage.VersionID{Epoch: 7, Counter: 4}},
	} {
		v := ChooseVersion(c.epoch, c.newest)
		if got := (storage.VersionID{Epoch: v.GetEpoch(), Counter: v.GetCounter()}); got != c.want {
			t.Errorf("ChooseVersion(%d, %v) = %v, want %v", c.epoch, c.newest, got, c.want)
		}
	}
}
