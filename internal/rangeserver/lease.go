package rangeserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/terroir-db/terroir/internal/epoch"
	"github.com/terroir-db/terroir/internal/raftgroup"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/tick"
	"github.com/terroir-db/terroir/internal/transport"
)

// leadership is the in-memory state of one lease held by this replica: the
// lease's identity and end, and the transactions holding locks under it.
type leadership struct {
	start  uint64 // the lease's start: identifies it across renewals
	end    atomic.Uint64
	txns   *txnTable
	ctx    context.Context // canceled when the lease is given up
	cancel context.CancelFunc
	// transferring is set while the lease is being handed to another
	// replica (TransferLease): no new request is served under it, and the
	// tick neither renews nor extends it. transferAt is when it was set
	// (unix ns).
	transferring atomic.Bool
	transferAt   atomic.Int64
	transferSeq  atomic.Uint64 // the lease's seq when the transfer began

	// The leader's tick alone reads and writes these (closed.go).
	closing   *closing  // a close under way, or nil
	lastClose time.Time // when the last close began
	loggedAt  uint64    // the applied index once the last close through the log applied (0: none yet)
}

func (r *Replica) loop() {
	defer r.wg.Done()
	t := tick.NewTicker(r.cfg.Tick)
	defer t.Stop()
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-t.C:
			t.Next()
		}
		r.tick()
	}
}

// tick keeps the lease: acquire or renew it while this replica leads the Raft
// group, activate leadership once the lease is ours, resolve orphans.
func (r *Replica) tick() {
	st := r.group.Status()
	home := r.followHome()
	if d := r.sm.Descriptor(); len(d.GetRehomeVoters()) > 0 || !home || (r.cfg.Region != "" && d.GetRegion() != r.cfg.Region) {
		// A rehome is moving the voters (this replica's group leader does
		// it), or this replica is outside its range's home: no lease here
		// (DESIGN.md §13).
		r.stepDown()
		if st.Leader == r.self && len(d.GetRehomeVoters()) > 0 {
			r.finishRehome()
		}
		return
	}
	if st.Leader == 0 && r.sm.Lease().GetHolder() == r.self {
		// The group has no leader and the lease names this replica (a range
		// a split just made, whose other replicas may have started after
		// its first vote request): stand for election now rather than after
		// an election timeout, so leadership and lease stay together.
		r.group.Campaign()
	}
	if st.Leader != r.self || !st.CaughtUp || r.sm.Descriptor().GetSubsumed() {
		r.stepDown() // a subsumed range serves nothing: no lease to keep
		return
	}
	r.mu.Lock()
	cur := r.lead
	r.mu.Unlock()
	if cur != nil && cur.transferring.Load() {
		// TransferLease owns the lease meanwhile; one whose outcome stayed
		// unknown is settled here, so the lease is not left unrenewed.
		if time.Since(time.Unix(0, cur.transferAt.Load())) > transferSettleAfter && r.settleTransfer(cur, cur.transferSeq.Load()) {
			if lease := r.sm.Lease(); lease.GetHolder() != r.self {
				// The transfer (or a rehome's end of the lease) applied
				// after all: finish it.
				r.stepDown()
				if lease.GetHolder() != 0 {
					r.group.TransferLeadership(lease.GetHolder())
				}
			}
			return
		}
		// The transfer waits for the prepared transactions to settle, and
		// one whose coordinator died settles only here: resolve orphans
		// meanwhile, or back-to-back transfers starve them (and fail).
		r.resolveOrphans(cur)
		return
	}
	ctx, cancel := context.WithTimeout(r.ctx, time.Second)
	defer cancel()
	e, err := r.tickEpoch(ctx)
	if err != nil {
		return
	}
	e = r.observeEpoch(e)
	lease := r.sm.Lease()
	if lease.GetHolder() != r.self && e < r.sm.Descriptor().GetRehomeRegionalFloor() {
		// The first lease after a rehome starts above the local epoch the
		// state at the barrier was copied at (DESIGN.md §13).
		return
	}
	if want := nextLease(lease, r.self, e, r.cfg.LeaseEpochs, r.cfg.LeaseRenewEpochs); want != nil {
		cmd := EncodeCommand(&pb.Command{Cmd: &pb.Command_Lease{Lease: &pb.LeaseCmd{Lease: want, PrevSeq: lease.GetSeq()}}})
		if _, err := r.group.Propose(ctx, cmd); err != nil {
			slog.Debug("lease proposal failed", "range", r.id, "err", err)
		}
		lease = r.sm.Lease()
	}
	if lease.GetHolder() != r.self {
		r.stepDown()
		return
	}
	highest := lease.GetStart()
	var handed []handedTxn
	if !r.leading(lease) {
		if in, ok := r.takeInheritance(lease); ok {
			// A split's left-hand leader's, under this very lease.
			handed = in.txns
			if r.src().Publisher != nil {
				highest = in.highest
			}
		} else if h, ok := r.sm.Handover(lease.GetSeq()); ok {
			// Handed over by its previous holder (DESIGN.md §12), in the
			// epochs its versions carry: global ones, or local ones in a
			// regional-only deployment (where the lease's start bounds it too).
			if r.src().Publisher != nil {
				highest = h
			} else {
				highest = max(highest, h)
			}
		} else if r.src().Publisher != nil {
			// A new leaseholder does not trust its predecessor's highest
			// epoch: it waits for the global epoch to advance once (DESIGN.md §3.5).
			if highest, err = r.nextGlobalEpoch(r.sm.Descriptor().GetRehomeBarrier()); err != nil {
				return
			}
		}
	}
	// Every later commit lands above the closed epoch (DESIGN.md §13), a
	// value the publisher has already shown.
	highest = max(highest, r.sm.ClosedEpoch()+1)
	l := r.activate(lease, highest, handed)
	r.resolveOrphans(l)
	r.maybeSplit()
	r.maybeMerge()
	r.maybeGC(e)
	r.maybeClose(ctx, l)
}

