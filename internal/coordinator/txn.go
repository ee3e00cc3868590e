package coordinator

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/terroir-db/terroir/internal/commitrule"
	"github.com/terroir-db/terroir/internal/epoch"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/routing"
	"github.com/terroir-db/terroir/internal/storage"
	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/txnstate/txnstatepb"
)

// notifyTimeout bounds the commit notification sent after the commit point.
const notifyTimeout = 5 * time.Second

// Txn is one read-write transaction. Its methods are safe for concurrent use but
// run one at a time.
type Txn struct {
	c    *Coordinator
	meta *pb.TxnMeta

	mu       sync.Mutex
	writes   map[string]*pb.Write    // buffered until commit
	parts    map[uint64]*participant // by range ID
	finished bool
	failed   error // the step that ended the transaction (DESIGN.md §10)
	hb       *heartbeater
}

// participant is one range the transaction touched.
type participant struct {
	desc        *pb.RangeDescriptor
	spans       map[string]struct{} // distinct spans locked there
	writes      map[string]struct{} // keys of buffered writes whose exclusive lock is there
	incarnation uint64              // the leader's record our locks belong to (0: none yet)
}

// locked records a lock taken at p under incarnation inc. A different
// incarnation than before means the earlier locks are gone: the transaction
// can no longer commit.
func (p *participant) locked(span string, inc uint64) error {
	if p.incarnation != 0 && p.incarnation != inc {
		return fmt.Errorf("%w: range %d lost this transaction's locks", ErrConflict, p.desc.GetRangeId())
	}
	p.incarnation = inc
	p.spans[span] = struct{}{}
	return nil
}

// pointSpan and rangeSpan name locked spans unambiguously (keys may hold any byte).
func pointSpan(key []byte) string { return "p" + string(key) }

func rangeSpan(start, end []byte) string {
	return "r" + string(binary.BigEndian.AppendUint32(nil, uint32(len(start)))) + string(start) + string(end)
}

// Priority returns the transaction's wait-die priority (pass it to Begin when
// retrying, so the retry keeps its age).
func (t *Txn) Priority() uint64 { return t.meta.GetPriority() }

func (t *Txn) part(g *pb.RangeDescriptor) *participant {
	p, ok := t.parts[g.GetRangeId()]
	if !ok {
		p = &participant{desc: g, spans: map[string]struct{}{}, writes: map[string]struct{}{}}
		t.parts[g.GetRangeId()] = p
	}
	return p
}

// local refuses a range homed outside the client's region unless both regions
// take part in the global epoch: versions across regions need it (paper §4.3).
func (c *Coordinator) local(g *pb.RangeDescriptor) error {
	region := g.GetRegion()
	if region == c.region {
		return nil
	}
	if c.global != nil && len(c.top.GroupsOfKind(topology.KindPublisher, region)) > 0 && c.epochs[region] != nil {
		return nil
	}
	return fmt.Errorf("%w: range %d is in %s, the client in %s, and not both have a publisher", ErrCrossRegion, g.GetRangeId(), region, c.region)
}

// begin checks the transaction is still open and has not failed; callers
// hold t.mu.
func (t *Txn) begin() error {
	if t.finished {
		return ErrTxnFinished
	}
	if t.failed == nil {
		if lost := t.hb.lostErr(); lost != nil {
			t.fail(context.Background(), lost)
		}
	}
	if t.failed != nil {
		return fmt.Errorf("%w: an earlier step failed: %v", ErrAborted, t.failed)
	}
	return nil
}

// fail ends the transaction after a step that reached the cluster failed
// (DESIGN.md §10): a conflict, lost locks, a failed validation, or an
// unknown outcome. The step's own error is returned; every later step and
// Commit return ErrAborted, so no commit carries part of what the
// application asked. Bad input found before any request was sent (a key too
// large, a key homed where the client cannot write) ends nothing. Callers
// hold t.mu.
func (t *Txn) fail(ctx context.Context, err error) error {
	if isInputError(err) || errors.Is(err, ErrCrossRegion) || t.failed != nil {
		return err
	}
	t.failed = err
	t.hb.stop()
	t.abortAll(ctx)
	return err
}

