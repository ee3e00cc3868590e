package rangeserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/transport"
)

// Errors of AdminMerge; each leaves both ranges as they were.
var (
	// ErrMergeLast: the range ends the key space; it has no right neighbour.
	ErrMergeLast = errors.New("rangeserver: the range is the last of the key space and has no right neighbour")
	// ErrMergeRegions: the two ranges are homed in different regions.
	ErrMergeRegions = errors.New("rangeserver: the ranges have different home regions")
	// ErrMergeReplicas: the two ranges are not on the same nodes (moving
	// replicas comes with membership).
	ErrMergeReplicas = errors.New("rangeserver: the ranges have different replicas")
	// ErrMergeBusy: the right-hand range is not ready (its leadership is
	// moving here, transactions kept committing, or a replica has not
	// caught up); retry shortly.
	ErrMergeBusy = errors.New("rangeserver: the right-hand range is not ready to merge")
	// ErrMergeRaced: a range changed (a split, a lease change) before the
	// merge applied; retry against the current descriptors.
	ErrMergeRaced = errors.New("rangeserver: a range changed before the merge applied")
)

// mergeWait bounds the wait for every replica of the subsumed range to
// apply its subsume command.
const mergeWait = 10 * time.Second

// AdminMerge merges the range with its right-hand neighbour R (DESIGN.md
// §11), on the range's leader, and returns the merged descriptor. R must be
// of the same region and on the same nodes, and lead on this node (if it
// does not, AdminMerge asks R's leadership to move here and returns
// ErrMergeBusy). The merge has two halves, each one Raft command:
//
//  1. subsume, on R: no transaction with locks at R may start to commit;
//     once none is prepared or committing, R's subsume command makes its
//     state final. From its apply on, R serves nothing (its replies are
//     range mismatches), and its active transactions are dropped (they
//     abort: no lock is lost silently).
//  2. merge, on this range, once every replica of R has applied the
//     subsume (each future leader reads R's data from its own engine):
//     with R's prepared transactions locked here first, the merge command
//     grows the span over R's, takes R's prepared records, and keeps this
//     range's lease. The leader raises its highest epoch to R's (invariant
//     5); each replica then removes its replica of R.
//
// A subsumed R whose merge did not happen (the leader failed between the
// halves) is merged by this range's leader on its next check: subsuming is
// the decision.
//
// endKey is where the caller saw the range end (nil: the range's current
// end): a range that already reaches past it absorbed the neighbour there
// (an earlier attempt finished), and AdminMerge returns its descriptor; one
// that ends before it split since (ErrMergeRaced).
//
// Errors: ErrNotLeaseholder / ErrLeaseNotActive (retry at the leader),
// ErrMergeLast, ErrMergeRegions, ErrMergeReplicas, ErrMergeBusy,
// ErrMergeRaced, or ctx's error.
func (r *Replica) AdminMerge(ctx context.Context, endKey []byte) (*pb.RangeDescriptor, error) {
	l, err := r.leader()
	if err != nil {
		return nil, err
	}
	// This range's move claim, for the whole merge: a replica this range
	// adds meanwhile would apply the merge from its log without the
	// right-hand range's data, which it never hosted, and serve its keys
	// empty. (applyMerge rejects such a merge too, for a claim another
	// leader holds.)
	release, ok := l.txns.claimMove()
	if !ok {
		return nil, fmt.Errorf("%w: range %d is changing shape or moving a replica", ErrMergeBusy, r.id)
	}
	defer release()
	if d := r.sm.Descriptor(); endKey != nil && !bytes.Equal(d.GetEndKey(), endKey) {
		if len(d.GetEndKey()) == 0 || bytes.Compare(d.GetEndKey(), endKey) > 0 {
			return d, nil // merged already
		}
		return nil, fmt.Errorf("%w: range %d ends at %q, before %q: it split", ErrMergeRaced, d.GetRangeId(), d.GetEndKey(), endKey)
	}
	right, err := r.rightNeighbour()
	if err != nil {
		return nil, err
	}
	highest, known := uint64(0), false
	if !right.Desc().GetSubsumed() {
		// Subsuming is the decision: start only if every replica of R
		// answers with R's current shape, so the merge need not wait for
		// a node that is down.
		if err := r.peersAgree(ctx, right.Desc()); err != nil {
			return nil, err
		}
		if cur, err := r.leader(); err != nil || cur != l {
			// This range's lease moved meanwhile: its new leader may be
			// changing its replicas (claimReplicaChange), so no subsume.
			return nil, fmt.Errorf("%w: range %d's lease changed before the subsume (%v)", ErrMergeRaced, r.id, err)
		}
		if highest, err = right.subsume(ctx); err != nil {
			return nil, err
		}
		known = true
	}
	return r.absorb(ctx, right, highest, known)
}

