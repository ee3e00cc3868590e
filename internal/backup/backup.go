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
			var err error
			if hold, err = dirs.Protect(ctx, fmt.Sprintf("backup-%d-%d", e, time.Now().UnixNano()), "backup into "+dir, e, protectionTTL); err != nil {
				return fmt.Errorf("backup: protecting epoch %d from GC: %w", e, err)
			}
		}
		ranges, err := tiling(ctx, dirs)
		if err != nil {
			return err
		}
		m = &Manifest{Format: formatVersion, Epoch: e}
		var keys int
		var size int64
		for i, r := range ranges {
			if err := writeRange(ctx, s, dir, &r); err != nil {
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

// writeRange scans r's span in s into r's SST file and fills in r's keys,
// size and checksum.
func writeRange(ctx context.Context, s *client.Snapshot, dir string, r *Range) error {
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
	for lo := r.Start; ; {
		if len(lo) == 0 {
			lo = []byte{0}
		}
		page, err := s.Scan(ctx, lo, hi, scanPage)
		if err != nil {
			_ = w.Close()
			return err
		}
		for _, kv := range page {
			if err := w.Set(kv.Key, kv.Value); err != nil {
				_ = w.Close()
				return err
			}
			r.Keys++
		}
		if len(page) < scanPage {
			break
		}
		lo = append(append([]byte(nil), page[len(page)-1].Key...), 0)
	}
	if err := w.Close(); err != nil { // syncs and closes the file
		return err
	}
	sum, n, err := checksum(path)
	r.SHA256, r.Bytes = sum, n
	return err
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