// epochRefresh is the longest a leaseholder's tick goes without reading the
// local epoch while its lease is active and its renewal far: 100 ms.
const epochRefresh = 100 * time.Millisecond

// tickEpoch returns the local epoch for the tick's lease keeping and
// housekeeping. A read is a round of RPCs to the epoch group, so a
// leaseholder whose lease is active reuses its newest read (lastEpoch,
// which commits raise too) for up to epochRefresh, as long as its renewal
// stays out of reach even if the epoch advanced meanwhile at twice the
// fastest rate seen between reads (issue 17: an idle leader reads ten
// times a second, not a hundred). Every other tick reads afresh. A value
// behind the epoch only delays a renewal; it cannot make two leases
// overlap, since each names its predecessor (DESIGN.md §3.3). Real time
// measures the age, not Config.Clock: a test's still clock must not stop
// the reads. Only the tick calls it.
func (r *Replica) tickEpoch(ctx context.Context) (uint64, error) {
	now, cur := time.Now(), r.lastEpoch.Load()
	if r.epochRead.reusable(now, r.sm.Lease(), r.self, cur, r.cfg.LeaseRenewEpochs) {
		return cur, nil
	}
	return r.readLocal(ctx, cur)
}

// readLocal reads the local epoch afresh for the tick, cur being the
// newest seen, and notes the read for tickEpoch's reuse (epochRead). Only
// the tick calls it: tickEpoch, and a side close (closed.go).
func (r *Replica) readLocal(ctx context.Context, cur uint64) (uint64, error) {
	began := time.Now()
	// A leaseholder whose lease is active needs the epoch only to keep
	// the lease: it leaves an idle region at its idle pace (epoch.Pace).
	// Every other tick wants the epoch to move: to take over a lapsed or
	// transferred lease, or to start its own queued one.
	var e uint64
	var err error
	if l := r.sm.Lease(); l.GetHolder() == r.self && l.GetStart() <= cur && cur <= l.GetEnd() {
		e, err = epoch.ReadBackground(ctx, r.src().Local)
	} else {
		e, err = r.src().Local.Read(ctx)
	}
	if err != nil {
		return 0, err
	}
	now := time.Now() // when the read ended: a slow read must not inflate the rate
	er := &r.epochRead
	switch span := now.Sub(er.rateAt); {
	case er.rateAt.IsZero() || e < er.rateEpoch:
		er.rateAt, er.rateEpoch = now, e
	case span >= minRateSpan:
		// The fastest rate seen, never forgotten: a stall (an epoch
		// leader's election) must not talk the next reuse into a lapse.
		// Never below the full pace: a leaseholder that saw only the idle
		// pace must not reuse a read while the pace returns (epoch.Pace).
		// Over minRateSpan at least: two reads a millisecond apart (a
		// side close's just after the tick's) would see a step of the
		// epoch as a rate of a thousand a second.
		rate := float64(e-er.rateEpoch) / span.Seconds()
		er.perSec = max(rate, er.perSec, float64(time.Second)/float64(r.cfg.EpochInterval))
		er.rateAt, er.rateEpoch = now, e
	}
	er.began, er.at, er.epoch = began, now, e
	return e, nil
}