// rightNeighbour returns this node's replica of the range that starts where
// this one ends, if the two may merge.
func (r *Replica) rightNeighbour() (*Replica, error) {
	d := r.sm.Descriptor()
	if len(d.GetEndKey()) == 0 {
		return nil, fmt.Errorf("%w: range %d", ErrMergeLast, d.GetRangeId())
	}
	right := r.rightSibling()
	if right == nil {
		return nil, fmt.Errorf("%w: node %d hosts no range starting at %q, where range %d ends", ErrMergeReplicas, r.self, d.GetEndKey(), d.GetRangeId())
	}
	rd := right.Desc()
	if len(d.GetLearners()) > 0 || len(rd.GetLearners()) > 0 {
		return nil, fmt.Errorf("%w: range %d (learners %v) or range %d (learners %v) is adding a replica", ErrMergeBusy,
			d.GetRangeId(), d.GetLearners(), rd.GetRangeId(), rd.GetLearners())
	}
	if rd.GetRegion() != d.GetRegion() {
		return nil, fmt.Errorf("%w: range %d is homed in %s, range %d in %s", ErrMergeRegions, d.GetRangeId(), d.GetRegion(), rd.GetRangeId(), rd.GetRegion())
	}
	if !sameNodes(rd.GetReplicas(), d.GetReplicas()) || !sameNodes(rd.GetNonVoters(), d.GetNonVoters()) {
		return nil, fmt.Errorf("%w: range %d on nodes %v (non-voters %v), range %d on %v (non-voters %v)", ErrMergeReplicas,
			d.GetRangeId(), d.GetReplicas(), d.GetNonVoters(), rd.GetRangeId(), rd.GetReplicas(), rd.GetNonVoters())
	}
	return right, nil
}

// absorbing reports whether a merge into this range is under way: this
// node's replica of the range that starts where this one ends is
// subsumed, and its ID. The merge applies only while both ranges have the
// same replicas (mergeable), so no replica change may start until it is
// done; the leader finishes it on its next check (maybeMerge).
func (r *Replica) absorbing() (uint64, bool) {
	right := r.rightSibling()
	if right == nil || !right.Desc().GetSubsumed() {
		return 0, false
	}
	return right.id, true
}

// claimReplicaChange takes l's move claim for a change of this range's
// replicas (a move, a non-voter, a rehome). busy wraps the error if a
// split, merge or other change holds the claim, if the right-hand
// neighbour does not lead here within neighbourWait (leadNeighbour), or if
// a merge into this range is under way (absorbing).
//
// Why the neighbour must lead here (DESIGN.md §11): a merge subsumes the
// right-hand range R where both ranges lead, and a change of this range's
// replicas leaves R unmergeable with it, so a subsume that lands after the
// change leaves R's keys served by no range. A subsume applies only under
// the lease it was proposed under. Once R's lease is active on this node,
// every earlier subsume has applied here, where absorbing sees it, and any
// later one is this node's own, which l's move claim keeps out until the
// change is done. Checking this node's replica of R alone is not enough: a
// leader that took this range over from the merge's node may not have
// applied the subsume yet.
func (r *Replica) claimReplicaChange(ctx context.Context, l *leadership, busy error) (release func(), err error) {
	release, ok := l.txns.claimMove()
	if !ok {
		return nil, fmt.Errorf("%w: range %d is changing shape or moving a replica", busy, r.id)
	}
	if l.transferring.Load() { // after the claim: TransferLease checks the claim after its flag
		release()
		return nil, fmt.Errorf("%w: range %d is handing its lease over", busy, r.id)
	}
	if err := r.leadNeighbour(ctx); err != nil {
		release()
		return nil, fmt.Errorf("%w: %v", busy, err)
	}
	if id, ok := r.absorbing(); ok {
		release()
		return nil, fmt.Errorf("%w: range %d is absorbing the subsumed range %d: its replicas stay until the merge is done", busy, r.id, id)
	}
	return release, nil
}