// track records a lock taken at range g under incarnation inc, for the commit
// and the heartbeats. A different incarnation than before fails the
// transaction: its earlier locks there are gone.
func (t *Txn) track(g *pb.RangeDescriptor, span string, inc uint64) error {
	if err := t.part(g).locked(span, inc); err != nil {
		return err
	}
	t.hb.track(g, inc)
	return nil
}

// Get returns key's value (ok false if absent), taking a shared lock on it. A
// key this transaction wrote reads back its own write.
func (t *Txn) Get(ctx context.Context, key []byte) (value []byte, ok bool, err error) {
	if err := CheckKey(key); err != nil {
		return nil, false, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.begin(); err != nil {
		return nil, false, err
	}
	if w, buffered := t.writes[string(key)]; buffered {
		return w.GetValue(), !w.GetTombstone(), nil
	}
	err = t.c.routeKey(ctx, key, t.c.local, func(g *pb.RangeDescriptor) error {
		var inc uint64
		err := t.c.rangeCall(ctx, g, true, func(ctx context.Context, rc pb.RangeClient) error {
			resp, err := rc.Get(ctx, &pb.GetRequest{RangeId: g.GetRangeId(), Txn: t.meta, Key: key})
			value, ok, inc = resp.GetValue(), resp.GetFound(), resp.GetIncarnation()
			return err
		})
		if err != nil {
			return err
		}
		return t.track(g, pointSpan(key), inc)
	})
	if err != nil {
		return nil, false, t.fail(ctx, err)
	}
	return value, ok, nil
}

// KeyValue is one scan result.
type KeyValue struct {
	Key, Value []byte
}

// Scan returns up to limit (0: no limit) key-value pairs with lo ≤ key < hi in
// key order (a nil hi scans to the end of the key space), taking shared
// key-range locks so that no key can appear in the range until the transaction
// ends. It fails with ErrInvalidRange if hi < lo.
func (t *Txn) Scan(ctx context.Context, lo, hi []byte, limit int) ([]KeyValue, error) {
	if err := checkScan(lo, hi); err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.begin(); err != nil {
		return nil, err
	}
	var out []KeyValue
	err := t.c.routeSpan(ctx, lo, hi, t.c.local, func(part routing.Part) (bool, error) {
		g, start, end := part.Desc, part.Start, part.End
		// Ask for enough that buffered deletes cannot leave us short.
		want := 0
		if limit > 0 {
			want = limit - len(out) + t.bufferedDeletes(start, end)
		}
		var resp *pb.ScanResponse
		err := t.c.rangeCallBulk(ctx, g, true, func(ctx context.Context, rc pb.RangeClient) error {
			var err error
			resp, err = rc.Scan(ctx, &pb.ScanRequest{RangeId: g.GetRangeId(), Txn: t.meta, Start: start, End: end, Limit: uint32(want)})
			return err
		})
		if err == nil {
			err = t.track(g, rangeSpan(start, end), resp.GetIncarnation())
		}
		if err != nil {
			return false, err
		}
		kvs := resp.GetKvs()
		out = t.overlay(out, kvs, start, end, want == 0 || len(kvs) < want)
		return limit > 0 && len(out) >= limit, nil
	})
	if err != nil {
		return nil, t.fail(ctx, err)
	}
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// checkScan validates a scan's bounds.
func checkScan(lo, hi []byte) error {
	if hi != nil && bytes.Compare(hi, lo) < 0 {
		return ErrInvalidRange
	}
	if len(lo) > MaxKeySize || len(hi) > MaxKeySize {
		return fmt.Errorf("%w: scan bound", ErrKeyTooLarge)
	}
	return nil
}

func inSpan(key, start, end []byte) bool {
	return bytes.Compare(key, start) >= 0 && (end == nil || bytes.Compare(key, end) < 0)
}

func (t *Txn) bufferedDeletes(start, end []byte) int {
	n := 0
	for k, w := range t.writes {
		if w.GetTombstone() && inSpan([]byte(k), start, end) {
			n++
		}
	}
	return n
}

// overlay merges the transaction's buffered writes in [start, end) into the
// stored values kvs and appends the result to out, in key order. complete is
// false when the range's answer was cut by a limit.
func (t *Txn) overlay(out []KeyValue, kvs []*pb.KeyValue, start, end []byte, complete bool) []KeyValue {
	merged := map[string][]byte{}
	for _, kv := range kvs {
		merged[string(kv.GetKey())] = kv.GetValue()
	}
	// When the answer was cut by its limit, a buffered write past the last
	// returned key may not be added: an unreturned stored key could sort before it.
	var last []byte
	if len(kvs) > 0 {
		last = kvs[len(kvs)-1].GetKey()
	}
	for k, w := range t.writes {
		if !inSpan([]byte(k), start, end) {
			continue
		}
		if w.GetTombstone() {
			delete(merged, k)
		} else if last == nil || bytes.Compare([]byte(k), last) <= 0 || complete {
			merged[k] = w.GetValue()
		}
	}
	keys := make([]string, 0, len(merged))
	for k := range merged {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		out = append(out, KeyValue{Key: []byte(k), Value: merged[k]})
	}
	return out
}

// Put writes key = value at commit, taking key's exclusive lock now.
func (t *Txn) Put(ctx context.Context, key, value []byte) error {
	if err := CheckValue(value); err != nil {
		return err
	}
	return t.write(ctx, &pb.Write{Key: append([]byte{}, key...), Value: append([]byte{}, value...)})
}

// Delete removes key at commit, taking key's exclusive lock now.
func (t *Txn) Delete(ctx context.Context, key []byte) error {
	return t.write(ctx, &pb.Write{Key: append([]byte{}, key...), Tombstone: true})
}

func (t *Txn) write(ctx context.Context, w *pb.Write) error {
	if err := CheckKey(w.GetKey()); err != nil {
		return err
	}
	if err := t.c.checkPlacement(w.GetKey()); err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.begin(); err != nil {
		return err
	}
	if _, locked := t.writes[string(w.GetKey())]; !locked {
		err := t.c.routeKey(ctx, w.GetKey(), t.c.local, func(g *pb.RangeDescriptor) error {
			var inc uint64
			err := t.c.rangeCall(ctx, g, true, func(ctx context.Context, rc pb.RangeClient) error {
				resp, err := rc.Lock(ctx, &pb.LockRequest{RangeId: g.GetRangeId(), Txn: t.meta, Key: w.GetKey()})
				inc = resp.GetIncarnation()
				return err
			})
			if err != nil {
				return err
			}
			if err := t.track(g, pointSpan(w.GetKey()), inc); err != nil {
				return err
			}
			t.part(g).writes[string(w.GetKey())] = struct{}{}
			return nil
		})
		if err != nil {
			return t.fail(ctx, err)
		}
	}
	t.writes[string(w.GetKey())] = w
	return nil
}

// writesFor returns the buffered writes whose exclusive lock p holds: the
// range they were routed to when they executed, not the one a descriptor
// cached since would name.
func (t *Txn) writesFor(p *participant) []*pb.Write {
	out := make([]*pb.Write, 0, len(p.writes))
	for k := range p.writes {
		out = append(out, t.writes[k])
	}
	return out
}

// Abort ends the transaction without effect and releases its locks (a failed
// transaction released them when it failed). Aborting a finished
// transaction returns ErrTxnFinished.
func (t *Txn) Abort(ctx context.Context) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.finished {
		return ErrTxnFinished
	}
	t.finished = true
	t.hb.stop()
	if t.failed == nil {
		t.abortAll(ctx)
	}
	return nil
}

// abortAll tells every participant to drop the transaction (best effort: a
// participant that misses it resolves the transaction itself). A participant
// that changed shape since (a mismatch reply: a split handed some of its
// locks to a new range) makes it tell, in a second round, every range that
// now holds a span or write the transaction tracked. It runs even when ctx
// has ended, for one second per round.
func (t *Txn) abortAll(ctx context.Context) {
	ctx = context.WithoutCancel(ctx)
	descs := make([]*pb.RangeDescriptor, 0, len(t.parts))
	for _, p := range t.parts {
		descs = append(descs, p.desc)
	}
	if t.abortAt(ctx, descs) {
		t.abortAt(ctx, t.rangesHoldingTracked(ctx))
	}
}

// abortAt sends Abort to every range of descs in parallel, naming the
// generation it is known by, and reports whether one changed shape since.
func (t *Txn) abortAt(ctx context.Context, descs []*pb.RangeDescriptor) (reshaped bool) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, g := range descs {
		wg.Add(1)
		go func(g *pb.RangeDescriptor) {
			defer wg.Done()
			actx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			_ = t.tell(actx, g, func(ctx context.Context, rc pb.RangeClient, id uint64) error {
				gen := g.GetGeneration()
				if id != g.GetRangeId() {
					gen = 0 // rerouted: the range that took g's record
				}
				resp, err := rc.Abort(ctx, &pb.AbortRequest{RangeId: id, TxnId: t.meta.GetId(), Generation: gen})
				if resp.GetReshaped() {
					t.c.routes.Update(resp.GetDescriptors()...)
					mu.Lock()
					reshaped = true
					mu.Unlock()
				}
				return err
			})
		}(g)
	}
	wg.Wait()
	return reshaped
}

