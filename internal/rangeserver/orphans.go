package rangeserver

import (
	"context"
	"log/slog"
	"time"

	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/txnstate/txnstatepb"
)

// resolveOrphans ends transactions whose coordinator went silent for
// OrphanAfter (no operation, no heartbeat, no lock wait under way): active
// ones hold only locks and are dropped; prepared ones — and
// prepared records the leader has no transaction for — are decided through the
// transaction state store (abort unless commit was recorded first).
func (r *Replica) resolveOrphans(l *leadership) {
	idle, undecided := l.txns.orphans(r.cfg.OrphanAfter, r.sm.Prepared())
	for _, id := range idle {
		l.txns.release(id, 0)
	}
	for _, t := range undecided {
		r.wg.Add(1)
		go r.resolve(l, t)
	}
}

func (r *Replica) resolve(l *leadership, t *leaderTxn) {
	defer r.wg.Done()
	defer l.txns.resolved(t)
	ctx, cancel := context.WithTimeout(l.ctx, 5*time.Second)
	defer cancel()
	d := r.deciders(t.meta.GetTxnStateGroup())
	if d == nil {
		slog.Error("no transaction state store for orphan", "range", r.id, "group", t.meta.GetTxnStateGroup())
		return
	}
	// The abort's bound: every lease granted in this region so far ends at
	// or below the local epoch now plus LeaseEpochs, so any l_R the
	// coordinator validated this transaction at does too. Forgetting the
	// record raises the store's watermark to it (DESIGN.md §14).
	local, err := r.src().Local.Read(ctx)
	if err != nil {
		return // retried at a later tick
	}
	rec, err := d.Decide(ctx, &txnstatepb.Record{TxnId: t.meta.GetId(), Outcome: txnstatepb.Outcome_OUTCOME_ABORTED,
		AbortRegion: r.sm.Descriptor().GetRegion(), AbortBound: max(local+r.cfg.LeaseEpochs, l.end.Load())})
	if err != nil {
		return // retried at a later tick
	}
	if rec.GetOutcome() == txnstatepb.Outcome_OUTCOME_COMMITTED {
		v := rec.GetVersion()
		var regional *pb.VersionID
		for _, p := range rec.GetParticipants() {
			if rv := p.GetRegionalVersion(); p.GetRangeId() == r.id && rv != nil {
				regional = &pb.VersionID{Epoch: rv.GetEpoch(), Counter: rv.GetCounter()}
			}
		}
		err = r.Commit(ctx, t.meta.GetId(), &pb.VersionID{Epoch: v.GetEpoch(), Counter: v.GetCounter()}, regional)
	} else {
		err = r.Abort(ctx, t.meta.GetId())
	}
	if err != nil {
		slog.Debug("resolving an orphaned transaction", "range", r.id, "err", err)
		return
	}
	slog.Info("resolved orphaned transaction", "range", r.id, "outcome", rec.GetOutcome().String())
}
