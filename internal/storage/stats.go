package storage

import (
	"bytes"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
)

// MVCCStats measures the versions stored under one MVCC prefix.
type MVCCStats struct {
	// Keys is the number of user keys with at least one version.
	Keys int
	// Versions is the number of versions, tombstones included.
	Versions int
	// Bytes is the encoded size (engine key and value) of every version:
	// what the history kept costs, before the engine's own overheads.
	Bytes int64
	// NewestBytes is the encoded size of each key's newest version only:
	// the data set itself.
	NewestBytes int64
}

// MVCCStats scans every version under prefix and counts them. It reads the
// whole prefix: for benchmarks and tools, not for a hot path. Errors wrap
// ErrCorrupt for an undecodable key.
func (e *Engine) MVCCStats(prefix []byte) (MVCCStats, error) {
	var s MVCCStats
	var cur []byte
	err := e.Scan(prefix, PrefixEnd(prefix), func(k, v []byte) (bool, error) {
		key, _, err := DecodeMVCCKey(prefix, k)
		if err != nil {
			return false, fmt.Errorf("%w: %v", ErrCorrupt, err)
		}
		n := int64(len(k) + len(v))
		if cur == nil || !bytes.Equal(key, cur) {
			cur = key
			s.Keys++
			s.NewestBytes += n // versions come newest first
		}
		s.Versions++
		s.Bytes += n
		return true, nil
	})
	return s, err
}

// Metrics returns Pebble's own metrics of the engine (LSM levels,
// compactions, flushes, caches, WAL), for the node's /metrics.
func (e *Engine) Metrics() *pebble.Metrics { return e.db.Metrics() }

// BytesWritten returns the bytes m's flushes and compactions wrote to
// tables and blob files (with the WAL's, what the store wrote to disk),
// and the part of compacted that went to blob files: separated values
// written again, to restore their locality or to reclaim a blob file's
// garbage. Pebble (v2.1) counts a flush's blob bytes in its level's
// BlobBytesCompacted as well as in BlobBytesFlushed; this counts them
// once, as flushed. pm.Total() is not used: it adds the WAL's bytes to
// the flushes'.
func BytesWritten(m *pebble.Metrics) (flushed, compacted, valuesRewritten uint64) {
	for _, l := range m.Levels {
		flushed += l.TableBytesFlushed + l.BlobBytesFlushed
		compacted += l.TableBytesCompacted
		if l.BlobBytesCompacted > l.BlobBytesFlushed {
			valuesRewritten += l.BlobBytesCompacted - l.BlobBytesFlushed
		}
	}
	return flushed, compacted + valuesRewritten, valuesRewritten
}
