// Package client is Terroir's Go API: strictly serializable, interactive
// read-write transactions, and lock-free snapshot transactions, over a cluster
// described by its topology file.
//
//	db, err := client.Open("examples/one-region.yaml", client.Options{CertsDir: "certs"})
//	defer db.Close()
//	err = db.Update(ctx, func(ctx context.Context, tx *client.Txn) error {
//		v, ok, err := tx.Get(ctx, []byte("k"))
//		...
//		return tx.Put(ctx, []byte("k"), []byte("v"))
//	})
//
// Reads take shared locks and writes take exclusive locks at the key's range
// leader as they execute; Commit runs two-phase commit (one phase for a single
// range). Transactions that touch only one region never wait on another region.
//
// Snapshot transactions are declared read-only at the start and read one
// consistent snapshot without taking locks, in a mode that trades freshness
// and cross-region calls (SnapshotMode):
//
//	stats, err := db.View(ctx, client.Strong, func(ctx context.Context, s *client.Snapshot) error {
//		v, ok, err := s.Get(ctx, []byte("k"))
//		...
//	})
//
// Errors are typed: compare with errors.Is against the Err values; IsRetryable
// tells which ones Update retries.
package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"

	"github.com/terroir-db/terroir/internal/coordinator"
	"github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/security"
	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/transport"
)

// Limits on keys and values.
const (
	// MaxKeySize is the largest key: 4 KiB (4096 bytes).
	MaxKeySize = coordinator.MaxKeySize
	// MaxValueSize is the largest value: 1 MiB (1048576 bytes).
	MaxValueSize = coordinator.MaxValueSize
)