// minRateSpan is the least time over which readLocal measures the local
// epoch's rate.
const minRateSpan = epochRefresh / 2

// epochReading is the tick's last fresh read of the local epoch (tickEpoch).
type epochReading struct {
	began  time.Time // when the read began
	at     time.Time // when it returned
	epoch  uint64
	perSec float64 // the fastest advance seen between two reads minRateSpan or more apart (epochs/s)
	// The read the next rate is measured from.
	rateAt    time.Time
	rateEpoch uint64
}

// reusable reports whether replica self, whose newest local epoch read is
// cur, may skip reading at now: it holds lease, active at cur, a fresh read
// is younger than epochRefresh, and lease stays more than renew epochs
// ahead even if the epoch advanced meanwhile at twice the fastest rate
// seen (unknown before two reads: no reuse).
func (er epochReading) reusable(now time.Time, lease *pb.Lease, self, cur, renew uint64) bool {
	age := now.Sub(er.at)
	if er.perSec <= 0 || age < 0 || age >= epochRefresh || lease.GetHolder() != self || cur < lease.GetStart() {
		return false
	}
	drift := uint64(2*er.perSec*age.Seconds()) + 2
	return cur+drift+renew < lease.GetEnd()
}

// nextLease returns the lease that replica self, leading the range's Raft
// group at local epoch e, should propose after current (nil: none), each
// lease reaching leaseEpochs past e (paper §2.3.1, DESIGN.md §3.3):
//   - its own lease, renewed (keeping its start) once fewer than renew
//     epochs of it remain;
//   - a new lease starting at e when there is none or the current one lapsed;
//   - a lease queued right after another holder's that ends within renew
//     epochs, so the two never overlap; it serves once e gets there.
//
// Every proposal names its predecessor's seq, so replicas reject it if
// another lease got in first.
func nextLease(current *pb.Lease, self, e, leaseEpochs, renew uint64) *pb.Lease {
	next := &pb.Lease{Holder: self, End: e + leaseEpochs, Seq: current.GetSeq() + 1}
	switch {
	case current.GetHolder() == self && current.GetEnd() >= e:
		if current.GetEnd() >= e+renew {
			return nil
		}
		next.Start = current.GetStart()
	case current.GetHolder() == 0 || current.GetEnd() < e:
		next.Start = e
	case current.GetEnd()+1 <= e+renew:
		next.Start = current.GetEnd() + 1
	default:
		return nil
	}
	return next
}

// takeInheritance returns, once, the highest epoch inherited for lease (see
// Inherit).
func (r *Replica) takeInheritance(lease *pb.Lease) (Inheritance, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	in := r.inherited
	r.inherited = Inheritance{}
	return in, in.set && in.leaseStart == lease.GetStart() && lease.GetHolder() == r.self
}

// leading reports whether this replica already leads under lease.
func (r *Replica) leading(lease *pb.Lease) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lead != nil && r.lead.start == lease.GetStart()
}

// nextGlobalEpoch reads the global epoch g at the region's publisher and waits
// until the publisher shows more than both g and floor (a rehome's barrier,
// DESIGN.md §13), which it returns.
func (r *Replica) nextGlobalEpoch(floor uint64) (uint64, error) {
	ctx, cancel := context.WithTimeout(r.ctx, 5*time.Second)
	defer cancel()
	g, err := r.src().Publisher.Read(ctx)
	if err != nil {
		return 0, err
	}
	g = max(g, floor)
	for {
		next, err := r.src().Publisher.Read(ctx)
		if err != nil {
			return 0, err
		}
		if next > g {
			return next, nil
		}
		if !transport.SleepCtx(ctx, r.cfg.Tick) {
			return 0, ctx.Err()
		}
	}
}

