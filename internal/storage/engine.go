// Package storage is a node's durable store: one Pebble LSM per node holding every
// Raft log, hard state, snapshot and applied state of the replicas the node hosts
// (DESIGN.md §2). It owns the top-level key layout so components cannot collide.
package storage

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// Key space prefixes. Every key in the engine starts with one of these bytes.
const (
	// PrefixMeta holds the store identity.
	PrefixMeta byte = 0x00
	// PrefixRaft holds Raft logs, hard states, conf states and snapshots (owned by raftgroup).
	PrefixRaft byte = 0x01
	// PrefixState holds replicated state machines' applied state, one sub-space
	// per group; a range keeps only its range-local state there (lease,
	// prepared records), never user data.
	PrefixState byte = 0x02
	// PrefixData holds the MVCC data of every range the node hosts, under the
	// user key (DESIGN.md §11), so a split or a merge moves no user data.
	PrefixData byte = 0x03
	// PrefixRegional holds the regional copies of that data: the same writes
	// under local-epoch version ids, which regional snapshots read (paper §5.4).
	PrefixRegional byte = 0x04
)

// LayoutVersion is the version of the key layout this binary reads and writes,
// recorded in every store it creates. Layout 1 kept each range's MVCC data
// under the range's id; layout 2 keeps it under the user key (PrefixData,
// PrefixRegional).
const LayoutVersion = 2

// Errors returned by Open and by readers of stored records.
var (
	// ErrCorrupt marks a data directory whose files are damaged or truncated, or a
	// stored record that does not decode. The data is left untouched for inspection.
	ErrCorrupt = errors.New("storage: corrupt data")
	// ErrWrongNode marks a data directory that belongs to another node.
	ErrWrongNode = errors.New("storage: data directory belongs to another node")
	// ErrInUse marks a data directory another process (or another Engine) holds open.
	ErrInUse = errors.New("storage: data directory in use")
	// ErrInvalidOptions marks Options a store cannot open with (a
	// CacheSize below MinCacheSize).
	ErrInvalidOptions = errors.New("storage: invalid options")
	// ErrLayout marks a data directory written in another key layout than
	// LayoutVersion; it is refused, untouched, rather than misread.
	ErrLayout = errors.New("storage: data directory has another key layout")
)

var (
	rangeIndexPrefix     = []byte{PrefixMeta, 'R'}
	rangeTombstonePrefix = []byte{PrefixMeta, 'T'}
	groupIndexPrefix     = []byte{PrefixMeta, 'G'}
	groupTombstonePrefix = []byte{PrefixMeta, 'H'}
	storeIdentKey        = []byte{PrefixMeta, 'i', 'd', 'e', 'n', 't'}
	layoutVersionKey     = []byte{PrefixMeta, 'l', 'a', 'y', 'o', 'u', 't'}
)

// Engine is a node's Pebble store. It is safe for concurrent use.
type Engine struct {
	db       *pebble.DB
	dir      string
	fsCloser io.Closer
	fs       vfs.FS // the store's file system (the crash-injecting one, if crashable): through useFS
	// closing orders the engine's own file work (staged SSTs) before Close
	// stops the file system's disk-health checker: a call after it would
	// start the checker's goroutine again, to outlive the engine.
	closing *fsGate
	crash   *crashFS      // nil unless opened with OpenCrashable
	cache   *pebble.Cache // the block cache (db holds the reference; freed by Close)
	rows    *rowCache     // the newest-version cache (rowcache.go)
	stalls  *stalls
}

// Open opens (creating if absent) the store in dir for node nodeID. A directory
// initialised by another node fails with ErrWrongNode, one written in another
// key layout with ErrLayout (naming both versions); damaged or truncated files
// fail with an error wrapping ErrCorrupt (never a panic).
func Open(dir string, nodeID uint64) (*Engine, error) { return open(dir, nodeID, Options{}) }

