package rangeserver

import (
	"bytes"
	"encoding/binary"
	"slices"

	"github.com/cockroachdb/pebble/v2"
	"google.golang.org/protobuf/proto"

	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/storage"
)

// The commands that change a range's shape (DESIGN.md §11), as every replica
// applies them: split, subsume (the right-hand range's half of a merge) and
// merge (the left-hand range's half). No user data moves: it lives under the
// user key, in a key space the node's ranges share.

// applySplit splits the range at cmd's key (DESIGN.md §11); callers hold
// sm.mu. The right-hand range's range-local state is written under its id in
// the same batch: its descriptor, the same lease (holder and epoch interval),
// and the prepared records of transactions with writes at or above the key,
// cut to those writes; the left keeps the rest. No user data moves. A split
// under another generation than the range's, or at a key not strictly inside
// its span, is rejected.
func (sm *StateMachine) applySplit(b *pebble.Batch, cmd *pb.SplitCmd) any {
	d, k := sm.desc.Load(), cmd.GetSplitKey()
	if cmd.GetGeneration() != d.GetGeneration() || d.GetSubsumed() || len(k) == 0 || bytes.Compare(k, d.GetStartKey()) <= 0 ||
		(len(d.GetEndKey()) > 0 && bytes.Compare(k, d.GetEndKey()) >= 0) || cmd.GetRightRangeId() == d.GetRangeId() {
		return Applied{Rejected: true}
	}
	left := proto.Clone(d).(*pb.RangeDescriptor)
	left.EndKey, left.Generation = k, d.GetGeneration()+1
	right := &pb.RangeDescriptor{RangeId: cmd.GetRightRangeId(), StartKey: k, EndKey: d.GetEndKey(), Region: d.GetRegion(),
		Replicas: d.GetReplicas(), NonVoters: d.GetNonVoters(), Generation: left.GetGeneration(), Sticky: cmd.GetSticky(),
		Rehomed: d.GetRehomed(), RehomeBarrier: d.GetRehomeBarrier(), RehomeRegionalFloor: d.GetRehomeRegionalFloor()}
	rprefix := binary.BigEndian.AppendUint64([]byte{storage.PrefixState}, right.GetRangeId())
	rsub := func(b byte, rest []byte) []byte { return append(append(append([]byte{}, rprefix...), b), rest...) }
	v, _ := proto.Marshal(right)
	_ = b.Set(rsub(subDescriptor, nil), v, nil)
	_ = b.Set(storage.RangeIndexKey(right.GetRangeId()), nil, nil)
	v, _ = proto.Marshal(sm.lease)
	_ = b.Set(rsub(subLease, nil), v, nil)
	if gc := sm.gc.Load(); gc.GetHorizon() != 0 || gc.GetRegionalHorizon() != 0 { // the right half's versions were collected alike
		v, _ = proto.Marshal(gc)
		_ = b.Set(rsub(subGC, nil), v, nil)
	}
	if c := sm.closedStored; c > 0 { // the right half's versions are closed alike
		_ = b.Set(rsub(subClosed, nil), encodeClosed(c), nil)
	}
	for id, rec := range sm.prepared {
		var lw, rw []*pb.Write
		for _, w := range rec.GetWrites() {
			if bytes.Compare(w.GetKey(), k) >= 0 {
				rw = append(rw, w)
			} else {
				lw = append(lw, w)
			}
		}
		if len(rw) == 0 {
			continue
		}
		v, _ := proto.Marshal(&pb.PreparedRecord{Txn: rec.GetTxn(), Writes: rw})
		_ = b.Set(rsub(subPrepared, []byte(id)), v, nil)
		kept := &pb.PreparedRecord{Txn: rec.GetTxn(), Writes: lw}
		v, _ = proto.Marshal(kept)
		_ = b.Set(sm.sub(subPrepared, []byte(id)), v, nil)
		sm.prepared[id] = kept
	}
	sm.storeDescriptor(b, left)
	s := Split{Left: left, Right: right}
	sm.splits = append(sm.splits, s)
	return Applied{Split: &s}
}

