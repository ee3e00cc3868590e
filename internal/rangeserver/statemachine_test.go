package rangeserver

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
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
	sm, err := NewStateMachine(e, &pb.RangeDescriptor{RangeId: 10, Generation: 1})
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
	if _, ok, _, _ := sm.Get(Versions, []byte("e"), maxVersion); ok || sm.IsPrepared(append(make([]byte, 15), 9)) {
		t.Fatal("a command under a stale lease took effect")
	}
	if sm.IsPrepared(txn.GetId()) || !sm.IsPrepared(other.GetId()) {
		t.Fatal("prepared set wrong after commit")
	}
	// Another replica of the same range takes its snapshot.
	dst := openSM(t, 2)
	transfer(t, sm, dst)
	if v, ok, _, _ := dst.Get(Versions, []byte("a"), maxVersion); !ok || string(v.Value) != "1" || v.ID != (storage.VersionID{Epoch: 5, Counter: 1}) {
		t.Fatalf("restored a = %q %v %v", v.Value, v.ID, ok)
	}
	if _, ok, _, _ := dst.Get(Versions, []byte("c"), maxVersion); !ok {
		t.Fatal("restored state lost the one-phase write")
	}
	if !dst.IsPrepared(other.GetId()) || dst.Lease().GetHolder() != 1 {
		t.Fatalf("restored replica lost its prepared record or lease: %v", dst.Lease())
	}
	if res := sm.Apply(sm.e.NewIndexedBatch(), 9, []byte{0xff, 0x01}); !errors.Is(res.(error), ErrBadCommand) {
		t.Fatalf("garbage command = %v, want ErrBadCommand", res)
	}
}

