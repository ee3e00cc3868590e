package backup_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/backup"
	"github.com/terroir-db/terroir/internal/directory"
	"github.com/terroir-db/terroir/internal/localcluster"
)

const (
	accounts = 6
	funds    = 100
)

// account i is homed in us-east1 for even i, us-west1 for odd i.
func account(i int) []byte {
	if i%2 == 0 {
		return []byte(fmt.Sprintf("b/acct-%d", i))
	}
	return []byte(fmt.Sprintf("p/acct-%d", i))
}

func xferKey(n int) []byte { return []byte(fmt.Sprintf("x/xfer-%06d", n)) }

// TestBackupDuringTransfersRestoresTheSnapshot: a backup taken while bank
// transfers cross regions restores, into a fresh cluster of another shape,
// the state of one snapshot: the bank's total is intact, every transfer
// acknowledged before the backup began is there and none begun after it
// ended; a deleted key stays deleted. Bad input is refused with typed
// errors and writes nothing.
func TestBackupDuringTransfersRestoresTheSnapshot(t *testing.T) {
	src := localcluster.StartT(t, "../../examples/three-regions.yaml", localcluster.Options{})
	db, err := src.Client("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := db.Update(ctx, func(ctx context.Context, tx *client.Txn) error {
		for i := range accounts {
			if err := tx.Put(ctx, account(i), []byte(strconv.Itoa(funds))); err != nil {
				return err
			}
		}
		if err := tx.Put(ctx, []byte("h/gone"), []byte("soon deleted")); err != nil {
			return err
		}
		return tx.Put(ctx, []byte("z/kept"), []byte("kept"))
	}); err != nil {
		t.Fatal(err)
	}
	if err := db.Update(ctx, func(ctx context.Context, tx *client.Txn) error { return tx.Delete(ctx, []byte("h/gone")) }); err != nil {
		t.Fatal(err)
	}

	// Transfers from east to west accounts and back, each recording itself.
	var mu sync.Mutex
	started, acked := map[int]time.Time{}, map[int]time.Time{}
	tctx, stopTransfers := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for n := 0; tctx.Err() == nil; n++ {
			from, to := n%accounts, (n+1)%accounts
			mu.Lock()
			started[n] = time.Now()
			mu.Unlock()
			err := db.Update(tctx, func(ctx context.Context, tx *client.Txn) error {
				a, err := readInt(ctx, tx, account(from))
				if err != nil {
					return err
				}
				b, err := readInt(ctx, tx, account(to))
				if err != nil {
					return err
				}
				if err := tx.Put(ctx, account(from), []byte(strconv.Itoa(a-1))); err != nil {
					return err
				}
				if err := tx.Put(ctx, account(to), []byte(strconv.Itoa(b+1))); err != nil {
					return err
				}
				return tx.Put(ctx, xferKey(n), []byte("done"))
			})
			if err == nil {
				mu.Lock()
				acked[n] = time.Now()
				mu.Unlock()
			}
		}
	}()
	time.Sleep(1500 * time.Millisecond)
	dir := filepath.Join(t.TempDir(), "bk")
	dirs := directory.NewDirectories(src.Topology, src.Dialer("us-east1"))
	began := time.Now()
	// Calls of the last pass: a snapshot the linearizable check or a lost
	// lease sends round again reports from its first range once more.
	var calls int
	m, err := backup.Take(ctx, db, dirs, dir, func(done, total, keys int, bytes int64) {
		if done == 1 {
			calls = 0
		}
		calls++
	})
	ended := time.Now()
	time.Sleep(1500 * time.Millisecond)
	stopTransfers()
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if calls != len(m.Ranges) || len(m.Ranges) != 4 || m.Epoch == 0 {
		t.Fatalf("manifest: epoch %d, %d ranges, %d progress calls in the last pass; want 4 ranges, a call each", m.Epoch, len(m.Ranges), calls)
	}
	t.Logf("backup at epoch %d: %d pairs, %d bytes, in %v", m.Epoch, m.Keys(), m.Bytes(), ended.Sub(began))

	if _, err := backup.Take(ctx, db, dirs, dir, nil); !errors.Is(err, backup.ErrBackupExists) {
		t.Fatalf("a backup into a used directory: %v, want ErrBackupExists", err)
	}

	dst := localcluster.StartT(t, "../../examples/one-region.yaml", localcluster.Options{})
	rdb, err := dst.Client("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	// Damaged and incomplete copies are refused before anything is written.
	for name, damage := range map[string]func(d string) error{
		"a flipped byte": func(d string) error {
			p := filepath.Join(d, m.Ranges[1].File)
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			data[len(data)/2] ^= 0xff
			return os.WriteFile(p, data, 0o644)
		},
		"a missing file": func(d string) error { return os.Remove(filepath.Join(d, m.Ranges[2].File)) },
		"no manifest":    func(d string) error { return os.Remove(filepath.Join(d, "MANIFEST.json")) },
		"a bad manifest": func(d string) error { return os.WriteFile(filepath.Join(d, "MANIFEST.json"), []byte("{"), 0o644) },
	} {
		bad := filepath.Join(t.TempDir(), "bad")
		if err := os.CopyFS(bad, os.DirFS(dir)); err != nil {
			t.Fatal(err)
		}
		if err := damage(bad); err != nil {
			t.Fatal(err)
		}
		_, err := backup.Restore(ctx, rdb, bad, nil)
		if !errors.Is(err, backup.ErrCorrupt) && !errors.Is(err, backup.ErrIncomplete) {
			t.Errorf("restoring a backup with %s: %v, want ErrCorrupt or ErrIncomplete", name, err)
		}
	}
	if kvs := scanAll(ctx, t, rdb); len(kvs) != 0 {
		t.Fatalf("refused restores wrote %d pairs", len(kvs))
	}

	if _, err := backup.Restore(ctx, rdb, dir, nil); err != nil {
		t.Fatal(err)
	}
	kvs := scanAll(ctx, t, rdb)
	if len(kvs) != m.Keys() {
		t.Fatalf("restored %d pairs, the backup holds %d", len(kvs), m.Keys())
	}
	got := map[string]string{}
	for _, kv := range kvs {
		got[string(kv.Key)] = string(kv.Value)
	}
	total := 0
	for i := range accounts {
		n, err := strconv.Atoi(got[string(account(i))])
		if err != nil {
			t.Fatalf("account %d: %q", i, got[string(account(i))])
		}
		total += n
	}
	if total != accounts*funds {
		t.Fatalf("restored bank total %d, want %d", total, accounts*funds)
	}
	if _, ok := got["h/gone"]; ok || got["z/kept"] != "kept" {
		t.Fatalf("restored h/gone %v, z/kept %q; want deleted, kept", ok, got["z/kept"])
	}
	before, after, in := 0, 0, 0
	for n, at := range acked {
		_, present := got[string(xferKey(n))]
		switch {
		case at.Before(began) && !present:
			t.Errorf("transfer %d acknowledged before the backup began is missing", n)
		case at.Before(began):
			before++
		}
	}
	for n, at := range started {
		_, present := got[string(xferKey(n))]
		switch {
		case at.After(ended) && present:
			t.Errorf("transfer %d begun after the backup ended was restored", n)
		case at.After(ended):
			after++
		case present:
			in++
		}
	}
	if before == 0 || after == 0 {
		t.Fatalf("%d transfers acknowledged before the backup, %d begun after it: the test shows nothing", before, after)
	}
	t.Logf("transfers: %d acknowledged before, %d begun after the backup; %d restored", before, after, in)

	if _, err := backup.Restore(ctx, rdb, dir, nil); !errors.Is(err, backup.ErrNotEmpty) {
		t.Fatalf("a restore into a cluster with data: %v, want ErrNotEmpty", err)
	}
}

type getter interface {
	Get(ctx context.Context, key []byte) ([]byte, bool, error)
}

func readInt(ctx context.Context, g getter, key []byte) (int, error) {
	v, ok, err := g.Get(ctx, key)
	if err != nil || !ok {
		return 0, fmt.Errorf("%q: %v (present %v)", key, err, ok)
	}
	return strconv.Atoi(string(v))
}

func scanAll(ctx context.Context, t *testing.T, db *client.DB) []client.KeyValue {
	t.Helper()
	var kvs []client.KeyValue
	if _, err := db.View(ctx, client.Linearizable, func(ctx context.Context, s *client.Snapshot) error {
		var err error
		kvs, err = s.Scan(ctx, []byte{0}, nil, 0)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return kvs
}
