package coordinator

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
)

// heartbeater keeps an open transaction alive at the range leaders where it
// holds locks (DESIGN.md §10): a leader resolves as an orphan only a
// transaction whose coordinator has been silent for orphan_after, so while the
// transaction is open its coordinator sends a Heartbeat to each of them every
// orphan_after/4. A transaction that lives less than one interval sends none,
// so the commit path pays only for arming and stopping one timer.
//
// A reply that the leader holds no locks of the transaction under the
// incarnation they were taken under (lost) dooms it: its next step and Commit
// return ErrAborted without waiting for the commit to find out.
type heartbeater struct {
	c     *Coordinator
	txnID []byte
	every time.Duration

	mu      sync.Mutex
	targets map[uint64]hbTarget // by range ID
	timer   *time.Timer         // armed while targets is non-empty and not stopped
	stopped bool
	lost    error // set once a leader reported the locks lost
}

// hbTarget is one range where the transaction holds locks.
type hbTarget struct {
	desc        *pb.RangeDescriptor
	incarnation uint64
	// tentative: a range that took over part of a target's span when it
	// changed shape, which may hold none of the transaction's locks (they
	// all lay in the other part). Lost there means only that: the target
	// is dropped, and the commit's lock counts tell a real loss.
	tentative bool
}

func newHeartbeater(c *Coordinator, txnID []byte) *heartbeater {
	return &heartbeater{c: c, txnID: txnID, every: max(c.top.OrphanAfter/4, time.Millisecond), targets: map[uint64]hbTarget{}}
}

// track records that the transaction holds locks at range g under
// incarnation, arming the timer on the first range.
func (h *heartbeater) track(g *pb.RangeDescriptor, incarnation uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopped {
		return
	}
	h.targets[g.GetRangeId()] = hbTarget{desc: g, incarnation: incarnation}
	if h.timer == nil {
		h.c.beating.Store(h, struct{}{}) // so Close stops it
		h.arm()
	}
}

// arm schedules the next beat; callers hold h.mu. The coordinator's wait group
// counts the scheduled beat, so Close waits for one in flight.
func (h *heartbeater) arm() {
	h.c.wg.Add(1)
	h.timer = time.AfterFunc(h.every, h.beat)
}

// stop ends the heartbeats; a beat in flight finishes on its own.
func (h *heartbeater) stop() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopped {
		return
	}
	h.stopped = true
	if h.timer != nil && h.timer.Stop() {
		h.c.wg.Done() // the scheduled beat will not run
	}
	h.c.beating.Delete(h)
}

// retarget replaces target t, whose range changed shape, by the ranges
// that now hold its span (a split handed them its locks under the same
// incarnation), as the routing cache has them; a range already targeted
// under another incarnation keeps it.
func (h *heartbeater) retarget(ctx context.Context, t hbTarget) {
	var end []byte
	if len(t.desc.GetEndKey()) > 0 {
		end = t.desc.GetEndKey()
	}
	parts, err := h.c.routes.Overlapping(ctx, t.desc.GetStartKey(), end)
	if err != nil {
		return // the next beat tries again
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if cur, ok := h.targets[t.desc.GetRangeId()]; ok && cur.desc == t.desc {
		delete(h.targets, t.desc.GetRangeId())
	}
	for _, p := range parts {
		if cur, ok := h.targets[p.Desc.GetRangeId()]; !ok || cur.incarnation == t.incarnation {
			h.targets[p.Desc.GetRangeId()] = hbTarget{desc: p.Desc, incarnation: t.incarnation, tentative: !ok || cur.tentative}
		}
	}
}

// lostErr returns why the transaction's locks are gone, or nil.
func (h *heartbeater) lostErr() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lost
}

// beat sends one heartbeat to every tracked leader, in parallel, each bounded
// by the interval; a failed call is retried at the next beat (the leader's
// bound is four intervals).
func (h *heartbeater) beat() {
	defer h.c.wg.Done()
	h.mu.Lock()
	if h.stopped {
		h.mu.Unlock()
		return
	}
	targets := make([]hbTarget, 0, len(h.targets))
	for _, t := range h.targets {
		targets = append(targets, t)
	}
	h.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), h.every)
	defer cancel()
	var wg sync.WaitGroup
	for _, t := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var lost bool
			err := h.c.rangeCall(ctx, t.desc, true, func(ctx context.Context, rc pb.RangeClient) error {
				resp, err := rc.Heartbeat(ctx, &pb.HeartbeatRequest{RangeId: t.desc.GetRangeId(), TxnId: h.txnID,
					Incarnation: t.incarnation, Generation: t.desc.GetGeneration()})
				lost = resp.GetLost()
				return err
			})
			if errors.Is(err, errStaleRoute) {
				h.retarget(ctx, t)
				return
			}
			if err == nil && lost && t.tentative {
				h.mu.Lock()
				if cur, ok := h.targets[t.desc.GetRangeId()]; ok && cur.tentative && cur.incarnation == t.incarnation {
					delete(h.targets, t.desc.GetRangeId())
				}
				h.mu.Unlock()
				return
			}
			if err == nil && lost {
				h.mu.Lock()
				if h.lost == nil {
					h.lost = fmt.Errorf("%w: range %d no longer holds this transaction's locks", ErrConflict, t.desc.GetRangeId())
				}
				h.mu.Unlock()
			}
		}()
	}
	wg.Wait()
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.stopped && h.lost == nil {
		h.arm()
	}
}