// Errors returned by this package.
var (
	// ErrConflict: a lock conflict, lost locks or a failed lease validation. Retryable.
	ErrConflict = coordinator.ErrConflict
	// ErrAborted: the transaction was aborted. Retryable.
	ErrAborted = coordinator.ErrAborted
	// ErrUnavailable: no leader answered in time. Retryable.
	ErrUnavailable = coordinator.ErrUnavailable
	// ErrPermissionDenied: the certificate's user may not run the
	// operation (operator actions need the admin user's certificate).
	ErrPermissionDenied = coordinator.ErrPermissionDenied
	// ErrRegionExcluded: the operation needs a range homed in a region that
	// is excluded from the global epoch; the message says since which epoch.
	// It is an ErrUnavailable (retryable: readmission heals it).
	ErrRegionExcluded = coordinator.ErrRegionExcluded
	// ErrCommitUnknown: the commit may or may not have happened. Not retried.
	ErrCommitUnknown = coordinator.ErrCommitUnknown
	// ErrKeyTooLarge: a key over MaxKeySize.
	ErrKeyTooLarge = coordinator.ErrKeyTooLarge
	// ErrValueTooLarge: a value over MaxValueSize.
	ErrValueTooLarge = coordinator.ErrValueTooLarge
	// ErrEmptyKey: an empty key.
	ErrEmptyKey = coordinator.ErrEmptyKey
	// ErrInvalidRange: a scan whose upper bound sorts before its lower bound.
	ErrInvalidRange = coordinator.ErrInvalidRange
	// ErrTxnFinished: an operation on a committed or aborted transaction.
	ErrTxnFinished = coordinator.ErrTxnFinished
	// ErrUnknownRegion: a region the topology does not declare.
	ErrUnknownRegion = coordinator.ErrUnknownRegion
	// ErrNoRegion: Open without a region on a cluster of several regions.
	ErrNoRegion = errors.New("client: no region given")
	// ErrCrossRegion: a key homed in another region when the two regions do not
	// both run a publisher of the global epoch.
	ErrCrossRegion = coordinator.ErrCrossRegion
	// ErrReadOnly: a write in a snapshot transaction.
	ErrReadOnly = coordinator.ErrReadOnly
	// ErrSplitKey: a split key that is empty, too large or already a range
	// boundary (AdminSplit).
	ErrSplitKey = coordinator.ErrSplitKey
	// ErrMergeLast: AdminMerge on the last range of the key space, which has
	// no right neighbour.
	ErrMergeLast = coordinator.ErrMergeLast
	// ErrMergeRegions: AdminMerge of two ranges homed in different regions.
	ErrMergeRegions = coordinator.ErrMergeRegions
	// ErrMergeReplicas: AdminMerge of two ranges on different nodes whose
	// right one could not be moved onto the left's nodes.
	ErrMergeReplicas = coordinator.ErrMergeReplicas
	// ErrLeaseTarget: AdminTransferLease to a node that is not a replica of
	// the range, or that holds its lease already.
	ErrLeaseTarget = coordinator.ErrLeaseTarget
	// ErrMoveTarget: AdminMoveReplica from a node that is not a replica of
	// the range, or to one that cannot take it.
	ErrMoveTarget = coordinator.ErrMoveTarget
	// ErrRehomeTarget: AdminRehome to an unknown region, one with no
	// publisher or too few live nodes, or the range's home already.
	ErrRehomeTarget = coordinator.ErrRehomeTarget
	// ErrSnapshotRetry: a Linearizable snapshot must run again at a later
	// epoch (paper §5.3.1). Retryable; View does it.
	ErrSnapshotRetry = coordinator.ErrSnapshotRetry
	// ErrSnapshotRestart: a Regional snapshot read a key homed in another
	// region and must run again as a multi-region one. View does it.
	ErrSnapshotRestart = coordinator.ErrSnapshotRestart
	// ErrSnapshotTooOld: the snapshot reads below a range's GC horizon
	// (named in the message); start a new snapshot.
	ErrSnapshotTooOld = coordinator.ErrSnapshotTooOld
	// ErrTooManyVersions: Snapshot.Changes met a key with more than twice
	// its limit of versions in the window; narrow the window of epochs.
	ErrTooManyVersions = coordinator.ErrTooManyVersions
	// ErrNoCerts: Open found neither certificates in Options.CertsDir nor
	// Options.Insecure (DESIGN.md §15).
	ErrNoCerts = security.ErrNoCerts
	// ErrBadCert: a certificate or key that cannot be read, or one the
	// cluster CA did not sign.
	ErrBadCert = security.ErrBadCert
	// ErrCertExpired: a certificate past its expiry (named in the message).
	ErrCertExpired = security.ErrExpired
)

// IsRetryable reports whether retrying the whole transaction may succeed.
func IsRetryable(err error) bool { return coordinator.IsRetryable(err) }

// Options configure a client.
type Options struct {
	// Region is where the client runs; it may be left empty when the topology
	// has one region.
	Region string
	// CertsDir holds the cluster CA's certificate (ca.crt) and the user's
	// certificate and key (client.<User>.crt, .key), made by `terroir cert`;
	// every connection is mutual TLS with them (DESIGN.md §15).
	CertsDir string
	// User names the certificate to present; empty means the admin user.
	User string
	// Insecure connects without TLS, to a cluster started with --insecure.
	// Open fails with ErrNoCerts when neither CertsDir nor Insecure is set.
	Insecure bool
}

// LoadCerts returns the certificates opts name, nil for an insecure client.
// Errors: ErrNoCerts, ErrBadCert, ErrCertExpired, each naming the file.
func (opts Options) LoadCerts() (*security.Certs, error) {
	if opts.Insecure {
		return nil, nil
	}
	if opts.CertsDir == "" {
		return nil, fmt.Errorf("%w: no certificates directory given, and not insecure", ErrNoCerts)
	}
	user := opts.User
	if user == "" {
		user = security.AdminUser
	}
	return security.LoadClient(opts.CertsDir, user)
}

