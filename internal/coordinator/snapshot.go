package coordinator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/terroir-db/terroir/internal/epoch"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/routing"
	"github.com/terroir-db/terroir/internal/storage"
)

// SnapshotMode chooses how a snapshot transaction picks the epoch it reads at,
// and so what it guarantees (paper §5.2–§5.4, DESIGN.md §5). Reading "at s"
// returns, for each key, its newest version below <s, 0>.
//
// In every mode but Regional, a range leader serves the read only once its
// region's publisher shows at least s, so every transaction that could still
// commit below s already holds its locks there; it waits those out. In a
// deployment without publishers every mode runs as Regional.
type SnapshotMode uint8

const (
	// Strong reads the global epoch e from the global epoch service and reads
	// at e+1 (paper §5.3): it sees every transaction that committed before it
	// began. Serializable and single-key linearizable; two transactions on
	// different clients and keys may appear out of real-time order (§5.3).
	Strong SnapshotMode = iota
	// StrongLocal is Strong without the cross-region call: it reads the local
	// publisher's e and reads at e+2 (one more advance to wait for).
	StrongLocal
	// Linearizable is Strong made strictly serializable (§5.3.1): before the
	// first read it waits until every publisher shows e+1, and it retries at a
	// later epoch when a key it read has its snapshot version at e while
	// another has a version at e+1 or later. With quiet_epochs = k the retry
	// reads just after a quiet epoch and cannot fail again.
	Linearizable
	// Serializable reads at the local publisher's epoch e, so it may miss
	// transactions of epoch e that committed before it began.
	Serializable
	// SerializableStale reads at e-1 and never waits for an epoch.
	SerializableStale
	// Regional reads the local-epoch versions of the client's region at the
	// local epoch l+1 (paper §5.4): strictly serializable within the region
	// and the cheapest. Reading a key homed in another region fails with
	// ErrSnapshotRestart; View then runs the snapshot again as Linearizable.
	Regional
)

var modeNames = [...]string{"strong", "strong-local", "linearizable", "serializable", "serializable-stale", "regional"}

// String returns the mode's name as the CLI spells it.
func (m SnapshotMode) String() string {
	if int(m) < len(modeNames) {
		return modeNames[m]
	}
	return fmt.Sprintf("mode(%d)", m)
}

// ParseSnapshotMode parses a mode name (String's spelling).
func ParseSnapshotMode(s string) (SnapshotMode, error) {
	for i, n := range modeNames {
		if n == s {
			return SnapshotMode(i), nil
		}
	}
	return 0, fmt.Errorf("unknown snapshot mode %q (one of %v)", s, modeNames)
}

// SnapshotStats reports how a snapshot transaction ran.
type SnapshotStats struct {
	// Mode is the mode it finished in (Regional becomes Linearizable on
	// restart; every mode runs as Regional on a topology without publishers).
	Mode SnapshotMode
	// Requested is the mode the caller asked for.
	Requested SnapshotMode
	// Epoch is the epoch it read at: versions below <Epoch, 0> (global epochs,
	// or local ones for Regional).
	Epoch uint64
	// EpochWait is the time spent choosing the epoch and waiting for it: at
	// the client, plus the longest wait of any read at a range leader (reads
	// may overlap), summed over attempts.
	EpochWait time.Duration
	// LockWait is the time range leaders spent waiting out exclusive locks.
	LockWait time.Duration
	// Retries counts attempts run again (linearizable check, regional restart).
	Retries int
	// FollowerReads counts reads a replica other than the leader served from
	// its closed epoch (FollowerReads policy, DESIGN.md §13), and
	// FollowerFallbacks the reads a follower could not serve in time, which
	// went to the leader instead.
	FollowerReads, FollowerFallbacks int
}

// snapshotPoll is how often the client re-reads an epoch it waits for.
const snapshotPoll = time.Millisecond

// Snapshot is a read-only transaction reading one consistent snapshot without
// taking locks. Its methods are safe for concurrent use.
type Snapshot struct {
	c      *Coordinator
	mode   SnapshotMode
	at     uint64
	closed bool // read from the ranges' closed epochs (ClosedSnapshot)

	mu       sync.Mutex
	finished bool
	lR       map[string]uint64 // l_R per region, read once per snapshot
	stats    SnapshotStats
	begin    time.Duration // the client's wait at BeginSnapshot
	atLeader time.Duration // the longest epoch wait at a range leader
	reads    []readCheck   // the linearizable check (paper §5.3.1) over the reads so far
	// rechecked names the ranges a Regional snapshot found homed in
	// another region by a cached descriptor and looked up afresh.
	rechecked map[uint64]bool
}