// OpenCrashable is Open for fault campaigns: the engine can also be stopped
// with Crash, which loses what a power loss would.
func OpenCrashable(dir string, nodeID uint64) (*Engine, error) {
	return open(dir, nodeID, Options{Crashable: true})
}

func open(dir string, nodeID uint64, o Options) (e *Engine, err error) {
	if o.CacheSize != 0 && o.CacheSize < MinCacheSize {
		return nil, fmt.Errorf("%w: a cache of %d bytes is below the %d-byte minimum", ErrInvalidOptions, o.CacheSize, MinCacheSize)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("storage: create %s: %w", dir, err)
	}
	// Disk-health checking wrapped here, not by Pebble, so its goroutine is
	// stopped even when Open fails.
	diskFS, fsCloser := vfs.WithDiskHealthChecks(vfs.Default, 5*time.Second, nil, func(info vfs.DiskSlowInfo) {
		slog.Warn("storage: slow disk", "path", info.Path, "op", info.OpType.String(), "duration", info.Duration)
	})
	defer func() {
		// Pebble reports some corruption through Logger.Fatalf (a panic here).
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %s: %v", ErrCorrupt, dir, r)
		}
		if err != nil {
			_ = fsCloser.Close()
		}
	}()
	if !o.plainWAL {
		diskFS = walFillFS{diskFS} // under crashFS: a crash cuts Pebble's own writes (walfill.go)
	}
	var crash *crashFS
	if o.Crashable {
		crash = newCrashFS(diskFS)
		diskFS = crash
	}
	cache := pebble.NewCache(cmp.Or(o.CacheSize, DefaultCacheSize))
	defer cache.Unref() // the DB holds its own reference
	opts := pebbleOptions(diskFS, cache)
	opts.EventListener = &pebble.EventListener{
		// The read that met the damage returns an error wrapping ErrCorrupt.
		DataCorruption: func(info pebble.DataCorruptionInfo) {
			slog.Error("storage: on-disk corruption", "path", info.Path,
				"err", strings.SplitN(info.Details.Error(), "\n", 2)[0])
		},
	}
	st := &stalls{}
	st.listen(opts.EventListener)
	db, err := pebble.Open(filepath.Clean(dir), opts)
	switch {
	case err == nil:
	case errors.Is(err, fs.ErrPermission):
		return nil, fmt.Errorf("storage: open %s: %w", dir, err)
	case errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EWOULDBLOCK) || strings.Contains(err.Error(), "lock"):
		return nil, fmt.Errorf("%w: %s: %v", ErrInUse, dir, err)
	default:
		// Anything else Pebble refuses at open is a damaged, truncated or foreign
		// file: a malformed MANIFEST or OPTIONS, a table of the wrong size, a
		// missing referenced file.
		return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, dir, err)
	}
	e = &Engine{db: db, dir: dir, fsCloser: fsCloser, fs: diskFS, closing: &fsGate{}, crash: crash, cache: cache, stalls: st,
		rows: newRowCache(rowCacheSize(cmp.Or(o.CacheSize, DefaultCacheSize)))}
	if err := e.checkIdent(nodeID); err != nil {
		_ = db.Close()
		return nil, err
	}
	if err := e.clearStaging(); err != nil {
		_ = db.Close()
		return nil, err
	}
	return e, nil
}

