package coordinator

import (
	"context"
	"crypto/rand"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/terroir-db/terroir/internal/epoch"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/transport"
	"github.com/terroir-db/terroir/internal/txnstate"
)

// Coordinator runs transactions for one client process located in one region.
type Coordinator struct {
	top        *topology.Topology
	region     string
	dialer     *transport.Dialer
	epochs     map[string]*epoch.Reader // each region's local epoch, by region
	publishers map[string]*epoch.Reader // each region's publisher, by region (regions that have one)
	global     epoch.Source             // this region's publisher; nil in a regional-only deployment
	service    *epoch.Reader            // the global epoch service; nil if there is none
	quiet      uint64                   // quiet_epochs (paper §5.3.1)
	txnState   *txnstate.Client
	stateID    uint64

	mode     atomic.Pointer[CommitMode] // nil: Chablis
	leaders  sync.Map                   // range ID → uint64 node believed to lead it
	session  atomic.Uint64              // the highest epoch this client has committed at
	lastPrio atomic.Uint64
	crash    atomic.Pointer[CrashHook] // nil: none

	wg      sync.WaitGroup // commit notifications and heartbeats in flight
	beating sync.Map       // *heartbeater → struct{}: open transactions' heartbeats
}

// New returns a coordinator for clients in region, calling nodes through dialer.
// It fails with ErrUnknownRegion, or when the region has no local epoch or
// txn-state group.
func New(top *topology.Topology, region string, dialer *transport.Dialer) (*Coordinator, error) {
	if !top.HasRegion(region) {
		return nil, fmt.Errorf("%w: %q", ErrUnknownRegion, region)
	}
	eg := top.GroupsOfKind(topology.KindLocalEpoch, region)
	tg := top.GroupsOfKind(topology.KindTxnState, region)
	if len(eg) == 0 || len(tg) == 0 {
		return nil, fmt.Errorf("coordinator: region %q needs a local-epoch and a txn-state group", region)
	}
	c := &Coordinator{
		top: top, region: region, dialer: dialer,
		epochs:     map[string]*epoch.Reader{},
		publishers: map[string]*epoch.Reader{},
		txnState:   txnstate.NewClient(dialer, tg[0].ID, tg[0].Replicas),
		stateID:    tg[0].ID,
		quiet:      top.QuietEpochs,
	}
	for _, r := range top.Regions {
		if g := top.GroupsOfKind(topology.KindLocalEpoch, r); len(g) > 0 {
			c.epochs[r] = epoch.NewReader(dialer, g[0].ID, g[0].Replicas)
		}
		if g := top.GroupsOfKind(topology.KindPublisher, r); len(g) > 0 {
			c.publishers[r] = epoch.NewReader(dialer, g[0].ID, g[0].Replicas)
		}
	}
	if p, ok := c.publishers[region]; ok {
		c.global = p
	}
	if g := top.GroupsOfKind(topology.KindGlobalEpoch, ""); len(g) > 0 {
		c.service = epoch.NewReader(dialer, g[0].ID, g[0].Replicas)
	}
	return c, nil
}

// Close stops the heartbeats of open transactions, waits for commit
// notifications in flight and stops the epoch readers.
func (c *Coordinator) Close() {
	c.beating.Range(func(h, _ any) bool {
		h.(*heartbeater).stop()
		return true
	})
	c.wg.Wait()
	for _, r := range c.epochs {
		r.Close()
	}
	for _, r := range c.publishers {
		r.Close()
	}
	if c.service != nil {
		c.service.Close()
	}
}

// priority returns a start-order priority for wait-die: the wall clock in
// nanoseconds, made strictly increasing within the process. Clocks only affect
// fairness, never correctness.
func (c *Coordinator) priority() uint64 {
	now := uint64(time.Now().UnixNano())
	for {
		last := c.lastPrio.Load()
		p := max(now, last+1)
		if c.lastPrio.CompareAndSwap(last, p) {
			return p
		}
	}
}

// CommitMode is how read-write transactions commit: the protocol, or a
// baseline that `terroir bench compare` measures it against. Both baselines
// are safe, only slower.
type CommitMode struct {
	// Naive reads the global epoch from the global epoch service itself,
	// across the WAN, at every commit (the paper's §3 problem).
	Naive bool
	// CommitWait, if positive, is waited with locks held before a writing
	// transaction is acknowledged (Spanner's commit wait).
	CommitWait time.Duration
}

// SetCommitMode makes transactions begun from now on commit in mode.
func (c *Coordinator) SetCommitMode(mode CommitMode) { c.mode.Store(&mode) }

// CrashPoint is a point in two-phase commit (DESIGN.md §4.4–4.5) where a
// fault campaign can make the coordinator stop as if its process had died.
type CrashPoint uint8

const (
	// CrashAfterPrepare: every participant has prepared; the commit record is
	// not written. The participants resolve the transaction as aborted.
	CrashAfterPrepare CrashPoint = iota + 1
	// CrashAfterCommitRecord: the commit record is durable; no participant
	// has been told. The participants resolve it as committed.
	CrashAfterCommitRecord
)

// String names the point.
func (p CrashPoint) String() string {
	switch p {
	case CrashAfterPrepare:
		return "between prepare and commit record"
	case CrashAfterCommitRecord:
		return "between commit record and notification"
	}
	return fmt.Sprintf("crashpoint(%d)", uint8(p))
}

