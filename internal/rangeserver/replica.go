package rangeserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/terroir-db/terroir/internal/epoch"
	"github.com/terroir-db/terroir/internal/locktable"
	"github.com/terroir-db/terroir/internal/raftgroup"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/storage"
	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/transport"
	"github.com/terroir-db/terroir/internal/txnstate/txnstatepb"
)

// EpochSource reads an epoch: the region's local epoch, or its publisher.
type EpochSource = epoch.Source

// Epochs are the epochs a range leader reads.
type Epochs struct {
	// Local is the region's local epoch (leases, regional versions).
	Local EpochSource
	// Publisher is the region's publisher of the global epoch; nil in a
	// regional-only deployment, where versions carry local epochs.
	Publisher EpochSource
	// Service is the global epoch service itself, across the WAN: read only
	// by the naive commit baseline (nil if there is none).
	Service EpochSource
}

// Decider records transaction outcomes; txnstate.Client implements it.
type Decider interface {
	Decide(ctx context.Context, rec *txnstatepb.Record) (*txnstatepb.Record, error)
}

// Config tunes a range replica. Zero fields take the defaults noted.
type Config struct {
	// LeaseEpochs is how far ahead of the current local epoch a lease's end is
	// set when it is acquired or renewed (default 100, paper §2.3.1).
	LeaseEpochs uint64
	// Tick is the period of the lease and resolver loop (default 10 ms).
	Tick time.Duration
	// OrphanAfter is how long a transaction may hold locks here, or stay
	// prepared without a decision, without a word from its coordinator (an
	// operation or a heartbeat) before the leader resolves it through the
	// transaction state store (default topology.DefaultOrphanAfter, DESIGN.md
	// §10). A transaction waiting for a lock here is never an orphan.
	OrphanAfter time.Duration
	// QuietEpochs is k of the paper's §5.3.1: no one-phase commit here takes a
	// global epoch that is a multiple of k (0: off).
	QuietEpochs uint64
}

func (c Config) withDefaults() Config {
	if c.LeaseEpochs == 0 {
		c.LeaseEpochs = 100
	}
	if c.Tick <= 0 {
		c.Tick = 10 * time.Millisecond
	}
	if c.OrphanAfter <= 0 {
		c.OrphanAfter = topology.DefaultOrphanAfter
	}
	return c
}

// Errors a replica returns; the server maps them to gRPC codes.
var (
	// ErrNotLeaseholder: this replica does not serve the range now.
	ErrNotLeaseholder = errors.New("rangeserver: not the leaseholder")
	// ErrLeaseNotActive: the replica holds a lease the epoch has not reached (or
	// has passed); retry shortly.
	ErrLeaseNotActive = errors.New("rangeserver: lease not active at the current epoch")
	// ErrConflict: wait-die chose this transaction to die; retry it.
	ErrConflict = errors.New("rangeserver: lock conflict with an older transaction")
	// ErrLocksLost: the transaction's locks are gone (the leaseholder changed, or
	// it sat idle past OrphanAfter); retry it.
	ErrLocksLost = errors.New("rangeserver: the transaction's locks were lost")
	// ErrLeaseValidation: the local epoch is outside the lease (paper §4.2).
	ErrLeaseValidation = errors.New("rangeserver: local epoch outside the lease")
	// ErrKeyOutsideRange: the key is not in this range.
	ErrKeyOutsideRange = errors.New("rangeserver: key outside the range")
)

// MaxKeySize is the largest key a range accepts: 4 KiB.
const MaxKeySize = 4 << 10

// keyspaceEnd sorts after every key of at most MaxKeySize bytes: the lock-table
// end of a scan to the end of the key space.
var keyspaceEnd = bytes.Repeat([]byte{0xff}, MaxKeySize+1)

// maxVersion sorts above every stored version: reads "as of now".
var maxVersion = storage.VersionID{Epoch: ^uint64(0), Counter: ^uint32(0)}