// checkIdent records node nodeID and LayoutVersion in a new store, and checks
// them in an existing one. A store from before layouts were recorded has
// layout 1.
func (e *Engine) checkIdent(nodeID uint64) error {
	v, err := e.Get(storeIdentKey)
	if err != nil {
		return err
	}
	if v == nil {
		b := e.db.NewBatch()
		_ = b.Set(storeIdentKey, binary.BigEndian.AppendUint64(nil, nodeID), nil)
		_ = b.Set(layoutVersionKey, binary.BigEndian.AppendUint32(nil, LayoutVersion), nil)
		return e.Commit(b, true)
	}
	if len(v) != 8 {
		return fmt.Errorf("%w: store identity record has %d bytes", ErrCorrupt, len(v))
	}
	if got := binary.BigEndian.Uint64(v); got != nodeID {
		return fmt.Errorf("%w: %s was initialised by node %d, not node %d", ErrWrongNode, e.dir, got, nodeID)
	}
	lv, err := e.Get(layoutVersionKey)
	if err != nil {
		return err
	}
	layout := uint32(1)
	switch {
	case lv == nil:
	case len(lv) != 4:
		return fmt.Errorf("%w: layout version record has %d bytes", ErrCorrupt, len(lv))
	default:
		layout = binary.BigEndian.Uint32(lv)
	}
	if layout != LayoutVersion {
		return fmt.Errorf("%w: %s holds layout version %d; this binary reads layout version %d only (start the node from an empty directory)",
			ErrLayout, e.dir, layout, LayoutVersion)
	}
	return nil
}

// RangeIndexKey is the key recording that the store holds range id's state
// though the topology file does not name the range (a split made it). Its
// value is empty; set it in the batch that creates the range's state.
func RangeIndexKey(id uint64) []byte {
	return binary.BigEndian.AppendUint64(append([]byte{}, rangeIndexPrefix...), id)
}

// IndexedRanges returns the IDs recorded by RangeIndexKey, ascending.
func (e *Engine) IndexedRanges() ([]uint64, error) {
	return e.rangeIDs(rangeIndexPrefix, "range index")
}

// rangeIDs returns the range IDs of the keys under prefix (each prefix and a
// big-endian ID), ascending. A key of another length wraps ErrCorrupt.
func (e *Engine) rangeIDs(prefix []byte, what string) ([]uint64, error) {
	var ids []uint64
	err := e.Scan(prefix, PrefixEnd(prefix), func(k, _ []byte) (bool, error) {
		if len(k) != len(prefix)+8 {
			return false, fmt.Errorf("%w: %s key of %d bytes", ErrCorrupt, what, len(k))
		}
		ids = append(ids, binary.BigEndian.Uint64(k[len(prefix):]))
		return true, nil
	})
	return ids, err
}

// RangeTombstoneKey is the key recording that range id was merged away on
// this store (DESIGN.md §11): the node never hosts it again, even if the
// topology file names it. Its value is empty; set it in the batch that
// applies the merge.
func RangeTombstoneKey(id uint64) []byte {
	return binary.BigEndian.AppendUint64(append([]byte{}, rangeTombstonePrefix...), id)
}

// RemovedRanges returns the IDs recorded by RangeTombstoneKey, ascending.
func (e *Engine) RemovedRanges() ([]uint64, error) {
	return e.rangeIDs(rangeTombstonePrefix, "range tombstone")
}

// GroupIndexKey is the key recording that the store hosts a replica of
// the non-range group id (an epoch, transaction-state or directory group)
// though the topology file does not name this node among its replicas: a
// replica move brought it (DESIGN.md §12). Its value is empty.
func GroupIndexKey(id uint64) []byte {
	return binary.BigEndian.AppendUint64(append([]byte{}, groupIndexPrefix...), id)
}

// IndexedGroups returns the IDs recorded by GroupIndexKey, ascending.
func (e *Engine) IndexedGroups() ([]uint64, error) {
	return e.rangeIDs(groupIndexPrefix, "group index")
}

// GroupTombstoneKey is the key recording that the non-range group id's
// replica left this store (a move took it elsewhere): the node does not
// host it at a restart though the topology file names it, until a move
// brings it back. Its value is empty.
func GroupTombstoneKey(id uint64) []byte {
	return binary.BigEndian.AppendUint64(append([]byte{}, groupTombstonePrefix...), id)
}

// RemovedGroups returns the IDs recorded by GroupTombstoneKey, ascending.
func (e *Engine) RemovedGroups() ([]uint64, error) {
	return e.rangeIDs(groupTombstonePrefix, "group tombstone")
}