// TestRangesShareTheNodesKeySpace: two adjacent ranges on one node keep their
// data under the user key in one key space (DESIGN.md §11) and only their
// range-local state under their ids; a range's snapshot holds exactly its
// span, and restoring it replaces that span without touching its neighbour.
func TestRangesShareTheNodesKeySpace(t *testing.T) {
	e, err := storage.Open(t.TempDir(), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	left, err := NewStateMachine(e, &pb.RangeDescriptor{RangeId: 10, EndKey: []byte("m"), Generation: 1})
	if err != nil {
		t.Fatal(err)
	}
	right, err := NewStateMachine(e, &pb.RangeDescriptor{RangeId: 11, StartKey: []byte("m"), Generation: 1})
	if err != nil {
		t.Fatal(err)
	}
	write := func(sm *StateMachine, key, value string, epoch uint64) {
		apply(t, sm, &pb.Command{Cmd: &pb.Command_OnePhase{OnePhase: &pb.OnePhaseCmd{TxnId: []byte("t"), LeaseStart: sm.Lease().GetStart(),
			Writes: []*pb.Write{{Key: []byte(key), Value: []byte(value)}}, Version: &pb.VersionID{Epoch: epoch, Counter: 1},
			RegionalVersion: &pb.VersionID{Epoch: epoch + 100, Counter: 1}}}})
	}
	apply(t, left, leaseCmd(1, 1, 100, 1, 0))
	apply(t, right, leaseCmd(1, 1, 100, 1, 0))
	write(left, "apple", "L", 5)
	write(right, "melon", "R", 6)
	write(right, "zebra", "R", 7)
	// One key space: either state machine reads every key of the node.
	if v, ok, _, _ := left.Get(Versions, []byte("melon"), maxVersion); !ok || string(v.Value) != "R" {
		t.Fatalf("melon through the left range's reader = %q %v; want the shared key space's R", v.Value, ok)
	}
	view := e.NewSnapshot()
	spans, err := left.SnapshotSpans(view.Get)
	if err != nil {
		t.Fatal(err)
	}
	var keys int
	for _, sp := range spans {
		_ = view.Scan(sp[0], sp[1], func(k, _ []byte) (bool, error) {
			keys++
			if k[0] == storage.PrefixData || k[0] == storage.PrefixRegional {
				if uk, _, err := storage.DecodeMVCCKey(k[:1], k); err != nil || string(uk) >= "m" {
					t.Fatalf("the left range's snapshot holds %q (%v)", uk, err)
				}
			}
			return true, nil
		})
	}
	view.Close()
	if keys != 3 { // the lease, apple's version and its regional copy
		t.Fatalf("the left range's snapshot holds %d keys; want 3", keys)
	}
	// Restoring the left range on a node that holds both replaces only its span.
	e2, err := storage.Open(t.TempDir(), 2)
	if err != nil {
		t.Fatal(err)
	}
	defer e2.Close()
	left2, _ := NewStateMachine(e2, &pb.RangeDescriptor{RangeId: 10, EndKey: []byte("m"), Generation: 1})
	right2, _ := NewStateMachine(e2, &pb.RangeDescriptor{RangeId: 11, StartKey: []byte("m"), Generation: 1})
	apply(t, left2, leaseCmd(2, 1, 100, 1, 0))
	apply(t, right2, leaseCmd(2, 1, 100, 1, 0))
	write(left2, "avocado", "stale", 3)
	write(right2, "mango", "R2", 4)
	transfer(t, left, left2)
	for key, want := range map[string]string{"apple": "L", "avocado": "", "mango": "R2"} {
		v, ok, _, err := left2.Get(Versions, []byte(key), maxVersion)
		if err != nil || string(v.Value) != want || ok != (want != "") {
			t.Errorf("after restoring the left range, %s = %q (found %v, %v); want %q", key, v.Value, ok, err, want)
		}
	}
	if v, ok, _, _ := left2.Get(RegionalVersions, []byte("apple"), maxVersion); !ok || v.ID.Epoch != 105 {
		t.Errorf("apple's regional copy after restore = %v %v; want epoch 105", v.ID, ok)
	}
	if left2.Lease().GetHolder() != 1 || right2.Lease().GetHolder() != 2 {
		t.Errorf("leases after restore: left %v, right %v; want 1's and 2's", left2.Lease(), right2.Lease())
	}
}

// transfer installs src's state on dst as a streamed Raft snapshot does
// (raftgroup's Host): the spans src names in a consistent engine snapshot
// are vetted by dst, written into an SST that first deletes them, ingested,
// and dst reloads.
func transfer(t *testing.T, src, dst *StateMachine) {
	t.Helper()
	view := src.e.NewSnapshot()
	defer view.Close()
	spans, err := src.SnapshotSpans(view.Get)
	if err != nil {
		t.Fatal(err)
	}
	if err := dst.CheckSpans(spans); err != nil {
		t.Fatal(err)
	}
	w, err := dst.e.NewSSTWriter()
	if err != nil {
		t.Fatal(err)
	}
	for _, sp := range spans {
		if err := w.DeleteRange(sp[0], sp[1]); err != nil {
			t.Fatal(err)
		}
	}
	for _, sp := range spans {
		if err := view.Scan(sp[0], sp[1], func(k, v []byte) (bool, error) { return true, w.Set(k, v) }); err != nil {
			t.Fatal(err)
		}
	}
	path, err := w.Finish()
	if err != nil {
		t.Fatal(err)
	}
	if err := dst.e.Ingest([]string{path}); err != nil {
		t.Fatal(err)
	}
	if err := dst.Reload(); err != nil {
		t.Fatal(err)
	}
}

// A range takes a snapshot only of its own state and the data and
// regional key spaces.
func TestCheckSpansRefusesOtherState(t *testing.T) {
	sm := openSM(t, 1)
	own := [2][]byte{sm.prefix, storage.PrefixEnd(sm.prefix)}
	other := binary.BigEndian.AppendUint64([]byte{storage.PrefixState}, 99)
	for _, c := range []struct {
		spans [][2][]byte
		ok    bool
	}{
		{[][2][]byte{own, {[]byte{storage.PrefixData, 'a'}, []byte{storage.PrefixData + 1}}}, true},
		{[][2][]byte{{other, storage.PrefixEnd(other)}}, false},
		{[][2][]byte{own, {[]byte{storage.PrefixRaft, 1}, []byte{storage.PrefixRaft, 2}}}, false},
		{[][2][]byte{own, {[]byte{storage.PrefixData, 'a'}, []byte{storage.PrefixRegional, 'a'}}}, false},
		{nil, false},
	} {
		if err := sm.CheckSpans(c.spans); (err == nil) != c.ok {
			t.Errorf("CheckSpans(%x) = %v, want ok %v", c.spans, err, c.ok)
		}
	}
}

// TestMidKeySplitsTheDataInHalf: a size split's key leaves about half the
// data's bytes on each side, counting every version, and never splits a
// user key's versions or leaves a side empty.
func TestMidKeySplitsTheDataInHalf(t *testing.T) {
	ctx := context.Background()
	val := strings.Repeat("v", 100)
	n := 0
	put := func(key string, epoch uint64) *pb.Command { // a 100-byte value, by a transaction of its own
		n++
		return onePhase(fmt.Sprintf("txn-%d", n), epoch, key, val)
	}
	for _, c := range []struct {
		name   string
		writes func() []*pb.Command
		want   func(mid []byte) bool
	}{
		{"400 equal keys", func() []*pb.Command {
			var cmds []*pb.Command
			for i := range 400 {
				cmds = append(cmds, put(fmt.Sprintf("k%03d", i), 5))
			}
			return cmds
		}, func(mid []byte) bool { return string(mid) >= "k195" && string(mid) <= "k205" }},
		{"the first key holds most versions", func() []*pb.Command {
			var cmds []*pb.Command
			for e := range 300 {
				cmds = append(cmds, put("a", uint64(5+e)))
			}
			for i := range 100 {
				cmds = append(cmds, put(fmt.Sprintf("k%03d", i), 5))
			}
			return cmds
		}, func(mid []byte) bool { return string(mid) == "k000" }},
		{"one key, many versions", func() []*pb.Command {
			var cmds []*pb.Command
			for e := range 300 {
				cmds = append(cmds, put("a", uint64(5+e)))
			}
			return cmds
		}, func(mid []byte) bool { return mid == nil }},
		{"two keys", func() []*pb.Command {
			return []*pb.Command{put("a", 5), put("b", 5)}
		}, func(mid []byte) bool { return string(mid) == "b" }},
		{"no data", func() []*pb.Command { return nil }, func(mid []byte) bool { return mid == nil }},
	} {
		sm := openSM(t, 1)
		apply(t, sm, append([]*pb.Command{leaseCmd(1, 1, 1000, 1, 0)}, c.writes()...)...)
		mid, err := sm.MidKey(ctx)
		if err != nil || !c.want(mid) {
			t.Errorf("%s: MidKey = %q, %v", c.name, mid, err)
		}
	}
	sm := openSM(t, 1)
	var cmds []*pb.Command
	for i := range 400 {
		cmds = append(cmds, put(fmt.Sprintf("k%03d", i), 5))
	}
	apply(t, sm, append([]*pb.Command{leaseCmd(1, 1, 1000, 1, 0)}, cmds...)...)
	done, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := sm.MidKey(done); !errors.Is(err, context.Canceled) {
		t.Errorf("MidKey with its context done = %v, want context.Canceled", err)
	}
}

// TestACommitAfterATransferRaisesTheHandedHighest: a prepared
// transaction's outcome may apply after its range's lease was handed over
// (its coordinator's notification, or the old holder's orphan resolution
// while the transfer was under way). Its epoch must raise what the
// successor starts at (DESIGN.md §3.5, §12), or the successor could
// version a later write below a commit it follows.
func TestACommitAfterATransferRaisesTheHandedHighest(t *testing.T) {
	sm := openSM(t, 1)
	txn := &pb.TxnMeta{Id: make([]byte, 16), Priority: 1, TxnStateGroup: 2}
	handed := leaseCmd(2, 12, 112, 2, 1)
	handed.GetLease().GetLease().HandedHighest = 5
	apply(t, sm,
		leaseCmd(1, 1, 10, 1, 0),
		&pb.Command{Cmd: &pb.Command_Prepare{Prepare: &pb.PrepareCmd{Txn: txn, LeaseStart: 1, Writes: []*pb.Write{{Key: []byte("a"), Value: []byte("1")}}}}},
		handed,
	)
	if h, ok := sm.Handover(2); !ok || h != 5 {
		t.Fatalf("handover before the commit = %d, %v; want 5, true", h, ok)
	}
	apply(t, sm, &pb.Command{Cmd: &pb.Command_Commit{Commit: &pb.CommitCmd{TxnId: txn.GetId(), Version: &pb.VersionID{Epoch: 9, Counter: 1}}}})
	if h, ok := sm.Handover(2); !ok || h != 9 {
		t.Fatalf("handover after a commit at epoch 9 applied = %d, %v; want 9, true", h, ok)
	}
}
