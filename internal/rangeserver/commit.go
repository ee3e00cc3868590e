package rangeserver

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/terroir-db/terroir/internal/commitrule"
	"github.com/terroir-db/terroir/internal/epoch"
	"github.com/terroir-db/terroir/internal/raftgroup"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/storage"
	"github.com/terroir-db/terroir/internal/transport"
)

// maxVersionOf returns the newest stored version among the keys of writes, in
// the global version ids and in the local-epoch ones (zero when this range
// does not store them twice).
func (r *Replica) maxVersionOf(writes []*pb.Write) (global, regional storage.VersionID, err error) {
	for _, w := range writes {
		newest, err := r.sm.Newest(Versions, w.GetKey())
		if err != nil {
			return global, regional, err
		}
		if global.Less(newest) {
			global = newest
		}
		if r.src().Publisher == nil {
			continue
		}
		newest, err = r.sm.Newest(RegionalVersions, w.GetKey())
		if err != nil {
			return global, regional, err
		}
		if regional.Less(newest) {
			regional = newest
		}
	}
	return global, regional, nil
}

// maxVersionsAsync starts maxVersionOf(writes) on its own goroutine and
// returns a function that waits for its result (at once for no writes).
func (r *Replica) maxVersionsAsync(writes []*pb.Write) func() (global, regional storage.VersionID, err error) {
	if len(writes) == 0 {
		return func() (storage.VersionID, storage.VersionID, error) {
			return storage.VersionID{}, storage.VersionID{}, nil
		}
	}
	type result struct {
		global, regional storage.VersionID
		err              error
	}
	ch := make(chan result, 1)
	go func() {
		var res result
		res.global, res.regional, res.err = r.maxVersionOf(writes)
		ch <- res
	}()
	return func() (storage.VersionID, storage.VersionID, error) {
		res := <-ch
		return res.global, res.regional, res.err
	}
}

// Prepare makes txn's writes durable as a prepared record (through Raft) and
// returns what the coordinator validates and versions with (DESIGN.md §4.2): the
// lease, the highest epoch, and the newest existing version of the write set. A
// read-only participant (no writes) writes nothing, but from here on it too
// keeps its locks until the outcome is known (invariant 4).
func (r *Replica) Prepare(ctx context.Context, meta *pb.TxnMeta, writes []*pb.Write, lockCount uint32, incarnation, generation uint64) (*pb.PrepareResponse, error) {
	l, err := r.leader()
	if err != nil {
		return nil, err
	}
	if err := r.checkGeneration(generation); err != nil {
		return nil, err
	}
	if err := r.checkWrites(writes); err != nil {
		return nil, err
	}
	if err := l.txns.startCommit(meta, writes, lockCount, incarnation, txnPrepared); err != nil {
		return nil, err
	}
	// The write set's newest versions cannot change while its exclusive
	// locks are held: look them up while the prepare replicates.
	newest := r.maxVersionsAsync(writes)
	if len(writes) > 0 {
		cmd := &pb.Command{Cmd: &pb.Command_Prepare{Prepare: &pb.PrepareCmd{Txn: meta, Writes: writes, LeaseStart: l.start}}}
		if err := r.propose(ctx, cmd); err != nil {
			_, _, _ = newest()
			return nil, err
		}
		r.load.recordWrite(meta.GetRegion())
	}
	mv, mr, err := newest()
	if cur, _ := r.leader(); cur != l {
		return nil, ErrLocksLost
	}
	if err != nil {
		return nil, err
	}
	return &pb.PrepareResponse{
		Lease:              &pb.Lease{Holder: r.self, Start: l.start, End: l.end.Load()},
		HighestEpoch:       l.txns.highestEpoch(),
		MaxVersion:         &pb.VersionID{Epoch: mv.Epoch, Counter: mv.Counter},
		MaxRegionalVersion: &pb.VersionID{Epoch: mr.Epoch, Counter: mr.Counter},
	}, nil
}

// Commit applies a committed transaction's prepared writes at version (and,
// if set, at the local-epoch version regional) and releases its locks. Its
// success means the range holds no prepared record of the transaction any
// more: the coordinator then lets the transaction state store forget the
// record (DESIGN.md §14). So a replica that finds no record first makes
// sure it has applied every committed entry (a ReadIndex round: a
// replica cut off from its group fails instead of answering from stale
// state).
func (r *Replica) Commit(ctx context.Context, txnID []byte, version, regional *pb.VersionID) error {
	cmd := &pb.Command{Cmd: &pb.Command_Commit{Commit: &pb.CommitCmd{TxnId: txnID, Version: version, RegionalVersion: regional}}}
	if !r.sm.IsPrepared(txnID) {
		if err := r.group.ReadIndex(ctx); err != nil {
			return err
		}
	}
	return r.finish(ctx, txnID, cmd, version.GetEpoch())
}

// Abort discards a transaction's prepared record, if any, and releases its locks.
func (r *Replica) Abort(ctx context.Context, txnID []byte) error {
	return r.finish(ctx, txnID, &pb.Command{Cmd: &pb.Command_Abort{Abort: &pb.AbortCmd{TxnId: txnID}}}, 0)
}

