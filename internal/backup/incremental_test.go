package backup_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/backup"
	"github.com/terroir-db/terroir/internal/directory"
	"github.com/terroir-db/terroir/internal/localcluster"
)

// TestIncrementalChainRestoresTheLastEpoch: a full backup and two
// incrementals on it, with updates, deletions, re-creations and keys
// written twice between them, restore into a fresh cluster exactly the
// source's state at the last one. A broken chain is refused before
// anything is written, and an incremental whose base GC has passed fails
// with ErrSnapshotTooOld.
func TestIncrementalChainRestoresTheLastEpoch(t *testing.T) {
	src := localcluster.StartT(t, "../../examples/one-region.yaml", localcluster.Options{})
	db, err := src.Client("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dirs := directory.NewDirectories(src.Topology, src.Dialer("us-east1"))
	write := func(puts map[string]string, dels ...string) {
		t.Helper()
		if err := db.Update(ctx, func(ctx context.Context, tx *client.Txn) error {
			for k, v := range puts {
				if err := tx.Put(ctx, []byte(k), []byte(v)); err != nil {
					return err
				}
			}
			for _, k := range dels {
				if err := tx.Delete(ctx, []byte(k)); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	base := t.TempDir()
	full, inc1, inc2 := filepath.Join(base, "full"), filepath.Join(base, "inc1"), filepath.Join(base, "inc2")
	initial := map[string]string{}
	for i := range 10 {
		initial[fmt.Sprintf("k%d", i)] = "v0"
		initial[fmt.Sprintf("x%d", i)] = "v0" // the second range
	}
	write(initial)
	if _, err := backup.Take(ctx, db, dirs, full, nil); err != nil {
		t.Fatal(err)
	}
	write(map[string]string{"k1": "v1", "k3": "a", "k10": "new", "x1": "v1"}, "k2", "x2")
	write(map[string]string{"k3": "b"})
	m1, err := backup.TakeIncremental(ctx, db, dirs, inc1, full, nil)
	if err != nil {
		t.Fatal(err)
	}
	if m1.Keys() != 6 || m1.Ranges[0].Deletes+m1.Ranges[1].Deletes != 2 {
		t.Fatalf("the first incremental holds %d entries (%d+%d deletions); want 6, 2 of them deletions", m1.Keys(), m1.Ranges[0].Deletes, m1.Ranges[1].Deletes)
	}
	write(map[string]string{"k1": "v2", "k2": "back"}, "k10", "x3")
	m2, err := backup.TakeIncremental(ctx, db, dirs, inc2, inc1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if m2.Since != m1.Epoch || m2.Keys() != 4 {
		t.Fatalf("the second incremental: since %d, %d entries; want since %d, 4 entries", m2.Since, m2.Keys(), m1.Epoch)
	}
	want := scanAll(ctx, t, db)

	dst := localcluster.StartT(t, "../../examples/one-region.yaml", localcluster.Options{})
	rdb, err := dst.Client("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	// A chain with a link broken is refused, naming it; nothing is written.
	for name, damage := range map[string]func(d string) error{
		"a base rewritten": func(d string) error {
			p := filepath.Join(d, "full", "MANIFEST.json")
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return os.WriteFile(p, append(data, '\n'), 0o644)
		},
		"a base missing": func(d string) error { return os.RemoveAll(filepath.Join(d, "inc1")) },
	} {
		bad := filepath.Join(t.TempDir(), "bad")
		if err := os.CopyFS(bad, os.DirFS(base)); err != nil {
			t.Fatal(err)
		}
		if err := damage(bad); err != nil {
			t.Fatal(err)
		}
		// The copy's manifests still name the original bases: point them here.
		for _, d := range []string{"inc1", "inc2"} {
			p := filepath.Join(bad, d, "MANIFEST.json")
			if data, err := os.ReadFile(p); err == nil {
				data = []byte(strings.ReplaceAll(string(data), base, bad))
				if err := os.WriteFile(p, data, 0o644); err != nil {
					t.Fatal(err)
				}
			}
		}
		_, err := backup.Restore(ctx, rdb, filepath.Join(bad, "inc2"), nil)
		if !errors.Is(err, backup.ErrCorrupt) && !errors.Is(err, backup.ErrIncomplete) {
			t.Errorf("restoring a chain with %s: %v, want ErrCorrupt or ErrIncomplete", name, err)
		}
	}
	if kvs := scanAll(ctx, t, rdb); len(kvs) != 0 {
		t.Fatalf("refused restores wrote %d pairs", len(kvs))
	}
	if _, err := backup.Restore(ctx, rdb, inc2, nil); err != nil {
		t.Fatal(err)
	}
	got := scanAll(ctx, t, rdb)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("restored chain:\n%q\nsource at the last incremental:\n%q", got, want)
	}

	// GC past the base: the incremental cannot be taken.
	if err := dirs.SetGCTTL(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	for {
		write(map[string]string{"k1": "churn", "x1": "churn"})
		_, err := backup.TakeIncremental(ctx, db, dirs, filepath.Join(t.TempDir(), "late"), inc2, nil)
		if errors.Is(err, client.ErrSnapshotTooOld) {
			break
		}
		if err != nil {
			t.Fatalf("an incremental on a base GC passed: %v, want ErrSnapshotTooOld", err)
		}
		if ctx.Err() != nil {
			t.Fatal("GC never passed the base's epoch")
		}
		time.Sleep(300 * time.Millisecond)
	}
}
