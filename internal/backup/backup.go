package backup

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/cockroachdb/pebble/v2/objstorage/objstorageprovider"
	"github.com/cockroachdb/pebble/v2/sstable"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/directory"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
)

// scanPage is how many pairs one snapshot scan returns at most.
const scanPage = 1000

// protectionTTL is how long a backup's GC protection outlives its last
// renewal (a backup that dies leaves it this long).
const protectionTTL = time.Minute

// Progress is called after each range is written: ranges done of total,
// and the pairs and file bytes written so far.
type Progress func(done, total, keys int, bytes int64)

// Take backs up the whole key space of db's cluster into dir (created; it
// must not exist or be empty): one Linearizable snapshot at epoch e, GC
// protected at e in every region's directory while it reads, one SST file
// per range of the directories, then the manifest. It never delays a
// writer. Errors: ErrBackupExists, the snapshot's errors (ErrSnapshotTooOld
// if GC passed e before the protection took hold), I/O errors; a backup
// that fails leaves no manifest, so restore refuses it.
func Take(ctx context.Context, db *client.DB, dirs *directory.Directories, dir string, progress Progress) (*Manifest, error) {
	return take(ctx, db, dirs, dir, "", nil, progress)
}

// TakeIncremental backs up into dir what changed since the backup in
// base (full or incremental; it must verify): for every key written in
// [base's epoch, e), its newest value or its deletion, at one Linearizable
// snapshot at epoch e (DESIGN.md §14). Restoring the chain gives the state
// at e. The versions since base's epoch must still be there: GC is held
// at base's epoch while it reads, and if GC already passed it the backup
// fails with ErrSnapshotTooOld (take a full one, and keep gc_ttl above the
// time between backups). Errors as Take's, and Verify's for base.
func TakeIncremental(ctx context.Context, db *client.DB, dirs *directory.Directories, dir, base string, progress Progress) (*Manifest, error) {
	bm, err := Verify(base)
	if err != nil {
		return nil, fmt.Errorf("the base backup %s: %w", base, err)
	}
	abs, err := filepath.Abs(base)
	if err != nil {
		return nil, err
	}
	return take(ctx, db, dirs, dir, abs, bm, progress)
}

