package rangeserver

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/terroir-db/terroir/internal/epoch"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/storage"
)

// Closed epochs (DESIGN.md §13). A range leader closes epoch c when
//  1. its publisher shows at least c+1,
//  2. it has raised its highest epoch to that value, so every later Prepare
//     reply and one-phase commit here lands above c, and
//  3. every transaction that was prepared or committing here at (2) has
//     applied its outcome;
//
// it then proposes ClosedEpochCmd{c} through Raft. A replica that applied
// it holds every version of the range with an epoch at or below c, and no
// transaction can add one, so it serves a read at any epoch up to c+1 by
// itself, with no epoch or lock wait: a changefeed's resolved epoch, and
// follower reads. Only global-epoch versions are closed (local
// epochs in a regional-only deployment); regional copies are not.

// subClosed holds the range's closed epoch (8 bytes, big-endian).
const subClosed byte = 'c'

// ErrNotClosed: a read from the closed epoch asked for an epoch above the
// replica's closed epoch + 1; retry later, or at the leader.
var ErrNotClosed = errors.New("rangeserver: epoch not closed at this replica")

// ClosedEpoch returns the range's closed epoch as this replica applied it
// (0: none yet).
func (sm *StateMachine) ClosedEpoch() uint64 { return sm.closed.Load() }

// The closed epoch lives in two places: closedStored (under sm.mu) is the
// value in the engine or in the batch being applied; closed, the one reads
// trust, is raised to it only by PostApply, once the batch — with every
// version the close covers, which may have applied in the same batch on a
// follower — is in the engine. Lowering it (a merge) takes effect at once.

// applyClosed applies a ClosedEpochCmd, with sm.mu held: under the lease it
// was proposed in, it raises the stored closed epoch (never lowers it).
func (sm *StateMachine) applyClosed(b *pebble.Batch, cmd *pb.ClosedEpochCmd) any {
	if cmd.GetLeaseStart() != sm.lease.GetStart() || sm.desc.Load().GetSubsumed() {
		return Applied{Rejected: true}
	}
	if c := cmd.GetEpoch(); c > sm.closedStored {
		sm.storeClosed(b, c)
	}
	return Applied{}
}

// storeClosed writes closed epoch c to b, with sm.mu held; reads trust it
// once PostApply publishes it.
func (sm *StateMachine) storeClosed(b *pebble.Batch, c uint64) {
	_ = b.Set(sm.sub(subClosed, nil), encodeClosed(c), nil)
	sm.closedStored = c
}

// encodeClosed is a closed epoch as stored: 8 bytes, big-endian.
func encodeClosed(c uint64) []byte { return binary.BigEndian.AppendUint64(nil, c) }

// lowerClosed sets the closed epoch to min(current, c), with sm.mu held: a
// merged range's is the smaller of its two halves'.
func (sm *StateMachine) lowerClosed(b *pebble.Batch, c uint64) {
	if c < sm.closedStored {
		sm.storeClosed(b, c)
	}
	if c < sm.closed.Load() {
		sm.setClosed(c)
	}
}

// publishClosed raises the closed epoch reads trust, with sm.mu held, to
// the stored one once the batch that stored it is in the engine
// (PostApply), and to a side-transported close once its applied index is
// (sideclosed.go). It never lowers it: only lowerClosed (a merge) and a
// snapshot's restore do.
func (sm *StateMachine) publishClosed() {
	c := sm.closedStored
	if s := sm.side; s.epoch > c && sm.sideValid(s) {
		c = s.epoch
	}
	if c > sm.closed.Load() {
		sm.setClosed(c)
	}
}

// setClosed sets the closed epoch reads trust and, when it rose, wakes the
// reads waiting for it (waitClosed).
func (sm *StateMachine) setClosed(c uint64) {
	if old := sm.closed.Swap(c); c > old {
		sm.closedWake.Lock()
		if sm.closedRose != nil {
			close(sm.closedRose)
			sm.closedRose = nil
		}
		sm.closedWake.Unlock()
	}
}

// waitClosed waits until the closed epoch reads trust is at least c, for
// at most d: true if it is. A rise wakes it (setClosed); it never polls.
func (sm *StateMachine) waitClosed(ctx context.Context, c uint64, d time.Duration) bool {
	if sm.closed.Load() >= c {
		return true
	}
	if d <= 0 {
		return false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		sm.closedWake.Lock()
		if sm.closedRose == nil {
			sm.closedRose = make(chan struct{})
		}
		rose := sm.closedRose
		sm.closedWake.Unlock()
		if sm.closed.Load() >= c { // read after taking the channel: no rise is missed
			return true
		}
		select {
		case <-rose:
		case <-t.C:
			return sm.closed.Load() >= c
		case <-ctx.Done():
			return false
		}
	}
}

// loadClosed reads the stored closed epoch through get (the engine or a
// batch being restored) with sm.mu held. Read from the engine, it is
// trusted at once; from a batch, the value trusted until it is in the
// engine is the smaller of the old and the new. A damaged value wraps
// storage.ErrCorrupt.
func (sm *StateMachine) loadClosed(get func([]byte) ([]byte, error), fromEngine bool) error {
	v, err := get(sm.sub(subClosed, nil))
	if err != nil {
		return err
	}
	var c uint64
	switch len(v) {
	case 0:
	case 8:
		c = binary.BigEndian.Uint64(v)
	default:
		return fmt.Errorf("%w: closed epoch of %d bytes", storage.ErrCorrupt, len(v))
	}
	sm.closedStored = c
	if fromEngine || c < sm.closed.Load() {
		sm.setClosed(c)
	}
	return nil
}

