package backup

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cockroachdb/pebble/v2/sstable"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/terroir-db/terroir/client"
)

// Batch bounds of a restore's write transactions: one file's pairs are
// written in transactions of at most restoreBatchKeys pairs and about
// restoreBatchBytes bytes (one range, so they commit in one phase).
const (
	restoreBatchKeys  = 200
	restoreBatchBytes = 512 << 10
)

// Verify checks that dir holds a finished, undamaged backup: its manifest
// decodes and tiles the key space, and every file it names is there with
// its size and checksum. Errors: ErrIncomplete, ErrCorrupt.
func Verify(dir string) (*Manifest, error) {
	m, err := ReadManifest(dir)
	if err != nil {
		return nil, err
	}
	for _, r := range m.Ranges {
		sum, n, err := checksum(filepath.Join(dir, r.File))
		switch {
		case os.IsNotExist(err):
			return nil, fmt.Errorf("%w: %s is missing", ErrIncomplete, r.File)
		case err != nil:
			return nil, err
		case n != r.Bytes || sum != r.SHA256:
			return nil, fmt.Errorf("%w: %s has %d bytes with SHA-256 %s, the manifest says %d bytes, %s", ErrCorrupt, r.File, n, sum, r.Bytes, r.SHA256)
		}
	}
	return m, nil
}

// Restore writes the backup in dir into db's cluster, which must hold no
// key, so that its state is the backup's: the snapshot at the manifest's
// epoch. Nothing is written unless the backup verifies and the cluster is
// empty. Errors: ErrIncomplete, ErrCorrupt (also for a file whose pairs
// differ from the manifest's count or span), ErrNotEmpty, the client's
// errors; a restore that fails part way leaves the pairs it wrote (restore
// into a fresh cluster again).
func Restore(ctx context.Context, db *client.DB, dir string, progress Progress) (*Manifest, error) {
	m, err := Verify(dir)
	if err != nil {
		return nil, err
	}
	var some []client.KeyValue
	if _, err := db.View(ctx, client.Linearizable, func(ctx context.Context, s *client.Snapshot) error {
		some, err = s.Scan(ctx, []byte{0}, nil, 1)
		return err
	}); err != nil {
		return nil, err
	}
	if len(some) > 0 {
		return nil, fmt.Errorf("%w: it holds %q", ErrNotEmpty, some[0].Key)
	}
	keys := 0
	var size int64
	for i, r := range m.Ranges {
		n, err := restoreRange(ctx, db, dir, r)
		if err != nil {
			return nil, fmt.Errorf("restore: %s: %w", r.File, err)
		}
		keys, size = keys+n, size+r.Bytes
		if progress != nil {
			progress(i+1, len(m.Ranges), keys, size)
		}
	}
	return m, nil
}

// restoreRange writes one file's pairs and returns how many.
func restoreRange(ctx context.Context, db *client.DB, dir string, r Range) (int, error) {
	f, err := vfs.Default.Open(filepath.Join(dir, r.File))
	if err != nil {
		return 0, err
	}
	readable, err := sstable.NewSimpleReadable(f)
	if err != nil {
		f.Close()
		return 0, err
	}
	rd, err := sstable.NewReader(ctx, readable, sstable.ReaderOptions{})
	if err != nil {
		readable.Close()
		return 0, fmt.Errorf("%w: %s: %v", ErrCorrupt, r.File, err)
	}
	defer rd.Close()
	it, err := rd.NewIter(sstable.NoTransforms, nil, nil, sstable.AssertNoBlobHandles)
	if err != nil {
		return 0, fmt.Errorf("%w: %s: %v", ErrCorrupt, r.File, err)
	}
	defer it.Close()
	var batch []client.KeyValue
	var batchBytes, n int
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		err := db.Update(ctx, func(ctx context.Context, tx *client.Txn) error {
			for _, kv := range batch {
				if err := tx.Put(ctx, kv.Key, kv.Value); err != nil {
					return err
				}
			}
			return nil
		})
		batch, batchBytes = batch[:0], 0
		return err
	}
	for kv := it.First(); kv != nil; kv = it.Next() {
		k := kv.K.UserKey
		if string(k) < string(r.Start) || (len(r.End) > 0 && string(k) >= string(r.End)) {
			return n, fmt.Errorf("%w: %s holds %q, outside [%q, %q)", ErrCorrupt, r.File, k, r.Start, r.End)
		}
		v, _, err := kv.Value(nil)
		if err != nil {
			return n, fmt.Errorf("%w: %s: %v", ErrCorrupt, r.File, err)
		}
		batch = append(batch, client.KeyValue{Key: append([]byte(nil), k...), Value: append([]byte(nil), v...)})
		batchBytes += len(k) + len(v)
		n++
		if len(batch) >= restoreBatchKeys || batchBytes >= restoreBatchBytes {
			if err := flush(); err != nil {
				return n, err
			}
		}
	}
	if err := it.Error(); err != nil {
		return n, fmt.Errorf("%w: %s: %v", ErrCorrupt, r.File, err)
	}
	if err := flush(); err != nil {
		return n, err
	}
	if n != r.Keys {
		return n, fmt.Errorf("%w: %s holds %d pairs, the manifest says %d", ErrCorrupt, r.File, n, r.Keys)
	}
	return n, nil
}
