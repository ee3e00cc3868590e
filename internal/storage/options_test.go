package storage

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/cockroachdb/pebble/v2"
)

// TestReadsHitTheBlockCache reads 20 MB of flushed keys twice: the second
// pass must be served from the block cache. Pebble's default cache (8 MB,
// in 2 MB shards) holds none of it, and every read went to a file.
func TestReadsHitTheBlockCache(t *testing.T) {
	const keys, size = 20000, 1000
	e, err := Open(t.TempDir(), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	b := e.NewBatch()
	for i := 0; i < keys; i++ {
		_ = b.Set([]byte(fmt.Sprintf("k%05d", i)), make([]byte, size), nil)
	}
	if err := e.Commit(b, false); err != nil {
		t.Fatal(err)
	}
	if err := e.db.Flush(); err != nil {
		t.Fatal(err)
	}
	read := func() {
		for i := 0; i < keys; i++ {
			if v, err := e.Get([]byte(fmt.Sprintf("k%05d", i))); err != nil || len(v) != size {
				t.Fatalf("k%05d: %d bytes, %v", i, len(v), err)
			}
		}
	}
	read()
	before := e.Metrics().BlockCache
	read()
	after := e.Metrics().BlockCache
	hits, misses := after.Hits-before.Hits, after.Misses-before.Misses
	if hits == 0 || misses > hits/100 {
		t.Fatalf("second pass over %d keys of %d bytes: %d block cache hits, %d misses (cache holds %d bytes); want every block cached", keys, size, hits, misses, after.Size)
	}
}

// TestOpenWithCacheSize: the block cache is the size asked for, or
// DefaultCacheSize.
func TestOpenWithCacheSize(t *testing.T) {
	for _, c := range []struct{ ask, want int64 }{{0, DefaultCacheSize}, {8 << 20, 8 << 20}} {
		e, err := OpenWith(t.TempDir(), 1, Options{CacheSize: c.ask})
		if err != nil {
			t.Fatal(err)
		}
		if got := e.cache.MaxSize(); got != c.want {
			t.Errorf("CacheSize %d: a cache of %d bytes, want %d", c.ask, got, c.want)
		}
		e.Close()
	}
}

// TestMemtablesLeaveHalfTheCache: however many memtables Pebble lets pile
// up before writes wait, and the one it keeps for reuse, their reservations
// leave at least half of the cache to blocks, for any cache size allowed.
func TestMemtablesLeaveHalfTheCache(t *testing.T) {
	for _, size := range []int64{MinCacheSize, 64 << 20, DefaultCacheSize, 4 << 30} {
		c := pebble.NewCache(size)
		o := pebbleOptions(nil, c)
		if worst := int64(o.MemTableSize) * int64(o.MemTableStopWritesThreshold+1); worst > size/2 {
			t.Errorf("cache %d bytes: memtables may reserve %d ((%d+1) × %d)", size, worst, o.MemTableStopWritesThreshold, o.MemTableSize)
		}
		c.Unref()
	}
}

// TestOpenWithTooSmallACache fails with ErrInvalidOptions and creates nothing.
func TestOpenWithTooSmallACache(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	if _, err := OpenWith(dir, 1, Options{CacheSize: MinCacheSize - 1}); !errors.Is(err, ErrInvalidOptions) {
		t.Fatalf("OpenWith(cache %d): %v, want ErrInvalidOptions", MinCacheSize-1, err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("the refused open left %s: %v", dir, err)
	}
}

// TestMVCCValuesGoToBlobFilesAndRaftValuesStayInline: a flush keeps the
// MVCC spaces' large values in blob files and every other space's inline
// (no blob bytes written for 1 KiB Raft entries), small MVCC values
// inline too, and every value reads back after a compaction.
func TestMVCCValuesGoToBlobFilesAndRaftValuesStayInline(t *testing.T) {
	const n, size = 200, 1024
	e, err := Open(t.TempDir(), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	blobBytes := func() (blob, table uint64) {
		for _, l := range e.Metrics().Levels {
			blob += l.BlobBytesFlushed + l.BlobBytesCompacted
			table += l.TableBytesFlushed + l.TableBytesCompacted
		}
		return blob, table
	}
	write := func(prefix byte, size int) {
		b := e.NewBatch()
		for i := 0; i < n; i++ {
			_ = b.Set(fmt.Appendf([]byte{prefix}, "k%04d", i), incompressible(i, size), nil)
		}
		if err := e.Commit(b, false); err != nil {
			t.Fatal(err)
		}
		if err := e.db.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	write(PrefixRaft, size)
	write(PrefixState, size)
	if blob, table := blobBytes(); blob != 0 || table < 2*n*size/2 {
		t.Fatalf("Raft and state values: %d bytes to blob files, %d to tables; want none to blob files", blob, table)
	}
	write(PrefixRegional, 100) // below separateAtLeast
	if blob, _ := blobBytes(); blob != 0 {
		t.Fatalf("%d-byte MVCC values: %d bytes to blob files; want none", 100, blob)
	}
	write(PrefixData, size)
	if blob, _ := blobBytes(); blob < n*size {
		t.Fatalf("%d MVCC values of %d bytes: %d bytes to blob files; want them all", n, size, blob)
	}
	if err := e.db.Compact(context.Background(), []byte{PrefixMeta}, []byte{PrefixRegional + 1}, true); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		prefix byte
		size   int
	}{{PrefixRaft, size}, {PrefixState, size}, {PrefixData, size}, {PrefixRegional, 100}} {
		for i := 0; i < n; i++ {
			k := fmt.Appendf([]byte{c.prefix}, "k%04d", i)
			if v, err := e.Get(k); err != nil || !bytes.Equal(v, incompressible(i, c.size)) {
				t.Fatalf("%q after a compaction: %d bytes, %v; want the %d written", k, len(v), err, c.size)
			}
		}
	}
}

// incompressible returns size bytes that Snappy cannot shrink, the same for
// the same i: a value whose stored size is its length.
func incompressible(i, size int) []byte {
	v := make([]byte, size)
	_, _ = rand.NewChaCha8([32]byte{byte(i), byte(i >> 8)}).Read(v)
	return v
}

// TestCompactionsCarryTheHistorysValuesForward writes 150 versions of each
// of 20 keys, a flush apart, as a hot key's history builds up under the
// GC TTL, then compacts everything: no compaction may write a value to a
// blob file again. Every table of such a history references every blob
// file, so a reference depth bounded below the flushes the history spans
// (Pebble's MaxBlobReferenceDepth) made compactions rewrite the whole
// history over and over, more of it as it grew (issue 17's steady state).
func TestCompactionsCarryTheHistorysValuesForward(t *testing.T) {
	const keys, versions, size = 20, 150, 300
	e, err := Open(t.TempDir(), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	value := func(k, v int) []byte { return incompressible(k*versions+v, size) }
	for v := 1; v <= versions; v++ {
		b := e.NewBatch()
		for k := 0; k < keys; k++ {
			_ = b.Set(EncodeMVCCKey([]byte{PrefixData}, fmt.Appendf(nil, "k%02d", k), VersionID{Epoch: uint64(v), Counter: 1}), value(k, v), nil)
		}
		if err := e.Commit(b, false); err != nil {
			t.Fatal(err)
		}
		if err := e.db.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.db.Compact(context.Background(), []byte{PrefixData}, []byte{PrefixData + 1}, true); err != nil {
		t.Fatal(err)
	}
	_, _, rewritten := BytesWritten(e.Metrics())
	var flushed uint64
	for _, l := range e.Metrics().Levels {
		flushed += l.BlobBytesFlushed
	}
	if flushed < keys*versions*size || rewritten != 0 {
		t.Fatalf("%d versions of %d keys, a flush apart: %d bytes of values flushed to blob files, %d written again by compactions; want all flushed once and none again",
			versions, keys, flushed, rewritten)
	}
	for k := 0; k < keys; k++ {
		for v := 1; v <= versions; v++ {
			key := EncodeMVCCKey([]byte{PrefixData}, fmt.Appendf(nil, "k%02d", k), VersionID{Epoch: uint64(v), Counter: 1})
			if got, err := e.Get(key); err != nil || !bytes.Equal(got, value(k, v)) {
				t.Fatalf("k%02d at version %d after the compactions: %d bytes, %v; want the %d written", k, v, len(got), err, size)
			}
		}
	}
}