func (r *Replica) observeEpoch(e uint64) uint64 {
	for {
		cur := r.lastEpoch.Load()
		if e <= cur {
			return cur
		}
		if r.lastEpoch.CompareAndSwap(cur, e) {
			return e
		}
	}
}

// activate returns the leadership of lease, building it if the lease is new: a
// fresh transaction table holding the exclusive locks of every prepared
// transaction and the transactions a split handed over, and highest, an
// epoch no lower than any of the previous leaseholders'.
func (r *Replica) activate(lease *pb.Lease, highest uint64, handed []handedTxn) *leadership {
	r.mu.Lock()
	defer r.mu.Unlock()
	if l := r.lead; l != nil && l.start == lease.GetStart() {
		l.end.Store(lease.GetEnd())
		return l
	}
	if r.lead != nil {
		r.lead.cancel()
	}
	ctx, cancel := context.WithCancel(r.ctx)
	l := &leadership{start: lease.GetStart(), txns: newTxnTable(r.cfg.Clock.Now, highest), ctx: ctx, cancel: cancel}
	l.end.Store(lease.GetEnd())
	for _, key := range l.txns.relock(r.sm.Prepared()) {
		slog.Error("re-locking a prepared transaction failed", "range", r.id, "key", key)
	}
	l.txns.adopt(handed)
	r.lead = l
	slog.Info("range leaseholder", "range", r.id, "replica", r.self, "lease", fmt.Sprintf("[%d, %d]", lease.GetStart(), lease.GetEnd()))
	return l
}

func (r *Replica) stepDown() {
	r.mu.Lock()
	l := r.lead
	r.lead = nil
	r.mu.Unlock()
	if l != nil {
		l.cancel()
	}
}

// Errors of TransferLease; each leaves the lease where it was.
var (
	// ErrTransferTarget: the target is this replica or not a replica of the range.
	ErrTransferTarget = errors.New("rangeserver: lease transfer target is not another replica of the range")
	// ErrTransferBusy: commits under way did not finish in time, or the
	// local epoch could not be read; retry later.
	ErrTransferBusy = errors.New("rangeserver: the lease could not be handed over now")
)

// transferQuiesce bounds how long a lease transfer waits for the
// transactions committing under the lease to finish; transferSettleAfter
// is how long after a transfer began the tick settles one whose outcome
// stayed unknown.
const (
	transferQuiesce     = 2 * time.Second
	transferSettleAfter = transferQuiesce + 3*proposeTimeout
)

