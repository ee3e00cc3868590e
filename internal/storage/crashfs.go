package storage

import (
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"sync"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// crashFS passes every operation to the disk, and remembers for each file it
// writes how much of it was synced, so that after Engine.Crash the directory
// is left as a power loss or kill -9 at that instant would leave it:
//   - from the crash on, nothing reaches the disk: writes and syncs vanish,
//     removals and renames do not happen, files created are removed again,
//     and a file "reused" for a new log is a fresh one (the old stays);
//   - once the store is closed, every file written before the crash is cut
//     back to its last sync (to empty if it never was).
//
// It models file contents; files created, renamed and removed before the
// crash stay so (Pebble syncs the directory after each, and an empty marker
// file is durable through that alone).
type crashFS struct {
	vfs.FS
	mu      sync.Mutex
	crashed bool
	hold    *syncGate            // non-nil while fsyncs are held (SyncHold)
	files   map[string]*fileSync // by path: written before the crash
	after   []string             // files created after the crash
}

// fileSync is what crashFS knows of one file written through it.
type fileSync struct {
	size   int64 // bytes written so far (the end of the furthest write)
	synced int64 // bytes known durable
}

func newCrashFS(under vfs.FS) *crashFS { return &crashFS{FS: under, files: map[string]*fileSync{}} }

// Unwrap implements vfs.FS.
func (c *crashFS) Unwrap() vfs.FS { return c.FS }

func (c *crashFS) track(name string, f vfs.File, s *fileSync) vfs.File {
	c.mu.Lock()
	c.files[name] = s
	c.mu.Unlock()
	return &crashFile{File: f, fs: c, sync: s}
}

// Create implements vfs.FS.
func (c *crashFS) Create(name string, cat vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := c.FS.Create(name, cat)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.crashed {
		c.after = append(c.after, name)
		return &crashFile{File: f, fs: c, sync: &fileSync{}}, nil
	}
	c.files[name] = &fileSync{}
	return &crashFile{File: f, fs: c, sync: c.files[name]}, nil
}

// OpenReadWrite implements vfs.FS: what the file holds already counts as synced.
func (c *crashFS) OpenReadWrite(name string, cat vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := c.FS.OpenReadWrite(name, cat, opts...)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	return c.track(name, f, &fileSync{size: st.Size(), synced: st.Size()}), nil
}

// ReuseForWrite implements vfs.FS: a recycled file's old bytes are garbage
// the reader must reject, so nothing of it counts as synced.
func (c *crashFS) ReuseForWrite(oldname, newname string, cat vfs.DiskWriteCategory) (vfs.File, error) {
	if c.dead() {
		return c.Create(newname, cat)
	}
	f, err := c.FS.ReuseForWrite(oldname, newname, cat)
	if err != nil {
		return nil, err
	}
	c.forget(oldname)
	return c.track(newname, f, &fileSync{}), nil
}

// Rename implements vfs.FS.
func (c *crashFS) Rename(oldname, newname string) error {
	if c.dead() {
		return nil
	}
	if err := c.FS.Rename(oldname, newname); err != nil {
		return err
	}
	c.mu.Lock()
	if s, ok := c.files[oldname]; ok {
		delete(c.files, oldname)
		c.files[newname] = s
	}
	c.mu.Unlock()
	return nil
}

// RemoveAll implements vfs.FS.
func (c *crashFS) RemoveAll(name string) error {
	if c.dead() {
		return nil
	}
	return c.FS.RemoveAll(name)
}

// Link implements vfs.FS.
func (c *crashFS) Link(oldname, newname string) error {
	if c.dead() {
		return nil
	}
	return c.FS.Link(oldname, newname)
}

// Remove implements vfs.FS.
func (c *crashFS) Remove(name string) error {
	if c.dead() {
		return nil
	}
	err := c.FS.Remove(name)
	if err == nil {
		c.forget(name)
	}
	return err
}

func (c *crashFS) forget(name string) {
	c.mu.Lock()
	delete(c.files, name)
	c.mu.Unlock()
}

// cut leaves the files as the crash found them: those written before it cut
// back to their synced length, those created after it removed. Call it once
// the store is closed.
func (c *crashFS) cut() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for _, name := range c.after {
		if err := os.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	var cutBytes int64
	cut := 0
	for name, s := range c.files {
		st, err := os.Stat(name)
		if err != nil || st.Size() <= s.synced {
			continue // removed, or nothing unsynced
		}
		if err := os.Truncate(name, s.synced); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
		cutBytes += st.Size() - s.synced
		cut++
	}
	// Writes still buffered in Pebble at the crash never reached a file;
	// they are lost too, uncounted.
	slog.Info("storage: crashed", "files_cut", cut, "bytes_cut", cutBytes, "files_created_after", len(c.after))
	c.files, c.after = map[string]*fileSync{}, nil
	return errors.Join(errs...)
}

// crash is the instant of the crash: nothing later reaches the disk. A
// held fsync returns, having synced nothing.
func (c *crashFS) crash() {
	c.mu.Lock()
	c.crashed = true
	c.holdLocked(false)
	c.mu.Unlock()
}

// syncGate is a hold's fsyncs: they wait until open closes.
type syncGate struct {
	open    chan struct{}
	waiting int // fsyncs that came to this gate
}

// holdLocked lets the fsyncs waiting at the hold, if any, go through, and
// holds later ones if held. c.mu is held.
func (c *crashFS) holdLocked(held bool) {
	if c.hold != nil {
		close(c.hold.open)
		c.hold = nil
	}
	if held {
		c.hold = &syncGate{open: make(chan struct{})}
	}
}

// waitSync returns once the file system lets an fsync through (at once
// unless fsyncs are held), and whether the crash has come: then the fsync
// reaches nothing.
func (c *crashFS) waitSync() (dead bool) {
	c.mu.Lock()
	g := c.hold
	if g == nil {
		defer c.mu.Unlock()
		return c.crashed
	}
	g.waiting++
	c.mu.Unlock()
	<-g.open
	return c.dead()
}

func (c *crashFS) dead() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.crashed
}

