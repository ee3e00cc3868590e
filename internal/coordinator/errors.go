// Package coordinator is the client side of a read-write transaction (paper §4.2,
// DESIGN.md §4): it routes each operation to the leader of the key's range,
// buffers writes, and runs commit — one phase at the leader for a single range,
// else Prepare in parallel with the local epoch read, lease validation, the
// commit record in the transaction state store, and the commit notification.
package coordinator

import (
	"errors"
	"fmt"
)

// Limits on keys and values.
const (
	// MaxKeySize is the largest key: 4 KiB.
	MaxKeySize = 4 << 10
	// MaxValueSize is the largest value: 1 MiB.
	MaxValueSize = 1 << 20
)

// Errors. Each is matched with errors.Is; IsRetryable says which ones a retry
// of the whole transaction can clear.
var (
	// ErrConflict: the transaction lost a lock conflict (wait-die), its locks were
	// lost to a leader change, or its lease validation failed. Retryable.
	ErrConflict = errors.New("terroir: transaction conflict, retry")
	// ErrAborted: the transaction was aborted (by the caller, or resolved as
	// aborted after its coordinator went silent). Retryable.
	ErrAborted = errors.New("terroir: transaction aborted")
	// ErrUnavailable: no leader could be reached in time. Retryable.
	ErrUnavailable = errors.New("terroir: unavailable")
	// ErrPermissionDenied: the caller's certificate does not allow the
	// operation (an operator action needs the admin user; DESIGN.md §15).
	ErrPermissionDenied = errors.New("terroir: permission denied")
	// ErrRegionExcluded: the operation needs a range homed in a region an
	// operator (or the automatic policy) excluded from the global epoch
	// service; the message says since which global epoch (DESIGN.md §7).
	// It wraps ErrUnavailable too, so it is retryable: readmission heals it.
	ErrRegionExcluded = fmt.Errorf("%w: region excluded", ErrUnavailable)
	// ErrCommitUnknown: the commit's outcome is unknown (a failure after the
	// commit was submitted). Not retried automatically.
	ErrCommitUnknown = errors.New("terroir: commit outcome unknown")
	// ErrKeyTooLarge: a key exceeds MaxKeySize.
	ErrKeyTooLarge = errors.New("terroir: key too large")
	// ErrValueTooLarge: a value exceeds MaxValueSize.
	ErrValueTooLarge = errors.New("terroir: value too large")
	// ErrEmptyKey: the key is empty.
	ErrEmptyKey = errors.New("terroir: empty key")
	// ErrInvalidRange: a scan's upper bound sorts before its lower bound.
	ErrInvalidRange = errors.New("terroir: invalid range: upper bound before lower bound")
	// ErrTxnFinished: the transaction already committed or aborted.
	ErrTxnFinished = errors.New("terroir: transaction already finished")
	// ErrUnknownRegion: a region the topology does not declare.
	ErrUnknownRegion = errors.New("terroir: unknown region")
	// ErrCrossRegion: the key is homed in another region than the client's, and
	// the two regions do not both run a publisher of the global epoch, which
	// multi-region read-write transactions need.
	ErrCrossRegion = errors.New("terroir: key homed in another region without a global epoch publisher")
	// ErrReadOnly: a write in a snapshot transaction, which is read-only.
	ErrReadOnly = errors.New("terroir: write in a read-only snapshot transaction")
	// ErrSnapshotRetry: a linearizable snapshot's check failed (paper §5.3.1);
	// it must run again at a later epoch. Retryable; View does it.
	ErrSnapshotRetry = errors.New("terroir: linearizable snapshot must retry at a later epoch")
	// ErrSnapshotRestart: a regional snapshot read a key homed in another region;
	// it must run again as a multi-region snapshot (paper §5.4). View does it.
	ErrSnapshotRestart = errors.New("terroir: regional snapshot touched another region")
	// ErrSnapshotTooOld: a snapshot read at an epoch below a range's GC
	// horizon, whose older versions may be collected (DESIGN.md §14). The
	// message names the horizon. Not retryable at the same epoch.
	ErrSnapshotTooOld = errors.New("terroir: snapshot older than the GC horizon")
	// ErrTooManyVersions: a Changes page met one key with more than twice
	// the page's limit of versions in its window; read a narrower window of
	// epochs, or with no limit. Not retryable as it is.
	ErrTooManyVersions = errors.New("terroir: a key has more versions in the window than a page holds")
)

// tooOld is how a range's refusal of a snapshot below its GC horizon reads
// (rangeserver.ErrSnapshotTooOld).
const tooOld = "snapshot below the GC horizon"

// IsRetryable reports whether retrying the whole transaction may succeed.
func IsRetryable(err error) bool {
	return errors.Is(err, ErrConflict) || errors.Is(err, ErrAborted) || errors.Is(err, ErrUnavailable) ||
		errors.Is(err, ErrSnapshotRetry) || errors.Is(err, ErrSnapshotRestart)
}

// CheckKey validates a key.
func CheckKey(key []byte) error {
	switch {
	case len(key) == 0:
		return ErrEmptyKey
	case len(key) > MaxKeySize:
		return fmt.Errorf("%w: %d bytes, limit %d", ErrKeyTooLarge, len(key), MaxKeySize)
	}
	return nil
}

// CheckValue validates a value.
func CheckValue(v []byte) error {
	if len(v) > MaxValueSize {
		return fmt.Errorf("%w: %d bytes, limit %d", ErrValueTooLarge, len(v), MaxValueSize)
	}
	return nil
}