// DB is a handle on a cluster. It is safe for concurrent use.
type DB struct {
	coord  *coordinator.Coordinator
	dialer *transport.Dialer
	top    *topology.Topology
	owns   bool

	retries atomic.Int64 // see Retries
}

// Open connects to the cluster of the topology file at path. It fails with a
// topology error, ErrUnknownRegion, or a certificate error (ErrNoCerts,
// ErrBadCert, ErrCertExpired).
func Open(path string, opts Options) (*DB, error) {
	top, err := topology.Load(path)
	if err != nil {
		return nil, err
	}
	region, err := pickRegion(top, opts.Region)
	if err != nil {
		return nil, err
	}
	certs, err := opts.LoadCerts()
	if err != nil {
		return nil, err
	}
	d := transport.NewDialer(transport.NewNetwork(top), transport.Endpoint{Region: region}, certs)
	db, err := OpenWithDialer(top, region, d)
	if err != nil {
		d.Close()
		return nil, err
	}
	db.owns = true
	return db, nil
}

func pickRegion(top *topology.Topology, region string) (string, error) {
	if region != "" {
		if !top.HasRegion(region) {
			return "", fmt.Errorf("%w: %q", ErrUnknownRegion, region)
		}
		return region, nil
	}
	if len(top.Regions) != 1 {
		return "", fmt.Errorf("%w: the cluster has %d regions (%s): say which one this client runs in (Options.Region)", ErrNoRegion, len(top.Regions), strings.Join(top.Regions, ", "))
	}
	return top.Regions[0], nil
}

// OpenWithDialer connects through an existing dialer (the in-process cluster's,
// whose network injects latency and faults). The dialer stays the caller's.
func OpenWithDialer(top *topology.Topology, region string, d *transport.Dialer) (*DB, error) {
	c, err := coordinator.New(top, region, d)
	if err != nil {
		return nil, err
	}
	return &DB{coord: c, dialer: d, top: top}, nil
}

// Close waits for commit notifications in flight and closes connections.
func (db *DB) Close() error {
	db.coord.Close()
	if db.owns {
		db.dialer.Close()
	}
	return nil
}

// Txn is a read-write transaction. Finish it with Commit or Abort.
type Txn struct {
	t *coordinator.Txn
}

// Begin starts a read-write transaction.
func (db *DB) Begin() *Txn { return &Txn{t: db.coord.Begin(0)} }

// Get returns key's value; ok is false if the key does not exist.
// Errors: ErrEmptyKey, ErrKeyTooLarge, ErrTxnFinished, and retryable ones.
func (tx *Txn) Get(ctx context.Context, key []byte) (value []byte, ok bool, err error) {
	return tx.t.Get(ctx, key)
}

// KeyValue is one result of Scan.
type KeyValue = coordinator.KeyValue

// Scan returns up to limit (0: all) pairs with lo ≤ key < hi, in key order; a
// nil hi means the end of the key space. No key can be inserted into the range
// until the transaction ends. Errors: ErrInvalidRange, ErrTxnFinished, and
// retryable ones.
func (tx *Txn) Scan(ctx context.Context, lo, hi []byte, limit int) ([]KeyValue, error) {
	return tx.t.Scan(ctx, lo, hi, limit)
}

// Put sets key to value when the transaction commits. Errors: ErrEmptyKey,
// ErrKeyTooLarge, ErrValueTooLarge, ErrTxnFinished, and retryable ones.
func (tx *Txn) Put(ctx context.Context, key, value []byte) error { return tx.t.Put(ctx, key, value) }

// Delete removes key when the transaction commits.
func (tx *Txn) Delete(ctx context.Context, key []byte) error { return tx.t.Delete(ctx, key) }

// Version identifies a committed transaction's writes (paper §5.1,
// DESIGN.md §6): the global epoch it committed in (the local epoch in a
// deployment without publishers), then a counter from 1 that orders the
// transactions of one epoch that wrote a common key. Versions order commits:
// if a.Less(b), a's writes precede b's. The zero Version is what a
// transaction that wrote nothing returns.
type Version struct {
	// Epoch is the epoch the transaction committed in.
	Epoch uint64
	// Counter orders transactions of one epoch (from 1).
	Counter uint32
}