// readCheck is what the linearizable check needs of one read.
type readCheck struct {
	atPrev bool // a version at exactly at-1 was read
	newer  bool // a version at or above at exists
	scan   bool // a scan: its keys are several members
}

// BeginSnapshot starts a snapshot transaction in mode, reading at an epoch of
// at least minAt (0: none; View passes the epoch a retry must reach). It fails
// with ErrUnavailable when the epoch cannot be read or reached before ctx ends.
func (c *Coordinator) BeginSnapshot(ctx context.Context, mode SnapshotMode, minAt uint64) (*Snapshot, error) {
	if c.global == nil && mode != Regional {
		// No global epoch: local-epoch versions are all there is. Said once
		// per client, so a user who asked for strong learns what ran.
		c.regionalOnly.Do(func() {
			slog.Warn("this cluster has no publishers of a global epoch: every snapshot runs as regional (reads the local epoch of the client's region)", "asked", mode)
		})
		mode = Regional
	}
	s := &Snapshot{c: c, mode: mode, lR: map[string]uint64{}}
	began := time.Now()
	at, err := c.snapshotEpoch(ctx, mode)
	if err != nil {
		return nil, fmt.Errorf("%w: choosing the snapshot epoch: %v", ErrUnavailable, err)
	}
	at = max(at, minAt)
	if mode == Linearizable {
		if c.quiet > 0 && minAt > 0 {
			// A retry reads just after a quiet epoch, where the check cannot fail.
			for (at-1)%c.quiet != 0 {
				at++
			}
		}
		// Every publisher shows at once the service shows at+1 (it advances
		// only after all have applied at): from then on no transaction
		// anywhere commits below at without already holding its locks.
		if _, err := epoch.WaitAtLeast(ctx, c.service, at+1, snapshotPoll); err != nil {
			return nil, fmt.Errorf("%w: waiting for global epoch %d: %v", ErrUnavailable, at+1, err)
		}
	}
	s.at = at
	s.begin = time.Since(began)
	s.stats = SnapshotStats{Mode: mode, Epoch: at, EpochWait: s.begin}
	return s, nil
}

// snapshotEpoch reads the epoch a new snapshot in mode reads at.
func (c *Coordinator) snapshotEpoch(ctx context.Context, mode SnapshotMode) (uint64, error) {
	read := func(src epoch.Source) (uint64, error) {
		if src == nil {
			return 0, fmt.Errorf("the topology has no global epoch service")
		}
		return src.Read(ctx)
	}
	var service epoch.Source
	if c.service != nil {
		service = c.service
	}
	switch mode {
	case Strong, Linearizable:
		e, err := read(service)
		return e + 1, err
	case StrongLocal:
		e, err := read(c.global)
		return e + 2, err
	case Serializable:
		return read(c.global)
	case SerializableStale:
		e, err := read(c.global)
		return max(e, 2) - 1, err
	case Regional:
		e, err := read(c.epochs[c.region])
		return e + 1, err
	}
	return 0, fmt.Errorf("unknown snapshot mode %d", mode)
}

// Stats returns how the snapshot has run so far.
func (s *Snapshot) Stats() SnapshotStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// Get returns key's value in the snapshot (ok false if absent). Errors:
// ErrEmptyKey, ErrKeyTooLarge, ErrTxnFinished, ErrSnapshotRestart (Regional,
// key in another region), ErrCrossRegion (the same, from a region without a
// publisher), ErrSnapshotRetry (Linearizable), ErrUnavailable.
func (s *Snapshot) Get(ctx context.Context, key []byte) (value []byte, ok bool, err error) {
	if err := CheckKey(key); err != nil {
		return nil, false, err
	}
	var resp *pb.SnapshotReadResponse
	err = s.c.routeKey(ctx, key, nil, func(g *pb.RangeDescriptor) (err error) {
		resp, err = s.read(ctx, g, &pb.SnapshotReadRequest{RangeId: g.GetRangeId(), Start: key})
		return err
	})
	if err != nil {
		return nil, false, err
	}
	if kvs := resp.GetKvs(); len(kvs) > 0 {
		return kvs[0].GetValue(), true, nil
	}
	return nil, false, nil
}

