package rangeserver

import (
	"bytes"
	"testing"

	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/storage"
)

// TestSubsumeAndMerge applies a merge's two commands as every replica does
// (DESIGN.md §11): the subsumed range takes no more writes, the merged one
// covers both spans with a generation above both, keeps its lease, holds the
// prepared records of both (one record for a transaction prepared at both),
// and the store tombstones the subsumed range. Commands under a stale
// generation or lease, or naming a neighbour that is not subsumed or not
// adjacent, change nothing; a snapshot of the merged range restores on a
// replica that still has the old span.
func TestSubsumeAndMerge(t *testing.T) {
	e, err := storage.Open(t.TempDir(), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	left, _ := NewStateMachine(e, &pb.RangeDescriptor{RangeId: 10, EndKey: []byte("m"), Region: "r", Generation: 3})
	right, _ := NewStateMachine(e, &pb.RangeDescriptor{RangeId: 11, StartKey: []byte("m"), EndKey: []byte("t"), Region: "r", Generation: 5})
	apply(t, left, leaseCmd(1, 1, 100, 1, 0))
	apply(t, right, leaseCmd(2, 7, 120, 1, 0))
	both := &pb.TxnMeta{Id: bytes.Repeat([]byte{1}, 16)}
	only := &pb.TxnMeta{Id: bytes.Repeat([]byte{2}, 16)}
	prepare := func(txn *pb.TxnMeta, lease uint64, key string) *pb.Command {
		return &pb.Command{Cmd: &pb.Command_Prepare{Prepare: &pb.PrepareCmd{Txn: txn, LeaseStart: lease, Writes: []*pb.Write{{Key: []byte(key), Value: []byte("v")}}}}}
	}
	apply(t, left, prepare(both, 1, "apple"))
	apply(t, right, prepare(both, 7, "melon"), prepare(only, 7, "peach"))

	subsume := func(gen, lease uint64) *pb.Command {
		return &pb.Command{Cmd: &pb.Command_Subsume{Subsume: &pb.SubsumeCmd{Generation: gen, LeaseStart: lease}}}
	}
	for i, r := range apply(t, right, subsume(4, 7), subsume(5, 1)) {
		if !r.(Applied).Rejected {
			t.Errorf("subsume %d under a stale generation or lease applied", i)
		}
	}
	res := apply(t, right, subsume(5, 7), prepare(&pb.TxnMeta{Id: bytes.Repeat([]byte{3}, 16)}, 7, "plum"), subsume(6, 7))
	rd := res[0].(Applied).Subsumed
	if rd == nil || !rd.GetSubsumed() || rd.GetGeneration() != 6 {
		t.Fatalf("subsume = %+v; want the descriptor subsumed at generation 6", res[0])
	}
	if !res[1].(Applied).Rejected || !res[2].(Applied).Rejected {
		t.Fatalf("a subsumed range took a prepare or a second subsume: %+v", res[1:])
	}

	merge := func(gen, lease uint64, r *pb.RangeDescriptor) *pb.Command {
		return &pb.Command{Cmd: &pb.Command_Merge{Merge: &pb.MergeCmd{Generation: gen, LeaseStart: lease, Right: r, RightPrepared: right.Prepared()}}}
	}
	notSubsumed := &pb.RangeDescriptor{RangeId: 11, StartKey: []byte("m"), EndKey: []byte("t"), Region: "r", Generation: 6}
	notAdjacent := &pb.RangeDescriptor{RangeId: 12, StartKey: []byte("n"), EndKey: []byte("t"), Region: "r", Generation: 6, Subsumed: true}
	otherRegion := &pb.RangeDescriptor{RangeId: 11, StartKey: []byte("m"), EndKey: []byte("t"), Region: "s", Generation: 6, Subsumed: true}
	for i, r := range apply(t, left, merge(2, 1, rd), merge(3, 9, rd), merge(3, 1, notSubsumed), merge(3, 1, notAdjacent), merge(3, 1, otherRegion)) {
		if !r.(Applied).Rejected {
			t.Errorf("merge %d (stale generation or lease, or a bad neighbour) applied", i)
		}
	}
	if d := left.Descriptor(); string(d.GetEndKey()) != "m" || d.GetGeneration() != 3 {
		t.Fatalf("rejected merges changed the range: %v", d)
	}
	res = apply(t, left, merge(3, 1, rd))
	m := res[0].(Applied).Merge
	if m == nil {
		t.Fatalf("merge = %+v; want applied", res[0])
	}
	if d := left.Descriptor(); string(d.GetStartKey()) != "" || string(d.GetEndKey()) != "t" || d.GetGeneration() != 7 || d.GetRangeId() != 10 {
		t.Fatalf("merged descriptor %v; want range 10 [\"\", t) at generation 7", d)
	}
	if l := left.Lease(); l.GetHolder() != 1 || l.GetStart() != 1 {
		t.Fatalf("merged lease %v; want the left range's", l)
	}
	writes := map[string]int{}
	for _, rec := range left.Prepared() {
		writes[string(rec.GetTxn().GetId())] = len(rec.GetWrites())
	}
	if writes[string(both.GetId())] != 2 || writes[string(only.GetId())] != 1 || len(writes) != 2 {
		t.Fatalf("merged prepared records %v; want both's two writes in one record and only's one", writes)
	}
	if removed, err := e.RemovedRanges(); err != nil || len(removed) != 1 || removed[0] != 11 {
		t.Fatalf("removed ranges %v, %v; want [11]", removed, err)
	}
	// A restart reads the merged state back.
	again, err := NewStateMachine(e, &pb.RangeDescriptor{RangeId: 10, EndKey: []byte("m"), Generation: 1})
	if err != nil || string(again.Descriptor().GetEndKey()) != "t" || len(again.Prepared()) != 2 {
		t.Fatalf("reloaded: %v, %d prepared, %v", again.Descriptor(), len(again.Prepared()), err)
	}

	// A replica that missed the merge restores the merged range's snapshot,
	// with data in the span it grew into.
	apply(t, left, &pb.Command{Cmd: &pb.Command_OnePhase{OnePhase: &pb.OnePhaseCmd{TxnId: []byte("t"), LeaseStart: 1,
		Writes: []*pb.Write{{Key: []byte("quince"), Value: []byte("q")}}, Version: &pb.VersionID{Epoch: 9, Counter: 1}}}})
	e2, err := storage.Open(t.TempDir(), 2)
	if err != nil {
		t.Fatal(err)
	}
	defer e2.Close()
	behind, _ := NewStateMachine(e2, &pb.RangeDescriptor{RangeId: 10, EndKey: []byte("m"), Region: "r", Generation: 3})
	transfer(t, left, behind)
	if v, ok, _, _ := behind.Get(Versions, []byte("quince"), maxVersion); !ok || string(v.Value) != "q" {
		t.Fatalf("quince after the restore = %q %v; want q", v.Value, ok)
	}
	if string(behind.Descriptor().GetEndKey()) != "t" {
		t.Fatalf("descriptor after the restore %v; want the merged span", behind.Descriptor())
	}
}