func take(ctx context.Context, db *client.DB, dirs *directory.Directories, dir, baseDir string, base *Manifest, progress Progress) (*Manifest, error) {
	if entries, err := os.ReadDir(dir); err == nil && len(entries) > 0 {
		return nil, fmt.Errorf("%w: %s", ErrBackupExists, dir)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var hold *directory.Hold
	defer func() {
		if hold != nil {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = hold.Release(rctx)
		}
	}()
	var m *Manifest
	// View runs the backup again at a later epoch when the Linearizable
	// check of paper §5.3.1 fails; the first epoch's protection covers the
	// later ones.
	_, err := db.View(ctx, client.Linearizable, func(ctx context.Context, s *client.Snapshot) error {
		e := s.Stats().Epoch
		if hold == nil {
			protect := e
			if base != nil {
				protect = base.Epoch // an incremental reads every version since
			}
			var err error
			if hold, err = dirs.Protect(ctx, fmt.Sprintf("backup-%d-%d", e, time.Now().UnixNano()), "backup into "+dir, protect, protectionTTL); err != nil {
				return fmt.Errorf("backup: protecting epoch %d from GC: %w", protect, err)
			}
		}
		ranges, err := tiling(ctx, dirs)
		if err != nil {
			return err
		}
		m = &Manifest{Format: formatVersion, Epoch: e}
		if base != nil {
			m.Since, m.Base, m.BaseSHA256 = base.Epoch, baseDir, base.sum
		}
		var keys int
		var size int64
		for i, r := range ranges {
			if err := writeRange(ctx, s, dir, &r, base); err != nil {
				return fmt.Errorf("backup: range %d [%q, %q): %w", r.RangeID, r.Start, r.End, err)
			}
			m.Ranges = append(m.Ranges, r)
			keys, size = keys+r.Keys, size+r.Bytes
			if progress != nil {
				progress(i+1, len(ranges), keys, size)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	m.Created = time.Now().UTC().Format(time.RFC3339)
	return m, writeManifest(dir, m)
}

// tiling returns the ranges of every region's directory as files that tile
// the key space: each from its start to the next one's (a directory a split
// behind leaves no gap and no overlap this way).
func tiling(ctx context.Context, dirs *directory.Directories) ([]Range, error) {
	var descs []*pb.RangeDescriptor
	for _, region := range dirs.Regions() {
		ds, err := dirs.Of(region).List(ctx)
		if err != nil {
			return nil, fmt.Errorf("backup: listing %s's ranges: %w", region, err)
		}
		descs = append(descs, ds...)
	}
	sort.Slice(descs, func(i, j int) bool { return bytes.Compare(descs[i].GetStartKey(), descs[j].GetStartKey()) < 0 })
	var out []Range
	for i, d := range descs {
		if i > 0 && bytes.Equal(d.GetStartKey(), descs[i-1].GetStartKey()) {
			continue // two directories disagreeing during a move: one file
		}
		out = append(out, Range{RangeID: d.GetRangeId(), Region: d.GetRegion(), Start: d.GetStartKey(),
			File: fmt.Sprintf("range-%d.sst", d.GetRangeId())})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("backup: the directories list no range")
	}
	out[0].Start = nil
	for i := range out[:len(out)-1] {
		out[i].End = out[i+1].Start
	}
	return out, nil
}

// writeRange writes r's span in s into r's SST file and fills in r's
// keys, size and checksum: the snapshot's pairs, or for an incremental
// backup (base set) each key changed since base's epoch, as its newest
// value or a deletion.
func writeRange(ctx context.Context, s *client.Snapshot, dir string, r *Range, base *Manifest) error {
	path := filepath.Join(dir, r.File)
	f, err := vfs.Default.Create(path, vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	w := sstable.NewWriter(objstorageprovider.NewFileWritable(f), sstable.WriterOptions{})
	var hi []byte
	if len(r.End) > 0 {
		hi = r.End
	}
	write := func(k, v []byte, deleted bool) error {
		r.Keys++
		if deleted {
			r.Deletes++
			return w.Delete(k)
		}
		return w.Set(k, v)
	}
	for lo := r.Start; ; {
		if len(lo) == 0 {
			lo = []byte{0}
		}
		last, n, err := writePage(ctx, s, lo, hi, base, write)
		if err != nil {
			_ = w.Close()
			return err
		}
		if n < scanPage {
			break
		}
		lo = append(append([]byte(nil), last...), 0)
	}
	if err := w.Close(); err != nil { // syncs and closes the file
		return err
	}
	sum, size, err := checksum(path)
	r.SHA256, r.Bytes = sum, size
	return err
}

// writePage reads one page of [lo, hi) — pairs, or with base set the
// changes since base's epoch — and writes each key once; it returns the
// page's last key and its length.
func writePage(ctx context.Context, s *client.Snapshot, lo, hi []byte, base *Manifest, write func(k, v []byte, deleted bool) error) ([]byte, int, error) {
	if base == nil {
		page, err := s.Scan(ctx, lo, hi, scanPage)
		if err != nil || len(page) == 0 {
			return nil, 0, err
		}
		for _, kv := range page {
			if err := write(kv.Key, kv.Value, false); err != nil {
				return nil, 0, err
			}
		}
		return page[len(page)-1].Key, len(page), nil
	}
	page, err := s.Changes(ctx, lo, hi, base.Epoch, true, scanPage)
	if err != nil || len(page) == 0 {
		return nil, 0, err
	}
	for _, c := range page {
		if err := write(c.Key, c.Value, c.Tombstone); err != nil {
			return nil, 0, err
		}
	}
	return page[len(page)-1].Key, len(page), nil
}

// checksum returns the file's SHA-256 (hex) and size.
func checksum(path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	return hex.EncodeToString(h.Sum(nil)), n, err
}
