package storage

import (
	"hash/maphash"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"
	"github.com/hashicorp/golang-lru/v2/simplelru"
)

// The newest-version cache (issue 17's steady state). A range leader reads
// the newest committed version of a key for every read of a read-write
// transaction (DESIGN.md §4.1) and the newest version id of every key it
// writes (§6). In Pebble each such read is an iterator over every level of
// the LSM, and under the history a store keeps for the GC TTL the levels
// fill one by one: a YCSB-A run's CPU per operation rose by a fifth between
// its 2nd and its 20th minute while disk writes per operation stayed flat.
// The cache keeps, for the keys read lately, the newest version (id,
// tombstone, value) as Pebble last showed it, so that such a read of a hot
// key costs a map lookup, whatever the history under it.
//
// It is a cache of Pebble's state, never a source: an entry is made only
// from a read of the engine. Every commit then brings the entries of the
// keys it writes up to date (Engine.Commit reads the batch: a new version
// replaces the entry, the deletion of the entry's version drops it), and
// an ingestion or a range deletion over the MVCC key spaces drops them
// all, after the write is visible in Pebble and before Commit returns, so
// before any lock the write's transaction holds is released or any
// applied index moves past it. Under YCSB-A's even mix of reads and
// writes, a cache that only dropped written keys answered half the reads;
// one that follows the writes answers nearly all of a hot key's. A read
// that raced a write cannot leave its older answer behind: each shard
// counts the writes it saw, and an entry made from a read is kept only
// when no write to its shard came between the read's start and its end.
// Snapshot-consistent reads at older epochs use an entry only when its
// version lies below the epoch read; scans, changefeeds and Pebble
// snapshots never use it.

// rowCacheShards is how many shards (each with its lock and LRU) the
// cache has: enough that commits and reads on two cores rarely meet.
const rowCacheShards = 32

// rowCacheMaxValue is the largest value the cache keeps, in bytes: a
// bigger row is read from Pebble each time, so that a few big rows do not
// evict the many small hot ones.
const rowCacheMaxValue = 16 << 10

// rowCacheEntryOverhead approximates, in bytes, what an entry costs beyond
// its key and value (the LRU's list element and map slot, the entry).
const rowCacheEntryOverhead = 96

// rowEntry is a key's newest version as Pebble last showed it: its id,
// whether it is a tombstone, and (full) its value; an entry made by
// NewestVersion, which does not read the value, has the id alone.
type rowEntry struct {
	id    VersionID
	tomb  bool
	full  bool
	value []byte
}

func (r rowEntry) size(key string) int64 {
	return int64(len(key) + len(r.value) + rowCacheEntryOverhead)
}

// rowCache is the newest-version cache of one Engine (see above), keyed by
// the escaped user key under its prefix (the MVCC key without its
// version). It is safe for concurrent use.
type rowCache struct {
	seed   maphash.Seed
	shards [rowCacheShards]rowShard
	// hits and misses count the reads (GetMVCC, NewestVersion) the
	// cache answered and those it sent to Pebble.
	hits, misses atomic.Uint64
}

// RowCacheStats is what a store's newest-version cache (rowcache.go) has
// done since the store opened: the reads of a key's newest version it
// answered (Hits) and those that went to Pebble (Misses), and the bytes
// it holds now (keys, values and an estimate of their overhead).
type RowCacheStats struct {
	Hits, Misses uint64
	Bytes        int64
}

// RowCacheStats returns the store's newest-version cache's counters.
func (e *Engine) RowCacheStats() RowCacheStats {
	c := e.rows
	if c == nil {
		return RowCacheStats{}
	}
	st := RowCacheStats{Hits: c.hits.Load(), Misses: c.misses.Load()}
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		st.Bytes += s.bytes
		s.mu.Unlock()
	}
	return st
}

// rowShard is one shard: its LRU, its bytes, the bytes it may hold, and
// the count of the writes and clears it saw (gen), which a racing read
// checks.
type rowShard struct {
	mu     sync.Mutex
	lru    *simplelru.LRU[string, rowEntry]
	bytes  int64
	budget int64
	gen    uint64
}

// newRowCache returns a cache of about capacity bytes (keys, values and
// overhead); nil when capacity is 0 (no cache).
func newRowCache(capacity int64) *rowCache {
	if capacity <= 0 {
		return nil
	}
	c := &rowCache{seed: maphash.MakeSeed()}
	for i := range c.shards {
		s := &c.shards[i]
		s.budget = max(capacity/rowCacheShards, 1)
		// The LRU's own bound is the entry count that fits the budget at
		// the smallest entry; bytes bound it first (evict).
		lru, err := simplelru.NewLRU[string, rowEntry](int(s.budget/rowCacheEntryOverhead)+1, nil)
		if err != nil {
			panic(err) // only for a size ≤ 0
		}
		s.lru = lru
	}
	return c
}

func (c *rowCache) shard(key []byte) *rowShard {
	return &c.shards[maphash.Bytes(c.seed, key)%rowCacheShards]
}

// get returns key's entry, if the cache holds one, and the shard's write
// count, which a read of the engine that follows a miss passes back to
// put.
func (c *rowCache) get(key []byte) (rowEntry, bool, uint64) {
	s := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.lru.Get(string(key))
	return e, ok, s.gen
}

// counted records whether a read was answered by the cache.
func (c *rowCache) counted(hit bool) {
	if hit {
		c.hits.Add(1)
	} else {
		c.misses.Add(1)
	}
}

