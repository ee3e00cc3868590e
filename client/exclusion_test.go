package client_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/admin"
	"github.com/terroir-db/terroir/internal/topology"
)

// writer commits one new key per transaction until stopped, and remembers
// which commits were acknowledged and when.
type writer struct {
	db     *client.DB
	prefix string

	mu      sync.Mutex
	acked   map[string]string // key → value, acknowledged commits
	lastAck time.Time
	n       int
}

func (w *writer) run(ctx context.Context, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		w.n++
		key, val := fmt.Sprintf("%s-%05d", w.prefix, w.n), strconv.Itoa(w.n)
		tctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		tx := w.db.Begin()
		err := tx.Put(tctx, []byte(key), []byte(val))
		if err == nil {
			_, err = tx.Commit(tctx)
		} else {
			_ = tx.Abort(tctx)
		}
		cancel()
		if err == nil {
			w.mu.Lock()
			w.acked[key], w.lastAck = val, time.Now()
			w.mu.Unlock()
		} else {
			time.Sleep(20 * time.Millisecond)
		}
	}
}

func (w *writer) last() (time.Time, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lastAck, len(w.acked)
}

// TestRegionCutOffExcludedAndReadmitted: us-west1 is cut off from the other
// regions. It stops committing within publisher_lease; the global epoch stops
// too, until an operator excludes us-west1; then us-east1's global epoch
// advances and its strong snapshots complete. After healing and readmission
// every region commits again, the publishers converge, and every acknowledged
// commit is there.
func TestRegionCutOffExcludedAndReadmitted(t *testing.T) {
	r := startThreeRegions(t, nil)
	c, top, east, west, pubEast, pubWest := r.c, r.top, r.east, r.west, r.pubEast, r.pubWest
	ctx := ctxT(t, 150*time.Second)
	ops := c.Dialer("us-east1")
	writers := []*writer{{db: east, prefix: "c", acked: map[string]string{}}, {db: west, prefix: "u", acked: map[string]string{}}}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, w := range writers {
		wg.Add(1)
		go func() { defer wg.Done(); w.run(ctx, stop) }()
	}
	stopWriters := sync.OnceFunc(func() {
		close(stop)
		wg.Wait()
	})
	defer stopWriters()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		_, e := writers[0].last()
		_, w := writers[1].last()
		if e >= 3 && w >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the writers did not get going: %d and %d commits in 30 s", e, w)
		}
	}

	_, eastAtCut := writers[0].last()
	cut := time.Now()
	c.Dialer("us-west1").Network().CutRegion("us-west1")
	time.Sleep(top.PublisherLease + 2*time.Second)
	lastWest, _ := writers[1].last()
	if stopped := lastWest.Sub(cut); stopped > top.PublisherLease+500*time.Millisecond {
		t.Fatalf("us-west1 still committed %v after it was cut off (publisher_lease %v)", stopped, top.PublisherLease)
	}
	t.Logf("us-west1 committed its last transaction %v after the cut", lastWest.Sub(cut).Round(time.Millisecond))
	stalled, _ := pubEast.Read(ctx)
	time.Sleep(time.Second)
	if e, _ := pubEast.Read(ctx); e > stalled+1 {
		t.Fatalf("the global epoch advanced from %d to %d without us-west1's publisher", stalled, e)
	}
	if _, n := writers[0].last(); n <= eastAtCut {
		t.Fatal("us-east1 committed nothing while us-west1 was cut off")
	}

	excluded := time.Now()
	if err := admin.SetRegionExcluded(ctx, ops, top, "us-west1", true); err != nil {
		t.Fatal(err)
	}
	regions, _, err := admin.Regions(ctx, ops, top)
	if err != nil || len(regions) != 2 || regions[1].Region != "us-west1" || !regions[1].Excluded {
		t.Fatalf("regions after excluding us-west1: %+v, %v", regions, err)
	}
	if _, err := epochWaitAbove(ctx, pubEast, stalled+2); err != nil {
		t.Fatalf("us-east1's global epoch did not advance after the exclusion: %v", err)
	}
	t.Logf("global epoch advanced again %v after the exclusion (lease %v)", time.Since(excluded).Round(time.Millisecond), top.PublisherLease)
	stats, err := east.View(ctx, client.Strong, func(ctx context.Context, s *client.Snapshot) error {
		_, err := s.Scan(ctx, []byte("c-"), []byte("c-~"), 0)
		return err
	})
	if err != nil {
		t.Fatalf("a strong snapshot of us-east1 with us-west1 excluded: %v", err)
	}
	t.Logf("strong snapshot of us-east1 while us-west1 is excluded: epoch %d, %v", stats.Epoch, stats.EpochWait)
	if err := admin.SetRegionExcluded(ctx, ops, top, "nowhere", true); !errors.Is(err, admin.ErrUnknownRegion) {
		t.Errorf("excluding an unknown region = %v, want ErrUnknownRegion", err)
	}
	if err := admin.SetRegionExcluded(ctx, ops, top, "us-central1", true); !errors.Is(err, admin.ErrNoPublisher) {
		t.Errorf("excluding a region without a publisher = %v, want ErrNoPublisher", err)
	}

	c.Dialer("us-west1").Network().Heal()
	if err := admin.SetRegionExcluded(ctx, ops, top, "us-west1", false); err != nil {
		t.Fatal(err)
	}
	readmitted := time.Now()
	_, before := writers[1].last()
	for {
		if _, n := writers[1].last(); n > before+3 {
			break
		}
		if time.Since(readmitted) > 20*time.Second {
			t.Fatal("us-west1 did not commit again after readmission")
		}
		time.Sleep(50 * time.Millisecond)
	}
	e, _ := pubEast.Read(ctx)
	if w, err := epochWaitAbove(ctx, pubWest, e); err != nil {
		t.Fatalf("us-west1's publisher did not catch up with us-east1's %d: %d, %v", e, w, err)
	}
	t.Logf("us-west1 committed again %v after readmission", time.Since(readmitted).Round(time.Millisecond))

	stopWriters()
	for _, w := range writers {
		// One strong snapshot per writer: a snapshot per key waited out a
		// global epoch each, 48 of this test's 58 s.
		present, err := scanOnce(ctx, east, w.prefix+"-", w.prefix+"-~")
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range w.acked {
			if got, ok := present[k]; !ok || got != v {
				t.Fatalf("acknowledged %s=%s reads back as %q (present: %v)", k, v, got, ok)
			}
		}
		t.Logf("%s: all %d acknowledged commits present", w.prefix, len(w.acked))
	}
}