// Less reports whether v orders before o.
func (v Version) Less(o Version) bool {
	return v.Epoch < o.Epoch || (v.Epoch == o.Epoch && v.Counter < o.Counter)
}

// String renders v as <epoch,counter>.
func (v Version) String() string { return fmt.Sprintf("<%d,%d>", v.Epoch, v.Counter) }

// Commit commits the transaction and returns its version. After a retryable
// error nothing was committed (ErrAborted when an earlier step failed: a
// failed step ends the transaction, DESIGN.md §10); after ErrCommitUnknown
// the outcome is unknown. Either way the transaction is finished.
func (tx *Txn) Commit(ctx context.Context) (Version, error) {
	v, err := tx.t.Commit(ctx)
	return Version{Epoch: v.Epoch, Counter: v.Counter}, err
}

// Abort discards the transaction and releases its locks.
func (tx *Txn) Abort(ctx context.Context) error { return tx.t.Abort(ctx) }

// Update runs fn in a transaction and commits it, retrying the whole
// transaction after retryable errors (keeping its wait-die priority, so it
// eventually wins) with jittered exponential backoff, until ctx ends. An error
// returned by fn aborts the transaction and is returned as is.
func (db *DB) Update(ctx context.Context, fn func(ctx context.Context, tx *Txn) error) error {
	return db.retry(ctx, func(priority uint64) (uint64, error) {
		t := db.coord.Begin(priority)
		tx := &Txn{t: t}
		err := fn(ctx, tx)
		if err == nil {
			_, err = tx.Commit(ctx)
		} else {
			_ = tx.Abort(context.WithoutCancel(ctx))
		}
		return t.Priority(), err
	})
}

// retry runs attempt (given the priority to keep, 0 for the first) until it
// succeeds, fails with an error that is not retryable, or ctx ends, sleeping
// a jittered exponential backoff (1 ms doubling to 100 ms) between attempts.
// attempt returns the priority its transaction had.
func (db *DB) retry(ctx context.Context, attempt func(priority uint64) (uint64, error)) error {
	var priority uint64
	backoff := time.Millisecond
	for {
		p, err := attempt(priority)
		if err == nil || !IsRetryable(err) {
			return err
		}
		db.retries.Add(1)
		priority = p
		sleep := backoff/2 + rand.N(backoff/2+1)
		timer := time.NewTimer(sleep)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return errors.Join(err, ctx.Err())
		}
		backoff = min(backoff*2, 100*time.Millisecond)
	}
}

// Retries returns how many transactions of Update, Get, Put and Delete ran
// again after a retryable error since the DB was opened.
func (db *DB) Retries() int64 { return db.retries.Load() }

// Get reads key in a transaction of its own, strictly serializable, in one
// round trip to the key's range leader (it locks, reads, validates its
// lease and commits there), retrying as Update does; ok is false if the key
// does not exist. Errors: ErrEmptyKey, ErrKeyTooLarge, ErrCrossRegion,
// ErrPermissionDenied, or, once ctx ends, the last retryable error
// (ErrConflict, ErrUnavailable) joined with ctx's.
func (db *DB) Get(ctx context.Context, key []byte) (value []byte, ok bool, err error) {
	err = db.retry(ctx, func(priority uint64) (uint64, error) {
		res, err := db.coord.OneShot(ctx, priority, key, nil)
		value, ok = res.Value, res.Found
		return res.Priority, err
	})
	return value, ok, err
}