// crashFile is a file written through crashFS.
type crashFile struct {
	vfs.File
	fs   *crashFS
	sync *fileSync
	pos  int64 // for Write: the file offset
}

// Write implements io.Writer; after the crash the bytes vanish.
func (f *crashFile) Write(p []byte) (int, error) {
	if f.fs.dead() {
		return len(p), nil
	}
	n, err := f.File.Write(p)
	f.fs.mu.Lock()
	f.pos += int64(n)
	f.sync.size = max(f.sync.size, f.pos)
	f.fs.mu.Unlock()
	return n, err
}

// WriteAt implements io.WriterAt; after the crash the bytes vanish.
func (f *crashFile) WriteAt(p []byte, off int64) (int, error) {
	if f.fs.dead() {
		return len(p), nil
	}
	n, err := f.File.WriteAt(p, off)
	f.fs.mu.Lock()
	f.sync.size = max(f.sync.size, off+int64(n))
	f.fs.mu.Unlock()
	return n, err
}

func (f *crashFile) synced(upTo int64) {
	f.fs.mu.Lock()
	f.sync.synced = max(f.sync.synced, min(upTo, f.sync.size))
	f.fs.mu.Unlock()
}

// Sync implements vfs.File.
func (f *crashFile) Sync() error {
	if f.fs.waitSync() {
		return nil
	}
	if err := f.File.Sync(); err != nil {
		return err
	}
	f.synced(1 << 62)
	return nil
}

// SyncData implements vfs.File.
func (f *crashFile) SyncData() error {
	if f.fs.waitSync() {
		return nil
	}
	if err := f.File.SyncData(); err != nil {
		return err
	}
	f.synced(1 << 62)
	return nil
}

// SyncTo implements vfs.File.
func (f *crashFile) SyncTo(length int64) (bool, error) {
	if f.fs.waitSync() {
		return true, nil
	}
	full, err := f.File.SyncTo(length)
	if err != nil {
		return full, err
	}
	if full {
		length = 1 << 62
	}
	f.synced(length)
	return full, nil
}

// SyncHold stalls a crashable store's fsyncs, as a disk whose cache flushes
// hang: while it holds, every fsync of the store's files (the WAL's, a
// flush's, the manifest's) waits, and writes go on. Engine.HoldSyncs makes
// one; a crash ends it (the held fsyncs return, having synced nothing).
type SyncHold struct{ c *crashFS }

// HoldSyncs holds the store's fsyncs until the hold's Release, for fault
// tests. It returns nil on an engine not opened crashable. One hold at a
// time: a second call lets the first one's fsyncs through and holds again.
func (e *Engine) HoldSyncs() *SyncHold {
	if e.crash == nil {
		return nil
	}
	e.crash.mu.Lock()
	defer e.crash.mu.Unlock()
	e.crash.holdLocked(true)
	return &SyncHold{c: e.crash}
}

// Waiting returns how many fsyncs have come to the hold.
func (h *SyncHold) Waiting() int {
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	if h.c.hold == nil {
		return 0
	}
	return h.c.hold.waiting
}

// Release lets every fsync go through, now and later.
func (h *SyncHold) Release() {
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	h.c.holdLocked(false)
}