// finish applies a transaction's outcome to its prepared record, then releases
// its locks (raising the highest epoch to committedEpoch). The command goes
// through Raft whenever a prepared record exists or may still be applying (the
// transaction prepared here), so no record outlives its outcome.
func (r *Replica) finish(ctx context.Context, txnID []byte, cmd *pb.Command, committedEpoch uint64) error {
	if d := r.sm.Descriptor(); d.GetSubsumed() {
		return subsumedError(d) // the merged range holds the record: tell it there
	}
	r.mu.Lock()
	l := r.lead
	r.mu.Unlock()
	if r.sm.IsPrepared(txnID) || (l != nil && l.txns.mayBePrepared(txnID)) {
		if err := r.propose(ctx, cmd); err != nil {
			return err
		}
	}
	if l != nil {
		l.txns.release(txnID, committedEpoch)
	}
	return nil
}

// CommitOnePhase commits a transaction whose only participant is this range
// (DESIGN.md §4): with every lock held, read the local epoch, validate the
// lease, version the writes, apply them through Raft, release. A request
// with take_locks carries the whole transaction: its locks are taken, and
// its reads read, here first (takeLocks), so it costs the client one round
// trip. It returns the version and, with take_locks, the values read.
// Errors: ErrNotLeaseholder, ErrLeaseNotActive, a *MismatchError,
// ErrConflict (wait-die), ErrLocksLost, ErrLeaseValidation, or the
// proposal's.
func (r *Replica) CommitOnePhase(ctx context.Context, req *pb.OnePhaseRequest) (*pb.VersionID, []*pb.ReadValue, error) {
	meta, writes, minEpoch := req.GetTxn(), req.GetWrites(), req.GetMinEpoch()
	l, err := r.leader()
	if err != nil {
		return nil, nil, err
	}
	if err := r.checkGeneration(req.GetGeneration()); err != nil {
		return nil, nil, err
	}
	if err := r.checkWrites(writes); err != nil {
		return nil, nil, err
	}
	lockCount, incarnation := req.GetLockCount(), req.GetIncarnation()
	var reads []*pb.ReadValue
	if req.GetTakeLocks() {
		began := time.Now()
		if !r.oneShots.claim(meta.GetId(), began) {
			return nil, nil, fmt.Errorf("%w: transaction %x", ErrDuplicate, meta.GetId())
		}
		if reads, lockCount, incarnation, err = r.takeLocks(ctx, l, meta, req.GetReads(), writes); err != nil {
			return nil, nil, err
		}
		r.observeStage(StageLocks, began)
	}
	if err := l.txns.startCommit(meta, writes, lockCount, incarnation, txnCommitting); err != nil {
		if req.GetTakeLocks() {
			l.txns.release(meta.GetId(), 0)
		}
		return nil, nil, err
	}
	abort := func() { l.txns.release(meta.GetId(), 0) } // nothing written: the transaction aborts
	// Read the epochs only now that every lock is held (invariant 4); the
	// local epoch validates the lease, the global one versions the writes.
	// The reads ask neither epoch to move (epoch.StartAll): a commit waits
	// for no epoch to pass.
	// A read-only transaction writes no version: the lease check is all it
	// needs, and it skips the global epoch (except in the naive baseline,
	// which reads it at every commit).
	home := r.home.Load() // one home throughout
	h := home.Epochs
	globalSrc := h.Publisher
	naive := meta.GetCommitMode() == pb.CommitMode_COMMIT_MODE_NAIVE && h.Service != nil && h.Publisher != nil
	switch {
	case naive:
		globalSrc = h.Service // the baseline: the service itself, across the WAN
	case len(writes) == 0:
		globalSrc = nil
	}
	// The newest versions of the write set cannot change while its
	// exclusive locks are held: look them up while the epochs are read.
	began := time.Now()
	// A transaction whose locks came from its Locks had its epochs read
	// ahead, at its last Lock (readahead.go).
	ahead := !req.GetTakeLocks() && !naive && len(writes) > 0
	reading := r.commitEpochs(ctx, l, home, meta.GetId(), ahead, globalSrc)
	mv, mr, mvErr := r.maxVersionOf(writes)
	epochs, err := reading(ctx)
	r.observeStage(StageEpochs, began)
	e, g := epochs[0], epochs[1]
	if h.Publisher == nil && len(writes) > 0 {
		g = e // regional-only: local-epoch versions
	}
	if err != nil {
		abort()
		return nil, nil, fmt.Errorf("%w: reading epochs: %v", ErrLeaseValidation, err)
	}
	r.observeEpoch(e)
	epoch := commitrule.VersionEpoch(g, l.txns.highestEpoch(), minEpoch)
	if err := commitrule.Validate(e, epoch, commitrule.Lease{Start: l.start, End: l.end.Load()}, h.Publisher == nil); err != nil {
		abort()
		return nil, nil, fmt.Errorf("%w: %v", ErrLeaseValidation, err)
	}
	for h.Publisher != nil && len(writes) > 0 && commitrule.IsQuiet(epoch, r.cfg.QuietEpochs) {
		// Quiet epoch (paper §5.3.1): wait, locks held, for the next one.
		if epoch, err = r.nextAfter(ctx, epoch); err != nil {
			abort()
			return nil, nil, fmt.Errorf("%w: waiting out quiet epoch: %v", ErrLeaseValidation, err)
		}
	}
	if mvErr != nil {
		abort()
		return nil, nil, mvErr
	}
	ver := wireVersion(commitrule.ChooseVersion(epoch, mv))
	var regional *pb.VersionID
	if h.Publisher != nil {
		regional = wireVersion(commitrule.ChooseVersion(e, mr))
	}
	if len(writes) > 0 {
		cmd := &pb.Command{Cmd: &pb.Command_OnePhase{OnePhase: &pb.OnePhaseCmd{TxnId: meta.GetId(), Writes: writes, Version: ver,
			LeaseStart: l.start, RegionalVersion: regional}}}
		began := time.Now()
		err := r.propose(ctx, cmd)
		r.observeStage(StageReplicate, began)
		if err != nil {
			if errors.Is(err, ErrLocksLost) || errors.Is(err, raftgroup.ErrBusy) || errors.Is(err, raftgroup.ErrNotLeader) {
				// Rejected at apply, or refused before it reached the log:
				// nothing written.
				abort()
				return nil, nil, err
			}
			// Otherwise the entry may still apply: the locks stay until it
			// has applied or never will (settleOnePhase).
			r.settleOnePhase(l, meta.GetId(), ver.GetEpoch())
			return nil, nil, err
		}
	}
	if meta.GetCommitMode() == pb.CommitMode_COMMIT_MODE_COMMIT_WAIT && len(writes) > 0 {
		// The baseline: wait out a clock uncertainty, locks held.
		time.Sleep(time.Duration(meta.GetCommitWaitUs()) * time.Microsecond)
	}
	l.txns.release(meta.GetId(), ver.GetEpoch())
	if len(writes) > 0 {
		r.load.recordWrite(meta.GetRegion())
	}
	return ver, reads, nil
}