// DeleteState deletes group id's state machine sub-space (PrefixState and
// the big-endian id), durably: a range merged away.
func (e *Engine) DeleteState(id uint64) error {
	lo := binary.BigEndian.AppendUint64([]byte{PrefixState}, id)
	b := e.NewBatch()
	if err := b.DeleteRange(lo, PrefixEnd(lo), nil); err != nil {
		_ = b.Close()
		return err
	}
	return e.Commit(b, true)
}

// DiskUsage estimates the bytes on disk of the keys in [start, end): the
// tables overlapping it, in proportion (data still in the memtable is not
// counted).
func (e *Engine) DiskUsage(start, end []byte) (uint64, error) {
	n, err := e.db.EstimateDiskUsage(start, end)
	if err != nil {
		return 0, wrapReadErr(err)
	}
	return n, nil
}

// Dir returns the data directory.
func (e *Engine) Dir() string { return e.dir }

// Get returns a copy of the value at key, or nil (and no error) if absent.
// Read failures from damaged files wrap ErrCorrupt.
func (e *Engine) Get(key []byte) ([]byte, error) { return get(e.db, key) }

// reader is what Engine and Snapshot read through: a Pebble DB or snapshot.
type reader interface {
	Get(key []byte) ([]byte, io.Closer, error)
	NewIter(o *pebble.IterOptions) (*pebble.Iterator, error)
}

func get(r reader, key []byte) ([]byte, error) {
	v, closer, err := r.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, wrapReadErr(err)
	}
	out := append([]byte{}, v...)
	_ = closer.Close()
	return out, nil
}

// NewBatch returns an empty write batch; commit it with Commit.
func (e *Engine) NewBatch() *pebble.Batch { return e.db.NewBatch() }

// NewIndexedBatch returns an empty batch whose Get and iterators see its own
// writes over the engine's state; commit it with Commit.
func (e *Engine) NewIndexedBatch() *pebble.Batch { return e.db.NewIndexedBatch() }

// Commit applies b atomically. With sync the batch is in the fsync'd WAL before
// Commit returns; Pebble groups concurrent synced commits into one fsync. A later
// synced commit also makes every earlier commit durable (the WAL is sequential).
func (e *Engine) Commit(b *pebble.Batch, sync bool) error {
	opt := pebble.NoSync
	if sync {
		opt = pebble.Sync
	}
	err := b.Commit(opt)
	// Visible in Pebble now: bring the newest-version cache up to date
	// with the keys written before the batch goes, and before the caller
	// releases any lock over them. A failed commit may have applied some
	// of it, or none: the cache forgets everything.
	if err != nil {
		e.rows.clear()
	} else {
		e.rows.applyBatch(b)
	}
	_ = b.Close()
	if err != nil {
		return fmt.Errorf("storage: commit: %w", err)
	}
	return nil
}

// Scan calls fn for each key in [lo, hi) in order until fn returns false or an
// error. The slices passed to fn are valid only during the call.
func (e *Engine) Scan(lo, hi []byte, fn func(k, v []byte) (bool, error)) error {
	return scan(e.db, lo, hi, fn)
}

func scan(r reader, lo, hi []byte, fn func(k, v []byte) (bool, error)) error {
	return iterate(r, lo, hi, func(it *pebble.Iterator) (bool, error) {
		v, err := it.ValueAndErr()
		if err != nil {
			return false, wrapReadErr(err)
		}
		return fn(it.Key(), v)
	})
}

// iterate calls step at each key of an iterator over [lo, hi) of r, in
// order, until step returns false or an error, then closes the iterator.
func iterate(r reader, lo, hi []byte, step func(*pebble.Iterator) (bool, error)) error {
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return wrapReadErr(err)
	}
	for valid := it.First(); valid; valid = it.Next() {
		if more, err := step(it); err != nil || !more {
			_ = it.Close()
			return err
		}
	}
	if err := it.Close(); err != nil {
		return wrapReadErr(err)
	}
	return nil
}

