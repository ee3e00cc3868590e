package storage

import (
	"bytes"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
)

// GCStats counts what one CollectMVCC call found and staged.
type GCStats struct {
	// Keys is how many user keys were examined.
	Keys int
	// Versions is how many versions were staged for deletion.
	Versions int
	// Bytes is the encoded size (engine key and value) of those versions.
	Bytes int64
}

// Add adds o's counts to s.
func (s *GCStats) Add(o GCStats) {
	s.Keys += o.Keys
	s.Versions += o.Versions
	s.Bytes += o.Bytes
}

// CollectMVCC stages in b the deletion of every version of each user key in
// [start, end) under prefix (a nil end: to the end of the key space) that no
// read at or above horizon can see (DESIGN.md §14): below horizon it keeps
// only the key's newest version, and drops that one too when it is a
// tombstone, since it then hides nothing. Versions at or above horizon are
// never touched. It examines at most maxKeys keys (0: no limit) and returns
// the key to resume from, or nil when it reached end. The deletions depend
// only on versions below horizon, which no commit writes any more, so every
// replica applying the same call at the same log index deletes the same
// versions. Errors wrap ErrCorrupt for an undecodable key or value.
func (e *Engine) CollectMVCC(b *pebble.Batch, prefix, start, end []byte, horizon VersionID, maxKeys int) (stats GCStats, resume []byte, err error) {
	lo, hi := MVCCKeyBounds(prefix, start, end)
	var (
		cur  []byte // the user key whose versions are being read
		seen bool   // cur's newest version below horizon has been seen
	)
	err = e.Scan(lo, hi, func(k, v []byte) (bool, error) {
		key, ver, err := DecodeMVCCKey(prefix, k)
		if err != nil {
			return false, fmt.Errorf("%w: %v", ErrCorrupt, err)
		}
		if cur == nil || !bytes.Equal(key, cur) {
			if maxKeys > 0 && stats.Keys == maxKeys {
				resume = key
				return false, nil
			}
			cur, seen = key, false
			stats.Keys++
		}
		if !ver.Less(horizon) {
			return true, nil // a read at or above horizon may see it
		}
		if seen {
			return true, stage(b, k, v, &stats) // shadowed below horizon
		}
		seen = true
		_, tomb, err := DecodeMVCCValue(v)
		if err != nil {
			return false, fmt.Errorf("%w: %v", ErrCorrupt, err)
		}
		if tomb {
			return true, stage(b, k, v, &stats) // hides only what goes with it
		}
		return true, nil
	})
	return stats, resume, err
}

// stage stages the deletion of one version.
func stage(b *pebble.Batch, k, v []byte, stats *GCStats) error {
	stats.Versions++
	stats.Bytes += int64(len(k) + len(v))
	return b.Delete(k, nil)
}