// Put sets key to value in a transaction of its own, in one round trip to
// the key's range leader, retrying as Update does, and returns the
// transaction's version. Errors: ErrEmptyKey, ErrKeyTooLarge,
// ErrValueTooLarge, ErrCrossRegion, placement errors (ErrNoRegionInKey),
// ErrCommitUnknown (the outcome is unknown), or ctx's.
func (db *DB) Put(ctx context.Context, key, value []byte) (Version, error) {
	return db.oneWrite(ctx, &rangepb.Write{Key: append([]byte{}, key...), Value: append([]byte{}, value...)})
}

// Delete removes key (writes a tombstone) in a transaction of its own, in
// one round trip, and returns its version; errors as Put's.
func (db *DB) Delete(ctx context.Context, key []byte) (Version, error) {
	return db.oneWrite(ctx, &rangepb.Write{Key: append([]byte{}, key...), Tombstone: true})
}

func (db *DB) oneWrite(ctx context.Context, w *rangepb.Write) (Version, error) {
	var v Version
	err := db.retry(ctx, func(priority uint64) (uint64, error) {
		res, err := db.coord.OneShot(ctx, priority, nil, w)
		v = Version{Epoch: res.Version.Epoch, Counter: res.Version.Counter}
		return res.Priority, err
	})
	return v, err
}

// CrashPoint is a point in two-phase commit where a fault campaign can make
// the client's coordinator stop as if its process had died; see the constants.
type CrashPoint = coordinator.CrashPoint

// Crash points.
const (
	// CrashAfterPrepare: every participant prepared, no commit record yet.
	CrashAfterPrepare = coordinator.CrashAfterPrepare
	// CrashAfterCommitRecord: the commit record is durable, no participant told.
	CrashAfterCommitRecord = coordinator.CrashAfterCommitRecord
)

// CrashHook is asked at each crash point of every two-phase commit with the
// transaction's ID and its participants' range IDs; true makes the commit
// stop there, unfinished, and return ErrCommitUnknown.
type CrashHook = coordinator.CrashHook

// SetCrashHook installs h for commits from now on (nil removes it). It exists
// for fault campaigns (terroir nemesis); the cluster resolves what a crashed
// commit leaves behind.
func (db *DB) SetCrashHook(h CrashHook) { db.coord.SetCrashHook(h) }

// StallHook is asked once every participant of a two-phase commit has
// prepared; a positive duration stalls the coordinator there, heartbeats
// stopped, as a paused process would.
type StallHook = coordinator.StallHook

// SetStallHook installs h for commits from now on (nil removes it). It
// exists for fault campaigns (terroir nemesis).
func (db *DB) SetStallHook(h StallHook) { db.coord.SetStallHook(h) }

// SnapshotMode chooses a snapshot transaction's epoch and guarantee; see the
// constants.
type SnapshotMode = coordinator.SnapshotMode

// Snapshot modes (paper §5, DESIGN.md §5).
const (
	// Strong: serializable and single-key linearizable; one call to the global
	// epoch service (paper §5.3).
	Strong = coordinator.Strong
	// StrongLocal: as Strong, with no cross-region epoch call and one more
	// epoch advance to wait for.
	StrongLocal = coordinator.StrongLocal
	// Linearizable: strictly serializable; may retry (paper §5.3.1).
	Linearizable = coordinator.Linearizable
	// Serializable: serializable, possibly stale by one epoch.
	Serializable = coordinator.Serializable
	// SerializableStale: serializable, stale by up to two epochs, never waits
	// for an epoch.
	SerializableStale = coordinator.SerializableStale
	// Regional: strictly serializable within the client's region, lowest
	// latency; restarted as Linearizable if it reads another region (§5.4).
	Regional = coordinator.Regional
)

// ParseSnapshotMode parses a mode name: strong, strong-local, linearizable,
// serializable, serializable-stale or regional.
func ParseSnapshotMode(s string) (SnapshotMode, error) { return coordinator.ParseSnapshotMode(s) }

