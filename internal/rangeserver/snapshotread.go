package rangeserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/terroir-db/terroir/internal/epoch"
	"github.com/terroir-db/terroir/internal/locktable"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/storage"
)

// ErrSnapshotEpoch: the epoch a snapshot reads at did not arrive in time (the
// region's publisher lags or refuses).
var ErrSnapshotEpoch = errors.New("rangeserver: snapshot epoch not reached")

// snapshotPoll is how often a snapshot read re-reads the epoch it waits for;
// snapshotEpochWait bounds that wait (the caller may retry).
const (
	snapshotPoll      = time.Millisecond
	snapshotEpochWait = 5 * time.Second
)

// followerEpochSlack is how much longer than its closed-epoch wait a
// follower read may wait for its publisher to show the epoch.
const followerEpochSlack = 100 * time.Millisecond

// awaitEpoch waits, at most snapshotEpochWait, until src shows at least
// at, and returns what it showed. Errors: ErrSnapshotEpoch.
func (r *Replica) awaitEpoch(ctx context.Context, src epoch.Source, at uint64) (uint64, error) {
	ectx, cancel := context.WithTimeout(ctx, snapshotEpochWait)
	defer cancel()
	got, err := epoch.WaitAtLeast(ectx, src, at, snapshotPoll)
	if err != nil {
		return 0, fmt.Errorf("%w: %d: %v", ErrSnapshotEpoch, at, err)
	}
	return got, nil
}