// applySubsume freezes the range for good as the right-hand side of a merge
// (DESIGN.md §11); callers hold sm.mu. From here on the range serves
// nothing and its prepared records stay as they are: the left-hand range
// takes them in its merge command. Rejected under another generation or
// lease, or if the range is already subsumed.
func (sm *StateMachine) applySubsume(b *pebble.Batch, cmd *pb.SubsumeCmd) any {
	d := sm.desc.Load()
	if cmd.GetGeneration() != d.GetGeneration() || d.GetSubsumed() || cmd.GetLeaseStart() != sm.lease.GetStart() {
		return Applied{Rejected: true}
	}
	nd := proto.Clone(d).(*pb.RangeDescriptor)
	nd.Subsumed, nd.Generation = true, d.GetGeneration()+1
	sm.storeDescriptor(b, nd)
	return Applied{Subsumed: nd}
}

// applyMerge grows the range over its subsumed right-hand neighbour
// (DESIGN.md §11); callers hold sm.mu. The range keeps its lease, takes the
// neighbour's prepared records (a transaction prepared at both keeps one
// record with the writes of both), and a generation above both; the node
// records the neighbour as removed in the same batch. Rejected unless the
// range is at cmd's generation under cmd's lease and the neighbour is
// subsumed, of the same region, and starts where the range ends, and
// every replica of the range hosted the neighbour (mergeable).
func (sm *StateMachine) applyMerge(b *pebble.Batch, cmd *pb.MergeCmd) any {
	d, rd := sm.desc.Load(), cmd.GetRight()
	if cmd.GetGeneration() != d.GetGeneration() || d.GetSubsumed() || cmd.GetLeaseStart() != sm.lease.GetStart() ||
		!rd.GetSubsumed() || len(d.GetEndKey()) == 0 || !bytes.Equal(d.GetEndKey(), rd.GetStartKey()) ||
		rd.GetRegion() != d.GetRegion() || rd.GetRangeId() == d.GetRangeId() || !mergeable(d, rd) {
		return Applied{Rejected: true}
	}
	merged := proto.Clone(d).(*pb.RangeDescriptor)
	merged.EndKey, merged.Generation = rd.GetEndKey(), max(d.GetGeneration(), rd.GetGeneration())+1
	merged.RehomeBarrier, merged.Rehomed = max(d.GetRehomeBarrier(), rd.GetRehomeBarrier()), d.GetRehomed() || rd.GetRehomed()
	merged.RehomeRegionalFloor = max(d.GetRehomeRegionalFloor(), rd.GetRehomeRegionalFloor())
	for _, rec := range cmd.GetRightPrepared() {
		id := string(rec.GetTxn().GetId())
		combined := &pb.PreparedRecord{Txn: rec.GetTxn(), Writes: rec.GetWrites()}
		if own, ok := sm.prepared[id]; ok {
			combined.Writes = append(append([]*pb.Write{}, own.GetWrites()...), rec.GetWrites()...)
		}
		v, _ := proto.Marshal(combined)
		_ = b.Set(sm.sub(subPrepared, []byte(id)), v, nil)
		sm.prepared[id] = combined
	}
	sm.raiseGC(b, cmd.GetRightGc())
	sm.lowerClosed(b, cmd.GetRightClosedEpoch())
	sm.storeDescriptor(b, merged)
	_ = b.Set(storage.RangeTombstoneKey(rd.GetRangeId()), nil, nil)
	_ = b.Delete(storage.RangeIndexKey(rd.GetRangeId()), nil)
	m := Merge{Merged: merged, Right: rd, Prepared: cmd.GetRightPrepared()}
	sm.merges = append(sm.merges, m)
	return Applied{Merge: &m}
}

// mergeable reports whether every replica of d, as it applies a merge
// over rd, hosted rd when rd was subsumed: d has no learners, the same
// voters as rd, and non-voters among rd's (a merge drops the non-voters
// behind on the subsume from d first). A replica of d that never hosted rd
// (one a move added after the merge began) would apply the merge without
// rd's data, and serve rd's keys empty.
func mergeable(d, rd *pb.RangeDescriptor) bool {
	if len(d.GetLearners()) > 0 || !sameNodes(d.GetReplicas(), rd.GetReplicas()) {
		return false
	}
	for _, n := range d.GetNonVoters() {
		if !slices.Contains(rd.GetNonVoters(), n) {
			return false
		}
	}
	return true
}

// storeDescriptor makes d the range's descriptor, in b and in memory.
func (sm *StateMachine) storeDescriptor(b *pebble.Batch, d *pb.RangeDescriptor) {
	v, _ := proto.Marshal(d)
	_ = b.Set(sm.sub(subDescriptor, nil), v, nil)
	sm.desc.Store(d)
}
