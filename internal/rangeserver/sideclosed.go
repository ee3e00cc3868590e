package rangeserver

import (
	"log/slog"
	"slices"

	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
)

// The closed-epoch side transport (DESIGN.md §13). A busy range closes
// epochs through its log (ClosedEpochCmd, closed.go). An idle one would
// spend a Raft entry, three fsyncs and a round of messages at every tick
// its publisher moved, to say only that nothing happened, so its leader
// sends the close outside the log instead: SideClosed{epoch c, applied
// index i, generation g}, meaning that every version of the range with an
// epoch at or below c is in the log up to i, and no transaction will add
// one.
// Node-wide, SideTransport batches these into one RPC per peer node.
//
// A replica trusts it once it has applied i while its descriptor is at
// generation g. Applied i, it holds every version up to c (conditions 1–3
// held for the log up to i, as for a ClosedEpochCmd at i). The generation
// keeps a close from outliving the shape it was made for: a merge after i
// brings the other half's versions, which this close says nothing about.
//
// No later leaseholder may commit at or below c. Through the log, the
// ClosedEpochCmd's place settles this: one applied before the next lease
// raises its first epoch (lease.go: highest ≥ closed + 1), and one applied
// after it is rejected. A side close has no place in the log, so the leader
// sends one only if, after conditions 1–3, a read of the local epoch that
// began after it saw the publisher at c + 1 returned e with e ≥ the lease's
// start and e + LeaseRenewEpochs ≤ its end, and no transfer began. Any later
// lease is acquired by a local epoch read returning more than e: a lapsed
// lease's successor reads more than the end, and a queued one (nextLease)
// more than the end − LeaseRenewEpochs. That read therefore returned after
// the leader's began (DESIGN.md §3.1), so after the publisher showed c + 1,
// and the successor's first epoch is above c: a lapsed lease's successor
// waits for the global epoch to pass a value read after that (≥ c, DESIGN.md
// §3.2); in a regional-only deployment its start alone is above e ≥ c + 1.
// A transfer's successor takes the leader's highest (raised to c + 1 by
// condition 2) unless the transfer began before the raise, and then the
// leader sees it and sends nothing. A delayed, duplicated or reordered side
// close is therefore still true when it lands: it may only come too late to
// raise anything.
//
// Side closes are not durable: a replica that restarts trusts its stored
// closed epoch until the next side close arrives.

// sideClosed is the newest side-transported close a replica received.
type sideClosed struct{ epoch, index, generation uint64 }

// sideValid reports whether s holds here now, with sm.mu held: it was made
// at the range's current generation, which is not subsumed, and its
// applied index is applied.
func (sm *StateMachine) sideValid(s sideClosed) bool {
	d := sm.desc.Load()
	return s.generation == d.GetGeneration() && !d.GetSubsumed() && sm.applied >= s.index
}

// receiveSide takes a side-transported close u when the group's applied
// index is applied: kept if it is newer than the last one and made at the
// range's current generation, trusted once sideValid.
func (sm *StateMachine) receiveSide(u *pb.SideClosed, applied uint64) {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	sm.applied = max(sm.applied, applied)
	gen := sm.desc.Load().GetGeneration()
	if u.GetGeneration() != gen || (sm.side.generation == gen && u.GetEpoch() <= sm.side.epoch) {
		return
	}
	sm.side = sideClosed{epoch: u.GetEpoch(), index: u.GetAppliedIndex(), generation: gen}
	sm.publishClosed()
}

// ReceiveSideClosed takes a close the range's leader sent outside the log
// (Range/SideClosed); see sideValid for when it is trusted.
func (r *Replica) ReceiveSideClosed(u *pb.SideClosed) { r.sm.receiveSide(u, r.group.Applied()) }

// AppliedIndex returns the replica's applied index in its range's log.
func (r *Replica) AppliedIndex() uint64 { return r.group.Applied() }

// idle reports whether nothing applied at the leader since its last close
// through the log, so the next close may go by the side transport. Only
// the leader's tick calls it.
func (r *Replica) idle(l *leadership) bool {
	return r.cfg.SideClose != nil && l.loggedAt != 0 && r.group.Applied() == l.loggedAt
}

// sideAllowed reports whether a side close may go under the lease that
// began at start, held by self, given local epoch e, read after the
// publisher showed the close's epoch + 1: lease is the range's current
// lease, memEnd the leadership's end in memory (a transfer lowers it), and
// renew the LeaseRenewEpochs by which a successor may queue (nextLease).
// True only if no lease but this one can be acquired by a read of e or
// less: e lies in the lease, LeaseRenewEpochs or more before its end.
func sideAllowed(lease *pb.Lease, self, start, memEnd, e, renew uint64) bool {
	end := min(lease.GetEnd(), memEnd)
	return lease.GetHolder() == self && lease.GetStart() == start && e >= lease.GetStart() && e+renew <= end
}

// sendSide sends the close under way (conditions 1–3 hold) outside the
// log, under leadership l, if the local epoch e — read by a read begun
// after the close's publisher read — shows its lease in force with no
// successor possible (sideAllowed); it keeps it to itself too. Only the
// leader's tick calls it.
func (r *Replica) sendSide(l *leadership, e uint64) {
	gen := r.sm.Descriptor().GetGeneration()
	applied := r.group.Applied()
	d := r.sm.Descriptor() // read after applied: a change applied meanwhile shows
	if d.GetGeneration() != gen || gen != l.closing.generation || d.GetSubsumed() {
		return
	}
	if !sideAllowed(r.sm.Lease(), r.self, l.start, l.end.Load(), e, r.cfg.LeaseRenewEpochs) || l.transferring.Load() || l.ctx.Err() != nil {
		slog.Debug("side close dropped: lease not in force", "range", r.id, "epoch", l.closing.epoch, "local epoch", e)
		return
	}
	u := &pb.SideClosed{RangeId: r.id, Generation: gen, Epoch: l.closing.epoch, AppliedIndex: applied}
	r.sm.receiveSide(u, applied)
	// Voters and non-voters: a learner a move adds gets the next close
	// once it votes.
	r.cfg.SideClose(slices.DeleteFunc(allReplicas(d), func(id uint64) bool { return id == r.self }), u)
	count(r.cfg.Closes[1])
}