// SnapshotRead serves one read of a snapshot transaction (paper §5.2,
// Algorithm 1; DESIGN.md §5). It waits until the region's publisher (for a
// regional read: its local epoch) shows at least req.At, so that every
// transaction that could still commit below <At, 0> already holds its locks;
// reads l_R (once per snapshot and region: the caller passes it back); refuses
// if l_R is past this leader's lease; waits until the transactions holding an
// exclusive lock on the span have finished; and reads the newest versions
// below <At, 0>. It takes no lock, so it never delays a writer.
//
// With req.Closed it is served instead, by any replica, from the closed
// epoch (DESIGN.md §13): no epoch or lock wait, at epochs up to the closed
// epoch + 1.
//
// Errors: a *MismatchError (keys outside the range), ErrNotLeaseholder (retry at another replica),
// ErrSnapshotEpoch, ErrSnapshotTooOld (below the range's GC threshold),
// ErrNotClosed (a closed read above the closed epoch + 1), ErrBadRequest (a
// closed read of regional versions), or ctx's error.
func (r *Replica) SnapshotRead(ctx context.Context, req *pb.SnapshotReadRequest) (*pb.SnapshotReadResponse, error) {
	start, end := req.GetStart(), req.GetEnd()
	if len(end) == 0 {
		end = nil
	}
	hm := r.home.Load() // one home throughout, should a rehome apply meanwhile
	h := hm.Epochs
	ks := Versions
	if h.Publisher != nil && req.GetRegional() {
		ks = RegionalVersions
	}
	// Checked before the read and again after it: a GC below the snapshot
	// that applied meanwhile may have removed what the read saw missing.
	oldest := req.GetAt()
	if req.GetChanges() {
		oldest = min(oldest, req.GetSince()) // every version from since on must be intact
	}
	check := func() error {
		if d := r.sm.Descriptor(); req.GetHome() != "" && req.GetHome() != d.GetRegion() || ks == RegionalVersions && d.GetRegion() != hm.Region {
			// Local epochs of another region than the reader's: the range
			// was rehomed (DESIGN.md §13).
			return &MismatchError{Desc: d, Keys: fmt.Sprintf("a read in %s's local epochs", req.GetHome()), Start: d.GetStartKey()}
		}
		if err := r.sm.checkSnapshotAge(ks, oldest); err != nil {
			return err
		}
		if !req.GetScan() {
			return r.checkKey(start)
		}
		return r.checkSpan(start, end)
	}
	if err := check(); err != nil {
		return nil, err
	}
	if req.GetScan() {
		if end != nil && bytes.Compare(start, end) >= 0 {
			return &pb.SnapshotReadResponse{LocalEpoch: req.GetLocalEpoch()}, nil
		}
	}
	if req.GetClosed() {
		// Every version at or below the closed epoch is applied here and
		// final (DESIGN.md §13): no leader, no epoch or lock wait.
		if ks == RegionalVersions {
			return nil, fmt.Errorf("%w: regional snapshots are not served from the closed epoch", ErrBadRequest)
		}
		wait := time.Duration(req.GetClosedWaitUs()) * time.Microsecond
		resp := &pb.SnapshotReadResponse{}
		if wait > 0 && req.GetAt() > r.sm.ClosedEpoch()+1 {
			// A follower read (DESIGN.md §13) first waits what the leader
			// would — for the publisher to show the epoch — then at most
			// wait more for a close to cover it.
			began := time.Now()
			src := h.closing()
			if h.Near != nil {
				src = h.Near // within one epoch of the home's (invariant 2)
			}
			// As long as the caller would wait for a close, and no longer:
			// a publisher that lags or refuses sends the read to the leader.
			actx, cancel := context.WithTimeout(ctx, wait+followerEpochSlack)
			_, err := r.awaitEpoch(actx, src, req.GetAt())
			cancel()
			if err != nil {
				return nil, fmt.Errorf("%w: epoch %d not reached here in time: %v", ErrNotClosed, req.GetAt(), err)
			}
			resp.EpochWaitUs = uint64(time.Since(began).Microseconds())
		}
		c, err := r.closedRead(ctx, req.GetAt(), wait)
		if err != nil {
			return nil, err
		}
		resp.ClosedEpoch = c
		return r.readVersions(ks, req, resp, end, check)
	}
	if _, err := r.leader(); err != nil {
		return nil, err
	}
	r.load.record(start)
	src := h.closing()
	if req.GetRegional() { // local-epoch versions
		src = h.Local
	}
	began := time.Now()
	got, err := r.awaitEpoch(ctx, src, req.GetAt())
	if err != nil {
		return nil, err
	}
	lR := req.GetLocalEpoch()
	if lR == 0 {
		if src == h.Local {
			lR = got
		} else if lR, err = h.Local.Read(ctx); err != nil {
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
	if err := l.txns.locks.WaitNoExclusive(wctx, span); err != nil {
		if ctx.Err() == nil {
			return nil, fmt.Errorf("%w: the lease ended while waiting for locks", ErrNotLeaseholder)
		}
		return nil, err
	}
	resp.LockWaitUs = uint64(time.Since(began).Microseconds())
	if cur, _ := r.leader(); cur != l {
		return nil, fmt.Errorf("%w: the lease ended while waiting for locks", ErrNotLeaseholder)
	}
	return r.readVersions(ks, req, resp, end, check)
}

// readVersions reads what req asks of ks at epoch req.At into resp, once
// the read is known complete (SnapshotRead's waits, or the closed epoch):
// a point read, a scan, or the changes. check runs again after the read: a
// GC that applied meanwhile may have removed what the read saw missing, and
// a merge subsumes a range only once its replicas stopped serving, so a
// read that ends after the subsume may have missed a write the merged
// range made since; either way it is refused (the reader retries).
func (r *Replica) readVersions(ks Keyspace, req *pb.SnapshotReadRequest, resp *pb.SnapshotReadResponse, end []byte, check func() error) (*pb.SnapshotReadResponse, error) {
	start := req.GetStart()
	below := storage.EpochStart(req.GetAt())
	resp.Generation = r.sm.Descriptor().GetGeneration()
	note := func(v storage.Version, newest storage.VersionID) {
		resp.SnapshotEpoch = max(resp.SnapshotEpoch, v.ID.Epoch)
		resp.LatestEpoch = max(resp.LatestEpoch, newest.Epoch)
	}
	if req.GetChanges() {
		return r.changes(ks, req, resp, end, check)
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
		if err := check(); err != nil {
			return nil, err
		}
		return resp, nil
	}
	limit := int(req.GetLimit())
	err := r.sm.Scan(ks, start, end, below, func(v storage.Version, newest storage.VersionID) bool {
		note(v, newest)
		if v.Live() {
			resp.Kvs = append(resp.Kvs, &pb.KeyValue{Key: v.Key, Value: v.Value})
		}
		return limit == 0 || len(resp.Kvs) < limit
	})
	if err != nil {
		return nil, err
	}
	if err := check(); err != nil {
		return nil, err
	}
	return resp, nil
}

// changes fills resp with the versions of req's span in [since, at), newest
// first per key, once SnapshotRead's waits made that set complete; a page
// of req.Limit versions ends at a key boundary, or, if one key alone has
// more than twice the limit, inside it with resp.KeyTruncated set. check
// runs again after the read, as for a snapshot scan.
func (r *Replica) changes(ks Keyspace, req *pb.SnapshotReadRequest, resp *pb.SnapshotReadResponse, end []byte, check func() error) (*pb.SnapshotReadResponse, error) {
	start := req.GetStart()
	if !req.GetScan() {
		end = append(append([]byte{}, start...), 0)
	}
	limit := int(req.GetLimit())
	var last []byte
	err := r.sm.Versions(ks, start, end, storage.EpochStart(req.GetSince()), storage.EpochStart(req.GetAt()), req.GetNewestOnly(), func(v storage.Version) bool {
		if limit > 0 && len(resp.Changes) >= limit {
			if !bytes.Equal(v.Key, last) {
				return false
			}
			if len(resp.Changes) >= 2*limit {
				resp.KeyTruncated = true
				return false
			}
		}
		last = v.Key
		resp.Changes = append(resp.Changes, &pb.Change{Key: v.Key, Value: v.Value, Tombstone: v.Tombstone,
			Version: &pb.VersionID{Epoch: v.ID.Epoch, Counter: v.ID.Counter}})
		return true
	})
	if err != nil {
		return nil, err
	}
	if err := check(); err != nil {
		return nil, err
	}
	return resp, nil
}
