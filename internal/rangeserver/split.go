package rangeserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/transport"
)

// Errors of AdminSplit; each leaves the range as it was.
var (
	// ErrSplitKey: the split key is empty or already a boundary of the range.
	ErrSplitKey = errors.New("rangeserver: bad split key")
	// ErrSplitBusy: transactions holding locks above the split key kept
	// committing for splitQuiesce; retry later.
	ErrSplitBusy = errors.New("rangeserver: transactions above the split key did not finish in time")
	// ErrSplitRaced: the range changed (another split, a lease change) before
	// the split applied; retry against its current descriptor.
	ErrSplitRaced = errors.New("rangeserver: the range changed before the split applied")
)

// splitQuiesce bounds the wait for prepared or committing transactions with
// locks above a split key to finish.
const splitQuiesce = 5 * time.Second

// AdminSplit splits the range at key (DESIGN.md §11), on its leader: the
// range keeps [start, key) and a new range on the same replicas takes
// [key, end) with the same lease, the prepared records of its keys, the
// highest epoch (invariant 5), and the locks at or above key with their
// transactions' records and incarnations, so transactions in flight across
// the split go on. It first stops transactions with locks at or above key
// from starting to commit and waits until none is prepared or committing.
// If the right-hand range comes to lead on another node than the left's
// leader, the handed locks are lost there, and their transactions find out
// (they abort: no lock is ever lost silently). It returns both new
// descriptors.
//
// Errors: ErrNotLeaseholder / ErrLeaseNotActive (retry at the leader),
// ErrSplitKey (empty, or already a boundary), a *MismatchError (key outside
// the range), ErrSplitBusy, ErrSplitRaced, or ctx's error.
//
// An operator's split (this call) is sticky: automatic merges keep its
// boundary.
func (r *Replica) AdminSplit(ctx context.Context, key []byte) (left, right *pb.RangeDescriptor, err error) {
	return r.split(ctx, key, true)
}

// split is AdminSplit; sticky marks the right-hand descriptor (see
// pb.RangeDescriptor.sticky).
func (r *Replica) split(ctx context.Context, key []byte, sticky bool) (left, right *pb.RangeDescriptor, err error) {
	if len(key) == 0 {
		return nil, nil, fmt.Errorf("%w: empty key", ErrSplitKey)
	}
	l, err := r.leader()
	if err != nil {
		return nil, nil, err
	}
	d := r.sm.Descriptor()
	if bytes.Equal(key, d.GetStartKey()) {
		return nil, nil, fmt.Errorf("%w: %q is already the start of range %d", ErrSplitKey, key, d.GetRangeId())
	}
	if err := r.checkKey(key); err != nil {
		return nil, nil, err
	}
	if r.home.Load().NewRangeID == nil {
		return nil, nil, fmt.Errorf("%w: range %d has no directory to allocate a range ID", ErrSplitBusy, d.GetRangeId())
	}
	rightID, err := r.home.Load().NewRangeID(ctx) // before the freeze: it is a round trip
	if err != nil {
		return nil, nil, fmt.Errorf("%w: allocating a range ID: %v", ErrSplitBusy, err)
	}
	thaw, ok := l.txns.freeze(key)
	if !ok {
		return nil, nil, fmt.Errorf("%w: range %d is already changing shape", ErrSplitBusy, d.GetRangeId())
	}
	defer thaw()
	if err := r.quiesce(ctx, l, key); err != nil {
		return nil, nil, err
	}
	cmd := &pb.Command{Cmd: &pb.Command_Split{Split: &pb.SplitCmd{SplitKey: key, RightRangeId: rightID, Generation: d.GetGeneration(), Sticky: sticky}}}
	pctx, pcancel := context.WithTimeout(context.WithoutCancel(ctx), proposeTimeout)
	defer pcancel()
	res, err := r.group.Propose(pctx, EncodeCommand(cmd))
	if err != nil {
		return nil, nil, err
	}
	a, ok := res.(Applied)
	if !ok || a.Split == nil {
		return nil, nil, fmt.Errorf("%w: range %d at %q", ErrSplitRaced, d.GetRangeId(), key)
	}
	return a.Split.Left, a.Split.Right, nil
}

// quiesce waits, up to splitQuiesce, until no transaction holding a lock at
// or above key is prepared or committing (the caller froze them: see
// txnTable.freeze). Errors: ErrSplitBusy, or ctx's error.
func (r *Replica) quiesce(ctx context.Context, l *leadership, key []byte) error {
	wctx, cancel := context.WithTimeout(ctx, splitQuiesce)
	defer cancel()
	for l.txns.committingAbove(key) {
		if !transport.SleepCtx(wctx, time.Millisecond) {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("%w: range %d at %q", ErrSplitBusy, r.id, key)
		}
	}
	return nil
}

