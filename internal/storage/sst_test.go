package storage

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"go.uber.org/goleak"
)

// An ingested SST replaces exactly its range deletions' spans: old keys
// inside them go, its own keys appear, keys outside stay; a snapshot taken
// before keeps seeing the old state.
func TestIngestReplacesSpans(t *testing.T) {
	dir := t.TempDir()
	e, err := Open(dir, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	b := e.NewBatch()
	for _, k := range []string{"a1", "b1", "b2", "c1"} {
		_ = b.Set([]byte(k), []byte("old"), nil)
	}
	if err := e.Commit(b, true); err != nil {
		t.Fatal(err)
	}
	before := e.NewSnapshot()
	defer before.Close()

	ingestSST(t, e, []byte("b"), []byte("c"), map[string]string{"b2": "new", "b3": "new"})
	got := map[string]string{}
	_ = e.Scan([]byte("a"), []byte("z"), func(k, v []byte) (bool, error) { got[string(k)] = string(v); return true, nil })
	want := map[string]string{"a1": "old", "b2": "new", "b3": "new", "c1": "old"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("after ingest: %v, want %v", got, want)
	}
	if v, _ := before.Get([]byte("b1")); string(v) != "old" {
		t.Fatalf("snapshot taken before the ingest sees b1 = %q, want old", v)
	}
}

// Staged files a crash left behind are removed when the store opens.
func TestStagingClearedAtOpen(t *testing.T) {
	dir := t.TempDir()
	e, err := Open(dir, 1)
	if err != nil {
		t.Fatal(err)
	}
	w, err := e.NewSSTWriter()
	if err != nil {
		t.Fatal(err)
	}
	_ = w.Set([]byte("k"), []byte("v"))
	path, err := w.Finish()
	if err != nil {
		t.Fatal(err)
	}
	e.Close()
	e, err = Open(dir, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("staged %s survived a reopen: %v", path, err)
	}
	if _, err := os.Stat(filepath.Join(dir, stagingDir)); err != nil {
		t.Fatal(err)
	}
}

// ingestSST ingests into e one table that deletes [lo, hi) and sets kvs.
func ingestSST(t *testing.T, e *Engine, lo, hi []byte, kvs map[string]string) {
	t.Helper()
	w, err := e.NewSSTWriter()
	if err != nil {
		t.Fatal(err)
	}
	if err := w.DeleteRange(lo, hi); err != nil {
		t.Fatal(err)
	}
	keys := make([]string, 0, len(kvs))
	for k := range kvs {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if err := w.Set([]byte(k), []byte(kvs[k])); err != nil {
			t.Fatal(err)
		}
	}
	path, err := w.Finish()
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Ingest([]string{path}); err != nil {
		t.Fatal(err)
	}
}

// A staged file abandoned after the engine closed (a snapshot's transfer
// ending as its node stops) touches no file system the engine closed: its
// disk-health checker's goroutine, stopped by Close, would otherwise start
// again and outlive the engine (CI's goroutine-leak check in the client
// package caught one). Staging a file after Close fails with
// pebble.ErrClosed.
func TestStagedFileWorkAfterCloseLeavesNoGoroutine(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	e, err := Open(t.TempDir(), 1)
	if err != nil {
		t.Fatal(err)
	}
	w, err := e.NewSSTWriter()
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Set([]byte("k"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	w.Abort()
	e.RemoveStaged([]string{"gone.sst"})
	if _, err := e.NewSSTWriter(); !errors.Is(err, pebble.ErrClosed) {
		t.Fatalf("NewSSTWriter after Close: %v, want pebble.ErrClosed", err)
	}
}
