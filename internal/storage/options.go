package storage

import (
	"runtime"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// DefaultCacheSize is the block cache of a store opened with
// Options.CacheSize 0: 256 MiB. The cache fills only as blocks are read,
// so a small store uses little of it.
const DefaultCacheSize = 256 << 20

// MinCacheSize is the smallest block cache Options.CacheSize may ask for:
// 8 MiB.
const MinCacheSize = 8 << 20

// Options tune a node's store. The zero value is the defaults.
type Options struct {
	// CacheSize is the memory in bytes shared by the block cache, which
	// keeps uncompressed sstable blocks outside Go's heap, and the
	// memtables, which Pebble charges to it (0: DefaultCacheSize; at least
	// MinCacheSize). A point read or Raft log read that misses the cache
	// reads and decompresses a block from a file. An eighth more
	// (rowCacheSize) holds the newest versions of the keys read lately
	// (rowcache.go).
	CacheSize int64
	// Crashable opens the store for fault campaigns: Crash can stop it,
	// losing what a power loss would.
	Crashable bool
	// plainWAL leaves the WAL as Pebble writes it, without walFillFS: for
	// BenchmarkSyncedCommit's comparison.
	plainWAL bool
}

// OpenWith is Open with options: the cache's size, and whether the store
// is crashable. Errors are Open's, and ErrInvalidOptions for a CacheSize
// below MinCacheSize.
func OpenWith(dir string, nodeID uint64, o Options) (*Engine, error) {
	return open(dir, nodeID, o)
}

// rowCacheSize is the newest-version cache (rowcache.go) of a store
// whose block cache holds cacheSize bytes: an eighth of it, 32 MiB by
// default, room for the newest versions of about 30 000 rows of 1 KiB.
func rowCacheSize(cacheSize int64) int64 { return cacheSize / 8 }

// memtableStops is how many memtables (the one taking writes and those
// waiting to flush) may exist before writes wait for a flush.
const memtableStops = 4

// memtableSize is the largest memtable of a store whose cache holds
// cacheSize bytes: a sixteenth of the cache, at most 32 MiB. Pebble charges
// every memtable to the block cache: the memtableStops that may exist, and
// one more kept for reuse, then take under a third of it.
func memtableSize(cacheSize int64) uint64 { return uint64(min(cacheSize/16, 32<<20)) }

// l0Stops is how many L0 sublevels stop writes until compactions catch up:
// three times Pebble's 12. A stall stops every Raft group of the node at
// once, so it should come only when compactions have fallen far behind;
// before that, Pebble runs up to compactionsMax compactions at once as the
// debt grows.
const l0Stops = 36

// compactionsMax is the most compactions Pebble runs at once (its
// default is 1, however far behind it falls): the node's cores.
func compactionsMax() int { return max(1, runtime.GOMAXPROCS(0)) }

// pebbleOptions is the Pebble configuration of a store on fs with the
// given cache. Pebble's defaults suit a library embedded in a test; a node
// writes every Raft entry twice (its log, then its applied state) and
// reads its newest versions constantly, so (as CockroachDB configures
// Pebble):
//   - a block cache that the memtables leave room in: Pebble's default
//     cache (8 MiB) was wholly reserved by its 4 MiB memtables, and every
//     read went to a file, more of them as the data grew;
//   - memtables that grow (from 256 KiB) to memtableSize and may pile up
//     to memtableStops before writes wait, so a burst flushes fewer,
//     larger L0 files;
//   - L0 compacted once it holds 2 files, more compactions at once as the
//     debt grows (compactionsMax), and writes stopped by L0 only at
//     l0Stops sublevels;
//   - the MVCC data's values kept out of the compactions (valueSeparation).
func pebbleOptions(fs vfs.FS, cache *pebble.Cache) *pebble.Options {
	o := &pebble.Options{
		FS:                          fs,
		Cache:                       cache,
		Logger:                      pebbleLogger{},
		FormatMajorVersion:          pebble.FormatNewest,
		MemTableSize:                memtableSize(cache.MaxSize()),
		MemTableStopWritesThreshold: memtableStops,
		L0CompactionThreshold:       2,
		L0StopWritesThreshold:       l0Stops,
		CompactionConcurrencyRange:  func() (int, int) { return 1, compactionsMax() },
	}
	o.Experimental.ValueSeparationPolicy = func() pebble.ValueSeparationPolicy { return valueSeparation }
	o.Experimental.SpanPolicyFunc = separateDataOnly
	return o
}

// valueSeparation keeps the values of MVCC versions (at least
// separateAtLeast bytes) in blob files, which flushes write once and
// compactions leave in place, moving only the keys and a reference (the
// WiscKey design, which Pebble implements and CockroachDB enables). A store
// keeps every version for the GC TTL (hours), so without it each version's
// value was rewritten at every level the LSM grew: under YCSB-A (1 KiB
// rows) compactions wrote 9 KiB per operation in the first minute and 22
// KiB in the fourth, growing with the history (issue 17's steady state);
// with it, 4 and 6 KiB. Blob files are rewritten to reclaim space
// once half their values are garbage (GC'd versions, removed replicas)
// and they are 5 minutes old.
//
// A compaction whose inputs reference more than MaxBlobReferenceDepth
// blob files writes their values anew, in key order. Under the history a
// store keeps for the GC TTL, every table of a hot key span references
// every blob file flushed since the history began (each flush holds a
// version of most of its keys), so any bound is reached after that many
// flushes, and from then on each compaction rewrote the whole history it
// covered, more of it as the history grew. At 10, a 21-minute YCSB-A run's
// compactions grew from 4.9 to 17.8 KiB per operation and its throughput
// fell to 0.69× (issue 17's steady state). At 100, the same came later:
// with 4 KiB rows, values written again by compactions rose from none in
// minutes 1–2 to 23 KiB per operation in minute 4 and 37 in minute 7, and
// CPU per operation from 649 to 980 µs. So no depth bound
// (maxBlobReferenceDepth): a value is written once, by its flush, and
// again only when its blob file is rewritten to reclaim garbage. In the
// same pair of 7-minute runs: no value written again, CPU per operation
// 655 µs against 708, throughput 2 055 ops/s against 1 866. The costs: a
// scan of consecutive keys may fetch their values from as many blob
// files, and a compaction looks up each value's blob file among the
// references of its output table, which grow with the flushes the
// history spans (Pebble searches them linearly: about a thousand
// comparisons per value after an hour of flushes every 4 s).
var valueSeparation = pebble.ValueSeparationPolicy{
	Enabled:               true,
	MinimumSize:           separateAtLeast,
	MaxBlobReferenceDepth: maxBlobReferenceDepth,
	RewriteMinimumAge:     5 * time.Minute,
	TargetGarbageRatio:    0.5,
}

// maxBlobReferenceDepth is the most blob files a compaction's inputs may
// reference before it rewrites their values (valueSeparation): more than
// a store flushes in weeks, so never (Pebble requires a bound).
const maxBlobReferenceDepth = 1 << 20

// separateAtLeast is the smallest value kept in a blob file, in bytes:
// below it, a reference saves a compaction too little to pay for the
// extra read.
const separateAtLeast = 256

// separateDataOnly is the stores' span policy: values are separated only
// in the MVCC key spaces (PrefixData and PrefixRegional). Everything
// before them (Raft logs, hard states, applied state) is written, read
// back once or twice and deleted within seconds; in a blob file each
// such value would cost a second read and leave garbage to rewrite.
func separateDataOnly(start []byte) (pebble.SpanPolicy, []byte, error) {
	if len(start) == 0 || start[0] < PrefixData {
		return pebble.SpanPolicy{ValueStoragePolicy: pebble.ValueStorageLowReadLatency}, []byte{PrefixData}, nil
	}
	return pebble.SpanPolicy{}, nil, nil
}
