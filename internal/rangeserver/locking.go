package rangeserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/terroir-db/terroir/internal/locktable"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/storage"
)

// maxWaitsWait bounds how long a request marked locktable.Txn.Waits waits
// for its lock before it dies (ErrConflict).
const maxWaitsWait = time.Second

// errWaitsBound is the cause of a Txn.Waits request's wait ending at its
// bound.
var errWaitsBound = errors.New("rangeserver: lock wait bound reached")

// waitsBound is how long a Txn.Waits request under ctx waits for its lock:
// maxWaitsWait, or half the time ctx has left if that is less, so that the
// request answers well before its deadline.
func waitsBound(ctx context.Context) time.Duration {
	d := maxWaitsWait
	if dl, ok := ctx.Deadline(); ok {
		d = min(d, time.Until(dl)/2)
	}
	return d
}

// lock takes a lock for txn, bounded by ctx and by the leadership's life, and
// returns the incarnation of the transaction's record that holds it. waits
// is locktable.Txn.Waits: the transaction holds no other lock here and will
// take no other; its wait is bounded by waitsBound, past which it fails
// with ErrConflict.
func (r *Replica) lock(ctx context.Context, l *leadership, meta *pb.TxnMeta, span locktable.Span, mode locktable.Mode, waits bool) (uint64, error) {
	// The contexts that bound a wait are made only for a lock that must
	// wait: made for every lock, they cost about 1% of the CPU of a
	// process of three nodes under YCSB-A (issue 17).
	var waited context.Context // the context the acquisition waited under, if it waited
	wait := func() (context.Context, context.CancelFunc) {
		wctx, cancel := context.WithCancel(ctx)
		stopWait := context.CancelFunc(func() {})
		if waits {
			// A request that may wait for anyone waits a bounded time, then
			// dies as wait-die would have: a definite abort its client retries,
			// never the request's own deadline, which would leave a write's
			// outcome unknown.
			wctx, stopWait = context.WithTimeoutCause(wctx, waitsBound(ctx), errWaitsBound)
		}
		stop := context.AfterFunc(l.ctx, cancel)
		waited = wctx
		return wctx, func() {
			stop()
			stopWait()
			cancel()
		}
	}
	began := time.Now()
	inc, err := l.txns.acquire(meta, span, mode, waits, wait)
	if r.cfg.LockWait != nil {
		r.cfg.LockWait.Observe(time.Since(began).Seconds())
	}
	switch {
	case errors.Is(err, ErrConflict):
		return 0, err
	case err != nil && ctx.Err() == nil && l.ctx.Err() == nil && waited != nil && errors.Is(context.Cause(waited), errWaitsBound):
		return 0, fmt.Errorf("%w: waited %v for a lock", ErrConflict, time.Since(began).Round(time.Millisecond))
	case err != nil && l.ctx.Err() != nil:
		return 0, ErrLocksLost
	case err != nil:
		return 0, err
	}
	if cur, _ := r.leader(); cur != l {
		return 0, ErrLocksLost // the lock is in a table that no longer counts
	}
	d := r.sm.Descriptor()
	var end []byte
	if len(d.GetEndKey()) > 0 {
		end = d.GetEndKey()
	}
	if d.GetSubsumed() || !span.Inside(d.GetStartKey(), end) {
		// A split applied while the lock was awaited: the lock is the
		// right-hand range's to give, so the transaction's locks here go.
		l.txns.release(meta.GetId(), 0)
		return 0, fmt.Errorf("%w: range %d split while the lock was awaited", ErrLocksLost, r.id)
	}
	return inc, nil
}

// Heartbeat records that txn's coordinator is alive (DESIGN.md §10). lost is
// true when this leader holds no locks of txn under incarnation: the
// transaction can no longer commit. Errors: ErrNotLeaseholder,
// ErrLeaseNotActive, a *MismatchError (the range changed shape since
// generation: the coordinator learns where the locks went; it is alive here
// all the same).
func (r *Replica) Heartbeat(txnID []byte, incarnation, generation uint64) (lost bool, err error) {
	l, err := r.leader()
	if err != nil {
		return false, err
	}
	if err := r.checkGeneration(generation); err != nil {
		l.txns.heartbeat(txnID, incarnation)
		return false, err
	}
	return l.txns.heartbeat(txnID, incarnation), nil
}

