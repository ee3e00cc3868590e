// Package client is Terroir's Go API: strictly serializable, interactive
// read-write transactions over a cluster described by its topology file.
//
//	db, err := client.Open("examples/one-region.yaml", client.Options{})
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
// Errors are typed: compare with errors.Is against the Err values; IsRetryable
// tells which ones Update retries.
package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/terroir-db/terroir/internal/coordinator"
	"github.com/terroir-db/terroir/internal/storage"
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
	// ErrCrossRegion: a key homed in another region when the two regions do not
	// both run a publisher of the global epoch.
	ErrCrossRegion = coordinator.ErrCrossRegion
)

// IsRetryable reports whether retrying the whole transaction may succeed.
func IsRetryable(err error) bool { return coordinator.IsRetryable(err) }

// Options configure a client.
type Options struct {
	// Region is where the client runs; it may be left empty when the topology
	// has one region.
	Region string
}

// DB is a handle on a cluster. It is safe for concurrent use.
type DB struct {
	coord  *coordinator.Coordinator
	dialer *transport.Dialer
	owns   bool
}

// Open connects to the cluster of the topology file at path. It fails with a
// topology error, or ErrUnknownRegion.
func Open(path string, opts Options) (*DB, error) {
	top, err := topology.Load(path)
	if err != nil {
		return nil, err
	}
	region, err := pickRegion(top, opts.Region)
	if err != nil {
		return nil, err
	}
	d := transport.NewDialer(transport.NewNetwork(top), transport.Endpoint{Region: region})
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
		return "", fmt.Errorf("client: the topology has %d regions: set Options.Region", len(top.Regions))
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
	return &DB{coord: c, dialer: d}, nil
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

// Commit commits the transaction and returns its version id. After a retryable
// error nothing was committed; after ErrCommitUnknown the outcome is unknown.
func (tx *Txn) Commit(ctx context.Context) (storage.VersionID, error) { return tx.t.Commit(ctx) }

// Abort discards the transaction and releases its locks.
func (tx *Txn) Abort(ctx context.Context) error { return tx.t.Abort(ctx) }

// Update runs fn in a transaction and commits it, retrying the whole
// transaction after retryable errors (keeping its wait-die priority, so it
// eventually wins) with jittered exponential backoff, until ctx ends. An error
// returned by fn aborts the transaction and is returned as is.
func (db *DB) Update(ctx context.Context, fn func(ctx context.Context, tx *Txn) error) error {
	var priority uint64
	backoff := time.Millisecond
	for {
		t := db.coord.Begin(priority)
		priority = t.Priority()
		tx := &Txn{t: t}
		err := fn(ctx, tx)
		if err == nil {
			_, err = tx.Commit(ctx)
			if err == nil {
				return nil
			}
		} else {
			_ = tx.Abort(context.WithoutCancel(ctx))
		}
		if !IsRetryable(err) {
			return err
		}
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