// onSplit runs on every replica once a split of this range is durable: the
// leader takes the locks the right-hand range now owns out of its table,
// with their transactions' records, for the right-hand range's replica on
// this node (HandOver).
func (r *Replica) onSplit(s Split) {
	r.mu.Lock()
	l := r.lead
	r.mu.Unlock()
	handed := 0
	if l != nil {
		// Hand the locks at or above the split key, with their records, to
		// the right-hand range's replica on this node (the node passes them
		// on), which leads under the same lease.
		in := Inheritance{leaseStart: l.start, highest: l.txns.highestEpoch(), txns: l.txns.handOff(s.Right.GetStartKey()), set: true}
		handed = len(in.txns)
		r.mu.Lock()
		if r.handoffs == nil {
			r.handoffs = map[uint64]Inheritance{}
		}
		r.handoffs[s.Right.GetRangeId()] = in
		r.mu.Unlock()
	}
	r.reshaped.Store(r.cfg.Clock.Now().UnixNano())
	r.load.reset() // its samples may lie in the right half
	slog.Info("range split", "range", r.id, "right", s.Right.GetRangeId(), "at", string(s.Right.GetStartKey()),
		"generation", s.Left.GetGeneration(), "handed_txns", handed)
}

// Automatic splits (DESIGN.md §11).
const (
	// splitCheck is how often a leader checks its size and load.
	splitCheck = time.Second
	// loadSplitAfter is how long a range must stay over SplitQPS, with its
	// requests sampled, before it splits by load.
	loadSplitAfter = 3 * time.Second
)

// splitQueue is a leader's automatic splitting: at most one split at a time.
type splitQueue struct {
	lastCheck time.Time   // read and written by the tick loop only
	lastMerge time.Time   // likewise, for maybeMerge
	running   atomic.Bool // a split or merge is under way

	// The last middle key found for a split by size (by the split's
	// goroutine, one at a time): reused while the range's generation
	// holds, so neither a split that fails (busy) nor a range without a
	// middle (one key's long history) reads the whole range every check.
	midGen  uint64 // the generation it was found at
	midSize uint64 // the range's size then
	midKey  []byte // nil: the range had no middle
}

// cachedMid returns the middle key found at generation gen, if one was and
// is still usable at size (a range without a middle is read again once it
// grew by an eighth of splitSize).
func (q *splitQueue) cachedMid(gen, size, splitSize uint64) ([]byte, bool) {
	if q.midGen != gen || q.midSize == 0 {
		return nil, false
	}
	if q.midKey == nil && size >= q.midSize+splitSize/8 {
		return nil, false
	}
	return q.midKey, true
}

// maybeSplit, on the leader's tick at most every splitCheck, splits the range
// when its data passed SplitSize (at its middle by bytes) or it has been
// hotter than SplitQPS for loadSplitAfter (at the key that divides its
// requests evenly). The split runs in the background; one at a time.
func (r *Replica) maybeSplit() {
	now := r.cfg.Clock.Now()
	if now.Sub(r.splits.lastCheck) < splitCheck || r.splits.running.Load() {
		return
	}
	r.splits.lastCheck = now
	var size uint64 // over SplitSize, or 0
	if r.cfg.SplitSize > 0 {
		if n, err := r.sm.Size(); err == nil && n >= r.cfg.SplitSize {
			size = n
		}
	}
	var key []byte
	reason := ""
	if r.cfg.SplitQPS > 0 {
		if key = r.load.splitKey(loadSplitAfter); key != nil {
			reason = fmt.Sprintf("load %.0f requests/s", r.load.QPS())
		}
	}
	if size == 0 && key == nil {
		return
	}
	r.splits.running.Store(true)
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer r.splits.running.Store(false)
		if size > 0 { // finding the middle reads the range: not on the tick
			gen := r.sm.Descriptor().GetGeneration()
			mid, ok := r.splits.cachedMid(gen, size, r.cfg.SplitSize)
			if !ok {
				var err error
				if mid, err = r.sm.MidKey(r.ctx); err == nil {
					r.splits.midGen, r.splits.midSize, r.splits.midKey = gen, size, mid
				}
			}
			if mid != nil {
				key, reason = mid, fmt.Sprintf("size %d bytes", size)
			}
		}
		if key == nil {
			return
		}
		ctx, cancel := context.WithTimeout(r.ctx, proposeTimeout+splitQuiesce)
		defer cancel()
		if _, _, err := r.split(ctx, key, false); err != nil {
			slog.Debug("automatic split", "range", r.id, "at", string(key), "reason", reason, "err", err)
			return
		}
		slog.Info("automatic split", "range", r.id, "at", string(key), "reason", reason)
	}()
}