// SnapshotStats reports how a snapshot ran: the epoch it read at, time spent
// waiting for the epoch and for locks, and retries.
type SnapshotStats = coordinator.SnapshotStats

// Snapshot is a read-only transaction over one consistent snapshot. Reads take
// no locks and never delay writers.
type Snapshot struct {
	s *coordinator.Snapshot
}

// BeginSnapshot starts a snapshot transaction in mode. Most callers want View,
// which also runs it again when the mode requires. Errors: ErrUnavailable.
func (db *DB) BeginSnapshot(ctx context.Context, mode SnapshotMode) (*Snapshot, error) {
	s, err := db.coord.BeginSnapshot(ctx, mode, 0)
	if err != nil {
		return nil, err
	}
	return &Snapshot{s: s}, nil
}

// View runs fn in a snapshot transaction in mode, running it again at a later
// epoch when a Linearizable check fails and as Linearizable when a Regional
// snapshot touches another region. fn may run more than once: it should only
// read. Any other error from fn ends View and is returned.
func (db *DB) View(ctx context.Context, mode SnapshotMode, fn func(ctx context.Context, s *Snapshot) error) (SnapshotStats, error) {
	return db.coord.View(ctx, mode, func(ctx context.Context, s *coordinator.Snapshot) error {
		return fn(ctx, &Snapshot{s: s})
	})
}

// Get returns key's value in the snapshot; ok is false if the key does not
// exist. Errors: ErrEmptyKey, ErrKeyTooLarge, ErrTxnFinished,
// ErrSnapshotRetry, ErrSnapshotRestart, ErrUnavailable.
func (s *Snapshot) Get(ctx context.Context, key []byte) (value []byte, ok bool, err error) {
	return s.s.Get(ctx, key)
}

// Scan returns up to limit (0: all) pairs of the snapshot with lo ≤ key < hi,
// in key order; a nil hi means the end of the key space. Errors as Get's, and
// ErrInvalidRange.
func (s *Snapshot) Scan(ctx context.Context, lo, hi []byte, limit int) ([]KeyValue, error) {
	return s.s.Scan(ctx, lo, hi, limit)
}

// Change is one committed write: a key's value or deletion at a version id,
// in the home region of its range (DESIGN.md §14).
type Change = coordinator.Change

// Changes returns every committed version with lo ≤ key < hi whose epoch
// lies in [since, Stats().Epoch), in key order and newest first within a
// key: what takes the state at epoch `since` to this snapshot's; with
// newestOnly, only each key's newest version of them. With limit > 0 about
// limit versions, ending at a key boundary. Errors as Scan's, and
// ErrSnapshotTooOld when GC collected versions at or above since. Most
// callers want Changefeed, which streams them in version order. The
// snapshot must be Linearizable for the set to be complete across regions
// (DESIGN.md §14).
func (s *Snapshot) Changes(ctx context.Context, lo, hi []byte, since uint64, newestOnly bool, limit int) ([]Change, error) {
	return s.s.Changes(ctx, lo, hi, since, newestOnly, limit)
}

// Put fails with ErrReadOnly: snapshots are read-only.
func (s *Snapshot) Put(ctx context.Context, key, value []byte) error { return s.s.Put(ctx, key, value) }

// Delete fails with ErrReadOnly: snapshots are read-only.
func (s *Snapshot) Delete(ctx context.Context, key []byte) error { return s.s.Delete(ctx, key) }

// Finish ends the snapshot and returns its stats (ErrTxnFinished the second time).
func (s *Snapshot) Finish() (SnapshotStats, error) { return s.s.Finish() }

// Stats returns the snapshot's stats so far.
func (s *Snapshot) Stats() SnapshotStats { return s.s.Stats() }

// CommitMode is how read-write transactions commit: the protocol (the zero
// value), or a baseline `terroir bench compare` measures it against. Both
// baselines are safe, only slower; applications have no reason to set one.
type CommitMode = coordinator.CommitMode