// Scan returns up to limit (0: all) key-value pairs of the snapshot with
// lo ≤ key < hi in key order (a nil hi: to the end of the key space). Errors
// as Get's, and ErrInvalidRange.
func (s *Snapshot) Scan(ctx context.Context, lo, hi []byte, limit int) ([]KeyValue, error) {
	if err := checkScan(lo, hi); err != nil {
		return nil, err
	}
	var out []KeyValue
	err := s.c.routeSpan(ctx, lo, hi, nil, func(part routing.Part) (bool, error) {
		want := 0
		if limit > 0 {
			want = limit - len(out)
		}
		resp, err := s.read(ctx, part.Desc, &pb.SnapshotReadRequest{RangeId: part.Desc.GetRangeId(), Start: part.Start, End: part.End,
			Scan: true, Limit: uint32(want)})
		if err != nil {
			return false, err
		}
		for _, kv := range resp.GetKvs() {
			out = append(out, KeyValue{Key: kv.GetKey(), Value: kv.GetValue()})
		}
		return limit > 0 && len(out) >= limit, nil
	})
	if err != nil {
		return nil, err
	}
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// Change is one committed write a changefeed or an incremental backup reads
// (DESIGN.md §14): a key's new value, or its deletion, at a version id, in
// the home region of the range that stores it.
type Change struct {
	Key, Value []byte
	Tombstone  bool
	Version    storage.VersionID
	Region     string
}

// Changes returns, in key order and newest first within a key, every
// committed version with lo ≤ key < hi (a nil hi: to the end of the key
// space) whose epoch lies in [since, at), where at is the snapshot's epoch
// (Stats().Epoch): the writes that take the state at `since` to the state
// the snapshot reads. The snapshot's waits make the set complete: no
// transaction can still commit below <at, 0> in the span. With limit > 0 it
// returns about limit versions, ending at a key boundary; the caller goes on
// from the last key's successor. With newestOnly, only each key's newest
// version in the window. Errors as Scan's, ErrSnapshotTooOld when a range
// collected versions at or above since, and ErrTooManyVersions when one key
// has more than twice limit versions in the window.
func (s *Snapshot) Changes(ctx context.Context, lo, hi []byte, since uint64, newestOnly bool, limit int) ([]Change, error) {
	if err := checkScan(lo, hi); err != nil {
		return nil, err
	}
	var out []Change
	err := s.c.routeSpan(ctx, lo, hi, nil, func(part routing.Part) (bool, error) {
		want := 0
		if limit > 0 {
			want = limit - len(out)
		}
		resp, err := s.read(ctx, part.Desc, &pb.SnapshotReadRequest{RangeId: part.Desc.GetRangeId(), Start: part.Start, End: part.End,
			Scan: true, Limit: uint32(want), Changes: true, Since: since, NewestOnly: newestOnly})
		if err != nil {
			return false, err
		}
		if resp.GetKeyTruncated() {
			return false, fmt.Errorf("%w: range %d, key %q, more than %d versions in epochs [%d, %d)", ErrTooManyVersions,
				part.Desc.GetRangeId(), resp.GetChanges()[len(resp.GetChanges())-1].GetKey(), 2*want, since, s.at)
		}
		for _, c := range resp.GetChanges() {
			out = append(out, Change{Key: c.GetKey(), Value: c.GetValue(), Tombstone: c.GetTombstone(),
				Version: versionOf(c.GetVersion()), Region: part.Desc.GetRegion()})
		}
		return limit > 0 && len(out) >= limit, nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Put fails: a snapshot transaction is read-only (ErrReadOnly), and after
// Finish it is over (ErrTxnFinished).
func (s *Snapshot) Put(context.Context, []byte, []byte) error { return s.refuseWrite() }

// Delete fails as Put does.
func (s *Snapshot) Delete(context.Context, []byte) error { return s.refuseWrite() }

func (s *Snapshot) refuseWrite() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.finished {
		return ErrTxnFinished
	}
	return ErrReadOnly
}

// Finish ends the snapshot and returns its stats; later reads fail with
// ErrTxnFinished, as does a second Finish.
func (s *Snapshot) Finish() (SnapshotStats, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.finished {
		return s.stats, ErrTxnFinished
	}
	s.finished = true
	return s.stats, nil
}

// read runs one snapshot read at range g's leader and applies the
// linearizable check.
func (s *Snapshot) read(ctx context.Context, g *pb.RangeDescriptor, req *pb.SnapshotReadRequest) (*pb.SnapshotReadResponse, error) {
	s.mu.Lock()
	if s.finished {
		s.mu.Unlock()
		return nil, ErrTxnFinished
	}
	if s.mode == Regional && g.GetRegion() != s.c.region && !s.rechecked[g.GetRangeId()] {
		// The cached descriptor may predate a rehome into this region
		// (DESIGN.md §13): look the range up afresh, once.
		if s.rechecked == nil {
			s.rechecked = map[uint64]bool{}
		}
		s.rechecked[g.GetRangeId()] = true
		s.mu.Unlock()
		s.c.routes.Forget(g.GetRangeId())
		return nil, fmt.Errorf("%w: range %d is in %s by the cached descriptor", errStaleRoute, g.GetRangeId(), g.GetRegion())
	}
	if s.mode == Regional && g.GetRegion() != s.c.region {
		s.mu.Unlock()
		if s.c.global == nil { // no global epoch here: a multi-region snapshot cannot run either
			return nil, fmt.Errorf("%w: range %d is in %s", ErrCrossRegion, g.GetRangeId(), g.GetRegion())
		}
		return nil, fmt.Errorf("%w: range %d is in %s", ErrSnapshotRestart, g.GetRangeId(), g.GetRegion())
	}
	if s.mode == Regional && s.at < g.GetRehomeRegionalFloor() {
		// It may have begun before the transactions the range's rehome
		// barrier holds committed (DESIGN.md §13).
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: range %d was rehomed here after the snapshot's epoch %d", ErrSnapshotRestart, g.GetRangeId(), s.at)
	}
	// Home names the region whose local epoch LocalEpoch (and, regional,
	// At) is: a range rehomed since answers with a mismatch.
	req.At, req.Regional, req.LocalEpoch, req.Closed, req.Home = s.at, s.mode == Regional, s.lR[g.GetRegion()], s.closed, g.GetRegion()
	s.mu.Unlock()
	// Reads of one snapshot may run in parallel: the lock is not held here.
	if !s.closed {
		if resp, err := s.fromFollower(ctx, g, req); resp != nil || err != nil {
			return resp, err
		}
	}
	var resp *pb.SnapshotReadResponse
	err := s.c.rangeCallBulk(ctx, g, true, func(ctx context.Context, rc pb.RangeClient) error {
		var err error
		resp, err = rc.SnapshotRead(ctx, req)
		return err
	})
	if err != nil {
		return nil, err
	}
	s.c.staleRoute(g, resp.GetGeneration())
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lR[g.GetRegion()] == 0 {
		s.lR[g.GetRegion()] = resp.GetLocalEpoch()
	}
	s.atLeader = max(s.atLeader, time.Duration(resp.GetEpochWaitUs())*time.Microsecond)
	s.stats.EpochWait = s.begin + s.atLeader
	s.stats.LockWait += time.Duration(resp.GetLockWaitUs()) * time.Microsecond
	if s.mode != Linearizable {
		return resp, nil
	}
	s.reads = append(s.reads, readCheck{atPrev: resp.GetSnapshotEpoch() == s.at-1, newer: resp.GetLatestEpoch() >= s.at, scan: req.GetScan()})
	if next, retry := s.mustRetry(); retry {
		return nil, &retryError{next: next}
	}
	return resp, nil
}

// mustRetry is the check of paper §5.3.1: some read saw its version at exactly
// at-1 while another read (or another key of the same scan) has a version at
// at or later. It returns the epoch a retry must read at.
func (s *Snapshot) mustRetry() (uint64, bool) {
	for i, a := range s.reads {
		if !a.atPrev {
			continue
		}
		for j, b := range s.reads {
			if b.newer && (i != j || a.scan) {
				return s.at + 1, true
			}
		}
	}
	return 0, false
}

// retryError is ErrSnapshotRetry with the epoch the retry must read at.
type retryError struct{ next uint64 }

func (e *retryError) Error() string {
	return fmt.Sprintf("%v (next at epoch %d)", ErrSnapshotRetry, e.next)
}

func (e *retryError) Unwrap() error { return ErrSnapshotRetry }

// View runs fn in a snapshot transaction in mode, running it again as the
// paper prescribes: at a later epoch after a failed linearizable check, and as
// Linearizable after a Regional one touches another region. Other errors from
// fn or the reads end it. It returns the stats summed over attempts.
func (c *Coordinator) View(ctx context.Context, mode SnapshotMode, fn func(ctx context.Context, s *Snapshot) error) (SnapshotStats, error) {
	total := SnapshotStats{Requested: mode}
	var minAt uint64
	for attempt := 0; ; attempt++ {
		s, err := c.BeginSnapshot(ctx, mode, minAt)
		if err != nil {
			return total, err
		}
		err = fn(ctx, s)
		st, _ := s.Finish()
		total.Mode, total.Epoch = st.Mode, st.Epoch
		total.EpochWait += st.EpochWait
		total.LockWait += st.LockWait
		total.FollowerReads += st.FollowerReads
		total.FollowerFallbacks += st.FollowerFallbacks
		var re *retryError
		switch {
		case err == nil:
			return total, nil
		case errors.As(err, &re):
			minAt = re.next
		case errors.Is(err, ErrSnapshotRestart):
			mode, minAt = Linearizable, 0
		default:
			return total, err
		}
		total.Retries++
		if ctx.Err() != nil {
			return total, fmt.Errorf("%w: %v", ErrUnavailable, ctx.Err())
		}
	}
}
