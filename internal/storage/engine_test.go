package storage

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"
)

// fill writes n keys of 100 bytes and flushes them into a table.
func fill(t *testing.T, dir string, n int) {
	t.Helper()
	e, err := Open(dir, 1)
	if err != nil {
		t.Fatal(err)
	}
	b := e.NewBatch()
	for i := 0; i < n; i++ {
		_ = b.Set([]byte(fmt.Sprintf("k%05d", i)), make([]byte, 100), nil)
	}
	if err := e.Commit(b, true); err != nil {
		t.Fatal(err)
	}
	if err := e.db.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
}

func damage(t *testing.T, dir, pattern string, fn func([]byte) []byte) {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, pattern))
	if len(files) == 0 {
		t.Fatalf("no %s in %s", pattern, dir)
	}
	f := files[len(files)-1]
	data, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f, fn(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestRoundTrip(t *testing.T) {
	dir := t.TempDir()
	fill(t, dir, 10)
	e, err := Open(dir, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	v, err := e.Get([]byte("k00003"))
	if err != nil || len(v) != 100 {
		t.Fatalf("Get = %d bytes, %v", len(v), err)
	}
	if v, err := e.Get([]byte("absent")); v != nil || err != nil {
		t.Fatalf("Get(absent) = %v, %v; want nil, nil", v, err)
	}
	n := 0
	if err := e.Scan([]byte("k00002"), []byte("k00005"), func(k, v []byte) (bool, error) { n++; return true, nil }); err != nil || n != 3 {
		t.Fatalf("Scan [k00002,k00005) saw %d keys, err %v; want 3", n, err)
	}
}

func TestCorruptManifest(t *testing.T) {
	dir := t.TempDir()
	fill(t, dir, 100)
	damage(t, dir, "MANIFEST-*", func(b []byte) []byte { b[10] ^= 0xff; return b })
	_, err := Open(dir, 1)
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Open with a flipped MANIFEST byte = %v, want ErrCorrupt", err)
	}
}

func TestTruncatedTable(t *testing.T) {
	dir := t.TempDir()
	fill(t, dir, 100)
	damage(t, dir, "*.sst", func(b []byte) []byte { return b[:len(b)/2] })
	_, err := Open(dir, 1)
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Open with truncated table = %v, want ErrCorrupt", err)
	}
}

func TestCorruptTableBlock(t *testing.T) {
	dir := t.TempDir()
	fill(t, dir, 1000)
	damage(t, dir, "*.sst", func(b []byte) []byte { b[len(b)/2] ^= 0xff; return b })
	e, err := Open(dir, 1)
	if err != nil {
		if errors.Is(err, ErrCorrupt) {
			return // detected at open: also acceptable
		}
		t.Fatal(err)
	}
	defer e.Close()
	err = e.Scan([]byte("k"), []byte("l"), func(k, v []byte) (bool, error) { return true, nil })
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Scan over a flipped block = %v, want ErrCorrupt", err)
	}
}

func TestWrongNodeAndInUse(t *testing.T) {
	dir := t.TempDir()
	e, err := Open(dir, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir, 1); !errors.Is(err, ErrInUse) {
		t.Errorf("second Open of a held dir = %v, want ErrInUse", err)
	}
	e.Close()
	if _, err := Open(dir, 2); !errors.Is(err, ErrWrongNode) {
		t.Fatalf("Open(dir of node 1) as node 2 = %v, want ErrWrongNode", err)
	}
}

// TestOtherLayoutIsRefused: a store written before layouts were recorded
// (layout 1: MVCC data under range ids) or by a later layout is refused with
// ErrLayout naming both versions, and left as it was.
func TestOtherLayoutIsRefused(t *testing.T) {
	for _, c := range []struct {
		name   string
		record []byte // the layout record to leave; nil: none (layout 1)
		want   string
	}{
		{"layout 1", nil, "layout version 1; this binary reads layout version 2"},
		{"layout 3", []byte{0, 0, 0, 3}, "layout version 3; this binary reads layout version 2"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			e, err := Open(dir, 1)
			if err != nil {
				t.Fatal(err)
			}
			b := e.NewBatch()
			if c.record == nil {
				_ = b.Delete(layoutVersionKey, nil)
			} else {
				_ = b.Set(layoutVersionKey, c.record, nil)
			}
			_ = b.Set([]byte{PrefixState, 'x'}, []byte("kept"), nil)
			if err := e.Commit(b, true); err != nil {
				t.Fatal(err)
			}
			e.Close()
			_, err = Open(dir, 1)
			if !errors.Is(err, ErrLayout) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Open = %v; want ErrLayout saying %q", err, c.want)
			}
			// Nothing was changed: put the current layout back and read.
			raw, err := pebble.Open(dir, &pebble.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if err := raw.Set(layoutVersionKey, []byte{0, 0, 0, LayoutVersion}, pebble.Sync); err != nil {
				t.Fatal(err)
			}
			raw.Close()
			e, err = Open(dir, 1)
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			if v, err := e.Get([]byte{PrefixState, 'x'}); err != nil || string(v) != "kept" {
				t.Fatalf("the refused store's data = %q, %v", v, err)
			}
		})
	}
}

// TestScanLazyReadsNoSeparatedValueItIsNotAskedFor: over flushed MVCC
// values in blob files, ScanLazy gives every key its value's length while
// reading a fraction of the blocks Scan reads, and a value it is asked for
// is the one written.
func TestScanLazyReadsNoSeparatedValueItIsNotAskedFor(t *testing.T) {
	const n, size = 2000, 1024
	e, err := Open(t.TempDir(), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	b := e.NewBatch()
	for i := 0; i < n; i++ {
		_ = b.Set(fmt.Appendf([]byte{PrefixData}, "k%04d", i), incompressible(i, size), nil)
	}
	if err := e.Commit(b, false); err != nil {
		t.Fatal(err)
	}
	if err := e.db.Flush(); err != nil {
		t.Fatal(err)
	}
	lo, hi := []byte{PrefixData}, []byte{PrefixData + 1}
	blocks := func(scan func()) int64 {
		before := e.Metrics().BlockCache
		scan()
		after := e.Metrics().BlockCache
		return (after.Hits + after.Misses) - (before.Hits + before.Misses)
	}
	full := blocks(func() {
		if err := e.Scan(lo, hi, func(k, v []byte) (bool, error) { return true, nil }); err != nil {
			t.Fatal(err)
		}
	})
	var keys int
	lazy := blocks(func() {
		err := e.ScanLazy(lo, hi, func(k []byte, v *LazyValue) (bool, error) {
			if v.Len() != size {
				t.Fatalf("%q: length %d, want %d", k, v.Len(), size)
			}
			keys++
			return true, nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
	if keys != n || lazy*4 > full {
		t.Fatalf("ScanLazy saw %d keys reading %d blocks, Scan %d; want %d keys and under a quarter of Scan's blocks", keys, lazy, full, n)
	}
	i := 0
	err = e.ScanLazy(lo, hi, func(k []byte, v *LazyValue) (bool, error) {
		if i%500 == 0 {
			if got, err := v.Value(); err != nil || !bytes.Equal(got, incompressible(i, size)) {
				t.Fatalf("%q: %d bytes, %v; want the value written", k, len(got), err)
			}
		}
		i++
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
