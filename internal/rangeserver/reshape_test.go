package rangeserver

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

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
	otherNodes := proto.Clone(rd).(*pb.RangeDescriptor)
	otherNodes.Replicas = []uint64{1, 2, 3} // the left range has no such replicas
	for i, r := range apply(t, left, merge(2, 1, rd), merge(3, 9, rd), merge(3, 1, notSubsumed), merge(3, 1, notAdjacent), merge(3, 1, otherRegion),
		merge(3, 1, otherNodes)) {
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

// TestMergeableOnlyOverTheSameReplicas: a merge applies only where every
// replica of the left-hand range hosted the subsumed one: no learner (a
// move under way, whose snapshot lacks the right-hand range's data), the
// same voters in any order, non-voters among the right-hand range's (a
// lagging one dropped).
func TestMergeableOnlyOverTheSameReplicas(t *testing.T) {
	right := &pb.RangeDescriptor{Replicas: []uint64{1, 2, 3}, NonVoters: []uint64{7, 8}}
	for _, tc := range []struct {
		name string
		left *pb.RangeDescriptor
		want bool
	}{
		{"the same replicas", &pb.RangeDescriptor{Replicas: []uint64{1, 2, 3}, NonVoters: []uint64{7, 8}}, true},
		{"in another order", &pb.RangeDescriptor{Replicas: []uint64{3, 1, 2}, NonVoters: []uint64{8, 7}}, true},
		{"a lagging non-voter dropped", &pb.RangeDescriptor{Replicas: []uint64{1, 2, 3}, NonVoters: []uint64{7}}, true},
		{"a learner joining", &pb.RangeDescriptor{Replicas: []uint64{1, 2, 3}, Learners: []uint64{4}, NonVoters: []uint64{7, 8}}, false},
		{"a voter moved", &pb.RangeDescriptor{Replicas: []uint64{1, 2, 4}, NonVoters: []uint64{7, 8}}, false},
		{"a voter fewer", &pb.RangeDescriptor{Replicas: []uint64{1, 2}, NonVoters: []uint64{7, 8}}, false},
		{"a non-voter added", &pb.RangeDescriptor{Replicas: []uint64{1, 2, 3}, NonVoters: []uint64{7, 8, 9}}, false},
	} {
		if got := mergeable(tc.left, right); got != tc.want {
			t.Errorf("%s: mergeable = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestNoReplicaChangeWhileAbsorbing: once the right-hand neighbour is
// subsumed, the left-hand range's replicas stay as they are until the
// merge is done (it applies only over the same replicas): a move,
// non-voter change or rehome is refused busy. Before the subsume, and
// after the merge, it takes the claim; so does nothing while another
// change holds it.
func TestNoReplicaChangeWhileAbsorbing(t *testing.T) {
	e, err := storage.Open(t.TempDir(), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	lsm, _ := NewStateMachine(e, &pb.RangeDescriptor{RangeId: 10, EndKey: []byte("m"), Region: "r", Generation: 3})
	rsm, _ := NewStateMachine(e, &pb.RangeDescriptor{RangeId: 11, StartKey: []byte("m"), EndKey: []byte("t"), Region: "r", Generation: 5})
	apply(t, lsm, leaseCmd(1, 1, 100, 1, 0))
	apply(t, rsm, leaseCmd(2, 7, 120, 1, 0))
	right := &Replica{id: 11, sm: rsm}
	left := &Replica{id: 10, sm: lsm, cfg: Config{Sibling: func(key []byte) *Replica {
		if bytes.Equal(key, rsm.Descriptor().GetStartKey()) {
			return right
		}
		return nil
	}}}
	l := &leadership{txns: newTxnTable(time.Now, 0)}
	claim := func() error {
		release, err := left.claimReplicaChange(context.Background(), l, ErrMoveBusy)
		if err == nil {
			release()
		}
		return err
	}
	if err := claim(); err != nil {
		t.Fatalf("a move before any merge = %v; want the claim", err)
	}
	held, _ := l.txns.claimMove()
	if err := claim(); !errors.Is(err, ErrMoveBusy) {
		t.Errorf("a move while another holds the claim = %v; want ErrMoveBusy", err)
	}
	held()
	rd := apply(t, rsm, &pb.Command{Cmd: &pb.Command_Subsume{Subsume: &pb.SubsumeCmd{Generation: 5, LeaseStart: 7}}})[0].(Applied).Subsumed
	if err := claim(); !errors.Is(err, ErrMoveBusy) || !strings.Contains(err.Error(), "absorbing the subsumed range 11") {
		t.Errorf("a move while absorbing = %v; want ErrMoveBusy naming range 11", err)
	}
	if release, ok := l.txns.claimMove(); ok {
		release() // the refusal gave the claim back
	} else {
		t.Error("a refused move kept the claim")
	}
	apply(t, lsm, &pb.Command{Cmd: &pb.Command_Merge{Merge: &pb.MergeCmd{Generation: 3, LeaseStart: 1, Right: rd}}})
	if err := claim(); err != nil {
		t.Errorf("a move after the merge = %v; want the claim", err)
	}
}