// neighbourWait bounds how long a change of a range's replicas waits for
// its mergeable right-hand neighbour's lease to come to its leader.
const neighbourWait = 5 * time.Second

// leadNeighbour returns once this node holds the active lease of the range
// starting where this one ends, if that range could be merged into this
// one (same region and nodes, as rightNeighbour requires), or is
// subsumed (absorbing refuses then). Until then it asks the neighbour's
// leaseholder to hand its lease here, for up to neighbourWait. Errors: the
// neighbour's lease did not come (its holder's error), or ctx's.
func (r *Replica) leadNeighbour(ctx context.Context) error {
	d := r.sm.Descriptor()
	right := r.rightSibling()
	if right == nil || r.cfg.PeerTransferLease == nil {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, neighbourWait)
	defer cancel()
	var last error
	for pause := 10 * time.Millisecond; ; {
		rd := right.Desc()
		if rd.GetSubsumed() || rd.GetRegion() != d.GetRegion() || !mergeable(d, rd) {
			return nil
		}
		if _, err := right.leader(); err == nil {
			return nil
		}
		if holder := right.sm.Lease().GetHolder(); holder != 0 && holder != r.self {
			if err := r.cfg.PeerTransferLease(wctx, holder, right.id, r.self); err != nil {
				last, pause = err, 100*time.Millisecond
			}
		} else {
			right.group.TransferLeadership(r.self) // no other holder: lead here, and the tick takes the lease
		}
		if !transport.SleepCtx(wctx, pause) {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("range %d, which a merge into range %d could subsume, does not lead on node %d after %v (last error: %v)",
				right.id, r.id, r.self, neighbourWait, last)
		}
	}
}

// rightSibling returns this node's replica of the range that starts where
// this one ends, or nil (the range ends the key space, or this node hosts
// no such range).
func (r *Replica) rightSibling() *Replica {
	end := r.sm.Descriptor().GetEndKey()
	if len(end) == 0 || r.cfg.Sibling == nil {
		return nil
	}
	return r.cfg.Sibling(end)
}

func sameNodes(a, b []uint64) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// subsume makes this range's state final as the right-hand side of a merge
// (see AdminMerge) and returns its highest epoch, final too.
func (r *Replica) subsume(ctx context.Context) (highest uint64, err error) {
	l, err := r.leader()
	if err != nil {
		// The merge runs where the left-hand range leads: ask for this
		// range's leadership there, and let the caller retry.
		r.group.TransferLeadership(r.self)
		return 0, fmt.Errorf("%w: range %d does not lead on node %d yet (%v)", ErrMergeBusy, r.id, r.self, err)
	}
	d := r.sm.Descriptor()
	thaw, ok := l.txns.freeze(d.GetStartKey())
	if !ok {
		return 0, fmt.Errorf("%w: range %d is already changing shape", ErrMergeBusy, r.id)
	}
	defer thaw()
	if err := r.quiesce(ctx, l, d.GetStartKey()); err != nil {
		if errors.Is(err, ErrSplitBusy) {
			err = fmt.Errorf("%w: %v", ErrMergeBusy, err)
		}
		return 0, err
	}
	cmd := &pb.Command{Cmd: &pb.Command_Subsume{Subsume: &pb.SubsumeCmd{Generation: d.GetGeneration(), LeaseStart: l.start}}}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), proposeTimeout)
	defer cancel()
	res, err := r.group.Propose(pctx, EncodeCommand(cmd))
	if err != nil {
		return 0, err
	}
	if a, ok := res.(Applied); !ok || a.Subsumed == nil {
		return 0, fmt.Errorf("%w: range %d changed before its subsume applied", ErrMergeRaced, r.id)
	}
	dropped := l.txns.dropActive()
	slog.Info("range subsumed", "range", r.id, "generation", d.GetGeneration()+1, "dropped_txns", dropped)
	return l.txns.highestEpoch(), nil
}