// Get takes a shared lock on key for txn and returns its newest committed value
// and the incarnation of the transaction's record here.
func (r *Replica) Get(ctx context.Context, meta *pb.TxnMeta, key []byte) (*pb.GetResponse, error) {
	if err := r.checkKey(key); err != nil {
		return nil, err
	}
	r.load.record(key)
	l, err := r.leader()
	if err != nil {
		return nil, err
	}
	inc, err := r.lock(ctx, l, meta, locktable.Point(key), locktable.Shared, false)
	if err != nil {
		return nil, err
	}
	v, ok, _, err := r.sm.Get(Versions, key, maxVersion)
	if err != nil {
		return nil, err
	}
	return &pb.GetResponse{Found: ok, Value: v.Value, Incarnation: inc}, nil
}

// Scan takes a shared key-range lock on [start, end) (a nil end: to the end of
// the key space), which must lie in the range (else a *MismatchError), so no
// phantom can appear in it, and returns up to limit (0: all) newest committed
// values.
func (r *Replica) Scan(ctx context.Context, meta *pb.TxnMeta, start, end []byte, limit int) (*pb.ScanResponse, error) {
	if err := r.checkSpan(start, end); err != nil {
		return nil, err
	}
	r.load.record(start)
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
	inc, err := r.lock(ctx, l, meta, span, locktable.Shared, false)
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
	r.load.record(key)
	l, err := r.leader()
	if err != nil {
		return 0, err
	}
	inc, err := r.lock(ctx, l, meta, locktable.Point(key), locktable.Exclusive, false)
	if err == nil {
		r.readAhead(l, meta) // the commit's epochs, should it come next (readahead.go)
	}
	return inc, err
}

// takeLocks serves a transaction whose whole body came in one request
// (OnePhaseRequest.take_locks, issue 17): it takes an exclusive lock on each
// key written and a shared one on each other key read, then reads the read
// keys, all before the commit reads any epoch (invariant 4). It returns the
// values in the order of reads, the number of distinct spans locked and the
// incarnation they were taken under; on an error it releases whatever it
// took. Errors: a *MismatchError (a key outside the range), ErrConflict
// (wait-die), ErrLocksLost, ctx's.
func (r *Replica) takeLocks(ctx context.Context, l *leadership, meta *pb.TxnMeta, reads [][]byte, writes []*pb.Write) (values []*pb.ReadValue, count uint32, inc uint64, err error) {
	modes := make(map[string]locktable.Mode, len(reads)+len(writes))
	for _, w := range writes {
		modes[string(w.GetKey())] = locktable.Exclusive
	}
	for _, k := range reads {
		if err := r.checkKey(k); err != nil {
			return nil, 0, 0, err
		}
		if _, ok := modes[string(k)]; !ok {
			modes[string(k)] = locktable.Shared
		}
	}
	defer func() {
		if err != nil {
			l.txns.release(meta.GetId(), 0)
		}
	}()
	// A transaction of one key that locked nothing here before holds
	// nothing while it waits: it may wait for anyone rather than die
	// (locktable.Txn.Waits). Clients send each attempt under a fresh ID.
	waits := len(modes) == 1 && l.txns.locks.HeldBy(lockID(meta.GetId())) == 0
	for k, mode := range modes {
		key := []byte(k)
		r.load.record(key)
		got, err := r.lock(ctx, l, meta, locktable.Point(key), mode, waits)
		if err != nil {
			return nil, 0, 0, err
		}
		if inc != 0 && got != inc {
			return nil, 0, 0, fmt.Errorf("%w: the transaction's record was resolved while it locked", ErrLocksLost)
		}
		inc = got
	}
	values = make([]*pb.ReadValue, 0, len(reads))
	for _, k := range reads {
		v, ok, _, err := r.sm.Get(Versions, k, maxVersion)
		if err != nil {
			return nil, 0, 0, err
		}
		values = append(values, &pb.ReadValue{Found: ok, Value: v.Value})
	}
	return values, uint32(len(modes)), inc, nil
}
