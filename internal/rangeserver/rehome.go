package rangeserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"google.golang.org/protobuf/proto"

	"github.com/terroir-db/terroir/internal/raftgroup"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/storage"
	"github.com/terroir-db/terroir/internal/transport"
)

// Rehoming a range from region A to region B (DESIGN.md §13), run at A's
// leaseholder:
//
//  1. the nodes of B that will vote join as non-voting replicas and catch
//     up, while A keeps serving;
//  2. the leaseholder stops serving (as for a lease transfer), lets
//     transactions prepared or committing here be decided, and reads the
//     barrier G_b: no transaction committed here above it;
//  3. one Raft entry (RehomeCmd) ends its lease, homes the range in B, and
//     rewrites the regional copies at the barrier (statemachine side,
//     below); no replica of A takes a lease again;
//  4. the Raft leader (still in A) makes B's replicas the voters in one
//     joint configuration change and leaves the group; one of B's is
//     elected, takes a lease in B's local epochs, and waits until B's
//     publisher shows more than G_b before serving (invariant 5 at B).
//
// Step 4 is driven by the tick of whichever replica leads the group while
// the descriptor names rehome voters, so a leader's crash midway does not
// strand the range without a lease.

// Errors of Rehome.
var (
	// ErrRehomeTarget: the range cannot move to that region: it is its
	// home already, this node cannot reach the region's epochs, the voters
	// named are not fit, or versions carry local epochs (a regional-only
	// deployment, where two regions' epochs do not compare). Nothing changed.
	ErrRehomeTarget = errors.New("rangeserver: bad rehome")
	// ErrRehomeBusy: another change of the range is under way, or its
	// transactions did not settle in time; the range still serves in its
	// home. Retry later.
	ErrRehomeBusy = errors.New("rangeserver: the range cannot be rehomed now")
)

// Rehome moves the range's home to region with voters (nodes of that
// region; at least one, none of them a voter of the range now), at the
// leaseholder, and returns the range's descriptor once the voters moved,
// and the barrier G_b (a global epoch). Errors: ErrRehomeTarget,
// ErrRehomeBusy, ErrNotLeaseholder, ErrMoveBusy or ErrMoveTarget (a
// non-voter could not be added), or ctx's error. Once the lease has ended,
// the move completes even if Rehome returns early (ctx ended): the range's
// Raft leader finishes it.
func (r *Replica) Rehome(ctx context.Context, region string, voters []uint64) (*pb.RangeDescriptor, uint64, error) {
	if d := r.sm.Descriptor(); len(voters) == 0 && r.cfg.PickVoters != nil && region != d.GetRegion() {
		var err error
		if voters, err = r.cfg.PickVoters(ctx, region, d); err != nil {
			return nil, 0, fmt.Errorf("%w: range %d: choosing its voters in %s: %v", ErrRehomeTarget, r.id, region, err)
		}
	}
	if err := r.checkRehome(r.sm.Descriptor(), region, voters); err != nil {
		return nil, 0, err
	}
	l, err := r.leader()
	if err != nil {
		return nil, 0, err
	}
	release, err := r.claimReplicaChange(ctx, l, ErrRehomeBusy) // no split, merge or other move meanwhile
	if err != nil {
		return nil, 0, err
	}
	defer release()
	if err := r.checkRehome(r.sm.Descriptor(), region, voters); err != nil {
		return nil, 0, err
	}
	began := time.Now()
	var added []uint64         // the non-voters this rehome added: removed again if it fails before the lease ends
	for _, n := range voters { // 1.
		if slices.Contains(r.sm.Descriptor().GetNonVoters(), n) {
			continue
		}
		if _, err := r.addNonVoterClaimed(ctx, n); err != nil {
			r.removeNonVoters(ctx, added)
			return nil, 0, err
		}
		added = append(added, n)
	}
	caughtUp := time.Since(began)
	barrier, err := r.endLeaseForRehome(ctx, l, region, voters) // 2. and 3.
	if err != nil {
		if r.sm.Descriptor().GetRegion() != region {
			r.removeNonVoters(ctx, added)
		}
		return nil, 0, err
	}
	ended := time.Now()
	for { // 4., by the group's leader
		if d := r.rehomedDescriptor(ctx, region, voters); d != nil {
			slog.Info("range rehomed", "range", r.id, "region", region, "voters", d.GetReplicas(), "barrier", barrier,
				"replicas_caught_up", caughtUp, "unserved", time.Since(ended))
			if r.cfg.Rehomed != nil {
				if err := r.cfg.Rehomed(ctx, d); err != nil {
					slog.Warn("telling the directories of a rehome (the reconciliation retries)", "range", r.id, "err", err)
				}
			}
			return d, barrier, nil
		}
		if !transport.SleepCtx(ctx, r.cfg.Tick) {
			return nil, barrier, fmt.Errorf("%w: range %d: its lease ended at barrier %d and its voters are still moving to %s (its Raft leader completes it): %v",
				ErrRehomeBusy, r.id, barrier, region, ctx.Err())
		}
	}
}

