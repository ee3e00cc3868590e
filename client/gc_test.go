package client_test

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
	"github.com/terroir-db/terroir/internal/localcluster"
)

// TestSnapshotBelowTheGCHorizonIsRefused: once a range collected the
// versions below a horizon, a snapshot that reads below it gets
// ErrSnapshotTooOld naming the horizon, never a wrong answer, and a new
// snapshot reads the newest value (DESIGN.md §14).
func TestSnapshotBelowTheGCHorizonIsRefused(t *testing.T) {
	c := localcluster.StartT(t, "../examples/one-region.yaml", localcluster.Options{})
	db, err := c.Client("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	put := func(v string) { putKey(ctx, t, db, "a", v) }
	put("v1")
	put("v2")
	old, err := db.BeginSnapshot(ctx, client.Linearizable)
	if err != nil {
		t.Fatal(err)
	}
	if v, ok, err := old.Get(ctx, []byte("a")); err != nil || !ok || string(v) != "v2" {
		t.Fatalf("old snapshot read %q %v %v, want v2", v, ok, err)
	}
	put("v3")
	time.Sleep(50 * time.Millisecond) // a few epochs on
	horizon := old.Stats().Epoch + 1
	const rangeID = 10 // holds "a" in examples/one-region.yaml
	var leader uint64
	for deadline := time.Now().Add(10 * time.Second); leader == 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		leader = c.Leader(rangeID)
	}
	stats, err := c.Node(leader).Range(rangeID).CollectGarbage(ctx, horizon, 0)
	if err != nil {
		t.Fatal(err)
	}
	if stats.Versions == 0 { // v1, and v2 too if v3 committed in the snapshot's epoch
		t.Fatalf("collected nothing below epoch %d: %+v", horizon, stats)
	}
	_, _, err = old.Get(ctx, []byte("a"))
	if !errors.Is(err, client.ErrSnapshotTooOld) || !strings.Contains(err.Error(), fmt.Sprint(horizon)) {
		t.Fatalf("old snapshot after GC: %v, want ErrSnapshotTooOld naming %d", err, horizon)
	}
	if _, err := db.View(ctx, client.Linearizable, func(ctx context.Context, s *client.Snapshot) error {
		v, ok, err := s.Get(ctx, []byte("a"))
		if err == nil && (!ok || string(v) != "v3") {
			err = fmt.Errorf("read %q %v, want v3", v, ok)
		}
		return err
	}); err != nil {
		t.Fatalf("a new snapshot: %v", err)
	}
}

// TestLeadersCollectBelowTheTTL: with gc_ttl 1s, range leaders collect by
// themselves, and a snapshot held open past the TTL is refused once they
// did, while a new one reads the newest values.
func TestLeadersCollectBelowTheTTL(t *testing.T) {
	data, err := os.ReadFile("../examples/one-region.yaml")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "gc.yaml")
	if err := os.WriteFile(path, append([]byte("gc_ttl: 1s\n"), data...), 0o644); err != nil {
		t.Fatal(err)
	}
	c := localcluster.StartT(t, path, localcluster.Options{})
	db, err := c.Client("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	put := func(k, v string) { putKey(ctx, t, db, k, v) }
	put("a", "v1")
	put("n", "v1")
	old, err := db.BeginSnapshot(ctx, client.Linearizable)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := old.Get(ctx, []byte("a")); err != nil {
		t.Fatal(err)
	}
	put("a", "v2")
	put("n", "v2")
	deadline := time.Now().Add(30 * time.Second)
	for _, k := range []string{"a", "n"} { // both ranges
		for {
			_, _, err := old.Get(ctx, []byte(k))
			if errors.Is(err, client.ErrSnapshotTooOld) {
				break
			}
			if err != nil || time.Now().After(deadline) {
				t.Fatalf("a snapshot at epoch %d reading %q %v after the TTL: %v, want ErrSnapshotTooOld", old.Stats().Epoch, k, time.Since(deadline.Add(-30*time.Second)), err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	if _, err := db.View(ctx, client.Linearizable, func(ctx context.Context, s *client.Snapshot) error {
		for _, k := range []string{"a", "n"} {
			if v, ok, err := s.Get(ctx, []byte(k)); err != nil || !ok || string(v) != "v2" {
				return fmt.Errorf("%s: %q %v %v, want v2", k, v, ok, err)
			}
		}
		return nil
	}); err != nil {
		t.Fatalf("a new snapshot: %v", err)
	}
}

// putKey writes key = value in a transaction of its own.
func putKey(ctx context.Context, t *testing.T, db *client.DB, key, value string) {
	t.Helper()
	if err := db.Update(ctx, func(ctx context.Context, tx *client.Txn) error { return tx.Put(ctx, []byte(key), []byte(value)) }); err != nil {
		t.Fatal(err)
	}
}
