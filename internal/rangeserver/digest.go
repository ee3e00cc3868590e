package rangeserver

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"

	"github.com/terroir-db/terroir/internal/storage"
)

// ErrDigestNotReady: a replica cannot digest its data as of an epoch it
// has not closed yet (it may still apply writes at or below it), or below
// its GC threshold (versions there may be collected on one replica and not
// yet on another).
var ErrDigestNotReady = errors.New("rangeserver: the replica's data as of that epoch is not settled")

// DataDigest returns a digest (64-bit FNV-1a) of this replica's data as of
// global epoch epoch: each key of the range's span with its newest version
// at or below epoch, by version id and value (deleted keys, and keys
// without such a version, are left out); the number of keys digested; and
// the descriptor's generation it was taken under. Replicas of one range
// at one generation that have closed epoch hold the same data as of it
// (DESIGN.md §3), so their digests match: a fault campaign's check that no
// replica lost or invented data (a replica that applied a merge without
// the subsumed range's data, say). Errors: ErrDigestNotReady,
// storage.ErrCorrupt.
func (r *Replica) DataDigest(epoch uint64) (sum uint64, keys int, generation uint64, err error) {
	d := r.sm.Descriptor()
	if closed := r.sm.ClosedEpoch(); closed < epoch {
		return 0, 0, 0, fmt.Errorf("%w: range %d on node %d has closed epoch %d, below %d", ErrDigestNotReady, r.id, r.self, closed, epoch)
	}
	if h := r.sm.GCThreshold().GetHorizon(); h > epoch {
		return 0, 0, 0, fmt.Errorf("%w: range %d on node %d collects below epoch %d, above %d", ErrDigestNotReady, r.id, r.self, h, epoch)
	}
	var end []byte
	if len(d.GetEndKey()) > 0 {
		end = d.GetEndKey()
	}
	h := fnv.New64a()
	var buf [12]byte
	err = r.sm.Scan(Versions, d.GetStartKey(), end, storage.VersionID{Epoch: epoch + 1}, func(v storage.Version, _ storage.VersionID) bool {
		if v.ID == (storage.VersionID{}) || v.Tombstone {
			return true
		}
		keys++
		binary.BigEndian.PutUint32(buf[:4], uint32(len(v.Key)))
		_, _ = h.Write(buf[:4])
		_, _ = h.Write(v.Key)
		binary.BigEndian.PutUint64(buf[:8], v.ID.Epoch)
		binary.BigEndian.PutUint32(buf[8:], v.ID.Counter)
		_, _ = h.Write(buf[:])
		binary.BigEndian.PutUint32(buf[:4], uint32(len(v.Value)))
		_, _ = h.Write(buf[:4])
		_, _ = h.Write(v.Value)
		return true
	})
	if err != nil {
		return 0, 0, 0, err
	}
	return h.Sum64(), keys, d.GetGeneration(), nil
}
