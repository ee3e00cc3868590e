package rangeserver

import (
	"context"

	"github.com/terroir-db/terroir/internal/epoch"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
)

// Reading a transaction's epochs ahead (issue 17). A one-phase commit reads
// its local and global epochs only once every lock it needs is held
// (invariant 4, DESIGN.md §3.4); a transaction that wrote through Lock has
// held them since its last Lock here, one client round trip before its
// commit arrives. So the leader begins the epoch read as soon as a Lock is
// granted, and the commit uses it if no lock acquisition of the
// transaction began here since the read began: the epochs are then read
// after every lock was held, as the invariant asks, and the commit no
// longer waits a round of epoch reads after its request arrives.
//
// Nothing else changes: the commit still checks its locks (startCommit),
// raises the epoch to the leader's highest (invariant 5, the closes of
// DESIGN.md §13), validates the lease against the local epoch, waits out a
// quiet epoch, and its entry still carries the lease it was proposed under.
// An epoch read earlier is one a commit could have read and then been
// delayed by as much before proposing, which the protocol already allows.
// The read is used only under the home it was begun in (a rehome changes
// the sources) and only for a commit with writes that reads the publisher
// (not the naive baseline, which reads the service). A transaction reads
// ahead at most once per leader's record, at its first granted Lock: one
// that locks more keys, or that commits in two phases, wastes at most that
// one read, which joins a round other reads share.

// readAhead is an epoch read begun after a transaction's lock acquisitions
// here: seq is the transaction's count of acquisitions begun when it began
// (leaderTxn.acquired), home the range's home it read.
type readAhead struct {
	seq     uint64
	home    *Home
	reading epoch.Reading
}

// beginAhead reports whether txnID's record may read ahead now, and the
// record and its count of acquisitions begun: it has not read ahead
// before, it is active, and no acquisition of it is under way. It marks
// the record as having read ahead.
func (tt *txnTable) beginAhead(txnID []byte) (*leaderTxn, uint64, bool) {
	tt.mu.Lock()
	defer tt.mu.Unlock()
	t, ok := tt.txns[string(txnID)]
	if !ok || t.ahead != nil || t.waiting > 0 || t.state != txnActive {
		return nil, 0, false
	}
	t.ahead = &readAhead{} // taken: a second Lock does not read ahead again
	return t, t.acquired, true
}

// setAhead records a, begun for record t, unless t began an acquisition
// meanwhile (the read would not follow every lock). A record that left the
// table meanwhile keeps it to itself: a record recreated for the
// transaction is another.
func (tt *txnTable) setAhead(t *leaderTxn, a *readAhead) {
	tt.mu.Lock()
	defer tt.mu.Unlock()
	if t.acquired == a.seq {
		t.ahead = a
	}
}

// takeAhead returns txnID's read ahead if it still follows every lock
// acquisition of the transaction here and was begun under home, and forgets
// it; nil otherwise.
func (tt *txnTable) takeAhead(txnID []byte, home *Home) epoch.Reading {
	tt.mu.Lock()
	defer tt.mu.Unlock()
	t, ok := tt.txns[string(txnID)]
	if !ok || t.ahead == nil {
		return nil
	}
	a := t.ahead
	t.ahead = &readAhead{} // used: the record does not read ahead again
	if a.reading == nil || a.seq != t.acquired || a.home != home {
		return nil
	}
	return a.reading
}

// readAhead begins, once a Lock of meta's transaction was granted under
// leadership l, the epoch read its one-phase commit would make (see above).
// The read is bounded by the leadership's life and the reader's round
// timeout, not by the Lock's request, which ends first.
func (r *Replica) readAhead(l *leadership, meta *pb.TxnMeta) {
	if meta.GetCommitMode() == pb.CommitMode_COMMIT_MODE_NAIVE {
		return
	}
	t, seq, ok := l.txns.beginAhead(meta.GetId())
	if !ok {
		return
	}
	home := r.home.Load()
	reading := epoch.Begin(l.ctx, home.Local, home.Publisher)
	l.txns.setAhead(t, &readAhead{seq: seq, home: home, reading: reading})
}

// commitEpochs returns the Reading of a one-phase commit's epochs under
// home: the transaction's read ahead when it may use it (ahead: a commit
// whose locks came from earlier Locks, with writes, reading the
// publisher), else a read begun now. A read ahead that fails is read again
// now: it decides nothing.
func (r *Replica) commitEpochs(ctx context.Context, l *leadership, home *Home, txnID []byte, ahead bool, globalSrc EpochSource) epoch.Reading {
	fresh := func() epoch.Reading { return epoch.Begin(ctx, home.Local, globalSrc) }
	if !ahead {
		return fresh()
	}
	early := l.txns.takeAhead(txnID, home)
	if early == nil {
		return fresh()
	}
	return func(wctx context.Context) ([]uint64, error) {
		epochs, err := early(wctx)
		if err != nil {
			return fresh()(wctx)
		}
		if c := r.cfg.EpochsReadAhead; c != nil {
			c.Inc()
		}
		return epochs, nil
	}
}