// Replica is one node's replica of a range, and while it holds the lease, the
// range's leader.
type Replica struct {
	desc     topology.Group
	self     uint64
	group    *raftgroup.Group
	sm       *StateMachine
	epochs   EpochSource // the region's local epoch
	global   EpochSource // the region's publisher; nil: versions use local epochs
	service  EpochSource // the global epoch service (naive baseline only)
	deciders func(txnStateGroup uint64) Decider
	cfg      Config

	lastEpoch atomic.Uint64 // the newest local epoch this replica has read

	mu   sync.Mutex
	lead *leadership // nil unless serving as leaseholder

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// leadership is the in-memory state of one lease held by this replica.
type leadership struct {
	start   uint64 // the lease's start: identifies it across renewals
	end     atomic.Uint64
	locks   *locktable.Table
	ctx     context.Context // canceled when the lease is given up
	cancel  context.CancelFunc
	mu      sync.Mutex
	txns    map[string]*leaderTxn
	highest uint64 // DESIGN.md §3.5: highest epoch of a transaction that released a lock
}

// leaderTxn is the leader's record of a transaction holding locks here. Its
// fields are guarded by the leadership's mu.
type leaderTxn struct {
	meta        *pb.TxnMeta
	incarnation uint64    // random per record: a recreated record has another
	lastActive  time.Time // the coordinator's last operation or heartbeat here
	waiting     int       // lock acquisitions under way: waiting is not silence
	state       txnState
	resolving   bool
}

// txnState is where a transaction stands at this leader.
type txnState uint8

const (
	// txnActive: executing; dropped (locks released) once its coordinator
	// has been silent for OrphanAfter.
	txnActive txnState = iota
	// txnCommitting: a one-phase commit is under way; only it ends the transaction.
	txnCommitting
	// txnPrepared: prepared here (with or without writes); only its outcome, from
	// the coordinator or the transaction state store, ends it.
	txnPrepared
)

// NewReplica ties a range's state machine to its Raft group. Start begins its loop.
//
// With a publisher in epochs, version ids carry global epochs (paper §5.1);
// without one they carry local epochs (a regional-only deployment).
func NewReplica(desc topology.Group, self uint64, group *raftgroup.Group, sm *StateMachine,
	epochs Epochs, deciders func(uint64) Decider, cfg Config) *Replica {
	ctx, cancel := context.WithCancel(context.Background())
	return &Replica{desc: desc, self: self, group: group, sm: sm, epochs: epochs.Local, global: epochs.Publisher,
		service: epochs.Service, deciders: deciders, cfg: cfg.withDefaults(), ctx: ctx, cancel: cancel}
}

// Start begins the lease and resolver loop.
func (r *Replica) Start() {
	r.wg.Add(1)
	go r.loop()
}

// Close stops the loop, gives up leadership (waking lock waiters) and waits.
func (r *Replica) Close() {
	r.cancel()
	r.wg.Wait()
	r.stepDown()
}

// Desc returns the range's descriptor.
func (r *Replica) Desc() topology.Group { return r.desc }

// LeaderHint returns the node this replica believes leads the range's Raft group.
func (r *Replica) LeaderHint() uint64 { return r.group.Status().Leader }

// Locks returns the number of locks the leader holds (0 when not leading).
func (r *Replica) Locks() int {
	r.mu.Lock()
	l := r.lead
	r.mu.Unlock()
	if l == nil {
		return 0
	}
	return l.locks.Len()
}

// HoldsLocks reports whether transaction txnID holds locks at this range:
// it is prepared in the replicated state, or this replica leads the range and
// tracks it in its lock table.
func (r *Replica) HoldsLocks(txnID []byte) bool {
	if r.sm.IsPrepared(txnID) {
		return true
	}
	r.mu.Lock()
	l := r.lead
	r.mu.Unlock()
	if l == nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.txns[string(txnID)]
	return ok
}

func (r *Replica) loop() {
	defer r.wg.Done()
	t := time.NewTicker(r.cfg.Tick)
	defer t.Stop()
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-t.C:
		}
		r.tick()
	}
}

// tick keeps the lease: acquire or renew it while this replica leads the Raft
// group, activate leadership once the lease is ours, resolve orphans.
func (r *Replica) tick() {
	st := r.group.Status()
	if st.Leader != r.self || !st.CaughtUp {
		r.stepDown()
		return
	}
	ctx, cancel := context.WithTimeout(r.ctx, time.Second)
	defer cancel()
	e, err := r.epochs.Read(ctx)
	if err != nil {
		return
	}
	e = r.observeEpoch(e)
	lease := r.sm.Lease()
	var want *pb.Lease
	switch {
	case lease.GetHolder() == r.self && lease.GetEnd() >= e:
		if lease.GetEnd() < e+r.cfg.LeaseEpochs/2 { // renew, keeping the start
			want = &pb.Lease{Holder: r.self, Start: lease.GetStart(), End: e + r.cfg.LeaseEpochs, Seq: lease.GetSeq() + 1}
		}
	case lease.GetHolder() == 0 || lease.GetEnd() < e:
		// No lease, or it lapsed: take one starting now.
		want = &pb.Lease{Holder: r.self, Start: e, End: e + r.cfg.LeaseEpochs, Seq: lease.GetSeq() + 1}
	case lease.GetEnd()+1 <= e+r.cfg.LeaseEpochs/2:
		// Another replica's lease ends soon: queue ours right after it, so that
		// the two never overlap (DESIGN.md §3.3). We serve once the epoch gets there.
		want = &pb.Lease{Holder: r.self, Start: lease.GetEnd() + 1, End: e + r.cfg.LeaseEpochs, Seq: lease.GetSeq() + 1}
	}
	if want != nil {
		cmd := EncodeCommand(&pb.Command{Cmd: &pb.Command_Lease{Lease: &pb.LeaseCmd{Lease: want, PrevSeq: lease.GetSeq()}}})
		if _, err := r.group.Propose(ctx, cmd); err != nil {
			slog.Debug("lease proposal failed", "range", r.desc.ID, "err", err)
		}
		lease = r.sm.Lease()
	}
	if lease.GetHolder() != r.self {
		r.stepDown()
		return
	}
	highest := lease.GetStart()
	if r.global != nil && !r.leading(lease) {
		// A new leaseholder does not trust its predecessor's highest epoch: it
		// waits for the global epoch to advance once (DESIGN.md §3.5).
		if highest, err = r.nextGlobalEpoch(); err != nil {
			return
		}
	}
	l := r.activate(lease, highest)
	r.resolveOrphans(l)
}