// absorb is the merge's second half (see AdminMerge), on this range's
// leader: right is subsumed. highest is right's highest epoch if known;
// else this leader waits for the global epoch to advance once, as a new
// leaseholder does (DESIGN.md §3.5).
func (r *Replica) absorb(ctx context.Context, right *Replica, highest uint64, known bool) (*pb.RangeDescriptor, error) {
	rd := right.Desc()
	lagging, err := r.waitSubsumed(ctx, right)
	if err != nil {
		return nil, err
	}
	if err := r.dropLagging(ctx, lagging); err != nil {
		return nil, err
	}
	if !known && r.src().Publisher != nil {
		if highest, err = r.nextGlobalEpoch(rd.GetRehomeBarrier()); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrMergeBusy, err)
		}
	}
	l, err := r.leader()
	if err != nil {
		return nil, err
	}
	// Lock R's prepared transactions here before the span grows over their
	// keys, so no other transaction can lock those keys in between.
	prepared := right.sm.Prepared()
	l.txns.raise(highest)
	for _, key := range l.txns.relock(prepared) {
		slog.Error("locking a subsumed range's prepared transaction failed", "range", r.id, "key", key)
	}
	d := r.sm.Descriptor()
	cmd := &pb.Command{Cmd: &pb.Command_Merge{Merge: &pb.MergeCmd{Generation: d.GetGeneration(), LeaseStart: l.start, Right: rd, RightPrepared: prepared, RightGc: right.sm.GCThreshold(),
		RightClosedEpoch: right.sm.ClosedEpoch()}}}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), proposeTimeout)
	defer cancel()
	res, err := r.group.Propose(pctx, EncodeCommand(cmd))
	if err != nil {
		return nil, err // the locks taken above lie outside the span: they block no one
	}
	a, ok := res.(Applied)
	if !ok || a.Merge == nil {
		for _, rec := range prepared {
			if !r.sm.IsPrepared(rec.GetTxn().GetId()) {
				l.txns.release(rec.GetTxn().GetId(), 0)
			}
		}
		return nil, fmt.Errorf("%w: range %d changed before the merge applied", ErrMergeRaced, r.id)
	}
	return a.Merge.Merged, nil
}

// peersAgree checks that every other replica of range d, non-voters
// included, answers with d's generation; else ErrMergeBusy.
func (r *Replica) peersAgree(ctx context.Context, d *pb.RangeDescriptor) error {
	if r.cfg.PeerDescriptor == nil {
		return nil
	}
	pctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	for _, n := range allReplicas(d) {
		if n == r.self {
			continue
		}
		pd, err := r.cfg.PeerDescriptor(pctx, n, d.GetRangeId())
		if err != nil {
			return fmt.Errorf("%w: range %d's replica on node %d does not answer: %v", ErrMergeBusy, d.GetRangeId(), n, err)
		}
		if pd.GetGeneration() != d.GetGeneration() {
			return fmt.Errorf("%w: range %d's replica on node %d is at generation %d, not %d", ErrMergeBusy, d.GetRangeId(), n, pd.GetGeneration(), d.GetGeneration())
		}
	}
	return nil
}

// waitSubsumed waits, up to mergeWait, until every replica of right has
// applied its subsume command: a replica that no longer hosts right
// removed it after the merge applied there. Non-voters too (DESIGN.md
// §13): a non-voter that applied the merge before right's last entries
// would hold the merged range without them, yet serve reads from a closed
// epoch that says they are there. A non-voter cut off from its home must
// not hold the frozen range back, though: once every voter has applied
// the subsume, non-voters get nonVoterGrace more, and those still behind
// are returned, for the merge to remove them from this range first.
func (r *Replica) waitSubsumed(ctx context.Context, right *Replica) (lagging []uint64, err error) {
	rd := right.Desc()
	wctx, cancel := context.WithTimeout(ctx, mergeWait)
	defer cancel()
	var votersDone time.Time
	for {
		var behind []uint64
		voters := true
		for _, n := range allReplicas(rd) {
			if n == r.self || r.cfg.PeerDescriptor == nil {
				continue // right is this node's replica, subsumed
			}
			d, err := r.cfg.PeerDescriptor(wctx, n, rd.GetRangeId())
			if err != nil || (d != nil && !d.GetSubsumed()) {
				behind = append(behind, n)
				voters = voters && slices.Contains(rd.GetNonVoters(), n)
			}
		}
		if len(behind) == 0 {
			return nil, nil
		}
		if voters { // only non-voters are behind
			if votersDone.IsZero() {
				votersDone = time.Now()
			} else if time.Since(votersDone) >= nonVoterGrace {
				return behind, nil
			}
		}
		if !transport.SleepCtx(wctx, 5*time.Millisecond) {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("%w: range %d's replicas on nodes %v have not applied its subsume", ErrMergeBusy, rd.GetRangeId(), behind)
		}
	}
}