// CommitStage indexes Config.CommitStages: the stages of a one-phase commit
// at its range leader (CommitOnePhase).
type CommitStage int

// The stages of a one-phase commit, in order.
const (
	StageLocks     CommitStage = iota // a one-shot's locks taken (waits included)
	StageEpochs                       // the local (and global) epoch read, and the write set's newest versions beside it
	StageReplicate                    // the writes proposed, committed and applied
	NumCommitStages
)

// String returns the stage's name: locks, epochs or replicate (the node's
// terroir_commit_stage_seconds stage label).
func (s CommitStage) String() string {
	switch s {
	case StageLocks:
		return "locks"
	case StageEpochs:
		return "epochs"
	case StageReplicate:
		return "replicate"
	}
	return fmt.Sprintf("stage(%d)", int(s))
}

// observeStage records that stage s of a commit took from began to now.
func (r *Replica) observeStage(s CommitStage, began time.Time) {
	if o := r.cfg.CommitStages[s]; o != nil {
		o.Observe(time.Since(began).Seconds())
	}
}

// settleOnePhase releases, in the background, the locks of a one-phase
// commit whose entry's outcome is unknown (its proposal timed out), once a
// barrier entry proposed after it has applied: the entry then applied
// before it, or never will. Until then the transaction holds its locks
// (invariant 4) and the range's closes wait for it. It gives up when
// leadership l ends, whose table goes with it; the barrier is a close of
// epoch 0, which changes nothing.
func (r *Replica) settleOnePhase(l *leadership, txnID []byte, committedEpoch uint64) {
	barrier := EncodeCommand(&pb.Command{Cmd: &pb.Command_Closed{Closed: &pb.ClosedEpochCmd{LeaseStart: l.start}}})
	r.spawn(func() { // a request's goroutine: Close may have begun
		for {
			ctx, cancel := context.WithTimeout(l.ctx, proposeTimeout)
			_, err := r.group.Propose(ctx, barrier)
			cancel()
			if err == nil { // applied (or rejected at apply: the lease changed)
				l.txns.release(txnID, committedEpoch)
				return
			}
			if !transport.SleepCtx(l.ctx, r.cfg.Tick) {
				return
			}
		}
	})
}

// checkWrites refuses a write outside the range.
func (r *Replica) checkWrites(writes []*pb.Write) error {
	for _, w := range writes {
		if err := r.checkKey(w.GetKey()); err != nil {
			return err
		}
	}
	return nil
}

// nextAfter waits until the region's publisher shows an epoch above e and
// returns it.
func (r *Replica) nextAfter(ctx context.Context, e uint64) (uint64, error) {
	return epoch.WaitAtLeast(ctx, r.src().Publisher, e+1, time.Millisecond)
}

// wireVersion is v as the wire carries it.
func wireVersion(v storage.VersionID) *pb.VersionID {
	return &pb.VersionID{Epoch: v.Epoch, Counter: v.Counter}
}
