package rangeserver

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/terroir-db/terroir/internal/locktable"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
)

// txnTable is what a leader knows, under one lease, of the transactions that
// hold locks at the range: one record per transaction, and the lock table
// holding their locks (DESIGN.md §3.4, §10). It decides nothing by itself
// about time: the leader passes it the clock, and asks it which transactions
// are orphans.
//
// A record's incarnation is random: a record recreated after its transaction
// lost its locks has another, which tells the coordinator its earlier locks
// are gone. Locks are released only by release, after the outcome is durable
// (invariant 4), or when an active transaction is found an orphan.
type txnTable struct {
	locks *locktable.Table
	now   func() time.Time

	mu       sync.Mutex
	txns     map[string]*leaderTxn
	highest  uint64 // DESIGN.md §3.5: highest epoch of a transaction that released a lock
	splitKey []byte // set while a split at it is being proposed: see freeze
	moving   bool   // set while a replica moves: see claimMove
}

// leaderTxn is the leader's record of a transaction holding locks here. Its
// fields are guarded by the table's mu.
type leaderTxn struct {
	meta        *pb.TxnMeta
	incarnation uint64    // random per record: a recreated record has another
	lastActive  time.Time // the coordinator's last operation or heartbeat here
	waiting     int       // lock acquisitions under way: waiting is not silence
	acquired    uint64    // lock acquisitions begun, ever: a read ahead counts only if none began after it (readahead.go)
	ahead       *readAhead
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

// newTxnTable returns an empty table whose highest epoch starts at highest.
func newTxnTable(now func() time.Time, highest uint64) *txnTable {
	return &txnTable{locks: locktable.New(), now: now, txns: map[string]*leaderTxn{}, highest: highest}
}

func lockTxn(m *pb.TxnMeta) locktable.Txn {
	var id locktable.TxnID
	copy(id[:], m.GetId())
	return locktable.Txn{ID: id, Priority: m.GetPriority()}
}

func lockID(txnID []byte) locktable.TxnID {
	var id locktable.TxnID
	copy(id[:], txnID)
	return id
}

// touch returns a transaction's record, marking its coordinator alive now,
// and creates it (with a fresh incarnation) if create is set and there is
// none; without create a missing record is ErrLocksLost.
func (tt *txnTable) touch(meta *pb.TxnMeta, create bool) (*leaderTxn, error) {
	tt.mu.Lock()
	defer tt.mu.Unlock()
	t, ok := tt.txns[string(meta.GetId())]
	if !ok {
		if !create {
			return nil, ErrLocksLost
		}
		t = &leaderTxn{meta: meta, incarnation: rand.Uint64()}
		tt.txns[string(meta.GetId())] = t
	}
	t.lastActive = tt.now()
	return t, nil
}

// acquire takes a lock for meta's transaction, waiting (bounded by the
// context wait returns) under wait-die (or for anyone, with waits:
// locktable.Txn.Waits), and returns the incarnation of the record that
// holds it. wait is called only if the lock is not free at once (most
// are), and its cancel func once the wait is over. While it waits the
// transaction is not an orphan. Errors: ErrConflict (wait-die chose it to
// die) or the wait context's error.
func (tt *txnTable) acquire(meta *pb.TxnMeta, span locktable.Span, mode locktable.Mode, waits bool, wait func() (context.Context, context.CancelFunc)) (uint64, error) {
	t, _ := tt.touch(meta, true)
	tt.mu.Lock()
	t.waiting++
	t.acquired++
	tt.mu.Unlock()
	lt := lockTxn(meta)
	lt.Waits = waits
	err := tt.locks.TryAcquire(lt, span, mode)
	if errors.Is(err, locktable.ErrWouldWait) {
		ctx, cancel := wait()
		err = tt.locks.Acquire(ctx, lt, span, mode)
		cancel()
	}
	tt.mu.Lock()
	t.waiting--
	tt.mu.Unlock()
	if errors.Is(err, locktable.ErrWouldDie) {
		return 0, ErrConflict
	}
	if err != nil {
		return 0, err
	}
	// Touch again: if the record was resolved meanwhile (at another range's
	// request, or by a lease change), this recreates it with a new
	// incarnation, which tells the client its earlier locks are gone, and
	// the new lock is released with it in turn.
	t, _ = tt.touch(meta, true)
	tt.mu.Lock()
	defer tt.mu.Unlock()
	return t.incarnation, nil
}

// heartbeat marks txnID's coordinator alive; lost reports that the table
// holds no record of it under incarnation.
func (tt *txnTable) heartbeat(txnID []byte, incarnation uint64) (lost bool) {
	tt.mu.Lock()
	defer tt.mu.Unlock()
	t, ok := tt.txns[string(txnID)]
	if !ok || t.incarnation != incarnation {
		return true
	}
	t.lastActive = tt.now()
	return false
}

// startCommit verifies, for Prepare or a one-phase commit, that meta's
// transaction still holds every lock it took here — the same incarnation it
// locked under, lockCount distinct spans, every write exclusively locked —
// and moves it to state, so that it is no longer dropped as an orphan: from
// here on only its outcome ends it. Errors wrap ErrLocksLost.
func (tt *txnTable) startCommit(meta *pb.TxnMeta, writes []*pb.Write, lockCount uint32, incarnation uint64, state txnState) error {
	t, err := tt.touch(meta, false)
	if err != nil {
		return err
	}
	id := lockID(meta.GetId())
	tt.mu.Lock()
	defer tt.mu.Unlock()
	if t.incarnation != incarnation {
		return fmt.Errorf("%w: locks taken under another incarnation", ErrLocksLost)
	}
	if tt.splitKey != nil && !tt.allBelow(id, tt.splitKey) {
		return fmt.Errorf("%w: the range is changing shape at %q", ErrLocksLost, tt.splitKey)
	}
	if held := tt.locks.HeldBy(id); held != int(lockCount) {
		return fmt.Errorf("%w: %d of %d locks held", ErrLocksLost, held, lockCount)
	}
	for _, w := range writes {
		if !tt.locks.Holds(id, locktable.Point(w.GetKey()), locktable.Exclusive) {
			return fmt.Errorf("%w: no exclusive lock on %q", ErrLocksLost, w.GetKey())
		}
	}
	if t.state == txnActive {
		t.state = state
	}
	// Prepared or committing in one phase, it takes no more locks: others
	// may wait for it rather than die.
	tt.locks.MarkPrepared(id)
	return nil
}

// relock re-creates, under a new lease, the records and exclusive locks of
// every prepared transaction. Prepared transactions never share a key
// exclusively, so no acquisition can wait (TryAcquire makes sure).
// It returns the keys it could not lock (none, unless the records disagree).
func (tt *txnTable) relock(prepared []*pb.PreparedRecord) (failed [][]byte) {
	now := tt.now()
	tt.mu.Lock()
	defer tt.mu.Unlock()
	for _, rec := range prepared {
		lt := lockTxn(rec.GetTxn())
		for _, w := range rec.GetWrites() {
			if err := tt.locks.TryAcquire(lt, locktable.Point(w.GetKey()), locktable.Exclusive); err != nil {
				failed = append(failed, w.GetKey())
			}
		}
		tt.locks.MarkPrepared(lt.ID)
		tt.txns[string(rec.GetTxn().GetId())] = &leaderTxn{meta: rec.GetTxn(), lastActive: now, state: txnPrepared, incarnation: rand.Uint64()}
	}
	return failed
}

// mayBePrepared reports whether txnID prepared here under this lease.
func (tt *txnTable) mayBePrepared(txnID []byte) bool {
	tt.mu.Lock()
	defer tt.mu.Unlock()
	t, ok := tt.txns[string(txnID)]
	return ok && t.state == txnPrepared
}

// holds reports whether txnID has a record here.
func (tt *txnTable) holds(txnID []byte) bool {
	tt.mu.Lock()
	defer tt.mu.Unlock()
	_, ok := tt.txns[string(txnID)]
	return ok
}

// highestEpoch returns the highest global epoch of a transaction that
// released a lock here (DESIGN.md §3.5).
func (tt *txnTable) highestEpoch() uint64 {
	tt.mu.Lock()
	defer tt.mu.Unlock()
	return tt.highest
}

// raise raises the highest epoch to e (a merge brings the subsumed range's).
func (tt *txnTable) raise(e uint64) {
	tt.mu.Lock()
	defer tt.mu.Unlock()
	tt.highest = max(tt.highest, e)
}

// raiseAndPending raises the highest epoch to e and returns, in the same
// step, the transactions prepared or committing here: those that may have
// read the highest epoch before it was raised (a close waits for them,
// DESIGN.md §13).
func (tt *txnTable) raiseAndPending(e uint64) [][]byte {
	tt.mu.Lock()
	defer tt.mu.Unlock()
	tt.highest = max(tt.highest, e)
	var out [][]byte
	for _, t := range tt.txns {
		if t.state != txnActive {
			out = append(out, t.meta.GetId())
		}
	}
	return out
}

// release drops txn's record and locks after its outcome is durable, raising
// the highest epoch to the transaction's (invariant 5) when it committed.
func (tt *txnTable) release(txnID []byte, committedEpoch uint64) {
	tt.mu.Lock()
	tt.highest = max(tt.highest, committedEpoch)
	delete(tt.txns, string(txnID))
	tt.mu.Unlock()
	tt.locks.ReleaseAll(lockID(txnID))
}

// orphans picks the transactions whose coordinator has been silent for bound
// (no operation, no heartbeat, no lock wait under way), and not already being
// resolved: active ones (idle), which hold only locks and can simply be
// dropped, and prepared ones (undecided), which must be decided through the
// transaction state store. A prepared record with no transaction here (left
// by an earlier lease) is undecided at once. Undecided records are marked
// resolving until resolved is called.
func (tt *txnTable) orphans(bound time.Duration, prepared []*pb.PreparedRecord) (idle [][]byte, undecided []*leaderTxn) {
	now := tt.now()
	tt.mu.Lock()
	defer tt.mu.Unlock()
	for id, t := range tt.txns {
		if now.Sub(t.lastActive) < bound || t.resolving || t.waiting > 0 {
			continue
		}
		switch t.state {
		case txnActive:
			idle = append(idle, []byte(id))
		case txnPrepared:
			t.resolving = true
			undecided = append(undecided, t)
		}
	}
	for _, rec := range prepared {
		if _, ok := tt.txns[string(rec.GetTxn().GetId())]; !ok {
			t := &leaderTxn{meta: rec.GetTxn(), state: txnPrepared, resolving: true, incarnation: rand.Uint64(), lastActive: now}
			tt.txns[string(rec.GetTxn().GetId())] = t
			undecided = append(undecided, t)
		}
	}
	return idle, undecided
}

// resolved ends an attempt to resolve t (successful or not); an unresolved
// t is tried again once it has been silent for the bound once more.
func (tt *txnTable) resolved(t *leaderTxn) {
	tt.mu.Lock()
	defer tt.mu.Unlock()
	t.resolving = false
	t.lastActive = tt.now()
}

// allBelow reports whether every lock txn holds lies below key.
func (tt *txnTable) allBelow(id locktable.TxnID, key []byte) bool {
	for _, sp := range tt.locks.SpansOf(id) {
		if !sp.Inside(nil, key) {
			return false
		}
	}
	return true
}

// freeze starts a split at key, or a subsume with key the range's start
// (DESIGN.md §11): from now on no transaction holding a lock at or above key
// may start to commit here, so that none is prepared or committing with
// locks the range that takes over those keys will not know of.
// It returns a function that ends the freeze, or ok false if another split
// or subsume holds the freeze: one change of shape at a time.
func (tt *txnTable) freeze(key []byte) (thaw func(), ok bool) {
	tt.mu.Lock()
	if tt.splitKey != nil || tt.moving {
		tt.mu.Unlock()
		return nil, false
	}
	tt.splitKey = key
	tt.mu.Unlock()
	return func() {
		tt.mu.Lock()
		tt.splitKey = nil
		tt.mu.Unlock()
	}, true
}

// claimMove marks a replica move under way, so that no split or merge
// (freeze) starts until release; false if one is under way, or another move.
// Unlike freeze it stops no commit.
func (tt *txnTable) claimMove() (release func(), ok bool) {
	tt.mu.Lock()
	defer tt.mu.Unlock()
	if tt.splitKey != nil || tt.moving {
		return nil, false
	}
	tt.moving = true
	return func() {
		tt.mu.Lock()
		tt.moving = false
		tt.mu.Unlock()
	}, true
}

// moveClaimed reports whether a replica move, non-voter change, rehome or
// merge holds the claim (claimMove): a lease transfer waits until none
// does.
func (tt *txnTable) moveClaimed() bool {
	tt.mu.Lock()
	defer tt.mu.Unlock()
	return tt.moving
}

// committingAbove reports whether a prepared or committing transaction holds
// a lock at or above key: a split there waits until none does.
func (tt *txnTable) committingAbove(key []byte) bool {
	tt.mu.Lock()
	defer tt.mu.Unlock()
	for id, t := range tt.txns {
		if t.state != txnActive && !tt.allBelow(lockID([]byte(id)), key) {
			return true
		}
	}
	return false
}

// settling reports whether a transaction is prepared or committing here:
// a lease transfer waits until none is.
func (tt *txnTable) settling() bool {
	tt.mu.Lock()
	defer tt.mu.Unlock()
	for _, t := range tt.txns {
		if t.state != txnActive {
			return true
		}
	}
	return false
}

// idle reports whether no transaction holds locks or a record here.
func (tt *txnTable) idle() bool {
	tt.mu.Lock()
	defer tt.mu.Unlock()
	return len(tt.txns) == 0
}

// handedTxn is a transaction's record and its locks at or above a split key,
// as the left-hand range's leader hands them to the right-hand range's
// (DESIGN.md §11).
type handedTxn struct {
	meta        *pb.TxnMeta
	incarnation uint64
	state       txnState
	locks       []locktable.Grant
}

// handOff takes every lock at or above key out of the table (cutting range
// locks that straddle it) with the records of the transactions holding
// them, for the right-hand range of a split at key: none is released, and
// each transaction keeps its incarnation. Every record stays here too: the
// transaction may lock keys below key again under the same incarnation.
func (tt *txnTable) handOff(key []byte) []handedTxn {
	grants := tt.locks.SplitOff(key)
	tt.mu.Lock()
	defer tt.mu.Unlock()
	byTxn := map[locktable.TxnID]*handedTxn{}
	var out []*handedTxn
	for _, g := range grants {
		h := byTxn[g.Txn.ID]
		if h == nil {
			t := tt.txns[string(g.Txn.ID[:])]
			if t == nil || t.state != txnActive {
				// No record, or one committing: the split waited for those,
				// so only one whose commit's outcome is unknown can be
				// here; its locks are not handed over, and its commit,
				// which names keys the range no longer holds, is refused.
				continue
			}
			h = &handedTxn{meta: t.meta, incarnation: t.incarnation, state: t.state}
			byTxn[g.Txn.ID] = h
			out = append(out, h)
		}
		h.locks = append(h.locks, g)
	}
	handed := make([]handedTxn, 0, len(out))
	for _, h := range out {
		handed = append(handed, *h)
	}
	return handed
}

// adopt installs the records and locks a split's left-hand leader handed
// over (handOff), keeping each transaction's incarnation; callers do so
// before the table serves.
func (tt *txnTable) adopt(handed []handedTxn) {
	now := tt.now()
	tt.mu.Lock()
	defer tt.mu.Unlock()
	for _, h := range handed {
		tt.locks.Install(h.locks)
		if h.state != txnActive {
			tt.locks.MarkPrepared(lockID(h.meta.GetId()))
		}
		tt.txns[string(h.meta.GetId())] = &leaderTxn{meta: h.meta, incarnation: h.incarnation, lastActive: now, state: h.state}
	}
}

// dropActive drops every active transaction, releasing its locks: a
// subsume made the range's state final, and the merged range will not know
// these locks, so the transactions must not commit (their next step or
// Prepare finds their locks gone). Prepared ones stay: the merge carries
// their records. It returns how many it dropped.
func (tt *txnTable) dropActive() int {
	tt.mu.Lock()
	var drop [][]byte
	for id, t := range tt.txns {
		if t.state == txnActive {
			drop = append(drop, []byte(id))
		}
	}
	tt.mu.Unlock()
	for _, id := range drop {
		tt.release(id, 0)
	}
	return len(drop)
}