// tell sends the transaction's outcome to participant g by send (given the
// range ID to name), retrying as rangeCall does. If g was merged away since
// (a mismatch reply), it tells the range that now holds g's start key
// instead, which took g's prepared record.
func (t *Txn) tell(ctx context.Context, g *pb.RangeDescriptor, send func(ctx context.Context, rc pb.RangeClient, id uint64) error) error {
	first := true
	return t.c.routeKey(ctx, g.GetStartKey(), nil, func(d *pb.RangeDescriptor) error {
		if first { // the participant itself; after a mismatch, the range holding its start
			d, first = g, false
		}
		return t.c.rangeCall(ctx, d, true, func(ctx context.Context, rc pb.RangeClient) error {
			return send(ctx, rc, d.GetRangeId())
		})
	})
}

// rangesHoldingTracked returns, as the routing cache has them, the ranges
// that hold a span the transaction locked or a key it wrote.
func (t *Txn) rangesHoldingTracked(ctx context.Context) []*pb.RangeDescriptor {
	byID := map[uint64]*pb.RangeDescriptor{}
	add := func(lo, hi []byte, point bool) {
		if point {
			if d, err := t.c.routes.Lookup(ctx, lo); err == nil {
				byID[d.GetRangeId()] = d
			}
			return
		}
		parts, _ := t.c.routes.Overlapping(ctx, lo, hi)
		for _, p := range parts {
			byID[p.Desc.GetRangeId()] = p.Desc
		}
	}
	for _, p := range t.parts {
		for span := range p.spans {
			if lo, hi, point, err := decodeSpan(span); err == nil {
				add(lo, hi, point)
			}
		}
		for key := range p.writes {
			add([]byte(key), nil, true)
		}
	}
	out := make([]*pb.RangeDescriptor, 0, len(byID))
	for _, d := range byID {
		out = append(out, d)
	}
	return out
}