// ScanLazy is Scan for readers that need the sizes of most values but not
// their bytes (a split's search for a range's middle, GC): fn gets each key
// in [lo, hi), in order, with its value unread (LazyValue). A value of
// separateAtLeast bytes or more lives in a blob file, where reading it
// costs a block read and decompression that its length does not. k and v
// are valid only during the call. fn returning false stops the scan.
// Errors are Scan's.
func (e *Engine) ScanLazy(lo, hi []byte, fn func(k []byte, v *LazyValue) (bool, error)) error {
	v := &LazyValue{}
	return iterate(e.db, lo, hi, func(it *pebble.Iterator) (bool, error) {
		v.lv = it.LazyValue()
		return fn(it.Key(), v)
	})
}

// LazyValue is a value ScanLazy passes unread.
type LazyValue struct{ lv pebble.LazyValue }

// Len is the value's length in bytes, known without reading it.
func (v *LazyValue) Len() int { return v.lv.Len() }

// Value reads the value (from its blob file, if it is in one). The bytes
// are valid only during the ScanLazy call. Errors are Scan's.
func (v *LazyValue) Value() ([]byte, error) {
	b, _, err := v.lv.Value(nil)
	if err != nil {
		return nil, wrapReadErr(err)
	}
	return b, nil
}

// Close closes the store. Data committed without sync may be lost, as in a
// crash; after Crash it is.
func (e *Engine) Close() error {
	err := e.db.Close()
	e.closing.mu.Lock()
	e.closing.closed = true
	e.closing.mu.Unlock()
	_ = e.fsCloser.Close()
	if e.crash != nil && e.crash.dead() {
		return e.crash.cut() // the store's own complaints are moot after a crash
	}
	return err
}

// useFS runs op on the store's file system, unless the engine is closed
// (an error wrapping pebble.ErrClosed).
func (e *Engine) useFS(op func(fs vfs.FS) error) error {
	e.closing.mu.RLock()
	defer e.closing.mu.RUnlock()
	if e.closing.closed {
		return fmt.Errorf("storage: %w", pebble.ErrClosed)
	}
	return op(e.fs)
}

// fsGate is what useFS and Close share: closed, under mu, once Close has
// begun.
type fsGate struct {
	mu     sync.RWMutex
	closed bool
}

// Crash is the instant of a power loss or kill -9: from now on nothing the
// engine does reaches the disk, and Close leaves the files as that instant
// did, cut back to their last sync, so every write not yet synced is lost.
// Reads keep working until Close. On an engine not opened with
// OpenCrashable it does nothing.
func (e *Engine) Crash() {
	if e.crash != nil {
		e.crash.crash()
	}
}

func wrapReadErr(err error) error {
	if pebble.IsCorruptionError(err) {
		return fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	return fmt.Errorf("storage: read: %w", err)
}

// pebbleLogger routes Pebble's logs to slog and turns Fatalf into a panic that Open
// recovers, so a damaged store never exits the process.
type pebbleLogger struct{}

func (pebbleLogger) Infof(format string, args ...any) {
	slog.Debug(fmt.Sprintf(format, args...), "component", "pebble")
}
func (pebbleLogger) Errorf(format string, args ...any) {
	slog.Error(fmt.Sprintf(format, args...), "component", "pebble")
}
func (pebbleLogger) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf(format, args...))
}

// AppendRecord appends b to dst as a 4-byte big-endian length and the bytes:
// the framing of state machine snapshots.
func AppendRecord(dst, b []byte) []byte {
	return append(binary.BigEndian.AppendUint32(dst, uint32(len(b))), b...)
}

// NextRecord splits the first record written by AppendRecord off data. A
// truncated record fails with ErrCorrupt.
func NextRecord(data []byte) (rec, rest []byte, err error) {
	if len(data) < 4 || uint64(len(data)-4) < uint64(binary.BigEndian.Uint32(data)) {
		return nil, nil, fmt.Errorf("%w: truncated snapshot record", ErrCorrupt)
	}
	n := binary.BigEndian.Uint32(data)
	return data[4 : 4+n], data[4+n:], nil
}
