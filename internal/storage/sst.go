package storage

import (
	"context"
	"fmt"
	"path/filepath"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/objstorage/objstorageprovider"
	"github.com/cockroachdb/pebble/v2/sstable"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// Snapshot is a consistent, point-in-time view of the engine (a Pebble
// snapshot): what a Raft snapshot streams from (DESIGN.md §12). Close it
// promptly: it pins the versions it sees.
type Snapshot struct{ s *pebble.Snapshot }

// NewSnapshot returns a view of every batch committed so far.
func (e *Engine) NewSnapshot() *Snapshot { return &Snapshot{s: e.db.NewSnapshot()} }

// Get returns a copy of the value at key in the view, or nil if absent.
func (s *Snapshot) Get(key []byte) ([]byte, error) { return get(s.s, key) }

// Scan calls fn for each key of the view in [lo, hi) in order until fn
// returns false or an error; the slices are valid only during the call.
func (s *Snapshot) Scan(lo, hi []byte, fn func(k, v []byte) (bool, error)) error {
	return scan(s.s, lo, hi, fn)
}

// Close releases the view.
func (s *Snapshot) Close() error { return s.s.Close() }

// stagingDir holds SSTs being received for ingestion; it is emptied at
// open, so a crash mid-transfer leaves nothing behind.
const stagingDir = "auxiliary/staging"

var stagedSeq atomic.Uint64

func (e *Engine) clearStaging() error {
	dir := filepath.Join(e.dir, stagingDir)
	return e.useFS(func(fs vfs.FS) error {
		if err := fs.RemoveAll(dir); err != nil {
			return fmt.Errorf("storage: clear %s: %w", dir, err)
		}
		return fs.MkdirAll(dir, 0o755)
	})
}

// SSTWriter writes one SST file for Ingest, in the engine's table format.
// Keys must be added in increasing order; range deletions in increasing
// order of their start, not overlapping one another. Memory stays bounded
// by Pebble's block size whatever the file's size.
type SSTWriter struct {
	w     *sstable.Writer
	e     *Engine
	path  string
	bytes uint64
	done  bool
}

// NewSSTWriter creates a staged SST file. Errors: the file system's, or
// one wrapping pebble.ErrClosed after Close.
func (e *Engine) NewSSTWriter() (*SSTWriter, error) {
	path := filepath.Join(e.dir, stagingDir, fmt.Sprintf("%d.sst", stagedSeq.Add(1)))
	var f vfs.File
	err := e.useFS(func(fs vfs.FS) (err error) {
		f, err = fs.Create(path, vfs.WriteCategoryUnspecified)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("storage: stage %s: %w", path, err)
	}
	w := sstable.NewWriter(objstorageprovider.NewFileWritable(f), sstable.WriterOptions{TableFormat: e.db.TableFormat()})
	return &SSTWriter{w: w, e: e, path: path}, nil
}

// Set adds key k with value v.
func (w *SSTWriter) Set(k, v []byte) error {
	w.bytes += uint64(len(k) + len(v))
	return w.w.Set(k, v)
}

// DeleteRange adds a deletion of [lo, hi): ingested, it deletes every key
// of the engine in the span, but none of the file's own.
func (w *SSTWriter) DeleteRange(lo, hi []byte) error { return w.w.DeleteRange(lo, hi) }

// Bytes returns the bytes of keys and values added so far.
func (w *SSTWriter) Bytes() uint64 { return w.bytes }

// Finish completes the file (synced) and returns its path for Ingest.
func (w *SSTWriter) Finish() (string, error) {
	w.done = true
	if err := w.w.Close(); err != nil {
		w.e.remove(w.path)
		return "", fmt.Errorf("storage: finish %s: %w", w.path, err)
	}
	return w.path, nil
}

// Abort abandons an unfinished file and removes it.
func (w *SSTWriter) Abort() {
	if !w.done {
		w.done = true
		_ = w.w.Close()
	}
	w.e.remove(w.path)
}

// RemoveStaged removes finished files that will not be ingested (after
// Close, none: the next open empties the staging directory).
func (e *Engine) RemoveStaged(paths []string) {
	for _, p := range paths {
		e.remove(p)
	}
}

// remove removes a staged file, best effort: what stays behind, the next
// open removes.
func (e *Engine) remove(path string) {
	_ = e.useFS(func(fs vfs.FS) error { return fs.Remove(path) })
}

// Ingest adds finished SST files to the engine atomically: every file's
// keys and range deletions become visible at once, as if one batch, and
// durable (Pebble syncs the ingestion). The files are moved into the store.
func (e *Engine) Ingest(paths []string) error {
	err := e.db.Ingest(context.Background(), paths)
	e.rows.clear() // the files may hold any MVCC key, and range deletions
	if err != nil {
		return fmt.Errorf("storage: ingest: %w", err)
	}
	return nil
}