// Commit commits the transaction and returns its version id. On a retryable
// error (IsRetryable) nothing was committed — after a failed step that is
// ErrAborted; on ErrCommitUnknown the outcome is unknown. Either way the
// transaction is finished.
func (t *Txn) Commit(ctx context.Context) (storage.VersionID, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.begin(); err != nil {
		if !errors.Is(err, ErrTxnFinished) {
			t.finished = true
		}
		return storage.VersionID{}, err
	}
	t.finished = true
	// The heartbeats run until the outcome is known: a participant may wait
	// for a quiet epoch or the commit record with the locks held.
	defer t.hb.stop()
	for attempt := 0; ; attempt++ {
		var v storage.VersionID
		var err error
		switch len(t.parts) {
		case 0:
			return storage.VersionID{}, nil
		case 1:
			for _, p := range t.parts {
				v, err = t.commitOnePhase(ctx, p)
			}
		default:
			v, err = t.commitTwoPhase(ctx)
		}
		if !isReshaped(err) {
			return v, err
		}
		// A participant changed shape; nothing was decided.
		if attempt == maxRepartitions {
			t.abortAll(ctx)
			return storage.VersionID{}, err
		}
		if rerr := t.repartition(ctx); rerr != nil {
			t.abortAll(ctx)
			return storage.VersionID{}, rerr
		}
	}
}