// put records e as key's newest version, read from the engine after get
// returned gen, unless the shard saw a write since (the read may have
// missed it). An id-only entry never replaces a full one for the same
// version.
func (c *rowCache) put(key []byte, e rowEntry, gen uint64) {
	s := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gen != gen {
		return
	}
	k := string(key)
	if old, ok := s.lru.Peek(k); ok && old.full && !e.full && old.id == e.id {
		return
	}
	s.store(k, e)
}

// store makes e key k's entry, or drops k's entry when e's value is above
// rowCacheMaxValue, then evicts the least recently used entries while the
// shard holds more than its budget (s.mu held).
func (s *rowShard) store(k string, e rowEntry) {
	s.drop(k)
	if len(e.value) > rowCacheMaxValue {
		return
	}
	s.lru.Add(k, e)
	s.bytes += e.size(k)
	for s.bytes > s.budget {
		k, v, ok := s.lru.RemoveOldest()
		if !ok {
			return
		}
		s.bytes -= v.size(k)
	}
}

// drop removes k's entry, if any (s.mu held).
func (s *rowShard) drop(k string) {
	if old, ok := s.lru.Peek(k); ok {
		s.bytes -= old.size(k)
		s.lru.Remove(k)
	}
}

// clear drops every entry and counts a write in every shard: an
// ingestion, a range deletion over the MVCC key spaces, a failed commit.
func (c *rowCache) clear() {
	if c == nil {
		return
	}
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		s.gen++
		s.lru.Purge()
		s.bytes = 0
		s.mu.Unlock()
	}
}

// len returns how many entries the cache holds (tests).
func (c *rowCache) len() int {
	n := 0
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		n += s.lru.Len()
		s.mu.Unlock()
	}
	return n
}

// cachedNewest looks up the newest version of lo (an escaped user key
// under its prefix) in the cache: hit when it holds an entry that use
// accepts (counted as a hit, anything else as a miss). On a miss, rows
// (nil when lo's key space is not cached: only the MVCC key spaces, whose
// writes applyBatch follows, are) and gen are what the read of
// Pebble that follows passes to put.
func (e *Engine) cachedNewest(lo []byte, use func(rowEntry) bool) (ent rowEntry, hit bool, rows *rowCache, gen uint64) {
	if e.rows == nil || !isMVCC(lo) {
		return rowEntry{}, false, nil, 0
	}
	ent, hit, gen = e.rows.get(lo)
	hit = hit && use(ent)
	e.rows.counted(hit)
	return ent, hit, e.rows, gen
}

// isMVCC reports whether an engine key lies in an MVCC key space.
func isMVCC(k []byte) bool {
	return len(k) > 0 && (k[0] == PrefixData || k[0] == PrefixRegional)
}

// applyBatch brings the cache up to date with b, which has been
// committed: each version b sets of a key the cache holds becomes its
// entry when it is at least as new (version ids only grow per key,
// DESIGN.md §6), and the entry of each version b deletes (GC) is dropped.
// A key the cache does not hold stays out: its newest version in Pebble is
// not known here. A range deletion reaching into an MVCC key space (a
// replica removed), or a batch that does not decode, drops every entry.
func (c *rowCache) applyBatch(b *pebble.Batch) {
	if c == nil {
		return
	}
	r := b.Reader()
	for {
		kind, k, v, ok, err := r.Next()
		if err != nil {
			c.clear()
			return
		}
		if !ok {
			return
		}
		switch kind {
		case pebble.InternalKeyKindRangeDelete, pebble.InternalKeyKindRangeKeySet,
			pebble.InternalKeyKindRangeKeyUnset, pebble.InternalKeyKindRangeKeyDelete:
			// [k, v): does it reach [PrefixData, PrefixRegional+1)?
			if (len(v) == 0 || v[0] >= PrefixData) && (len(k) == 0 || k[0] <= PrefixRegional) {
				c.clear()
				return
			}
		case pebble.InternalKeyKindLogData:
		case pebble.InternalKeyKindSet, pebble.InternalKeyKindSetWithDelete:
			if isMVCC(k) && len(k) > versionLen {
				c.written(k[:len(k)-versionLen], decodeVersion(k[len(k)-versionLen:]), v)
			}
		default: // deletions: Delete, SingleDelete, DeleteSized
			if isMVCC(k) && len(k) > versionLen {
				c.deleted(k[:len(k)-versionLen], decodeVersion(k[len(k)-versionLen:]))
			}
		}
	}
}

// written records a commit of version id of key with the encoded MVCC
// value enc: the key's entry, if the cache holds one at most as new,
// becomes it (a copy of the value). Either way the shard counts a write,
// so that a read that began before the commit keeps nothing.
func (c *rowCache) written(key []byte, id VersionID, enc []byte) {
	s := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gen++
	k := string(key)
	if old, ok := s.lru.Peek(k); !ok || id.Less(old.id) {
		return
	}
	val, tomb, err := DecodeMVCCValue(enc)
	switch {
	case err != nil || len(val) > rowCacheMaxValue:
		s.drop(k)
	case tomb:
		s.store(k, rowEntry{id: id, tomb: true, full: true})
	default:
		s.store(k, rowEntry{id: id, full: true, value: append([]byte{}, val...)})
	}
}

// deleted records the deletion of version id of key (GC): the entry goes
// if it was that version (the key's newest is now an older one, or none).
func (c *rowCache) deleted(key []byte, id VersionID) {
	s := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gen++
	if old, ok := s.lru.Peek(string(key)); ok && !id.Less(old.id) {
		s.drop(string(key))
	}
}