// closing is a close under way at the leader: the epoch it will close, the
// transactions that must apply their outcome first (condition 3), the
// range's generation when it began (a split or merge since ends it), and
// when its publisher read returned (a side close needs a later read).
type closing struct {
	epoch      uint64
	pending    [][]byte
	generation uint64
	shown      time.Time // when the publisher read that showed epoch + 1 returned
}

// closingSource is the epoch the range's global versions carry: its
// region's publisher, or in a regional-only deployment its local epoch.
func (r *Replica) closingSource() epoch.Source { return r.src().closing() }

// maybeClose runs on the leader's tick, under leadership l: it starts a
// close once ClosedInterval has passed since the last began (conditions 1
// and 2), and once the transactions it waits for are done (3) proposes it,
// or sends it outside the log if nothing applied since the last (idle).
// A close the range's shape changed under (a merge brings prepared
// transactions it did not wait for) is dropped; a proposal that fails is
// not retried: the next close begins ClosedInterval after it.
func (r *Replica) maybeClose(ctx context.Context, l *leadership) {
	if r.cfg.ClosedInterval <= 0 || r.closePaused.Load() {
		return
	}
	now := r.cfg.Clock.Now()
	if l.closing == nil {
		if now.Sub(l.lastClose) < r.cfg.ClosedInterval {
			return
		}
		// Housekeeping: closes follow the closing source's pace — the
		// global epoch's, or in a regional-only deployment the local
		// epoch's — rather than keep it at the full pace (epoch.Demand).
		p, err := epoch.ReadBackground(ctx, r.closingSource())
		if err != nil {
			return
		}
		shown := time.Now()
		closed := r.sm.ClosedEpoch()
		if r.cfg.ClosedLag != nil && p >= closed {
			r.cfg.ClosedLag.Observe(float64(p - closed))
		}
		if p < 2 || p-1 <= closed {
			return
		}
		// Raised to the publisher's value, never above it: a commit in a
		// future epoch would escape strong snapshots that start after it.
		l.closing = &closing{epoch: p - 1, pending: l.txns.raiseAndPending(p), generation: r.sm.Descriptor().GetGeneration(), shown: shown}
		for _, rec := range r.sm.Prepared() {
			l.closing.pending = append(l.closing.pending, rec.GetTxn().GetId())
		}
		l.lastClose = now
	}
	if r.sm.Descriptor().GetGeneration() != l.closing.generation {
		l.closing = nil
		return
	}
	for _, id := range l.closing.pending {
		if l.txns.holds(id) || r.sm.IsPrepared(id) {
			return // not yet applied: the close waits (a later tick looks again)
		}
	}
	if r.idle(l) {
		// Nothing applied since the last close: no entry (sideclosed.go),
		// but a local epoch read begun after the publisher read, which
		// the tick reuses (tickEpoch).
		e := r.epochRead.epoch
		if !r.epochRead.began.After(l.closing.shown) {
			var err error
			if e, err = r.readLocal(ctx, r.lastEpoch.Load()); err != nil {
				return // the close waits: a later tick tries again
			}
			r.observeEpoch(e)
		}
		r.sendSide(l, e)
		l.closing = nil
		return
	}
	cmd := EncodeCommand(&pb.Command{Cmd: &pb.Command_Closed{Closed: &pb.ClosedEpochCmd{Epoch: l.closing.epoch, LeaseStart: l.start}}})
	if _, err := r.group.Propose(ctx, cmd); err != nil {
		slog.Debug("closed epoch proposal failed", "range", r.id, "epoch", l.closing.epoch, "err", err)
	} else {
		l.loggedAt = r.group.Applied()
		count(r.cfg.Closes[0])
	}
	l.closing = nil
}

// count adds one to c, if set.
func count(c prometheus.Counter) {
	if c != nil {
		c.Inc()
	}
}

// PauseClosing stops (true) or resumes (false) this replica's closing of
// epochs while it leads: a test holds a range's closed epoch back with it.
func (r *Replica) PauseClosing(paused bool) { r.closePaused.Store(paused) }

// ClosedEpoch returns the range's closed epoch as this replica applied it,
// once key span [start, end) is checked to lie in the range (a
// *MismatchError otherwise; an empty start skips the check).
func (r *Replica) ClosedEpoch(start, end []byte) (uint64, error) {
	if len(start) > 0 {
		if err := r.checkSpan(start, end); err != nil {
			return 0, err
		}
	}
	return r.sm.ClosedEpoch(), nil
}

// maxClosedWait caps how long a closed read waits for its epoch to close,
// whatever the request asks.
const maxClosedWait = time.Second

// closedRead checks that this replica may serve a read at epoch at from its
// closed epoch, waiting up to wait (at most maxClosedWait) for the closed
// epoch to reach at-1: ErrNotClosed if at still passes the closed epoch + 1.
// It returns the closed epoch it judged by.
func (r *Replica) closedRead(ctx context.Context, at uint64, wait time.Duration) (uint64, error) {
	if at > 0 {
		r.sm.waitClosed(ctx, at-1, min(wait, maxClosedWait))
	}
	c := r.sm.ClosedEpoch()
	if at > c+1 {
		return c, fmt.Errorf("%w: epoch %d, closed epoch %d", ErrNotClosed, at, c)
	}
	return c, nil
}