// nonVoterGrace is how long a merge waits for a lagging non-voter of the
// subsumed range once every voter has applied the subsume.
const nonVoterGrace = 2 * time.Second

// dropLagging removes from this range, at its leader during a merge, the
// non-voters on nodes that did not apply the right-hand range's subsume
// (waitSubsumed): the merge would otherwise reach them before the right
// range's last entries. The placement that wants them adds them again.
func (r *Replica) dropLagging(ctx context.Context, nodes []uint64) error {
	for _, n := range nodes {
		d := r.sm.Descriptor()
		if !slices.Contains(d.GetNonVoters(), n) {
			return fmt.Errorf("%w: node %d, behind on the subsume, is no non-voter of range %d", ErrMergeBusy, n, r.id)
		}
		steps := r.moveSteps(slices.DeleteFunc(slices.Clone(d.GetNonVoters()), func(x uint64) bool { return x == n }))
		steps.Keep = d.GetNonVoters()
		if _, err := r.changed(r.group.RemoveNonVoter(ctx, n, steps)); err != nil {
			return fmt.Errorf("%w: removing the non-voter on node %d, behind on the subsume: %v", ErrMergeBusy, n, err)
		}
		slog.Warn("merge: removed a non-voter that did not apply the subsume in time", "range", r.id, "node", n)
	}
	return nil
}

// onMerge runs on every replica once a merge into this range is durable.
func (r *Replica) onMerge(m Merge) {
	r.reshaped.Store(r.cfg.Clock.Now().UnixNano())
	r.load.reset()
	slog.Info("range merged", "range", r.id, "subsumed", m.Right.GetRangeId(),
		"span", fmt.Sprintf("[%q, %q)", m.Merged.GetStartKey(), m.Merged.GetEndKey()), "generation", m.Merged.GetGeneration())
}

// maybeMerge, on the leader's tick at most every splitCheck, finishes the
// merge of a subsumed right-hand neighbour, or merges with the neighbour
// when both are small and cold: together under MergeSize bytes and
// MergeQPS requests per second, both unchanged in shape for MergeDelay, and
// the boundary not set by an operator (sticky). The thresholds sit well
// below the split thresholds, so a merged range does not split back. One
// split or merge at a time, in the background.
func (r *Replica) maybeMerge() {
	now := r.cfg.Clock.Now()
	if now.Sub(r.splits.lastMerge) < splitCheck || r.splits.running.Load() {
		return
	}
	r.splits.lastMerge = now
	right, err := r.rightNeighbour()
	if err != nil {
		return
	}
	rd := right.Desc()
	reason := "finishing a subsumed neighbour"
	if !rd.GetSubsumed() {
		if r.cfg.MergeSize == 0 || rd.GetSticky() || !r.coldFor(now) || !right.coldFor(now) {
			return
		}
		if _, err := right.leader(); err != nil {
			return
		}
		lsize, err1 := r.sm.Size()
		rsize, err2 := right.sm.Size()
		qps := r.load.QPS() + right.load.QPS()
		if err1 != nil || err2 != nil || lsize+rsize >= r.cfg.MergeSize || (r.cfg.MergeQPS > 0 && qps >= r.cfg.MergeQPS) {
			return
		}
		reason = fmt.Sprintf("small and cold: %d bytes, %.0f requests/s", lsize+rsize, qps)
	}
	r.splits.running.Store(true)
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer r.splits.running.Store(false)
		ctx, cancel := context.WithTimeout(r.ctx, 2*proposeTimeout+splitQuiesce+mergeWait)
		defer cancel()
		if _, err := r.AdminMerge(ctx, nil); err != nil {
			slog.Debug("automatic merge", "range", r.id, "right", rd.GetRangeId(), "reason", reason, "err", err)
			return
		}
		slog.Info("automatic merge", "range", r.id, "right", rd.GetRangeId(), "reason", reason)
	}()
}

// coldFor reports whether the range has kept its shape for MergeDelay.
func (r *Replica) coldFor(now time.Time) bool {
	return now.Sub(time.Unix(0, r.reshaped.Load())) >= r.cfg.MergeDelay
}

// allReplicas returns d's voters and non-voters.
func allReplicas(d *pb.RangeDescriptor) []uint64 {
	return append(slices.Clone(d.GetReplicas()), d.GetNonVoters()...)
}
