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
	"github.com/terroir-db/terroir/internal/directory"
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
	c := localcluster.StartT(t, withGCTTL(t, "1s"), localcluster.Options{})
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
	for _, k := range []string{"a", "n"} { // both ranges
		waitTooOld(ctx, t, old, k)
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

// waitTooOld reads key through old until it gets ErrSnapshotTooOld, for up
// to 30 s.
func waitTooOld(ctx context.Context, t *testing.T, old *client.Snapshot, key string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, _, err := old.Get(ctx, []byte(key))
		if errors.Is(err, client.ErrSnapshotTooOld) {
			return
		}
		if err != nil || time.Now().After(deadline) {
			t.Fatalf("a snapshot at epoch %d reading %q: %v, want ErrSnapshotTooOld", old.Stats().Epoch, key, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestProtectionKeepsALongSnapshotReadable: with gc_ttl 1s, a snapshot
// whose epoch a protection holds stays readable long past the TTL while
// newer versions are written; once the protection is released, the
// leaders collect below it and the snapshot is refused (DESIGN.md §14).
func TestProtectionKeepsALongSnapshotReadable(t *testing.T) {
	c, db, ctx := startWithClient(t, withGCTTL(t, "1s"))
	old := snapshotAfter(ctx, t, db, "a", "v1")
	dirs := directory.NewDirectories(c.Topology, c.Dialer("us-east1"))
	hold, err := dirs.Protect(ctx, "test-backup", "TestProtectionKeepsALongSnapshotReadable", old.Stats().Epoch, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Release(context.Background())
	for end := time.Now().Add(6 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		putKey(ctx, t, db, "a", "v2")
		if v, ok, err := old.Get(ctx, []byte("a")); err != nil || !ok || string(v) != "v1" {
			t.Fatalf("a protected snapshot read %q %v %v, want v1", v, ok, err)
		}
	}
	if err := hold.Release(ctx); err != nil {
		t.Fatal(err)
	}
	waitTooOld(ctx, t, old, "a")
}

// TestGCTTLChangesAtRunTime: a cluster started with the default gc_ttl
// (4h) collects within seconds once an operator sets 1s; a gc_ttl below
// the minimum is refused with ErrBadGCTTL and changes nothing.
func TestGCTTLChangesAtRunTime(t *testing.T) {
	c, db, ctx := startWithClient(t, "../examples/one-region.yaml")
	old := snapshotAfter(ctx, t, db, "n", "v1")
	putKey(ctx, t, db, "n", "v2")
	dirs := directory.NewDirectories(c.Topology, c.Dialer("us-east1"))
	if err := dirs.SetGCTTL(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	waitTooOld(ctx, t, old, "n")
	if err := dirs.SetGCTTL(ctx, 10*time.Millisecond); !errors.Is(err, directory.ErrBadGCTTL) {
		t.Fatalf("gc_ttl 10ms: %v, want ErrBadGCTTL", err)
	}
	pol, err := dirs.Of("us-east1").GCPolicy(ctx)
	if err != nil || pol.GetGcTtlMs() != 1000 {
		t.Fatalf("gc_ttl after a refusal: %v %v, want 1000 ms", pol, err)
	}
}

// startWithClient starts the cluster of the topology at path and returns
// it with a client in us-east1 and a context of 90 s, both ended when the
// test ends.
func startWithClient(t *testing.T, path string) (*localcluster.Cluster, *client.DB, context.Context) {
	t.Helper()
	c := localcluster.StartT(t, path, localcluster.Options{})
	db, err := c.Client("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	return c, db, ctx
}

// snapshotAfter writes key = value, then opens a Linearizable snapshot
// and reads key in it, which fixes what the snapshot sees.
func snapshotAfter(ctx context.Context, t *testing.T, db *client.DB, key, value string) *client.Snapshot {
	t.Helper()
	putKey(ctx, t, db, key, value)
	s, err := db.BeginSnapshot(ctx, client.Linearizable)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Get(ctx, []byte(key)); err != nil {
		t.Fatal(err)
	}
	return s
}

// withGCTTL returns examples/one-region.yaml with gc_ttl set, in a
// temporary file.
func withGCTTL(t *testing.T, ttl string) string {
	t.Helper()
	data, err := os.ReadFile("../examples/one-region.yaml")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "gc.yaml")
	if err := os.WriteFile(path, append([]byte("gc_ttl: "+ttl+"\n"), data...), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// putKey writes key = value in a transaction of its own.
func putKey(ctx context.Context, t *testing.T, db *client.DB, key, value string) {
	t.Helper()
	if err := db.Update(ctx, func(ctx context.Context, tx *client.Txn) error { return tx.Put(ctx, []byte(key), []byte(value)) }); err != nil {
		t.Fatal(err)
	}
}