// epochWaitAbove reads r until it shows at least e (bounded by ctx).
func epochWaitAbove(ctx context.Context, r interface {
	Read(context.Context) (uint64, error)
}, e uint64) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for {
		got, err := r.Read(ctx)
		if err == nil && got >= e {
			return got, nil
		}
		if ctx.Err() != nil {
			return got, errors.Join(err, ctx.Err())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// scanOnce reads every key in [lo, hi) in one strong snapshot, as a map of
// key to value.
func scanOnce(ctx context.Context, db *client.DB, lo, hi string) (map[string]string, error) {
	kvs := map[string]string{}
	_, err := db.View(ctx, client.Strong, func(ctx context.Context, s *client.Snapshot) error {
		clear(kvs)
		got, err := s.Scan(ctx, []byte(lo), []byte(hi), 0)
		for _, kv := range got {
			kvs[string(kv.Key)] = string(kv.Value)
		}
		return err
	})
	return kvs, err
}

func readOnce(ctx context.Context, db *client.DB, key string) (string, bool, error) {
	var v []byte
	var ok bool
	_, err := db.View(ctx, client.Strong, func(ctx context.Context, s *client.Snapshot) error {
		var err error
		v, ok, err = s.Get(ctx, []byte(key))
		return err
	})
	return string(v), ok, err
}

// TestAutomaticExclusion: with auto_exclude_after set, the global epoch
// service excludes a cut-off region's publisher by itself and the others'
// global epoch advances again.
func TestAutomaticExclusion(t *testing.T) {
	r := startThreeRegions(t, func(top *topology.Topology) { top.AutoExcludeAfter = 2 * time.Second })
	c, top, pubEast := r.c, r.top, r.pubEast
	ctx := ctxT(t, 60*time.Second)
	if _, err := epochWaitAbove(ctx, pubEast, 3); err != nil {
		t.Fatal(err)
	}
	c.Dialer("us-west1").Network().CutRegion("us-west1")
	cut := time.Now()
	stalled, _ := pubEast.Read(ctx)
	if _, err := epochWaitAbove(ctx, pubEast, stalled+3); err != nil {
		t.Fatalf("the global epoch did not advance again without us-west1: %v", err)
	}
	t.Logf("global epoch advanced again %v after the cut (auto_exclude_after %v, lease %v)",
		time.Since(cut).Round(time.Millisecond), top.AutoExcludeAfter, top.PublisherLease)
	if d := time.Since(cut); d < top.AutoExcludeAfter {
		t.Fatalf("advanced %v after the cut, before auto_exclude_after", d)
	}
	regions, _, err := admin.Regions(ctx, c.Dialer("us-east1"), top)
	if err != nil || !regions[1].Excluded || regions[0].Excluded {
		t.Fatalf("regions: %+v, %v; want us-west1 excluded", regions, err)
	}
}

// TestPreparedLocksHoldWhileCoordinatorRegionExcluded: a transaction from
// us-east1 writes a key in each data region; right after its commit record
// its coordinator dies, the leader of its us-west1 range dies, and us-east1 is
// cut off and excluded, so the global epoch moves on without it. The new
// us-west1 leader cannot learn the outcome from us-east1's state store, yet
// must keep the prepared transaction's lock: until us-east1 returns, no
// transaction or snapshot in us-west1 may read the key without the committed
// write. Afterwards the write is there.
func TestPreparedLocksHoldWhileCoordinatorRegionExcluded(t *testing.T) {
	r := startThreeRegions(t, nil)
	ctx := ctxT(t, 120*time.Second)
	net := r.c.Dialer("us-central1").Network()
	ops := r.c.Dialer("us-central1")                   // the operator sits with the global epoch service
	a, x := []byte("a-excluded"), []byte("x-excluded") // us-east1, us-west1
	var killed uint64
	r.east.SetCrashHook(func(p client.CrashPoint, _ []byte, _ []uint64) bool {
		if p != client.CrashAfterCommitRecord {
			return false
		}
		if killed = r.c.Leader(201); killed != 0 {
			if err := r.c.KillNode(killed); err != nil {
				t.Error(err)
			}
		}
		net.CutRegion("us-east1")
		return true
	})
	err := r.east.Update(ctx, func(ctx context.Context, tx *client.Txn) error {
		if err := tx.Put(ctx, a, []byte("t1")); err != nil {
			return err
		}
		return tx.Put(ctx, x, []byte("t1"))
	})
	r.east.SetCrashHook(nil)
	if !errors.Is(err, client.ErrCommitUnknown) || killed == 0 {
		t.Fatalf("commit = %v, leader killed = %d; want ErrCommitUnknown and a kill", err, killed)
	}
	if err := admin.SetRegionExcluded(ctx, ops, r.top, "us-east1", true); err != nil {
		t.Fatal(err)
	}
	e, err := r.pubWest.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := epochWaitAbove(ctx, r.pubWest, e+3); err != nil {
		t.Fatalf("the global epoch did not move on without us-east1: %v", err)
	}
	// Neither a locking transaction nor a strong snapshot may read x without
	// t1's write; both have to wait (here: until they give up).
	tctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	var read []byte
	err = r.west.Update(tctx, func(ctx context.Context, tx *client.Txn) error {
		v, _, err := tx.Get(ctx, x)
		if read = v; err != nil {
			return err
		}
		return tx.Put(ctx, x, append(v, "+t2"...))
	})
	cancel()
	if err == nil && string(read) != "t1" {
		t.Fatalf("with the outcome unreachable, a us-west1 transaction read x = %q and committed; want it to wait for t1", read)
	}
	tctx, cancel = context.WithTimeout(ctx, 3*time.Second)
	v, ok, err := readOnce(tctx, r.west, string(x))
	cancel()
	if err == nil && v != "t1" && v != "t1+t2" {
		t.Fatalf("with the outcome unreachable, a strong snapshot read x = %q (present %v); want it to wait for t1", v, ok)
	}
	net.Heal()
	if err := admin.SetRegionExcluded(ctx, ops, r.top, "us-east1", false); err != nil {
		t.Fatal(err)
	}
	if err := r.c.RestartNode(killed); err != nil {
		t.Fatal(err)
	}
	for _, k := range [][]byte{a, x} {
		var got []byte
		if err := r.west.Update(ctx, func(ctx context.Context, tx *client.Txn) (err error) {
			got, _, err = tx.Get(ctx, k)
			return err
		}); err != nil || (string(got) != "t1" && string(got) != "t1+t2") {
			t.Fatalf("after healing, %s = %q (%v); want t1's write", k, got, err)
		}
	}
}
