package client_test

import (
	"testing"
	"time"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/localcluster"
	"github.com/terroir-db/terroir/internal/topology"
)

// TestVersionsCarryTheGlobalEpoch commits single-region transactions in the
// three-region layout, where the global epoch (one round trip to us-central1
// per advance) moves several times slower than the local one (10 ms): versions
// must carry the global epoch read at the publisher (paper §5.1), raised by the
// client session, never the local epoch.
func TestVersionsCarryTheGlobalEpoch(t *testing.T) {
	c := localcluster.StartT(t, "../examples/three-regions.yaml", localcluster.Options{})
	ctx := ctxT(t, 60*time.Second)
	db, err := c.Client("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	pub, err := c.Reader(topology.KindPublisher, "us-east1", "us-east1")
	if err != nil {
		t.Fatal(err)
	}
	local, err := c.EpochReader("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // let the local epoch run ahead of the global one
	var last uint64
	for i := 0; i < 10; i++ {
		before, err := pub.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		tx := db.Begin()
		if err := tx.Put(ctx, []byte("a-key"), []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Put(ctx, []byte("h-key"), []byte{byte(i)}); err != nil { // a second range: two-phase
			t.Fatal(err)
		}
		ver, err := tx.Commit(ctx)
		if err != nil {
			t.Fatal(err)
		}
		after, _ := pub.Read(ctx)
		l, _ := local.Read(ctx)
		if ver.Epoch+1 < before || ver.Epoch > after+1 {
			t.Fatalf("commit %d at epoch %d; the global epoch went from %d to %d around it (local epoch %d)", i, ver.Epoch, before, after, l)
		}
		if ver.Epoch < last {
			t.Fatalf("version epochs went backwards in one session: %d after %d", ver.Epoch, last)
		}
		last = ver.Epoch
		if l < 2*ver.Epoch { // the local epoch is ~4× ahead by now: the version is not local
			t.Fatalf("version epoch %d is not the global epoch (local epoch %d)", ver.Epoch, l)
		}
	}
	// A transaction writing in both regions commits at a global epoch, and a
	// client in the other region reads it.
	ver, err := func() (v interface{ String() string }, err error) {
		tx := db.Begin()
		if err := tx.Put(ctx, []byte("a-both"), []byte("east")); err != nil {
			return nil, err
		}
		if err := tx.Put(ctx, []byte("zebra"), []byte("west")); err != nil {
			return nil, err
		}
		return tx.Commit(ctx)
	}()
	if err != nil {
		t.Fatalf("multi-region transaction: %v", err)
	}
	west, err := c.Client("us-west1")
	if err != nil {
		t.Fatal(err)
	}
	tx := west.Begin()
	a, _, err1 := tx.Get(ctx, []byte("a-both"))
	z, _, err2 := tx.Get(ctx, []byte("zebra"))
	if err1 != nil || err2 != nil || string(a) != "east" || string(z) != "west" {
		t.Fatalf("read from us-west1 after %v: %q %q (%v %v)", ver, a, z, err1, err2)
	}
	if _, err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestBaselineCommitModes: the naive and commit-wait baselines commit
// correctly, the naive one paying the WAN to us-central1 and the commit-wait
// one its wait on every write.
func TestBaselineCommitModes(t *testing.T) {
	c := localcluster.StartT(t, "../examples/three-regions.yaml", localcluster.Options{})
	ctx := ctxT(t, 60*time.Second)
	db, err := c.Client("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	put(t, ctx, db, "b-mode", "chablis")
	for _, m := range []struct {
		name  string
		mode  client.CommitMode
		least time.Duration
	}{
		{"naive", client.CommitMode{Naive: true}, 31 * time.Millisecond}, // one round trip to us-central1
		{"commit-wait", client.CommitMode{CommitWait: 20 * time.Millisecond}, 20 * time.Millisecond},
	} {
		db.SetCommitMode(m.mode)
		for i := 0; i < 3; i++ {
			began := time.Now()
			put(t, ctx, db, "b-mode", m.name, "h-mode", m.name) // two ranges: two-phase
			put(t, ctx, db, "b-mode", m.name)                   // one range: one phase
			if d := time.Since(began); d < 2*m.least {
				t.Fatalf("%s: two commits took %v, less than its cost %v each", m.name, d, m.least)
			}
		}
		got, ok, err := readOnce(ctx, db, "b-mode")
		if err != nil || !ok || got != m.name {
			t.Fatalf("%s: read back %q %v %v", m.name, got, ok, err)
		}
	}
	db.SetCommitMode(client.CommitMode{})
}
