package backup

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"

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

// maxChain bounds a chain of incremental backups (a cycle of Base links
// would otherwise never end).
const maxChain = 1000

// Chain returns the backups a restore of dir applies, oldest first: the
// full backup, then each incremental on it up to dir's, each verified
// (Verify), each link checked: an incremental's Since is its base's epoch
// and its BaseSHA256 its base's manifest checksum. Errors: ErrIncomplete,
// ErrCorrupt (naming the broken link).
func Chain(dir string) ([]*Manifest, []string, error) {
	var ms []*Manifest
	var dirs []string
	for cur := dir; ; {
		m, err := Verify(cur)
		if err != nil {
			return nil, nil, err
		}
		if len(ms) > 0 {
			next := ms[len(ms)-1]
			if m.sum != next.BaseSHA256 || m.Epoch != next.Since {
				return nil, nil, fmt.Errorf("%w: %s is based on a backup at epoch %d with manifest SHA-256 %s; %s holds epoch %d, SHA-256 %s",
					ErrCorrupt, dirs[len(dirs)-1], next.Since, next.BaseSHA256, cur, m.Epoch, m.sum)
			}
		}
		ms, dirs = append(ms, m), append(dirs, cur)
		if !m.Incremental() {
			break
		}
		if len(ms) >= maxChain {
			return nil, nil, fmt.Errorf("%w: a chain of more than %d incremental backups", ErrCorrupt, maxChain)
		}
		cur = m.Base
	}
	slices.Reverse(ms)
	slices.Reverse(dirs)
	return ms, dirs, nil
}

// Restore writes the backup in dir into db's cluster, which must hold no
// key, so that its state is the backup's: the snapshot at the manifest's
// epoch. For an incremental backup it restores the whole chain: the full
// backup, then each incremental's changes in order. Nothing is written
// unless every backup of the chain verifies and the cluster is empty.
// Errors: ErrIncomplete, ErrCorrupt (also for a file whose entries differ
// from the manifest's count or span), ErrNotEmpty, the client's errors; a
// restore that fails part way leaves the pairs it wrote (restore into a
// fresh cluster again). It returns dir's manifest.
func Restore(ctx context.Context, db *client.DB, dir string, progress Progress) (*Manifest, error) {
	chain, dirs, err := Chain(dir)
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
	total := 0
	for _, m := range chain {
		total += len(m.Ranges)
	}
	done, keys := 0, 0
	var size int64
	for i, m := range chain {
		for _, r := range m.Ranges {
			n, err := restoreRange(ctx, db, dirs[i], r, m.Incremental())
			if err != nil {
				return nil, fmt.Errorf("restore: %s: %w", filepath.Join(dirs[i], r.File), err)
			}
			done, keys, size = done+1, keys+n, size+r.Bytes
			if progress != nil {
				progress(done, total, keys, size)
			}
		}
	}
	return chain[len(chain)-1], nil
}

// entry is one entry of a backup file: a pair, or a deletion.
type entry struct {
	key, value []byte
	deleted    bool
}

// restoreRange writes one file's entries (deletions only in an
// incremental backup) and returns how many.
func restoreRange(ctx context.Context, db *client.DB, dir string, r Range, incremental bool) (int, error) {
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
	var batch []entry
	var batchBytes, n int
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		err := db.Update(ctx, func(ctx context.Context, tx *client.Txn) error {
			for _, e := range batch {
				var err error
				if e.deleted {
					err = tx.Delete(ctx, e.key)
				} else {
					err = tx.Put(ctx, e.key, e.value)
				}
				if err != nil {
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
		e := entry{key: append([]byte(nil), k...)}
		switch kind := kv.Kind(); {
		case kind == sstable.InternalKeyKindDelete && incremental:
			e.deleted = true
		case kind != sstable.InternalKeyKindSet:
			return n, fmt.Errorf("%w: %s holds an entry of kind %v for %q", ErrCorrupt, r.File, kind, k)
		default:
			v, _, err := kv.Value(nil)
			if err != nil {
				return n, fmt.Errorf("%w: %s: %v", ErrCorrupt, r.File, err)
			}
			e.value = append([]byte(nil), v...)
		}
		batch = append(batch, e)
		batchBytes += len(e.key) + len(e.value)
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