// removeNonVoters removes the range's non-voters on nodes, best effort
// (a failed rehome's), under the caller's move claim.
func (r *Replica) removeNonVoters(ctx context.Context, nodes []uint64) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rehomeQuiesce)
	defer cancel()
	for _, n := range nodes {
		if _, err := r.removeNonVoterClaimed(ctx, n); err != nil {
			slog.Info("removing a failed rehome's non-voter", "range", r.id, "node", n, "err", err)
		}
	}
}

// rehomedDescriptor returns the range's descriptor once its voters are
// the rehome's, as this replica applied it or, once it left the group
// (perhaps before it applied the last change), as one of voters has; nil
// while they are still moving.
func (r *Replica) rehomedDescriptor(ctx context.Context, region string, voters []uint64) *pb.RangeDescriptor {
	done := func(d *pb.RangeDescriptor) bool {
		return d.GetRegion() == region && len(d.GetRehomeVoters()) == 0 && !d.GetSubsumed()
	}
	if d := r.sm.Descriptor(); done(d) {
		return d
	}
	if v, _, _ := r.group.Members(); r.cfg.PeerDescriptor == nil || r.ctx.Err() == nil && slices.Contains(v, r.self) {
		return nil // still a voter here: the change reaches this replica
	}
	if !transport.SleepCtx(ctx, 100*time.Millisecond) { // ask the new voters at this pace
		return nil
	}
	for _, n := range voters {
		pctx, cancel := context.WithTimeout(ctx, proposeTimeout)
		d, err := r.cfg.PeerDescriptor(pctx, n, r.id)
		cancel()
		if err == nil && d != nil && done(d) {
			return d
		}
	}
	return nil
}

// checkRehome vets a rehome of the range described by d to region with voters.
func (r *Replica) checkRehome(d *pb.RangeDescriptor, region string, voters []uint64) error {
	switch {
	case r.cfg.HomeOf == nil || r.src().Publisher == nil:
		return fmt.Errorf("%w: range %d: this deployment cannot rehome ranges (versions carry local epochs)", ErrRehomeTarget, r.id)
	case region == "" || region == d.GetRegion():
		return fmt.Errorf("%w: range %d is homed in %q already", ErrRehomeTarget, r.id, d.GetRegion())
	case len(voters) < max(len(d.GetReplicas()), 1):
		return fmt.Errorf("%w: range %d has %d voters; %d named in %s (%v)", ErrRehomeTarget, r.id, len(d.GetReplicas()), len(voters), region, voters)
	case d.GetSubsumed():
		return fmt.Errorf("%w: range %d is being merged away", ErrRehomeBusy, r.id)
	case len(d.GetRehomeVoters()) > 0:
		return fmt.Errorf("%w: range %d is moving its voters to %s", ErrRehomeBusy, r.id, d.GetRegion())
	case len(d.GetLearners()) > 0:
		return fmt.Errorf("%w: range %d is moving a replica", ErrRehomeBusy, r.id)
	}
	for i, n := range voters {
		if n == 0 || slices.Contains(d.GetReplicas(), n) || slices.Contains(voters[:i], n) {
			return fmt.Errorf("%w: range %d: node %d cannot be one of its voters in %s (voters now %v)", ErrRehomeTarget, r.id, n, region, d.GetReplicas())
		}
	}
	if _, err := r.cfg.HomeOf(region); err != nil {
		return fmt.Errorf("%w: range %d: region %q: %v", ErrRehomeTarget, r.id, region, err)
	}
	return nil
}

// rehomeQuiesce bounds how long a rehome waits for the range's prepared
// and committing transactions to be decided before it gives up (the
// range serves on).
const rehomeQuiesce = 5 * time.Second