// CrashHook is asked at each CrashPoint of every two-phase commit, with the
// transaction's ID and its participants' range IDs. Returning true makes the
// coordinator stop there: it neither aborts nor notifies, and Commit returns
// ErrCommitUnknown; its heartbeats stop, and the participants resolve the
// transaction through its state store once their orphan bound has passed.
type CrashHook func(p CrashPoint, txnID []byte, ranges []uint64) bool

// SetCrashHook installs h for transactions committing from now on (nil
// removes it). It exists for fault campaigns (terroir nemesis).
func (c *Coordinator) SetCrashHook(h CrashHook) {
	if h == nil {
		c.crash.Store(nil)
		return
	}
	c.crash.Store(&h)
}

// crashes asks the crash hook whether the transaction's coordinator dies at p.
func (t *Txn) crashes(p CrashPoint) bool {
	h := t.c.crash.Load()
	if h == nil {
		return false
	}
	ranges := make([]uint64, 0, len(t.parts))
	for _, part := range t.parts {
		ranges = append(ranges, part.desc.ID)
	}
	return (*h)(p, t.meta.GetId(), ranges)
}

// Begin starts a read-write transaction. A retry of a transaction should pass
// the priority of its first attempt (Txn.Priority), so it ages and eventually
// wins its conflicts; 0 takes a fresh one.
func (c *Coordinator) Begin(priority uint64) *Txn {
	id := make([]byte, txnstate.TxnIDLen)
	_, _ = rand.Read(id)
	if priority == 0 {
		priority = c.priority()
	}
	meta := &pb.TxnMeta{Id: id, Priority: priority, TxnStateGroup: c.stateID}
	if m := c.mode.Load(); m != nil {
		switch {
		case m.Naive:
			meta.CommitMode = pb.CommitMode_COMMIT_MODE_NAIVE
		case m.CommitWait > 0:
			meta.CommitMode, meta.CommitWaitUs = pb.CommitMode_COMMIT_MODE_COMMIT_WAIT, uint32(m.CommitWait/time.Microsecond)
		}
	}
	return &Txn{
		c:      c,
		meta:   meta,
		writes: map[string]*pb.Write{},
		parts:  map[uint64]*participant{},
		hb:     newHeartbeater(c, id),
	}
}

// rangeCall runs f against the leader of range g, following leader hints and
// retrying while no leader serves, until ctx ends. Aborted maps to ErrConflict.
// A call that is not idempotent is retried only after errors that prove it did
// not execute (FailedPrecondition); any other failure is ErrCommitUnknown.
func (c *Coordinator) rangeCall(ctx context.Context, g topology.Group, idempotent bool, f func(context.Context, pb.RangeClient) error) error {
	var lastErr error
	next := 0
	for attempt := 0; ; attempt++ {
		target := g.Replicas[next%len(g.Replicas)]
		if hint, ok := c.leaders.Load(g.ID); ok {
			target = hint.(uint64)
		}
		conn, err := c.dialer.Conn(target)
		if err != nil {
			return err
		}
		err = f(ctx, pb.NewRangeClient(conn))
		if err == nil {
			c.leaders.Store(g.ID, target)
			return nil
		}
		lastErr = err
		st := status.Convert(err)
		switch st.Code() {
		case codes.Aborted:
			return fmt.Errorf("%w: %s", ErrConflict, st.Message())
		case codes.InvalidArgument, codes.OutOfRange, codes.Internal, codes.DataLoss, codes.NotFound:
			return err
		case codes.FailedPrecondition: // did not execute: not the leader, or not serving yet
			hint := uint64(0)
			for _, d := range st.Details() {
				if nl, ok := d.(*pb.NotLeader); ok {
					hint = nl.GetLeaderHint()
				}
			}
			if hint != 0 {
				c.leaders.Store(g.ID, hint)
			} else {
				c.leaders.Delete(g.ID)
				next++
			}
		default: // Unknown, Unavailable, deadline: it may have executed
			if !idempotent {
				return fmt.Errorf("%w: range %d: %v", ErrCommitUnknown, g.ID, err)
			}
			c.leaders.Delete(g.ID)
			next++
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%w: range %d: %v", ErrUnavailable, g.ID, lastErr)
		}
		t := time.NewTimer(time.Duration(min(attempt+1, 20)) * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w: range %d: %v", ErrUnavailable, g.ID, lastErr)
		}
	}
}

// readEpochs reads, in parallel, the local epoch of every region in regions
// and the global epoch: the maximum over the publishers of those regions, so
// that once a region's publisher shows e, no transaction touching that region
// commits below it (which snapshot reads rely on, DESIGN.md §5); naive reads
// the global epoch service instead. In a regional-only deployment this
// region's local epoch stands in for it.
func (c *Coordinator) readEpochs(ctx context.Context, regions []string, naive bool) (locals map[string]uint64, global uint64, err error) {
	var sources []epoch.Source
	for _, r := range regions {
		sources = append(sources, c.epochs[r])
	}
	for _, r := range regions {
		if p, ok := c.publishers[r]; ok && c.global != nil {
			sources = append(sources, p)
		}
	}
	if naive && c.global != nil && c.service != nil {
		// The naive baseline: the service itself, across the WAN, instead.
		sources = append(sources[:len(regions)], c.service)
	}
	epochs, err := epoch.ReadAll(ctx, sources...)
	locals = map[string]uint64{}
	for i, r := range regions {
		locals[r] = epochs[i]
	}
	for _, e := range epochs[len(regions):] {
		global = max(global, e)
	}
	if c.global == nil {
		global = locals[c.region]
	}
	return locals, global, err
}
