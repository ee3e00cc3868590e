// Package commitrule holds the rules a read-write transaction commits by
// (paper §4.2, §5.1, §5.3.1; DESIGN.md §3–§6), in one place for both sides
// that apply them: the coordinator running two-phase commit and the range
// leader committing in one phase. They are pure functions of epochs, leases
// and versions, with no I/O and no clock.
package commitrule

import (
	"errors"
	"fmt"

	"github.com/terroir-db/terroir/internal/storage"
)

// ErrLeaseValidation: the local epoch read for the commit lies outside a
// participant's lease, or a local-epoch version would pass its end; the
// transaction must abort (paper §4.2).
var ErrLeaseValidation = errors.New("commitrule: local epoch outside the lease")

// Lease is a participant's lease interval of local epochs, [Start, End]
// (DESIGN.md §3.3).
type Lease struct {
	Start, End uint64
}

// Validate checks a participant's lease for a transaction whose local epoch
// read after every lock was held is local, and whose version epoch is
// version (DESIGN.md §4.3): local must lie in the lease, so no other
// leaseholder could have granted a conflicting lock meanwhile; and with
// local-epoch versions (a regional-only deployment, localVersions) the
// version's epoch must not pass the lease's end, or a later leaseholder's
// writers could be ordered before the transaction. Errors wrap
// ErrLeaseValidation.
func Validate(local, version uint64, lease Lease, localVersions bool) error {
	if local < lease.Start || local > lease.End {
		return fmt.Errorf("%w: local epoch %d, lease [%d, %d]", ErrLeaseValidation, local, lease.Start, lease.End)
	}
	if localVersions && version > lease.End {
		return fmt.Errorf("%w: version epoch %d past the lease's end %d", ErrLeaseValidation, version, lease.End)
	}
	return nil
}

// VersionEpoch is the epoch a transaction's version carries (paper §5.1,
// DESIGN.md §3.5): the highest of the global epoch read at the publisher (the
// local epoch in a regional-only deployment), every participant's highest
// epoch, and the client session's highest.
func VersionEpoch(read uint64, highest ...uint64) uint64 {
	for _, h := range highest {
		read = max(read, h)
	}
	return read
}

// IsQuiet reports whether global epoch e is quiet: a multiple of k > 0, at
// which no transaction commits (paper §5.3.1). A writer whose version epoch
// is quiet waits, with its locks held, for the next epoch.
func IsQuiet(e, k uint64) bool { return k > 0 && e%k == 0 }

// ChooseVersion returns the version id of a transaction with epoch `epoch`
// whose write set's newest existing version is newest (DESIGN.md §6):
// <epoch, 1>, or the next counter if the write set already has a version at
// or above it, so the new version exceeds every version of its keys.
func ChooseVersion(epoch uint64, newest storage.VersionID) storage.VersionID {
	v := storage.VersionID{Epoch: epoch, Counter: 1}
	if !newest.Less(v) {
		v = newest.Next()
	}
	return v
}