// endLeaseForRehome stops serving under l, waits until no transaction is
// prepared or committing here, reads the barrier, and proposes the
// RehomeCmd; it returns the barrier once the command applied. On an error
// the lease serves again, unless the command may have applied (then the
// tick settles it, as for a lease transfer).
func (r *Replica) endLeaseForRehome(ctx context.Context, l *leadership, region string, voters []uint64) (uint64, error) {
	if !l.transferring.CompareAndSwap(false, true) {
		return 0, fmt.Errorf("%w: range %d is handing its lease over", ErrRehomeBusy, r.id)
	}
	l.transferAt.Store(time.Now().UnixNano())
	keep := true // the lease serves again unless the command may apply
	defer func() {
		if keep {
			l.transferring.Store(false)
		}
	}()
	dropped := l.txns.dropActive()
	wctx, cancel := context.WithTimeout(ctx, rehomeQuiesce)
	defer cancel()
	for l.txns.settling() || len(r.sm.Prepared()) > 0 {
		if !transport.SleepCtx(wctx, time.Millisecond) {
			return 0, fmt.Errorf("%w: range %d: transactions still prepared or committing", ErrRehomeBusy, r.id)
		}
	}
	// G_b: at or above every commit here (each raised the highest epoch)
	// and the publisher's epoch once they were all decided.
	g, err := r.src().Publisher.Read(wctx)
	if err != nil {
		return 0, fmt.Errorf("%w: reading the global epoch: %v", ErrRehomeBusy, err)
	}
	barrier := max(g, l.txns.highestEpoch(), r.sm.ClosedEpoch())
	// The new home's local epoch now: its regional snapshots at or below
	// it may have begun before the transactions above were decided, so
	// they do not read the state at the barrier.
	home, err := r.cfg.HomeOf(region)
	if err != nil {
		return 0, fmt.Errorf("%w: %v", ErrRehomeTarget, err)
	}
	eB, err := home.Local.Read(wctx)
	if err != nil {
		return 0, fmt.Errorf("%w: reading %s's local epoch: %v", ErrRehomeBusy, region, err)
	}
	cur := r.sm.Lease()
	if cur.GetHolder() != r.self || cur.GetStart() != l.start {
		return 0, fmt.Errorf("%w: the lease changed", ErrNotLeaseholder)
	}
	l.transferSeq.Store(cur.GetSeq())
	cmd := EncodeCommand(&pb.Command{Cmd: &pb.Command_Rehome{Rehome: &pb.RehomeCmd{Region: region, Barrier: barrier, PrevSeq: cur.GetSeq(), Voters: voters, RegionalFloor: eB + 2}}})
	pctx, pcancel := context.WithTimeout(context.WithoutCancel(ctx), proposeTimeout)
	defer pcancel()
	res, err := r.group.Propose(pctx, cmd)
	switch {
	case err == nil:
		if a, ok := res.(Applied); !ok || a.Rejected {
			return 0, fmt.Errorf("%w: range %d: the rehome entry was rejected (the lease or the range changed)", ErrRehomeBusy, r.id)
		}
	case errors.Is(err, raftgroup.ErrNotLeader), errors.Is(err, raftgroup.ErrBusy):
		return 0, fmt.Errorf("%w: %v", ErrRehomeBusy, err) // refused before it entered the log
	default:
		keep = false // it may apply: settled here, or by the tick
		if !r.settleTransfer(l, cur.GetSeq()) {
			return 0, err
		}
		if r.sm.Lease().GetSeq() == cur.GetSeq() {
			return 0, fmt.Errorf("%w: the rehome entry was lost", ErrRehomeBusy)
		}
		if r.sm.Descriptor().GetRegion() != region {
			return 0, fmt.Errorf("%w: another lease got in first", ErrRehomeBusy)
		}
	}
	keep = false
	r.stepDown()
	slog.Info("range lease ended for a rehome", "range", r.id, "region", region, "barrier", barrier, "dropped_txns", dropped)
	return barrier, nil
}

// rehomeRetry is how long the leader waits before it tries again to move
// the voters of a rehome whose configuration change failed.
const rehomeRetry = 250 * time.Millisecond

// finishRehome moves the range's voters to the rehome's, in the
// background, on the Raft leader's tick (step 4): a step at a time
// (raftgroup.Group.StepVoters), each promoting one and removing one, until
// the voters are the rehome's; when only this leader is left to remove, it
// hands leadership to one of them, which goes on.
func (r *Replica) finishRehome() {
	if time.Now().UnixNano() < r.rehomeRetryAt.Load() || !r.rehoming.CompareAndSwap(false, true) {
		return
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer r.rehoming.Store(false)
		ctx, cancel := context.WithTimeout(r.ctx, rehomeMoveTimeout)
		defer cancel()
		for {
			d := r.sm.Descriptor()
			to := d.GetRehomeVoters()
			if len(to) == 0 {
				return
			}
			others := slices.DeleteFunc(slices.Clone(d.GetNonVoters()), func(n uint64) bool { return slices.Contains(to, n) })
			steps := r.moveSteps(others)
			for _, n := range to { // the rehome's learners not promoted yet stay named
				if !slices.Contains(d.GetReplicas(), n) && (slices.Contains(d.GetNonVoters(), n) || slices.Contains(d.GetLearners(), n)) {
					steps.Keep = append(steps.Keep, n)
				}
			}
			_, done, err := r.group.StepVoters(ctx, to, steps)
			switch {
			case errors.Is(err, raftgroup.ErrNotLeader):
				r.rehomeRetryAt.Store(time.Now().Add(10 * r.cfg.Tick).UnixNano()) // leadership is moving
				return
			case err != nil:
				if r.ctx.Err() == nil {
					r.rehomeRetryAt.Store(time.Now().Add(rehomeRetry).UnixNano())
					slog.Warn("moving a rehomed range's voters (retried)", "range", r.id, "to", to, "err", err)
				}
				return
			case done:
				nd := r.sm.Descriptor()
				slog.Info("rehomed range's voters moved", "range", r.id, "region", nd.GetRegion(), "voters", nd.GetReplicas(), "generation", nd.GetGeneration())
				return
			}
		}
	}()
}