// TransferLease hands this replica's lease to replica `to` without waiting
// for it to run out (DESIGN.md §12): the holder stops serving new requests
// under the lease, drops the transactions that hold only unreplicated locks
// (they abort), waits until every transaction prepared or committing here
// has its outcome applied and its locks released (so the coordinators that
// were told the lease's end have finished with it, and the highest epoch
// includes theirs), reads its local epoch e and proposes one lease entry
// ending its own lease at e+1 and granting `to` [e+2, e+2+LeaseEpochs] with
// its highest epoch, then hands Raft leadership to `to`. It returns the
// successor's lease. Errors: ErrNotLeaseholder here, ErrTransferTarget for
// a target that is not another replica of the range, ErrTransferBusy if a
// change of the range's replicas or a merge holds its claim, transactions
// did not finish in time, or the entry did not apply (the lease stays);
// any other error leaves the outcome unknown.
func (r *Replica) TransferLease(ctx context.Context, to uint64, ifIdle bool) (*pb.Lease, error) {
	d := r.sm.Descriptor()
	switch {
	case to == r.self:
		// A queue whose view is stale asks the holder to hand the lease to itself.
		return nil, fmt.Errorf("%w: node %d already holds the lease of range %d", ErrTransferTarget, to, r.id)
	case !slices.Contains(d.GetReplicas(), to):
		return nil, fmt.Errorf("%w: node %d is not another replica of range %d (replicas %v)", ErrTransferTarget, to, r.id, d.GetReplicas())
	}
	l, err := r.leader()
	if err != nil {
		return nil, err
	}
	if !l.transferring.CompareAndSwap(false, true) {
		return nil, fmt.Errorf("%w: range %d is already handing its lease over", ErrTransferBusy, r.id)
	}
	l.transferAt.Store(time.Now().UnixNano())
	keep := true // the lease stays here unless the transfer entry may apply
	defer func() {
		if keep {
			l.transferring.Store(false)
		}
	}()
	if l.txns.moveClaimed() {
		// A change of the replicas runs at this leader and counts on
		// staying here: a move's source that took the lease (and with it
		// Raft leadership) would leave the joint configuration and drop
		// its own replica before the others learned the change committed,
		// stranding them in it when another voter is down. The check
		// follows the flag above and claimReplicaChange checks the flag
		// after claiming, so one of the two always sees the other.
		return nil, fmt.Errorf("%w: range %d is changing its replicas or merging", ErrTransferBusy, r.id)
	}
	if ifIdle && !l.txns.idle() { // checked once no new lock is taken here
		return nil, fmt.Errorf("%w: range %d: transactions hold locks here", ErrTransferBusy, r.id)
	}
	dropped := l.txns.dropActive()
	wctx, cancel := context.WithTimeout(ctx, transferQuiesce)
	defer cancel()
	for l.txns.settling() {
		if !transport.SleepCtx(wctx, time.Millisecond) {
			return nil, fmt.Errorf("%w: range %d: transactions still prepared or committing", ErrTransferBusy, r.id)
		}
	}
	e, err := r.src().Local.Read(wctx)
	if err != nil {
		return nil, fmt.Errorf("%w: reading the local epoch: %v", ErrTransferBusy, err)
	}
	e = r.observeEpoch(e)
	cur := r.sm.Lease()
	if cur.GetHolder() != r.self || cur.GetStart() != l.start {
		return nil, fmt.Errorf("%w: the lease changed", ErrNotLeaseholder)
	}
	l.transferSeq.Store(cur.GetSeq())
	if end := l.end.Load(); e+1 < end {
		l.end.Store(e + 1) // nothing is served past it while the transfer may apply
	}
	next := &pb.Lease{Holder: to, Start: e + 2, End: e + 2 + r.cfg.LeaseEpochs, Seq: cur.GetSeq() + 1,
		HandedHighest: max(l.txns.highestEpoch(), 1)}
	cmd := EncodeCommand(&pb.Command{Cmd: &pb.Command_Lease{Lease: &pb.LeaseCmd{Lease: next, PrevSeq: cur.GetSeq()}}})
	pctx, pcancel := context.WithTimeout(context.WithoutCancel(ctx), proposeTimeout)
	defer pcancel()
	res, err := r.group.Propose(pctx, cmd)
	switch {
	case err == nil:
		if a, ok := res.(Applied); !ok || !a.LeaseGranted {
			return nil, fmt.Errorf("%w: another lease got in first", ErrTransferBusy)
		}
	case errors.Is(err, raftgroup.ErrNotLeader), errors.Is(err, raftgroup.ErrBusy):
		return nil, fmt.Errorf("%w: %v", ErrTransferBusy, err) // refused before it entered the log
	default:
		keep = false // it may apply: settled below, or by the tick
		if !r.settleTransfer(l, cur.GetSeq()) {
			return nil, err
		}
		if r.sm.Lease().GetSeq() == cur.GetSeq() {
			return nil, fmt.Errorf("%w: the transfer entry was lost", ErrTransferBusy)
		}
	}
	keep = false
	r.stepDown()
	r.group.TransferLeadership(to)
	slog.Info("range lease transferred", "range", r.id, "from", r.self, "to", to,
		"lease", fmt.Sprintf("[%d, %d]", next.GetStart(), next.GetEnd()), "dropped_txns", dropped)
	return next, nil
}

// settleTransfer learns the outcome of a transfer entry of lease l (whose
// seq was seq) that may or may not have entered the log: a barrier entry
// proposed after it applies after it, if at all. It reports whether the
// barrier applied; if the lease then is still seq, the transfer was lost
// and l serves again.
func (r *Replica) settleTransfer(l *leadership, seq uint64) bool {
	ctx, cancel := context.WithTimeout(r.ctx, proposeTimeout)
	defer cancel()
	if _, err := r.group.Propose(ctx, EncodeCommand(&pb.Command{})); err != nil {
		return false
	}
	if lease := r.sm.Lease(); lease.GetSeq() == seq && lease.GetHolder() == r.self {
		l.transferring.Store(false)
	}
	return true
}