// FollowerReads says which replica serves a snapshot's reads (DESIGN.md
// §13): the nearest one by default, a follower serving from its closed
// epoch where it can; see coordinator.FollowerReads for the policies.
type FollowerReads = coordinator.FollowerReads

// The follower-read policies.
const (
	FollowerReadsNearest   = coordinator.FollowerReadsNearest
	FollowerReadsPreferred = coordinator.FollowerReadsPreferred
	FollowerReadsOff       = coordinator.FollowerReadsOff
)

// ParseFollowerReads parses a policy name: nearest, preferred or off.
func ParseFollowerReads(s string) (FollowerReads, error) { return coordinator.ParseFollowerReads(s) }

// SetFollowerReads makes this handle's snapshot reads from now on choose
// their replica by policy p.
func (db *DB) SetFollowerReads(p FollowerReads) { db.coord.SetFollowerReads(p) }

// SetCommitMode makes this handle's transactions begun from now on commit in
// mode.
func (db *DB) SetCommitMode(mode CommitMode) { db.coord.SetCommitMode(mode) }

// RangeInfo describes a range (DESIGN.md §11): its ID, its span [Start, End)
// (a nil End: to the end of the key space), its home region, the nodes that
// hold its replicas, and its generation, which rises with every split, merge
// and replica change.
type RangeInfo struct {
	ID         uint64
	Start, End []byte
	Region     string
	Replicas   []uint64
	// NonVoters are the range's non-voting replicas (DESIGN.md §13), by
	// node id: they serve snapshot reads from their closed epoch.
	NonVoters  []uint64
	Generation uint64
}

func rangeInfo(d *rangepb.RangeDescriptor) RangeInfo {
	r := RangeInfo{ID: d.GetRangeId(), Start: d.GetStartKey(), Region: d.GetRegion(), Replicas: d.GetReplicas(), NonVoters: d.GetNonVoters(), Generation: d.GetGeneration()}
	if len(d.GetEndKey()) > 0 {
		r.End = d.GetEndKey()
	}
	return r
}

// AdminSplit splits the range holding key at key (DESIGN.md §11): an
// operator's action (`terroir admin range split`). Transactions in flight
// across the split commit or abort cleanly. Errors: ErrSplitKey (empty, too
// large, or already a range boundary: nothing changed), ErrUnavailable,
// ErrConflict (retry), ErrCommitUnknown (whether it split is unknown).
func (db *DB) AdminSplit(ctx context.Context, key []byte) error {
	_, _, err := db.AdminSplitRanges(ctx, key)
	return err
}

// AdminMerge merges the range holding key with its right neighbour, which
// it absorbs (DESIGN.md §11): an operator's action (`terroir admin range
// merge`). It returns the merged range. Transactions in flight on the
// absorbed range commit or abort cleanly. A neighbour on other nodes is
// moved onto the range's nodes first. Errors: ErrMergeLast,
// ErrMergeRegions, ErrMergeReplicas (not merged), ErrKeyTooLarge,
// ErrUnavailable, ErrCommitUnknown (whether it merged is unknown).
func (db *DB) AdminMerge(ctx context.Context, key []byte) (RangeInfo, error) {
	d, err := db.coord.MergeRange(ctx, key)
	if err != nil {
		return RangeInfo{}, err
	}
	return rangeInfo(d), nil
}

// AdminTransferLease hands the lease of the range holding key to node to,
// one of its replicas, without waiting for it to run out (DESIGN.md §12):
// an operator's action (`terroir admin range transfer-lease`). It returns
// the range and the first local epoch of the new holder's lease.
// Transactions holding only unreplicated locks on the range abort; those
// prepared or committing there finish first. Errors: ErrLeaseTarget
// (nothing changed), ErrKeyTooLarge, ErrUnavailable, ErrCommitUnknown.
func (db *DB) AdminTransferLease(ctx context.Context, key []byte, to uint64) (RangeInfo, uint64, error) {
	d, lease, err := db.coord.TransferLease(ctx, key, to)
	if err != nil {
		return RangeInfo{}, 0, err
	}
	return rangeInfo(d), lease.GetStart(), nil
}