// commitOnePhase commits at the single participant's leader (DESIGN.md §4).
func (t *Txn) commitOnePhase(ctx context.Context, p *participant) (storage.VersionID, error) {
	var ver *pb.VersionID
	err := t.c.rangeCall(ctx, p.desc, false, func(ctx context.Context, rc pb.RangeClient) error {
		resp, err := rc.CommitOnePhase(ctx, &pb.OnePhaseRequest{
			RangeId: p.desc.GetRangeId(), Txn: t.meta, Writes: t.writesFor(p),
			MinEpoch: t.c.session.Load(), LockCount: uint32(len(p.spans)), Incarnation: p.incarnation,
			Generation: p.desc.GetGeneration(),
		})
		ver = resp.GetVersion()
		return err
	})
	if err != nil {
		if IsRetryable(err) && !isReshaped(err) {
			t.abortAll(ctx)
		}
		return storage.VersionID{}, err
	}
	t.c.raiseSession(ver.GetEpoch())
	return storage.VersionID{Epoch: ver.GetEpoch(), Counter: ver.GetCounter()}, nil
}

func (c *Coordinator) raiseSession(e uint64) {
	for {
		cur := c.session.Load()
		if e <= cur || c.session.CompareAndSwap(cur, e) {
			return
		}
	}
}

type prepared struct {
	p    *participant
	resp *pb.PrepareResponse
	err  error
}

