package coordinator

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/terroir-db/terroir/internal/directory"
	"github.com/terroir-db/terroir/internal/epoch"
	"github.com/terroir-db/terroir/internal/epoch/epochpb"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/routing"
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
	// regionalOnly says once that snapshots run as Regional (no publishers).
	regionalOnly sync.Once
	// membership caches the global epoch service's publisher set for the
	// errors of failed calls (excludedSince).
	membership struct {
		mu   sync.Mutex
		resp *epochpb.MembershipResponse
		at   time.Time
	}
	quiet    uint64 // quiet_epochs (paper §5.3.1)
	txnState *txnstate.Client
	stateID  uint64
	forget   *forgetter // records of finished two-phase commits

	mode atomic.Pointer[CommitMode] // nil: Chablis
	// followerReads is the FollowerReads policy of snapshot reads; spread
	// rotates a read's choice among equally near followers.
	followerReads atomic.Uint32
	spread        atomic.Uint64
	routes        *routing.Cache        // range descriptors and leader hints
	nodes         routing.NodesResolver // asks the nodes which ranges they host
	session       atomic.Uint64         // the highest epoch this client has committed at
	lastPrio      atomic.Uint64
	crash         atomic.Pointer[CrashHook] // nil: none
	stall         atomic.Pointer[StallHook] // nil: none

	wg      sync.WaitGroup // commit notifications and heartbeats in flight
	beating sync.Map       // *heartbeater → struct{}: open transactions' heartbeats

	dropLookup func() // takes the registry lookup out of the dialer's network

	dirs      *directory.Directories
	placement placementRules // placement.go
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
		txnState:   txnstate.NewClient(dialer, tg[0]),
		stateID:    tg[0].ID,
		quiet:      top.QuietEpochs,
	}
	c.forget = &forgetter{client: c.txnState}
	// Routing asks the directories (DESIGN.md §11), never the file's ranges.
	c.nodes = routing.NodesResolver{Topology: top, Dialer: dialer}
	dirs := directory.NewDirectories(top, dialer)
	c.dirs = dirs
	c.routes = routing.NewCache(directory.NewResolver(top, region, dirs, c.nodes))
	// Nodes that joined after this process started are found in the registry.
	c.dropLookup = dialer.Network().AddLookup(dirs.RegisteredNodes)
	for _, r := range top.Regions {
		if g := top.GroupsOfKind(topology.KindLocalEpoch, r); len(g) > 0 {
			c.epochs[r] = epoch.NewReader(dialer, g[0])
		}
		if g := top.GroupsOfKind(topology.KindPublisher, r); len(g) > 0 {
			c.publishers[r] = epoch.NewReader(dialer, g[0])
		}
	}
	if p, ok := c.publishers[region]; ok {
		c.global = p
	}
	if g := top.GroupsOfKind(topology.KindGlobalEpoch, ""); len(g) > 0 {
		c.service = epoch.NewReader(dialer, g[0])
	}
	return c, nil
}