// AdminMoveReplica moves the replica of the range holding key from node
// from to node to, a node of the range's region that does not host it
// (DESIGN.md §12): an operator's action (`terroir admin range move`). The
// new replica joins as a learner, catches up by a snapshot streamed from a
// consistent storage snapshot, and is promoted as the old one is removed,
// in one joint configuration change, so the range keeps three voters
// throughout; a leaseholder's replica first hands its lease to another.
// It returns the range as it is after. Errors: ErrMoveTarget (nothing
// changed), ErrKeyTooLarge, ErrUnavailable, ErrCommitUnknown.
func (db *DB) AdminMoveReplica(ctx context.Context, key []byte, from, to uint64) (RangeInfo, error) {
	d, err := db.coord.MoveReplica(ctx, key, from, to)
	if err != nil {
		return RangeInfo{}, err
	}
	return rangeInfo(d), nil
}

// AdminAddNonVoter adds a non-voting replica of the range holding key on
// node, any node of the cluster that does not host the range, in any
// region (DESIGN.md §13): an operator's action (`terroir admin range
// add-non-voter`). The replica joins as a learner that stays one, catches
// up by a streamed snapshot, and from then on serves snapshot reads of
// clients near it from its closed epoch, with no call to the home region.
// Adding one that is there already changes nothing. It returns the range
// as it is after. Errors: ErrMoveTarget (nothing changed: an unknown node,
// one that holds a voter of the range), ErrKeyTooLarge, ErrUnavailable,
// ErrCommitUnknown.
func (db *DB) AdminAddNonVoter(ctx context.Context, key []byte, node uint64) (RangeInfo, error) {
	d, err := db.coord.ChangeNonVoter(ctx, key, node, false)
	if err != nil {
		return RangeInfo{}, err
	}
	return rangeInfo(d), nil
}

// AdminRemoveNonVoter removes the non-voting replica on node of the range
// holding key (`terroir admin range remove-non-voter`). Errors as
// AdminAddNonVoter's.
func (db *DB) AdminRemoveNonVoter(ctx context.Context, key []byte, node uint64) (RangeInfo, error) {
	d, err := db.coord.ChangeNonVoter(ctx, key, node, true)
	if err != nil {
		return RangeInfo{}, err
	}
	return rangeInfo(d), nil
}

// AdminRehome moves the home of the range holding key to region (DESIGN.md
// §13; `terroir admin range rehome`): nodes of the region join as
// non-voting replicas and catch up while the range serves on; then the
// leaseholder stops, lets prepared transactions be decided, ends its lease
// by a Raft entry that records the rehome barrier, and the region's
// replicas become the voters. From then on the range's transactions commit
// at the new region's latency. Transactions holding locks there that had
// not prepared abort, and their clients retry. It returns the range as it
// is after and the barrier's global epoch. Errors: ErrRehomeTarget
// (nothing changed), ErrKeyTooLarge, ErrUnavailable, ErrCommitUnknown.
func (db *DB) AdminRehome(ctx context.Context, key []byte, region string) (RangeInfo, uint64, error) {
	d, barrier, err := db.coord.Rehome(ctx, key, region)
	if err != nil {
		return RangeInfo{}, 0, err
	}
	return rangeInfo(d), barrier, nil
}

// AdminSplitRanges is AdminSplit, returning the two ranges it made.
func (db *DB) AdminSplitRanges(ctx context.Context, key []byte) (left, right RangeInfo, err error) {
	l, r, err := db.coord.SplitRange(ctx, key)
	if err != nil {
		return RangeInfo{}, RangeInfo{}, err
	}
	return rangeInfo(l), rangeInfo(r), nil
}