// leading reports whether this replica already leads under lease.
func (r *Replica) leading(lease *pb.Lease) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lead != nil && r.lead.start == lease.GetStart()
}

// nextGlobalEpoch reads the global epoch g at the region's publisher and waits
// until the publisher shows g+1, which it returns.
func (r *Replica) nextGlobalEpoch() (uint64, error) {
	ctx, cancel := context.WithTimeout(r.ctx, 5*time.Second)
	defer cancel()
	g, err := r.global.Read(ctx)
	if err != nil {
		return 0, err
	}
	for {
		next, err := r.global.Read(ctx)
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
// fresh lock table holding the exclusive locks of every prepared transaction,
// and highest, an epoch no lower than any of the previous leaseholders'.
func (r *Replica) activate(lease *pb.Lease, highest uint64) *leadership {
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
	l := &leadership{start: lease.GetStart(), locks: locktable.New(), ctx: ctx, cancel: cancel,
		txns: map[string]*leaderTxn{}, highest: highest}
	l.end.Store(lease.GetEnd())
	now := time.Now()
	// Re-lock every prepared transaction. Prepared transactions never share a
	// key exclusively, so no acquisition can wait; a canceled context makes sure.
	noWait, cancelNoWait := context.WithCancel(ctx)
	cancelNoWait()
	for _, rec := range r.sm.Prepared() {
		lt := lockTxn(rec.GetTxn())
		for _, w := range rec.GetWrites() {
			if err := l.locks.Acquire(noWait, lt, locktable.Point(w.GetKey()), locktable.Exclusive); err != nil {
				slog.Error("re-locking a prepared transaction failed", "range", r.desc.ID, "key", w.GetKey(), "err", err)
			}
		}
		l.locks.MarkPrepared(lt.ID)
		l.txns[string(rec.GetTxn().GetId())] = &leaderTxn{meta: rec.GetTxn(), lastActive: now, state: txnPrepared, incarnation: rand.Uint64()}
	}
	r.lead = l
	slog.Info("range leaseholder", "range", r.desc.ID, "replica", r.self, "lease", fmt.Sprintf("[%d, %d]", lease.GetStart(), lease.GetEnd()))
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

func lockTxn(m *pb.TxnMeta) locktable.Txn {
	var id locktable.TxnID
	copy(id[:], m.GetId())
	return locktable.Txn{ID: id, Priority: m.GetPriority()}
}

// leader returns the serving leadership or why there is none.
func (r *Replica) leader() (*leadership, error) {
	r.mu.Lock()
	l := r.lead
	r.mu.Unlock()
	if l == nil || !r.group.IsLeader() {
		return nil, ErrNotLeaseholder
	}
	if e := r.lastEpoch.Load(); e < l.start || e > l.end.Load() {
		return nil, ErrLeaseNotActive
	}
	return l, nil
}

// txn returns the leader's record of a transaction, creating it (with a fresh
// incarnation) if create is set and there is none.
func (l *leadership) txn(meta *pb.TxnMeta, create bool) (*leaderTxn, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	t, ok := l.txns[string(meta.GetId())]
	if !ok {
		if !create {
			return nil, ErrLocksLost
		}
		t = &leaderTxn{meta: meta, incarnation: rand.Uint64()}
		l.txns[string(meta.GetId())] = t
	}
	t.lastActive = time.Now()
	return t, nil
}

// lock takes a lock for txn, bounded by ctx and by the leadership's life, and
// returns the incarnation of the transaction's record that holds it.
func (r *Replica) lock(ctx context.Context, l *leadership, meta *pb.TxnMeta, span locktable.Span, mode locktable.Mode) (uint64, error) {
	if _, err := l.txn(meta, true); err != nil {
		return 0, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(l.ctx, cancel)
	defer stop()
	l.setWaiting(meta.GetId(), +1)
	err := l.locks.Acquire(ctx, lockTxn(meta), span, mode)
	l.setWaiting(meta.GetId(), -1)
	switch {
	case errors.Is(err, locktable.ErrWouldDie):
		return 0, ErrConflict
	case err != nil && l.ctx.Err() != nil:
		return 0, ErrLocksLost
	case err != nil:
		return 0, err
	}
	// Touch again: if the transaction was resolved as an orphan while it
	// waited (it cannot be while it waits here, but it can be resolved at
	// another range's request), this recreates its record with a new
	// incarnation, which tells the client its earlier locks are gone, so the
	// new lock is released in turn.
	t, _ := l.txn(meta, true)
	if cur, _ := r.leader(); cur != l {
		return 0, ErrLocksLost // the lock is in a table that no longer counts
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return t.incarnation, nil
}

// setWaiting counts a lock acquisition of txn starting (+1) or ending (-1).
func (l *leadership) setWaiting(txnID []byte, delta int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if t, ok := l.txns[string(txnID)]; ok {
		t.waiting += delta
		t.lastActive = time.Now()
	}
}

// Heartbeat records that txn's coordinator is alive (DESIGN.md §10). lost is
// true when this leader holds no locks of txn under incarnation: the
// transaction can no longer commit. Errors: ErrNotLeaseholder,
// ErrLeaseNotActive.
func (r *Replica) Heartbeat(txnID []byte, incarnation uint64) (lost bool, err error) {
	l, err := r.leader()
	if err != nil {
		return false, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	t, ok := l.txns[string(txnID)]
	if !ok || t.incarnation != incarnation {
		return true, nil
	}
	t.lastActive = time.Now()
	return false, nil
}

func (r *Replica) checkKey(key []byte) error {
	if !r.desc.Contains(key) {
		return fmt.Errorf("%w: %q not in range %d", ErrKeyOutsideRange, key, r.desc.ID)
	}
	return nil
}

// Get takes a shared lock on key for txn and returns its newest committed value
// and the incarnation of the transaction's record here.
func (r *Replica) Get(ctx context.Context, meta *pb.TxnMeta, key []byte) (*pb.GetResponse, error) {
	if err := r.checkKey(key); err != nil {
		return nil, err
	}
	l, err := r.leader()
	if err != nil {
		return nil, err
	}
	inc, err := r.lock(ctx, l, meta, locktable.Point(key), locktable.Shared)
	if err != nil {
		return nil, err
	}
	v, ok, _, err := r.sm.Get(Versions, key, maxVersion)
	if err != nil {
		return nil, err
	}
	return &pb.GetResponse{Found: ok, Value: v.Value, Incarnation: inc}, nil
}

// Scan takes a shared key-range lock on [start, end) ∩ range (so no phantom can
// appear in it) and returns up to limit (0: all) newest committed values.
func (r *Replica) Scan(ctx context.Context, meta *pb.TxnMeta, start, end []byte, limit int) (*pb.ScanResponse, error) {
	if bytes.Compare(start, r.desc.Start) < 0 {
		start = r.desc.Start
	}
	if r.desc.End != nil && (end == nil || bytes.Compare(end, r.desc.End) > 0) {
		end = r.desc.End
	}
	if end != nil && bytes.Compare(start, end) >= 0 {
		return &pb.ScanResponse{}, nil
	}
	l, err := r.leader()
	if err != nil {
		return nil, err
	}
	span := locktable.Span{Key: start, EndKey: end}
	if end == nil {
		span.EndKey = keyspaceEnd
	}
	inc, err := r.lock(ctx, l, meta, span, locktable.Shared)
	if err != nil {
		return nil, err
	}
	resp := &pb.ScanResponse{Incarnation: inc}
	err = r.sm.Scan(Versions, start, end, maxVersion, func(v storage.Version, _ storage.VersionID) bool {
		if !v.Live() {
			return true
		}
		resp.Kvs = append(resp.Kvs, &pb.KeyValue{Key: v.Key, Value: v.Value})
		return limit == 0 || len(resp.Kvs) < limit
	})
	return resp, err
}

// Lock takes the exclusive lock a Put or Delete of key needs (DESIGN.md §3.4:
// writes lock when they execute, not at Prepare) and returns the incarnation.
func (r *Replica) Lock(ctx context.Context, meta *pb.TxnMeta, key []byte) (uint64, error) {
	if err := r.checkKey(key); err != nil {
		return 0, err
	}
	l, err := r.leader()
	if err != nil {
		return 0, err
	}
	return r.lock(ctx, l, meta, locktable.Point(key), locktable.Exclusive)
}

// commitStart verifies, for Prepare or a one-phase commit, that txn still holds
// every lock it took here — the same incarnation it locked under, lockCount
// distinct spans, every write exclusively locked — and moves it to state, so
// that it is no longer dropped as idle: from here on only its outcome ends it.
func (r *Replica) commitStart(l *leadership, meta *pb.TxnMeta, writes []*pb.Write, lockCount uint32, incarnation uint64, state txnState) (*leaderTxn, error) {
	t, err := l.txn(meta, false)
	if err != nil {
		return nil, err
	}
	var id locktable.TxnID
	copy(id[:], meta.GetId())
	l.mu.Lock()
	defer l.mu.Unlock()
	if t.incarnation != incarnation {
		return nil, fmt.Errorf("%w: locks taken under another incarnation", ErrLocksLost)
	}
	if held := l.locks.HeldBy(id); held != int(lockCount) {
		return nil, fmt.Errorf("%w: %d of %d locks held", ErrLocksLost, held, lockCount)
	}
	for _, w := range writes {
		if err := r.checkKey(w.GetKey()); err != nil {
			return nil, err
		}
		if !l.locks.Holds(id, locktable.Point(w.GetKey()), locktable.Exclusive) {
			return nil, fmt.Errorf("%w: no exclusive lock on %q", ErrLocksLost, w.GetKey())
		}
	}
	if t.state == txnActive {
		t.state = state
	}
	return t, nil
}

// maxVersionOf returns the newest stored version among the keys of writes, in
// the global version ids and in the local-epoch ones (zero when this range
// does not store them twice).
func (r *Replica) maxVersionOf(writes []*pb.Write) (global, regional storage.VersionID, err error) {
	for _, w := range writes {
		_, _, newest, err := r.sm.Get(Versions, w.GetKey(), maxVersion)
		if err != nil {
			return global, regional, err
		}
		if global.Less(newest) {
			global = newest
		}
		if r.global == nil {
			continue
		}
		_, _, newest, err = r.sm.Get(RegionalVersions, w.GetKey(), maxVersion)
		if err != nil {
			return global, regional, err
		}
		if regional.Less(newest) {
			regional = newest
		}
	}
	return global, regional, nil
}

// proposeTimeout bounds the wait for a proposal the caller may have given up
// on: its entry can still apply, so the leader keeps waiting for it.
const proposeTimeout = 5 * time.Second

// propose replicates a command and waits for it to apply, independently of the
// caller's context; a rejected command (its lease changed) is ErrLocksLost.
func (r *Replica) propose(ctx context.Context, cmd *pb.Command) error {
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), proposeTimeout)
	defer cancel()
	res, err := r.group.Propose(pctx, EncodeCommand(cmd))
	if err != nil {
		return err
	}
	if a, ok := res.(Applied); ok && a.Rejected {
		return fmt.Errorf("%w: the lease changed before the command applied", ErrLocksLost)
	}
	if err, ok := res.(error); ok {
		return err
	}
	return nil
}

// Prepare makes txn's writes durable as a prepared record (through Raft) and
// returns what the coordinator validates and versions with (DESIGN.md §4.2): the
// lease, the highest epoch, and the newest existing version of the write set. A
// read-only participant (no writes) writes nothing, but from here on it too
// keeps its locks until the outcome is known (invariant 4).
func (r *Replica) Prepare(ctx context.Context, meta *pb.TxnMeta, writes []*pb.Write, lockCount uint32, incarnation uint64) (*pb.PrepareResponse, error) {
	l, err := r.leader()
	if err != nil {
		return nil, err
	}
	if _, err := r.commitStart(l, meta, writes, lockCount, incarnation, txnPrepared); err != nil {
		return nil, err
	}
	var id locktable.TxnID
	copy(id[:], meta.GetId())
	l.locks.MarkPrepared(id) // it takes no more locks: others may wait for it
	if len(writes) > 0 {
		cmd := &pb.Command{Cmd: &pb.Command_Prepare{Prepare: &pb.PrepareCmd{Txn: meta, Writes: writes, LeaseStart: l.start}}}
		if err := r.propose(ctx, cmd); err != nil {
			return nil, err
		}
	}
	if cur, _ := r.leader(); cur != l {
		return nil, ErrLocksLost
	}
	mv, mr, err := r.maxVersionOf(writes)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	highest := l.highest
	l.mu.Unlock()
	return &pb.PrepareResponse{
		Lease:              &pb.Lease{Holder: r.self, Start: l.start, End: l.end.Load()},
		HighestEpoch:       highest,
		MaxVersion:         &pb.VersionID{Epoch: mv.Epoch, Counter: mv.Counter},
		MaxRegionalVersion: &pb.VersionID{Epoch: mr.Epoch, Counter: mr.Counter},
	}, nil
}

// release drops txn's locks after its outcome is durable, raising the highest
// epoch to the transaction's (invariant 5) when it committed.
func (l *leadership) release(txnID []byte, committedEpoch uint64) {
	var id locktable.TxnID
	copy(id[:], txnID)
	l.mu.Lock()
	l.highest = max(l.highest, committedEpoch)
	delete(l.txns, string(txnID))
	l.mu.Unlock()
	l.locks.ReleaseAll(id)
}

// Commit applies a committed transaction's prepared writes at version (and,
// if set, at the local-epoch version regional) and releases its locks. The
// decision is already durable in the transaction state store, so a replica
// that is not the leader can ignore this: the next leader resolves the
// prepared record.
func (r *Replica) Commit(ctx context.Context, txnID []byte, version, regional *pb.VersionID) error {
	cmd := &pb.Command{Cmd: &pb.Command_Commit{Commit: &pb.CommitCmd{TxnId: txnID, Version: version, RegionalVersion: regional}}}
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
	r.mu.Lock()
	l := r.lead
	r.mu.Unlock()
	mayBePrepared := r.sm.IsPrepared(txnID)
	if l != nil {
		l.mu.Lock()
		if t, ok := l.txns[string(txnID)]; ok && t.state == txnPrepared {
			mayBePrepared = true
		}
		l.mu.Unlock()
	}
	if mayBePrepared {
		if err := r.propose(ctx, cmd); err != nil {
			return err
		}
	}
	if l != nil {
		l.release(txnID, committedEpoch)
	}
	return nil
}

// CommitOnePhase commits a transaction whose only participant is this range
// (DESIGN.md §4): with every lock held, read the local epoch, validate the
// lease, version the writes, apply them through Raft, release.
func (r *Replica) CommitOnePhase(ctx context.Context, meta *pb.TxnMeta, writes []*pb.Write, minEpoch uint64, lockCount uint32, incarnation uint64) (*pb.VersionID, error) {
	l, err := r.leader()
	if err != nil {
		return nil, err
	}
	if _, err := r.commitStart(l, meta, writes, lockCount, incarnation, txnCommitting); err != nil {
		return nil, err
	}
	// Read the epochs only now that every lock is held (invariant 4); the
	// local epoch validates the lease, the global one versions the writes.
	// A read-only transaction writes no version: the lease check is all it
	// needs, and it skips the global epoch (except in the naive baseline,
	// which reads it at every commit).
	globalSrc := r.global
	naive := meta.GetCommitMode() == pb.CommitMode_COMMIT_MODE_NAIVE && r.service != nil && r.global != nil
	switch {
	case naive:
		globalSrc = r.service // the baseline: the service itself, across the WAN
	case len(writes) == 0:
		globalSrc = nil
	}
	epochs, err := epoch.ReadAll(ctx, r.epochs, globalSrc)
	e, g := epochs[0], epochs[1]
	if r.global == nil && len(writes) > 0 {
		g = e // regional-only: local-epoch versions
	}
	if err != nil {
		l.release(meta.GetId(), 0) // nothing proposed: the transaction aborts
		return nil, fmt.Errorf("%w: reading epochs: %v", ErrLeaseValidation, err)
	}
	r.observeEpoch(e)
	l.mu.Lock()
	epoch := max(g, l.highest, minEpoch)
	l.mu.Unlock()
	// With local-epoch versions the version's epoch must lie in the lease too
	// (a later leaseholder's writers could otherwise be ordered before it).
	if end := l.end.Load(); e < l.start || e > end || (r.global == nil && epoch > end) {
		l.release(meta.GetId(), 0)
		return nil, fmt.Errorf("%w: epoch %d (version epoch %d), lease [%d, %d]", ErrLeaseValidation, e, epoch, l.start, end)
	}
	for r.global != nil && len(writes) > 0 && IsQuiet(epoch, r.cfg.QuietEpochs) {
		// Quiet epoch (paper §5.3.1): wait, locks held, for the next one.
		if epoch, err = r.nextAfter(ctx, epoch); err != nil {
			l.release(meta.GetId(), 0)
			return nil, fmt.Errorf("%w: waiting out quiet epoch: %v", ErrLeaseValidation, err)
		}
	}
	mv, mr, err := r.maxVersionOf(writes)
	if err != nil {
		l.release(meta.GetId(), 0)
		return nil, err
	}
	ver := ChooseVersion(epoch, mv)
	var regional *pb.VersionID
	if r.global != nil {
		regional = ChooseVersion(e, mr)
	}
	if len(writes) > 0 {
		cmd := &pb.Command{Cmd: &pb.Command_OnePhase{OnePhase: &pb.OnePhaseCmd{TxnId: meta.GetId(), Writes: writes, Version: ver,
			LeaseStart: l.start, RegionalVersion: regional}}}
		if err := r.propose(ctx, cmd); err != nil {
			if errors.Is(err, ErrLocksLost) { // rejected at apply: nothing written
				l.release(meta.GetId(), 0)
			}
			// Otherwise the entry may still apply; the locks stay with this
			// leadership until it ends.
			return nil, err
		}
	}
	if meta.GetCommitMode() == pb.CommitMode_COMMIT_MODE_COMMIT_WAIT && len(writes) > 0 {
		// The baseline: wait out a clock uncertainty, locks held.
		time.Sleep(time.Duration(meta.GetCommitWaitUs()) * time.Microsecond)
	}
	l.release(meta.GetId(), ver.GetEpoch())
	return ver, nil
}

// IsQuiet reports whether global epoch e is quiet: a multiple of k > 0, at
// which no transaction commits (paper §5.3.1).
func IsQuiet(e, k uint64) bool { return k > 0 && e%k == 0 }

// nextAfter waits until the region's publisher shows an epoch above e and
// returns it.
func (r *Replica) nextAfter(ctx context.Context, e uint64) (uint64, error) {
	return epoch.WaitAtLeast(ctx, r.global, e+1, time.Millisecond)
}

// ChooseVersion returns the version id of a transaction with epoch `epoch` whose
// write set's newest existing version is newest (DESIGN.md §6): <epoch, 1>, or
// the next counter if the write set already has a version in that epoch.
func ChooseVersion(epoch uint64, newest storage.VersionID) *pb.VersionID {
	v := storage.VersionID{Epoch: epoch, Counter: 1}
	if !newest.Less(v) {
		v = newest.Next()
	}
	return &pb.VersionID{Epoch: v.Epoch, Counter: v.Counter}
}

// resolveOrphans ends transactions whose coordinator went silent for
// OrphanAfter (no operation, no heartbeat, no lock wait under way): active
// ones hold only locks and are dropped; prepared ones — and
// prepared records the leader has no transaction for — are decided through the
// transaction state store (abort unless commit was recorded first).
func (r *Replica) resolveOrphans(l *leadership) {
	now := time.Now()
	var idle [][]byte
	var orphans []*leaderTxn
	l.mu.Lock()
	for id, t := range l.txns {
		if now.Sub(t.lastActive) < r.cfg.OrphanAfter || t.resolving || t.waiting > 0 {
			continue
		}
		switch t.state {
		case txnActive:
			idle = append(idle, []byte(id))
		case txnPrepared:
			t.resolving = true
			orphans = append(orphans, t)
		}
	}
	for _, rec := range r.sm.Prepared() {
		if _, ok := l.txns[string(rec.GetTxn().GetId())]; !ok {
			t := &leaderTxn{meta: rec.GetTxn(), state: txnPrepared, resolving: true, incarnation: rand.Uint64()}
			l.txns[string(rec.GetTxn().GetId())] = t
			orphans = append(orphans, t)
		}
	}
	l.mu.Unlock()
	for _, id := range idle {
		l.release(id, 0)
	}
	for _, t := range orphans {
		r.wg.Add(1)
		go r.resolve(l, t)
	}
}

func (r *Replica) resolve(l *leadership, t *leaderTxn) {
	defer r.wg.Done()
	defer func() {
		l.mu.Lock()
		t.resolving = false
		t.lastActive = time.Now()
		l.mu.Unlock()
	}()
	ctx, cancel := context.WithTimeout(l.ctx, 5*time.Second)
	defer cancel()
	d := r.deciders(t.meta.GetTxnStateGroup())
	if d == nil {
		slog.Error("no transaction state store for orphan", "range", r.desc.ID, "group", t.meta.GetTxnStateGroup())
		return
	}
	rec, err := d.Decide(ctx, &txnstatepb.Record{TxnId: t.meta.GetId(), Outcome: txnstatepb.Outcome_OUTCOME_ABORTED})
	if err != nil {
		return // retried at a later tick
	}
	if rec.GetOutcome() == txnstatepb.Outcome_OUTCOME_COMMITTED {
		v := rec.GetVersion()
		var regional *pb.VersionID
		for _, p := range rec.GetParticipants() {
			if rv := p.GetRegionalVersion(); p.GetRangeId() == r.desc.ID && rv != nil {
				regional = &pb.VersionID{Epoch: rv.GetEpoch(), Counter: rv.GetCounter()}
			}
		}
		err = r.Commit(ctx, t.meta.GetId(), &pb.VersionID{Epoch: v.GetEpoch(), Counter: v.GetCounter()}, regional)
	} else {
		err = r.Abort(ctx, t.meta.GetId())
	}
	if err != nil {
		slog.Debug("resolving an orphaned transaction", "range", r.desc.ID, "err", err)
		return
	}
	slog.Info("resolved orphaned transaction", "range", r.desc.ID, "outcome", rec.GetOutcome().String())
}

// ErrSnapshotEpoch: the epoch a snapshot reads at did not arrive in time (the
// region's publisher lags or refuses).
var ErrSnapshotEpoch = errors.New("rangeserver: snapshot epoch not reached")

// snapshotPoll is how often a snapshot read re-reads the epoch it waits for;
// snapshotEpochWait bounds that wait (the caller may retry).
const (
	snapshotPoll      = time.Millisecond
	snapshotEpochWait = 5 * time.Second
)

// SnapshotRead serves one read of a snapshot transaction (paper §5.2,
// Algorithm 1; DESIGN.md §5). It waits until the region's publisher (for a
// regional read: its local epoch) shows at least req.At, so that every
// transaction that could still commit below <At, 0> already holds its locks;
// reads l_R (once per snapshot and region: the caller passes it back); refuses
// if l_R is past this leader's lease; waits until the transactions holding an
// exclusive lock on the span have finished; and reads the newest versions
// below <At, 0>. It takes no lock, so it never delays a writer.
//
// Errors: ErrKeyOutsideRange, ErrNotLeaseholder (retry at another replica),
// ErrSnapshotEpoch, or ctx's error.
func (r *Replica) SnapshotRead(ctx context.Context, req *pb.SnapshotReadRequest) (*pb.SnapshotReadResponse, error) {
	start, end := req.GetStart(), req.GetEnd()
	if len(end) == 0 {
		end = nil
	}
	if !req.GetScan() {
		if err := r.checkKey(start); err != nil {
			return nil, err
		}
	} else {
		if bytes.Compare(start, r.desc.Start) < 0 {
			start = r.desc.Start
		}
		if r.desc.End != nil && (end == nil || bytes.Compare(end, r.desc.End) > 0) {
			end = r.desc.End
		}
		if end != nil && bytes.Compare(start, end) >= 0 {
			return &pb.SnapshotReadResponse{LocalEpoch: req.GetLocalEpoch()}, nil
		}
	}
	if _, err := r.leader(); err != nil {
		return nil, err
	}
	src, ks := r.global, Versions
	switch {
	case r.global == nil: // regional-only: the data carries local epochs
		src = r.epochs
	case req.GetRegional():
		src, ks = r.epochs, RegionalVersions
	}
	began := time.Now()
	ectx, ecancel := context.WithTimeout(ctx, snapshotEpochWait)
	got, err := epoch.WaitAtLeast(ectx, src, req.GetAt(), snapshotPoll)
	ecancel()
	if err != nil {
		return nil, fmt.Errorf("%w: %d: %v", ErrSnapshotEpoch, req.GetAt(), err)
	}
	lR := req.GetLocalEpoch()
	if lR == 0 {
		if src == r.epochs {
			lR = got
		} else if lR, err = r.epochs.Read(ctx); err != nil {
			return nil, err
		}
	}
	resp := &pb.SnapshotReadResponse{LocalEpoch: lR, EpochWaitUs: uint64(time.Since(began).Microseconds())}
	r.observeEpoch(lR)
	l, err := r.leader()
	if err != nil {
		return nil, err
	}
	if end := l.end.Load(); lR > end {
		// A later lease may hold locks this leader does not know of.
		return nil, fmt.Errorf("%w: the snapshot's local epoch %d is past the lease's end %d", ErrNotLeaseholder, lR, end)
	}
	span := locktable.Point(start)
	if req.GetScan() {
		span = locktable.Span{Key: start, EndKey: end}
		if end == nil {
			span.EndKey = keyspaceEnd
		}
	}
	began = time.Now()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(l.ctx, cancel)
	defer stop()
	if err := l.locks.WaitNoExclusive(wctx, span); err != nil {
		if ctx.Err() == nil {
			return nil, fmt.Errorf("%w: the lease ended while waiting for locks", ErrNotLeaseholder)
		}
		return nil, err
	}
	resp.LockWaitUs = uint64(time.Since(began).Microseconds())
	if cur, _ := r.leader(); cur != l {
		return nil, fmt.Errorf("%w: the lease ended while waiting for locks", ErrNotLeaseholder)
	}
	below := storage.EpochStart(req.GetAt())
	note := func(v storage.Version, newest storage.VersionID) {
		resp.SnapshotEpoch = max(resp.SnapshotEpoch, v.ID.Epoch)
		resp.LatestEpoch = max(resp.LatestEpoch, newest.Epoch)
	}
	if !req.GetScan() {
		v, ok, newest, err := r.sm.Get(ks, start, below)
		if err != nil {
			return nil, err
		}
		note(v, newest)
		if ok {
			resp.Kvs = []*pb.KeyValue{{Key: v.Key, Value: v.Value}}
		}
		return resp, nil
	}
	limit := int(req.GetLimit())
	err = r.sm.Scan(ks, start, end, below, func(v storage.Version, newest storage.VersionID) bool {
		note(v, newest)
		if v.Live() {
			resp.Kvs = append(resp.Kvs, &pb.KeyValue{Key: v.Key, Value: v.Value})
		}
		return limit == 0 || len(resp.Kvs) < limit
	})
	return resp, err
}