// commitTwoPhase runs 2PC (DESIGN.md §4.2–4.5).
func (t *Txn) commitTwoPhase(ctx context.Context) (storage.VersionID, error) {
	// Prepare everywhere in parallel with the local epoch read: every lock is
	// already held (invariant 4).
	results := make(chan prepared, len(t.parts))
	for _, p := range t.parts {
		go func(p *participant) {
			var resp *pb.PrepareResponse
			err := t.c.rangeCall(ctx, p.desc, true, func(ctx context.Context, rc pb.RangeClient) error {
				var err error
				resp, err = rc.Prepare(ctx, &pb.PrepareRequest{
					RangeId: p.desc.GetRangeId(), Txn: t.meta, Writes: t.writesFor(p), LockCount: uint32(len(p.spans)),
					Incarnation: p.incarnation, Generation: p.desc.GetGeneration(),
				})
				return err
			})
			results <- prepared{p, resp, err}
		}(p)
	}
	// The local epoch of every region touched (paper §4.3), and the global one.
	var regions []string
	seen := map[string]bool{}
	for _, p := range t.parts {
		if !seen[p.desc.GetRegion()] {
			seen[p.desc.GetRegion()] = true
			regions = append(regions, p.desc.GetRegion())
		}
	}
	locals, global, epochErr := t.c.readEpochs(ctx, regions, t.meta.GetCommitMode() == pb.CommitMode_COMMIT_MODE_NAIVE)
	var preps []prepared
	var firstErr error
	reshaped := false
	for range t.parts {
		r := <-results
		preps = append(preps, r)
		switch {
		case isReshaped(r.err):
			reshaped = true
		case r.err != nil && firstErr == nil:
			firstErr = r.err
		}
	}
	if firstErr == nil && reshaped {
		// Nothing decided: the caller moves the participants and prepares
		// again (a participant that prepared takes the same prepare again).
		return storage.VersionID{}, errStaleRoute
	}
	if firstErr == nil && epochErr != nil {
		firstErr = fmt.Errorf("%w: reading epochs: %v", ErrUnavailable, epochErr)
	}
	// The version's epoch is the global one, raised to every participant's
	// highest and this client's (paper §5.1); then every participant's lease
	// must hold its region's local epoch (and, with local-epoch versions, the
	// version's epoch) (paper §4.2).
	versionEpoch := commitrule.VersionEpoch(global, t.c.session.Load())
	var newest storage.VersionID
	newestRegional := map[string]storage.VersionID{} // by region
	for _, r := range preps {
		if firstErr != nil {
			break
		}
		versionEpoch = commitrule.VersionEpoch(versionEpoch, r.resp.GetHighestEpoch())
		if mv := versionOf(r.resp.GetMaxVersion()); newest.Less(mv) {
			newest = mv
		}
		if mr := versionOf(r.resp.GetMaxRegionalVersion()); newestRegional[r.p.desc.GetRegion()].Less(mr) {
			newestRegional[r.p.desc.GetRegion()] = mr
		}
	}
	for _, r := range preps {
		if firstErr != nil {
			break
		}
		l := commitrule.Lease{Start: r.resp.GetLease().GetStart(), End: r.resp.GetLease().GetEnd()}
		if err := commitrule.Validate(locals[r.p.desc.GetRegion()], versionEpoch, l, t.c.global == nil); err != nil {
			firstErr = fmt.Errorf("%w: range %d: %v", ErrConflict, r.p.desc.GetRangeId(), err)
		}
	}
	if firstErr != nil {
		t.abortAll(ctx)
		if isAmbiguousPrepare(firstErr) {
			return storage.VersionID{}, fmt.Errorf("%w: %v", ErrConflict, firstErr)
		}
		return storage.VersionID{}, firstErr
	}
	// Quiet epochs (paper §5.3.1): a writer whose epoch is quiet waits, locks
	// held, for the next one.
	for firstErr == nil && t.c.global != nil && len(t.writes) > 0 && commitrule.IsQuiet(versionEpoch, t.c.quiet) {
		if versionEpoch, firstErr = epoch.WaitAtLeast(ctx, t.c.publishers[regions[0]], versionEpoch+1, time.Millisecond); firstErr != nil {
			firstErr = fmt.Errorf("%w: waiting out quiet epoch: %v", ErrUnavailable, firstErr)
		}
	}
	if firstErr != nil {
		t.abortAll(ctx)
		return storage.VersionID{}, firstErr
	}
	ver := wireVersion(commitrule.ChooseVersion(versionEpoch, newest))
	// Regions with a publisher also store the writes under local-epoch
	// versions, one per region (paper §5.4).
	regional := map[string]*pb.VersionID{}
	for _, r := range regions {
		if _, ok := t.c.publishers[r]; ok && t.c.global != nil {
			regional[r] = wireVersion(commitrule.ChooseVersion(locals[r], newestRegional[r]))
		}
	}

	if t.crashes(CrashAfterPrepare) {
		return storage.VersionID{}, fmt.Errorf("%w: the coordinator crashed %v", ErrCommitUnknown, CrashAfterPrepare)
	}
	t.stalls(ctx)
	// The commit point: record the decision (DESIGN.md §4.4).
	rec := &txnstatepb.Record{TxnId: t.meta.GetId(), Outcome: txnstatepb.Outcome_OUTCOME_COMMITTED,
		Version: &txnstatepb.VersionID{Epoch: ver.GetEpoch(), Counter: ver.GetCounter()}, LocalEpochs: map[string]uint64{}}
	for _, p := range t.parts {
		region := p.desc.GetRegion()
		rec.LocalEpochs[region] = locals[region] // validated against (see forgetting, DESIGN.md §14)
		part := &txnstatepb.Participant{RangeId: p.desc.GetRangeId(), Writes: len(t.writesFor(p)) > 0,
			StartKey: p.desc.GetStartKey(), Region: region}
		if rv := regional[p.desc.GetRegion()]; rv != nil {
			part.RegionalVersion = &txnstatepb.VersionID{Epoch: rv.GetEpoch(), Counter: rv.GetCounter()}
		}
		rec.Participants = append(rec.Participants, part)
	}
	won, err := t.c.txnState.Decide(ctx, rec)
	if err != nil {
		return storage.VersionID{}, fmt.Errorf("%w: recording the commit: %v", ErrCommitUnknown, err)
	}
	if won.GetOutcome() != txnstatepb.Outcome_OUTCOME_COMMITTED {
		t.abortAll(ctx)
		return storage.VersionID{}, fmt.Errorf("%w: a participant resolved the transaction as aborted", ErrAborted)
	}
	t.c.raiseSession(ver.GetEpoch())
	if t.crashes(CrashAfterCommitRecord) {
		return storage.VersionID{}, fmt.Errorf("%w: the coordinator crashed %v", ErrCommitUnknown, CrashAfterCommitRecord)
	}
	if t.meta.GetCommitMode() == pb.CommitMode_COMMIT_MODE_COMMIT_WAIT && len(t.writes) > 0 {
		// The baseline: wait out a clock uncertainty before acknowledging and
		// releasing the locks.
		time.Sleep(time.Duration(t.meta.GetCommitWaitUs()) * time.Microsecond)
	}
	// Tell the participants, in the background: the outcome is durable, and a
	// participant that misses this resolves it through the state store. A
	// participant merged away since answers with a mismatch; the range that
	// now holds its start key took its prepared record, and is told instead.
	parts := make([]*pb.RangeDescriptor, 0, len(t.parts))
	for _, p := range t.parts {
		parts = append(parts, p.desc)
	}
	t.c.wg.Add(1)
	go func() {
		defer t.c.wg.Done()
		nctx, cancel := context.WithTimeout(context.Background(), notifyTimeout)
		defer cancel()
		var wg sync.WaitGroup
		var failed atomic.Bool
		for _, g := range parts {
			wg.Add(1)
			go func(g *pb.RangeDescriptor) {
				defer wg.Done()
				err := t.tell(nctx, g, func(ctx context.Context, rc pb.RangeClient, id uint64) error {
					_, err := rc.Commit(ctx, &pb.CommitRequest{RangeId: id, TxnId: t.meta.GetId(), Version: ver, RegionalVersion: regional[g.GetRegion()]})
					return err
				})
				if err != nil {
					failed.Store(true)
				}
			}(g)
		}
		wg.Wait()
		if !failed.Load() { // every participant applied the commit
			t.c.forget.add(t.meta.GetId())
		}
	}()
	return storage.VersionID{Epoch: ver.GetEpoch(), Counter: ver.GetCounter()}, nil
}

func versionOf(v *pb.VersionID) storage.VersionID {
	return storage.VersionID{Epoch: v.GetEpoch(), Counter: v.GetCounter()}
}

func wireVersion(v storage.VersionID) *pb.VersionID {
	return &pb.VersionID{Epoch: v.Epoch, Counter: v.Counter}
}

// isAmbiguousPrepare reports a prepare failure that is not already typed: since no
// commit was recorded, the transaction is aborted and may be retried.
func isAmbiguousPrepare(err error) bool {
	return !IsRetryable(err) && !isInputError(err)
}

func isInputError(err error) bool {
	for _, e := range []error{ErrKeyTooLarge, ErrValueTooLarge, ErrEmptyKey, ErrInvalidRange, ErrTxnFinished} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