// rehomeMoveTimeout bounds one attempt to move a rehome's voters.
const rehomeMoveTimeout = 30 * time.Second

// applyRehome applies a RehomeCmd (callers hold sm.mu): the lease of seq
// cmd.PrevSeq ends, the range is homed in cmd.Region with cmd.Voters to
// become its voters, and its regional copies are rewritten at the barrier.
// Rejected on a subsumed range, under another lease, while a rehome is
// under way, or while a transaction is prepared here.
func (sm *StateMachine) applyRehome(b *pebble.Batch, cmd *pb.RehomeCmd) any {
	d := sm.desc.Load()
	if d.GetSubsumed() || cmd.GetPrevSeq() != sm.lease.GetSeq() || cmd.GetRegion() == "" || cmd.GetRegion() == d.GetRegion() ||
		len(cmd.GetVoters()) == 0 || len(d.GetRehomeVoters()) > 0 || len(sm.prepared) > 0 {
		return Applied{Rejected: true}
	}
	if err := sm.rewriteRegional(b, d, cmd.GetBarrier(), cmd.GetRegionalFloor()); err != nil {
		return err // a read of the engine failed: nothing else changed
	}
	ended := &pb.Lease{Seq: sm.lease.GetSeq() + 1}
	v, _ := proto.Marshal(ended)
	_ = b.Set(sm.sub(subLease, nil), v, nil)
	sm.lease, sm.handover = ended, nil
	// The regional copies start over in the new home's local epochs; no
	// regional snapshot below the floor reads them.
	gc := &pb.GCThreshold{Horizon: sm.gc.Load().GetHorizon(), RegionalHorizon: cmd.GetRegionalFloor()}
	v, _ = proto.Marshal(gc)
	_ = b.Set(sm.sub(subGC, nil), v, nil)
	sm.gc.Store(gc)
	nd := proto.CloneOf(d)
	nd.Region, nd.RehomeVoters, nd.Rehomed, nd.RehomeBarrier = cmd.GetRegion(), slices.Clone(cmd.GetVoters()), true, cmd.GetBarrier()
	nd.RehomeRegionalFloor = cmd.GetRegionalFloor()
	nd.Generation++
	sm.storeDescriptor(b, nd)
	return Applied{Rehomed: nd}
}

// rewriteRegional replaces the regional copies of d's span: the old home's
// local-epoch versions go, and each key's newest global version at or
// below barrier, unless a tombstone, is written at local epoch floor-1
// (counter 1): visible to the regional snapshots at or above the floor
// only, and below every version the new home writes (its lease starts
// later). It reads through b, which holds what the entries before it in
// the same apply wrote. The deletion is staged only once the reads are
// done, so a failed read stages nothing.
func (sm *StateMachine) rewriteRegional(b *pebble.Batch, d *pb.RangeDescriptor, barrier, floor uint64) error {
	var end []byte
	if len(d.GetEndKey()) > 0 {
		end = d.GetEndKey()
	}
	var live []storage.Version
	err := storage.ScanMVCCBatch(b, dataPrefix, d.GetStartKey(), end, storage.EpochStart(barrier+1), func(v storage.Version, _ storage.VersionID) bool {
		if v.Live() {
			live = append(live, v)
		}
		return true
	})
	if err != nil {
		return err
	}
	lo, hi := storage.MVCCKeyBounds(regionalPrefix, d.GetStartKey(), end)
	_ = b.DeleteRange(lo, hi, nil)
	at := storage.VersionID{Epoch: max(floor, 1) - 1, Counter: 1}
	for _, v := range live {
		_ = b.Set(storage.EncodeMVCCKey(regionalPrefix, v.Key, at), storage.EncodeMVCCValue(v.Value, false), nil)
	}
	return nil
}