// Close stops the heartbeats of open transactions, waits for commit
// notifications in flight, sends the pending forgets of finished
// transactions' records and stops the epoch readers.
func (c *Coordinator) Close() {
	c.dropLookup()
	c.beating.Range(func(h, _ any) bool {
		h.(*heartbeater).stop()
		return true
	})
	c.wg.Wait()
	c.forget.close()
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

// StallHook is asked, once every participant of a two-phase commit has
// prepared, with the transaction's ID and its participants' range IDs. A
// positive duration stalls the coordinator there, as a paused process
// would: its heartbeats stop and it waits that long before writing the
// commit record — which the transaction state store may then refuse, if
// the participants resolved the transaction as an orphan meanwhile.
type StallHook func(txnID []byte, ranges []uint64) time.Duration

// SetStallHook installs h for transactions committing from now on (nil
// removes it). It exists for fault campaigns (terroir nemesis).
func (c *Coordinator) SetStallHook(h StallHook) {
	if h == nil {
		c.stall.Store(nil)
		return
	}
	c.stall.Store(&h)
}

// stalls runs the stall hook, if any: it stops the heartbeats and sleeps
// for as long as the hook says (bounded by ctx).
func (t *Txn) stalls(ctx context.Context) {
	h := t.c.stall.Load()
	if h == nil {
		return
	}
	d := (*h)(t.meta.GetId(), t.rangeIDs())
	if d <= 0 {
		return
	}
	t.hb.stop()
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func (t *Txn) rangeIDs() []uint64 {
	ranges := make([]uint64, 0, len(t.parts))
	for _, part := range t.parts {
		ranges = append(ranges, part.desc.GetRangeId())
	}
	return ranges
}

// crashes asks the crash hook whether the transaction's coordinator dies at p.
func (t *Txn) crashes(p CrashPoint) bool {
	h := t.c.crash.Load()
	if h == nil {
		return false
	}
	return (*h)(p, t.meta.GetId(), t.rangeIDs())
}

// Begin starts a read-write transaction. A retry of a transaction should pass
// the priority of its first attempt (Txn.Priority), so it ages and eventually
// wins its conflicts; 0 takes a fresh one.
func (c *Coordinator) Begin(priority uint64) *Txn {
	meta := c.newMeta(priority)
	return &Txn{
		c:      c,
		meta:   meta,
		writes: map[string]*pb.Write{},
		parts:  map[uint64]*participant{},
		hb:     newHeartbeater(c, meta.GetId()),
	}
}

// newMeta returns a new transaction's identity: a random ID, priority (0: a
// new one, younger than every earlier), this coordinator's region and state
// store, and the commit mode set.
func (c *Coordinator) newMeta(priority uint64) *pb.TxnMeta {
	id := make([]byte, txnstate.TxnIDLen)
	_, _ = rand.Read(id)
	if priority == 0 {
		priority = c.priority()
	}
	meta := &pb.TxnMeta{Id: id, Priority: priority, TxnStateGroup: c.stateID, Region: c.region}
	if m := c.mode.Load(); m != nil {
		switch {
		case m.Naive:
			meta.CommitMode = pb.CommitMode_COMMIT_MODE_NAIVE
		case m.CommitWait > 0:
			meta.CommitMode, meta.CommitWaitUs = pb.CommitMode_COMMIT_MODE_COMMIT_WAIT, uint32(m.CommitWait/time.Microsecond)
		}
	}
	return meta
}

// errStaleRoute: a range answered that the request's keys are not in its
// span; the routing cache has been refreshed from its reply, and the request
// did not execute. Retryable (it is a conflict to a transaction whose range
// changed shape under it); routeKey and routeSpan route again on it.
var errStaleRoute = fmt.Errorf("%w: the range changed shape", ErrConflict)

// rangeCall runs f against the leader of range g, following leader hints and
// retrying while no leader serves, until ctx ends. Aborted maps to ErrConflict;
// a mismatch reply refreshes the routing cache and returns errStaleRoute.
// A call that is not idempotent is retried only after errors that prove it did
// not execute (FailedPrecondition); any other failure is ErrCommitUnknown.
//
// The calls travel over each node's Multiplex stream
// (transport.Dialer.Multiplexed: a message each way, not a gRPC stream of
// their own, issue 17); rangeCallBulk's, whose replies may be large
// (scans), each on a stream of its own, so that a large reply holds up no
// other call's.
func (c *Coordinator) rangeCall(ctx context.Context, g *pb.RangeDescriptor, idempotent bool, f func(context.Context, pb.RangeClient) error) error {
	return c.rangeCallVia(ctx, g, idempotent, c.dialer.Multiplexed, f)
}

// rangeCallBulk is rangeCall for a call whose reply may be large.
func (c *Coordinator) rangeCallBulk(ctx context.Context, g *pb.RangeDescriptor, idempotent bool, f func(context.Context, pb.RangeClient) error) error {
	return c.rangeCallVia(ctx, g, idempotent, func(id uint64) (grpc.ClientConnInterface, error) { return c.dialer.Conn(id) }, f)
}

func (c *Coordinator) rangeCallVia(ctx context.Context, g *pb.RangeDescriptor, idempotent bool, dial func(uint64) (grpc.ClientConnInterface, error), f func(context.Context, pb.RangeClient) error) error {
	var lastErr error
	next, missing := 0, 0 // missing: replicas in a row that do not host the range
	id, replicas := g.GetRangeId(), g.GetReplicas()
	for attempt := 0; ; attempt++ {
		target := replicas[next%len(replicas)]
		if hint, ok := c.routes.Leader(id); ok {
			target = hint
		}
		conn, err := dial(target)
		if err != nil {
			return err
		}
		err = f(ctx, pb.NewRangeClient(conn))
		if err == nil {
			c.routes.SetLeader(id, target)
			return nil
		}
		lastErr = err
		st := status.Convert(err)
		if st.Code() != codes.NotFound {
			missing = 0
		}
		switch st.Code() {
		case codes.Aborted:
			return fmt.Errorf("%w: %s", ErrConflict, st.Message())
		case codes.OutOfRange:
			for _, d := range st.Details() {
				if m, ok := d.(*pb.RangeMismatch); ok {
					c.routes.Update(m.GetDescriptors()...)
					return fmt.Errorf("%w: %s", errStaleRoute, st.Message())
				}
			}
			if strings.Contains(st.Message(), tooOld) {
				return fmt.Errorf("%w: %s", ErrSnapshotTooOld, st.Message())
			}
			return err
		case codes.InvalidArgument, codes.Internal, codes.DataLoss:
			return err
		case codes.PermissionDenied, codes.Unauthenticated: // did not execute: refused before the handler
			return fmt.Errorf("%w: %v", ErrPermissionDenied, err)
		case codes.NotFound: // did not execute: the node does not host the range (yet: a split applies there later)
			c.routes.ForgetLeader(id)
			next++
			if missing++; missing >= len(replicas) {
				// No replica hosts it: the range was merged away.
				c.routes.Forget(id)
				return fmt.Errorf("%w: range %d is hosted nowhere: %s", errStaleRoute, id, st.Message())
			}
		case codes.FailedPrecondition: // did not execute: not the leader, or not serving yet
			hint := uint64(0)
			for _, d := range st.Details() {
				if nl, ok := d.(*pb.NotLeader); ok {
					hint = nl.GetLeaderHint()
				}
			}
			if hint != 0 {
				c.routes.SetLeader(id, hint)
			} else {
				c.routes.ForgetLeader(id)
				next++
			}
		case codes.Unavailable:
			c.routes.ForgetLeader(id)
			next++
			if !idempotent && !transport.NotSent(err) { // sent: it may have executed
				return fmt.Errorf("%w: range %d: %v", ErrCommitUnknown, id, err)
			}
		default: // Unknown, deadline: it may have executed
			c.routes.ForgetLeader(id)
			if !idempotent {
				return fmt.Errorf("%w: range %d: %v", ErrCommitUnknown, id, err)
			}
			next++
		}
		if ctx.Err() != nil {
			return c.unavailable(ctx, g, lastErr)
		}
		t := time.NewTimer(time.Duration(min(attempt+1, 20)) * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return c.unavailable(ctx, g, lastErr)
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

// maxRouteAttempts bounds how often one operation is routed again after
// mismatch replies, or while no range serves its key (a merge between its
// two halves), before it gives up as unavailable; routeBackoff spaces the
// attempts (about 1.5 s in all).
const maxRouteAttempts = 40

// routeBackoff waits before routing attempt (from 0) again: not at all
// after the first mismatch, then 2 ms more each time up to 50 ms. It
// reports false if ctx ended.
func routeBackoff(ctx context.Context, attempt int) bool {
	if attempt == 0 {
		return ctx.Err() == nil
	}
	return transport.SleepCtx(ctx, time.Duration(min(2*attempt, 50))*time.Millisecond)
}

// lookupRetryable reports a routing failure that a later attempt may not
// meet: no range serves the key now.
func lookupRetryable(err error) bool { return errors.Is(err, routing.ErrNoRange) }

// routeKey runs f at the range holding key, as the routing cache has it, and
// again at the range the cache then names after each mismatch reply
// (errStaleRoute), so a stale cache is never a final error. check, if set,
// vets the range first (c.local: a range homed where this client cannot
// write is ErrCrossRegion); a range it refuses is vetted once more as
// resolved afresh (recheck) before the refusal stands.
func (c *Coordinator) routeKey(ctx context.Context, key []byte, check func(*pb.RangeDescriptor) error, f func(*pb.RangeDescriptor) error) error {
	var err error
	rechecked := false
	for attempt := 0; attempt < maxRouteAttempts && routeBackoff(ctx, attempt); attempt++ {
		var d *pb.RangeDescriptor
		if d, err = c.routes.Lookup(ctx, key); err != nil {
			if lookupRetryable(err) {
				continue
			}
			return c.routeUnavailable(ctx, key, err)
		}
		if check != nil {
			if err = check(d); err != nil {
				if c.recheck(d, &rechecked) {
					continue
				}
				return err
			}
		}
		if err = f(d); !errors.Is(err, errStaleRoute) {
			return err
		}
	}
	return c.routeUnavailable(ctx, key, err)
}

// recheck drops d, a cached descriptor a check refused, from the routing
// cache so that the next attempt vets the range as resolved afresh, and
// reports whether it did: once per call (*done). A cached descriptor can
// be stale in what the checks look at without any reply ever saying so
// (a replica moved by another client, or a lease with it): refusing on it
// would refuse, for good, what the range itself accepts, as the replicate
// queue found retrying a move from a node its cache did not list.
func (c *Coordinator) recheck(d *pb.RangeDescriptor, done *bool) bool {
	if *done {
		return false
	}
	*done = true
	c.routes.Forget(d.GetRangeId())
	return true
}

// routeSpan runs f on each part of [lo, hi) (a nil hi: to the end of the key
// space) in key order, as the routing cache splits it by range, until f
// returns done or an error. After a mismatch reply it splits the rest of the
// span again from the part that failed. check, if set, vets each range first.
func (c *Coordinator) routeSpan(ctx context.Context, lo, hi []byte, check func(*pb.RangeDescriptor) error,
	f func(p routing.Part) (done bool, err error)) error {
	var err error
	rechecked := false
	for attempt := 0; attempt < maxRouteAttempts && routeBackoff(ctx, attempt); attempt++ {
		var parts []routing.Part
		if parts, err = c.routes.Overlapping(ctx, lo, hi); err != nil {
			if lookupRetryable(err) {
				continue
			}
			return fmt.Errorf("%w: routing [%q, %q): %v", ErrUnavailable, lo, hi, err)
		}
		stale := false
		for _, p := range parts {
			if check != nil {
				if err := check(p.Desc); err != nil {
					if c.recheck(p.Desc, &rechecked) {
						lo, stale = p.Start, true
						break
					}
					return err
				}
			}
			done, err := f(p)
			if errors.Is(err, errStaleRoute) {
				lo, stale = p.Start, true
				break
			}
			if err != nil || done {
				return err
			}
		}
		if !stale {
			return nil
		}
	}
	return fmt.Errorf("%w: routing [%q, %q): %v", ErrUnavailable, lo, hi, err)
}

// ErrSplitKey: a split key that is empty or already a range boundary.
var ErrSplitKey = errors.New("terroir: bad split key")

// SplitRange splits the range holding key at key (DESIGN.md §11) and returns
// the two new descriptors; the routing cache learns them at once. Errors:
// ErrSplitKey (empty, too large, or already a boundary), ErrUnavailable,
// ErrConflict (retry: transactions above the key kept committing, or the
// range changed first), ErrCommitUnknown (the call failed after it was
// sent: whether it split is unknown). While transactions above the key keep
// committing, the leader refuses and the call retries until ctx ends.
func (c *Coordinator) SplitRange(ctx context.Context, key []byte) (left, right *pb.RangeDescriptor, err error) {
	if len(key) == 0 {
		return nil, nil, fmt.Errorf("%w: empty key", ErrSplitKey)
	}
	if len(key) > MaxKeySize {
		return nil, nil, fmt.Errorf("%w: %d bytes, limit %d", ErrSplitKey, len(key), MaxKeySize)
	}
	for {
		err = c.routeKey(ctx, key, nil, func(d *pb.RangeDescriptor) error {
			return c.rangeCall(ctx, d, false, func(ctx context.Context, rc pb.RangeClient) error {
				resp, err := rc.AdminSplit(ctx, &pb.AdminSplitRequest{RangeId: d.GetRangeId(), SplitKey: key})
				left, right = resp.GetLeft(), resp.GetRight()
				return err
			})
		})
		if !errors.Is(err, ErrCommitUnknown) || ctx.Err() != nil {
			break
		}
		// The reply was lost (a leader died, say): read the outcome from
		// the nodes, and ask again only if the range did not split.
		if left, right = c.splitAt(ctx, key); right != nil {
			err = nil
			break
		}
	}
	if status.Code(err) == codes.InvalidArgument {
		return nil, nil, fmt.Errorf("%w: %v", ErrSplitKey, status.Convert(err).Message())
	}
	if err != nil {
		return nil, nil, err
	}
	c.routes.Update(left, right)
	return left, right, nil
}

// Errors of MergeRange; each leaves the ranges as they were.
var (
	// ErrMergeLast: the range holding the key ends the key space.
	ErrMergeLast = errors.New("terroir: the last range of the key space has no right neighbour to absorb")
	// ErrMergeRegions: the range and its right neighbour are homed in
	// different regions.
	ErrMergeRegions = errors.New("terroir: the range and its right neighbour have different home regions")
	// ErrMergeReplicas: the range and its right neighbour are not on the
	// same nodes, and moving the neighbour's replicas onto the range's
	// nodes failed (a target not live, the moves raced the replicate queue).
	ErrMergeReplicas = errors.New("terroir: the range and its right neighbour are on different nodes")
)

// MergeRange merges the range holding key with its right neighbour, which
// it absorbs (DESIGN.md §11), and returns the merged descriptor; the routing
// cache learns it at once. Transactions in flight on the right-hand range
// commit or abort cleanly. A neighbour on other nodes is first moved onto
// the range's nodes (colocate). Errors: ErrMergeLast, ErrMergeRegions,
// ErrMergeReplicas (not merged; the neighbour may have moved), ErrUnavailable,
// ErrCommitUnknown (whether it merged is unknown). While the right-hand range is not ready
// (its leadership moving, transactions committing) or a range changed
// first, the call retries until ctx ends; a replica moved between its
// check and the leader's (the replicate queue) makes it read the ranges
// afresh and colocate again, 50 ms on, up to maxColocations times.
func (c *Coordinator) MergeRange(ctx context.Context, key []byte) (*pb.RangeDescriptor, error) {
	if len(key) > MaxKeySize {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrKeyTooLarge, len(key), MaxKeySize)
	}
	var first *pb.RangeDescriptor // the range holding key when first asked
	colocations, refusals := 0, 0 // colocate calls; the leader's refusals for different replicas
	for {
		// The checks below read the routing cache: refresh it from the
		// nodes first, so a stale descriptor (a range that split since)
		// does not refuse a merge the leader would make.
		if descs, err := c.nodes.Resolve(ctx, key); err == nil {
			c.routes.Update(descs...)
			if d := grewPast(descs, first); d != nil {
				return d, nil // an attempt that reported a conflict merged after all
			}
		}
		var merged, left *pb.RangeDescriptor
		err := c.routeKey(ctx, key, nil, func(d *pb.RangeDescriptor) error {
			left = d
			if first == nil {
				first = d
			}
			if err := c.mergeable(ctx, d); err != nil {
				if right := (*misplaced)(nil); errors.As(err, &right) && colocations < maxColocations {
					colocations++
					return c.colocate(ctx, d, right.right)
				}
				return err
			}
			return c.rangeCall(ctx, d, false, func(ctx context.Context, rc pb.RangeClient) error {
				resp, err := rc.AdminMerge(ctx, &pb.AdminMergeRequest{RangeId: d.GetRangeId(), EndKey: d.GetEndKey()})
				merged = resp.GetMerged()
				return err
			})
		})
		switch {
		case err == nil:
			c.routes.Update(merged)
			return merged, nil
		case errors.Is(err, ErrCommitUnknown) && ctx.Err() == nil:
			// The reply was lost: read the outcome from the nodes, and ask
			// again only if the range did not grow.
			if descs, rerr := c.nodes.Resolve(ctx, key); rerr == nil {
				c.routes.Update(descs...)
				if d := grewPast(descs, left); d != nil {
					return d, nil
				}
			}
		case errors.Is(err, errColocated):
			// The neighbour moved onto the range's nodes: ask again.
		case errors.Is(err, ErrConflict) && ctx.Err() == nil:
			// A range changed first: route and ask again.
			if !routeBackoff(ctx, 5) {
				return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
			}
		case status.Code(err) == codes.InvalidArgument:
			msg := status.Convert(err).Message()
			if strings.Contains(msg, mergeDifferentReplicas) && refusals < maxColocations && routeBackoff(ctx, 25) {
				// A replica moved (the replicate queue) after the routing
				// check: read the ranges afresh, 50 ms on, and colocate again.
				refusals++
				continue
			}
			return nil, mergeRefusal(msg)
		default:
			return nil, err
		}
	}
}

// grewPast returns the descriptor in descs of range was, grown past was's
// end (it absorbed its neighbour: merged), or nil.
func grewPast(descs []*pb.RangeDescriptor, was *pb.RangeDescriptor) *pb.RangeDescriptor {
	if was == nil || len(was.GetEndKey()) == 0 {
		return nil
	}
	for _, d := range descs {
		if d.GetRangeId() == was.GetRangeId() && !d.GetSubsumed() &&
			(len(d.GetEndKey()) == 0 || bytes.Compare(d.GetEndKey(), was.GetEndKey()) > 0) {
			return d
		}
	}
	return nil
}

// mergeable checks, by the routing cache, that range d may absorb its right
// neighbour: the leader checks again by its own state.
func (c *Coordinator) mergeable(ctx context.Context, d *pb.RangeDescriptor) error {
	if len(d.GetEndKey()) == 0 {
		return fmt.Errorf("%w: range %d [%q, end of the key space)", ErrMergeLast, d.GetRangeId(), d.GetStartKey())
	}
	right, err := c.routes.Lookup(ctx, d.GetEndKey())
	if err != nil {
		return fmt.Errorf("%w: routing %q: %v", ErrUnavailable, d.GetEndKey(), err)
	}
	if right.GetRegion() != d.GetRegion() {
		return fmt.Errorf("%w: range %d is homed in %s, range %d in %s", ErrMergeRegions, d.GetRangeId(), d.GetRegion(), right.GetRangeId(), right.GetRegion())
	}
	if !routing.SameNodes(d.GetReplicas(), right.GetReplicas()) || !routing.SameNodes(d.GetNonVoters(), right.GetNonVoters()) {
		return &misplaced{right: right, err: fmt.Errorf("%w: range %d on nodes %v (non-voters %v), range %d on %v (non-voters %v)", ErrMergeReplicas,
			d.GetRangeId(), d.GetReplicas(), d.GetNonVoters(), right.GetRangeId(), right.GetReplicas(), right.GetNonVoters())}
	}
	return nil
}

// misplaced is mergeable's refusal of neighbours on different nodes
// (ErrMergeReplicas), with the right one's descriptor for colocate.
type misplaced struct {
	right *pb.RangeDescriptor
	err   error
}

func (m *misplaced) Error() string { return m.err.Error() }
func (m *misplaced) Unwrap() error { return m.err }

// maxColocations bounds how often one merge moves its right-hand range onto
// the left's nodes (the replicate queue may move one away meanwhile).
const maxColocations = 3

// errColocated: colocate moved the right-hand range; route and ask again.
var errColocated = errors.New("coordinator: the right-hand range moved onto the left's nodes")

// colocate moves right's replicas onto left's nodes, one replica move
// (DESIGN.md §12) per node of right's that left lacks, as CockroachDB's
// merge queue relocates a right-hand range before it merges, and gives it
// left's non-voting replicas (§13). It returns errColocated once they
// match, or ErrMergeReplicas when a change fails.
func (c *Coordinator) colocate(ctx context.Context, left, right *pb.RangeDescriptor) error {
	var extra, missing []uint64
	for _, n := range right.GetReplicas() {
		if !slices.Contains(left.GetReplicas(), n) {
			extra = append(extra, n)
		}
	}
	for _, n := range left.GetReplicas() {
		if !slices.Contains(right.GetReplicas(), n) {
			missing = append(missing, n)
		}
	}
	if len(extra) != len(missing) {
		return fmt.Errorf("%w: range %d on nodes %v, range %d on %v (not as many)", ErrMergeReplicas, left.GetRangeId(), left.GetReplicas(), right.GetRangeId(), right.GetReplicas())
	}
	for i := range extra {
		if _, err := c.MoveReplica(ctx, right.GetStartKey(), extra[i], missing[i]); err != nil {
			return fmt.Errorf("%w: moving range %d's replica from node %d to node %d, to join range %d's: %v",
				ErrMergeReplicas, right.GetRangeId(), extra[i], missing[i], left.GetRangeId(), err)
		}
	}
	// Non-voting replicas (DESIGN.md §13) as the left's: the missing ones
	// added first, so the region served keeps one.
	for _, n := range left.GetNonVoters() {
		if !slices.Contains(right.GetNonVoters(), n) {
			if _, err := c.ChangeNonVoter(ctx, right.GetStartKey(), n, false); err != nil {
				return fmt.Errorf("%w: adding range %d's non-voter on node %d, as range %d has: %v", ErrMergeReplicas, right.GetRangeId(), n, left.GetRangeId(), err)
			}
		}
	}
	for _, n := range right.GetNonVoters() {
		if !slices.Contains(left.GetNonVoters(), n) {
			if _, err := c.ChangeNonVoter(ctx, right.GetStartKey(), n, true); err != nil {
				return fmt.Errorf("%w: removing range %d's non-voter on node %d, which range %d lacks: %v", ErrMergeReplicas, right.GetRangeId(), n, left.GetRangeId(), err)
			}
		}
	}
	slog.Info("merge: right-hand range moved onto the left's nodes", "left", left.GetRangeId(), "right", right.GetRangeId(), "replicas", left.GetReplicas())
	return errColocated
}

// mergeDifferentReplicas is in a leader's refusal of a merge of ranges
// whose replicas differ (rangeserver.ErrMergeReplicas).
const mergeDifferentReplicas = "different replicas"

// mergeRefusal types a leader's refusal of a merge by its message.
func mergeRefusal(msg string) error {
	for _, r := range []struct {
		says string
		err  error
	}{{"has no right neighbour", ErrMergeLast}, {"different home regions", ErrMergeRegions}, {mergeDifferentReplicas, ErrMergeReplicas}} {
		if strings.Contains(msg, r.says) {
			return fmt.Errorf("%w: %s", r.err, msg)
		}
	}
	return fmt.Errorf("%w: %s", ErrMergeReplicas, msg)
}

// splitAt returns the ranges on either side of a boundary at key, as the
// nodes report them, or nils if key is no range's start.
func (c *Coordinator) splitAt(ctx context.Context, key []byte) (left, right *pb.RangeDescriptor) {
	descs, err := c.nodes.Resolve(ctx, key)
	if err != nil {
		return nil, nil
	}
	c.routes.Update(descs...)
	for _, d := range descs {
		switch {
		case bytes.Equal(d.GetStartKey(), key) && (right == nil || d.GetGeneration() > right.GetGeneration()):
			right = d
		case bytes.Equal(d.GetEndKey(), key) && (left == nil || d.GetGeneration() > left.GetGeneration()):
			left = d
		}
	}
	if left == nil || right == nil {
		return nil, nil
	}
	return left, right
}
