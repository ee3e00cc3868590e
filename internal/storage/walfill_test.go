package storage

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/terroir-db/terroir/internal/latency"
)

// walSizes returns the sizes of dir's WAL files (bytes).
func walSizes(t *testing.T, dir string) []int64 {
	t.Helper()
	logs, err := filepath.Glob(filepath.Join(dir, "*.log"))
	if err != nil || len(logs) == 0 {
		t.Fatalf("no WAL in %s (%v)", dir, err)
	}
	var sizes []int64
	for _, l := range logs {
		st, err := os.Stat(l)
		if err != nil {
			t.Fatal(err)
		}
		sizes = append(sizes, st.Size())
	}
	return sizes
}

// TestWALWrittenAheadOfItsAppends: the WAL a store appends to is written
// ahead of its appends to a walFillChunk boundary (so a synced append
// overwrites blocks the file holds), and a store reopened after a kill -9,
// a clean close or a crash replays it to its last record and no further:
// every key committed with sync is there, and what a crash cut is not.
func TestWALWrittenAheadOfItsAppends(t *testing.T) {
	dir := t.TempDir()
	e, err := OpenCrashable(dir, 1)
	if err != nil {
		t.Fatal(err)
	}
	key := func(i int) []byte { return fmt.Appendf(nil, "k%05d", i) }
	const synced = 3000 // 3000 × ~530 B: 1.5 MiB
	for i := range synced {
		b := e.NewBatch()
		_ = b.Set(key(i), make([]byte, 512), nil)
		if err := e.Commit(b, true); err != nil {
			t.Fatal(err)
		}
	}
	for _, size := range walSizes(t, dir) { // memtables rotate: several
		if size == 0 || size%walFillChunk != 0 {
			t.Fatalf("WAL of %d bytes after 1.5 MiB of appends: want a multiple of %d", size, walFillChunk)
		}
	}
	// What a kill -9 leaves: the files as they are, the last WAL ending in
	// zeros with no EOF trailer.
	killed := t.TempDir()
	if err := os.CopyFS(killed, os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	check := func(e *Engine, n int) {
		t.Helper()
		for _, i := range []int{0, n / 2, n - 1} {
			if v, err := e.Get(key(i)); err != nil || v == nil {
				t.Fatalf("key %s committed with sync: present %v, err %v", key(i), v != nil, err)
			}
		}
		if v, err := e.Get(key(n)); err != nil || v != nil {
			t.Fatalf("key %s: present %v (err %v), want absent", key(n), v != nil, err)
		}
	}
	k, err := Open(killed, 1)
	if err != nil {
		t.Fatalf("opening a store killed over a WAL with a zeroed tail: %v", err)
	}
	check(k, synced)
	if err := k.Close(); err != nil {
		t.Fatal(err)
	}
	e, err = OpenCrashable(dir, 1)
	if err != nil {
		t.Fatalf("reopening over a WAL with a zeroed tail: %v", err)
	}
	check(e, synced)
	for i := synced; i < synced+100; i++ {
		b := e.NewBatch()
		_ = b.Set(key(i), make([]byte, 512), nil)
		if err := e.Commit(b, i == synced+49); err != nil {
			t.Fatal(err)
		}
	}
	e.Crash()
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if e, err = Open(dir, 1); err != nil {
		t.Fatalf("reopening after a crash: %v", err)
	}
	defer e.Close()
	check(e, synced+50)
}

// BenchmarkSyncedCommit commits 300-byte batches with sync to one store,
// and to three at once (a cluster's three nodes on this machine's disk),
// with the WAL written ahead (walFillFS) and as Pebble writes it, and
// reports each commit's P50, P99, P99.9 and maximum (µs).
func BenchmarkSyncedCommit(b *testing.B) {
	for _, stores := range []int{1, 3} {
		for _, plain := range []bool{false, true} {
			name := fmt.Sprintf("stores=%d/written-ahead", stores)
			if plain {
				name = fmt.Sprintf("stores=%d/pebble", stores)
			}
			b.Run(name, func(b *testing.B) { benchSyncedCommit(b, stores, plain) })
		}
	}
}

func benchSyncedCommit(b *testing.B, stores int, plain bool) {
	dir := b.TempDir()
	var es []*Engine
	for i := range stores {
		e, err := OpenWith(filepath.Join(dir, fmt.Sprint(i)), 1, Options{plainWAL: plain})
		if err != nil {
			b.Fatal(err)
		}
		defer e.Close()
		es = append(es, e)
	}
	h := latency.New()
	var mu sync.Mutex
	var wg sync.WaitGroup
	b.ResetTimer()
	for s, e := range es {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range b.N {
				batch := e.NewBatch()
				_ = batch.Set(fmt.Appendf(nil, "s%d-%09d", s, i), make([]byte, 300), nil)
				start := time.Now()
				if err := e.Commit(batch, true); err != nil {
					b.Error(err)
					return
				}
				mu.Lock()
				h.Since(start)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(h.Quantile(50).Microseconds()), "P50-µs")
	b.ReportMetric(float64(h.Quantile(99).Microseconds()), "P99-µs")
	b.ReportMetric(float64(h.Quantile(99.9).Microseconds()), "P99.9-µs")
	b.ReportMetric(float64(h.Quantile(100).Microseconds()), "max-µs")
}
