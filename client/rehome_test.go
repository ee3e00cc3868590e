package client_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/localcluster"
)

// rehomeAccount is one of the accounts of range 101 ([g, m), us-east1).
func rehomeAccount(i int) []byte { return []byte(fmt.Sprintf("h-acct-%02d", i)) }

const rehomeAccounts = 8

// sumRehomed reads every account of range 101 in one snapshot of mode.
func sumRehomed(ctx context.Context, db *client.DB, mode client.SnapshotMode) (int64, error) {
	var sum int64
	_, err := db.View(ctx, mode, func(ctx context.Context, s *client.Snapshot) error {
		sum = 0
		for i := range rehomeAccounts {
			v, ok, err := s.Get(ctx, rehomeAccount(i))
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("account %d missing", i)
			}
			sum += dec(v)
		}
		return nil
	})
	return sum, err
}

// TestRehomeUnderLoad moves range 101 from us-east1 to us-west1 and back
// (DESIGN.md §13) while clients of both regions transfer money between its
// accounts and check the total with strong and regional snapshots: no
// transfer is lost or doubled, every snapshot sees the initial total, a
// regional snapshot in the new home reads the state at the rehome barrier
// for keys written only before it (a deleted key stays deleted), and a
// regional snapshot there sees a commit made there just before it. Bad
// rehomes are refused with ErrRehomeTarget and change nothing.
func TestRehomeUnderLoad(t *testing.T) {
	c := localcluster.StartT(t, "../examples/three-regions.yaml", localcluster.Options{})
	ctx := ctxT(t, 240*time.Second)
	east, west := eastWest(t, c)
	const total = rehomeAccounts * initialBalance
	if err := east.Update(ctx, func(ctx context.Context, tx *client.Txn) error {
		for i := range rehomeAccounts {
			if err := tx.Put(ctx, rehomeAccount(i), enc(initialBalance)); err != nil {
				return err
			}
		}
		if err := tx.Put(ctx, []byte("h-static"), []byte("before")); err != nil {
			return err
		}
		return tx.Put(ctx, []byte("h-deleted"), []byte("x"))
	}); err != nil {
		t.Fatal(err)
	}
	if err := east.Update(ctx, func(ctx context.Context, tx *client.Txn) error { return tx.Delete(ctx, []byte("h-deleted")) }); err != nil {
		t.Fatal(err)
	}
	before, err := rangeOf(ctx, east, "h")
	if err != nil {
		t.Fatal(err)
	}

	for _, bad := range []string{"us-east1", "mars", "us-central1", ""} {
		if _, _, err := east.AdminRehome(ctx, []byte("h"), bad); !errors.Is(err, client.ErrRehomeTarget) {
			t.Errorf("rehome to %q: %v, want ErrRehomeTarget", bad, err)
		}
	}
	if after, err := rangeOf(ctx, east, "h"); err != nil || after.Generation != before.Generation || after.Region != "us-east1" {
		t.Fatalf("after refused rehomes: %+v, %v; want generation %d in us-east1", after, err, before.Generation)
	}

	var transfers, snapshots atomic.Int64
	work, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for w, db := range []*client.DB{east, west, east, west} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 7))
			for work.Err() == nil {
				if w >= 2 { // checkers
					mode := client.Strong
					if w == 3 {
						mode = client.Regional
					}
					sum, err := sumRehomed(work, db, mode)
					switch {
					case err == nil && sum != total:
						t.Errorf("a %v snapshot saw a total of %d, want %d", mode, sum, total)
					case err == nil:
						snapshots.Add(1)
					case work.Err() == nil && !client.IsRetryable(err):
						t.Errorf("%v snapshot: %v", mode, err)
					}
					continue
				}
				from, to := r.IntN(rehomeAccounts), r.IntN(rehomeAccounts)
				if from == to {
					continue
				}
				err := db.Update(work, func(ctx context.Context, tx *client.Txn) error {
					a, _, err := tx.Get(ctx, rehomeAccount(from))
					if err != nil {
						return err
					}
					b, _, err := tx.Get(ctx, rehomeAccount(to))
					if err != nil {
						return err
					}
					if err := tx.Put(ctx, rehomeAccount(from), enc(dec(a)-1)); err != nil {
						return err
					}
					return tx.Put(ctx, rehomeAccount(to), enc(dec(b)+1))
				})
				switch {
				case err == nil:
					transfers.Add(1)
				case errors.Is(err, client.ErrCommitUnknown): // committed or not, the total stands
				case work.Err() == nil && !client.IsRetryable(err):
					t.Errorf("transfer: %v", err)
				}
			}
		}()
	}

	time.Sleep(time.Second)
	moved, barrier, err := east.AdminRehome(ctx, []byte("h"), "us-west1")
	if err != nil {
		t.Fatal(err)
	}
	if moved.Region != "us-west1" || len(moved.Replicas) != 3 || slices.ContainsFunc(moved.Replicas, func(n uint64) bool { return n < 4 || n > 6 }) || barrier == 0 {
		t.Fatalf("rehomed to us-west1: %+v, barrier %d; want voters 4-6", moved, barrier)
	}
	t.Logf("rehomed to us-west1 at barrier %d: %+v", barrier, moved)
	for _, n := range []uint64{1, 2, 3} {
		waitHosted(t, c, n, moved.ID, true)
	}

	// The state at the barrier, for keys not written since, in the new
	// home's regional snapshots.
	st, err := west.View(ctx, client.Regional, func(ctx context.Context, s *client.Snapshot) error {
		if v, ok, err := s.Get(ctx, []byte("h-static")); err != nil || !ok || string(v) != "before" {
			return errors.Join(err, fmt.Errorf("h-static: %q, %v; want \"before\"", v, ok))
		}
		if v, ok, err := s.Get(ctx, []byte("h-deleted")); err != nil || ok {
			return errors.Join(err, fmt.Errorf("h-deleted: %q, %v; want deleted", v, ok))
		}
		return nil
	})
	if err != nil || st.Mode != client.Regional {
		t.Fatalf("a regional snapshot in the new home: %v, stats %+v; want one served as Regional", err, st)
	}
	// A commit in the new home, then a regional snapshot there, sees it.
	for i := range 3 {
		want := fmt.Sprintf("after-%d", i)
		putKey(ctx, t, west, "h-static", want)
		st, err := west.View(ctx, client.Regional, func(ctx context.Context, s *client.Snapshot) error {
			if v, ok, err := s.Get(ctx, []byte("h-static")); err != nil || !ok || string(v) != want {
				return errors.Join(err, fmt.Errorf("h-static after a us-west1 commit: %q, %v; want %q", v, ok, want))
			}
			return nil
		})
		if err != nil || st.Mode != client.Regional {
			t.Fatalf("a regional snapshot after a commit in the new home: %v, stats %+v", err, st)
		}
	}

	time.Sleep(time.Second)
	back, _, err := west.AdminRehome(ctx, []byte("h"), "us-east1")
	if err != nil {
		t.Fatal(err)
	}
	if back.Region != "us-east1" || slices.ContainsFunc(back.Replicas, func(n uint64) bool { return n > 3 }) {
		t.Fatalf("rehomed back to us-east1: %+v", back)
	}
	time.Sleep(time.Second)
	stop()
	wg.Wait()
	for _, db := range []*client.DB{east, west} {
		for _, mode := range []client.SnapshotMode{client.Strong, client.Regional} {
			if sum, err := sumRehomed(ctx, db, mode); err != nil || sum != total {
				t.Errorf("after the rehomes, a %v snapshot: total %d, %v; want %d", mode, sum, err, total)
			}
		}
	}
	if transfers.Load() == 0 || snapshots.Load() == 0 {
		t.Fatalf("%d transfers and %d snapshots completed under the rehomes", transfers.Load(), snapshots.Load())
	}
	t.Logf("%d transfers, %d snapshots checked", transfers.Load(), snapshots.Load())
}

// rangeOf returns the range holding key, as the cluster lists it.
func rangeOf(ctx context.Context, db *client.DB, key string) (client.RangeInfo, error) {
	ranges, err := db.Ranges(ctx)
	if err != nil {
		return client.RangeInfo{}, err
	}
	for _, r := range ranges {
		if string(r.Start) <= key && (r.End == nil || key < string(r.End)) {
			return r, nil
		}
	}
	return client.RangeInfo{}, fmt.Errorf("no range holds %q", key)
}

// TestAutoRehomeFollowsTheWriters: with auto_rehome_after set, a us-east1
// range written only from us-west1 moves there by itself (DESIGN.md §13),
// and a range written from its own home stays.
func TestAutoRehomeFollowsTheWriters(t *testing.T) {
	src, err := os.ReadFile("../examples/three-regions.yaml")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "auto.yaml")
	if err := os.WriteFile(path, append(src, []byte("\nauto_rehome_after: 2s\n")...), 0o600); err != nil {
		t.Fatal(err)
	}
	c := localcluster.StartT(t, path, localcluster.Options{RebalanceInterval: 500 * time.Millisecond})
	ctx := ctxT(t, 120*time.Second)
	east, west := eastWest(t, c)
	deadline := time.Now().Add(60 * time.Second)
	for i := 0; ; i++ {
		putKey(ctx, t, west, fmt.Sprintf("h-auto-%d", i%10), "w") // range 101, [g, m)
		putKey(ctx, t, east, fmt.Sprintf("b-auto-%d", i%10), "e") // range 100, [, g)
		if r, err := rangeOf(ctx, east, "h"); err == nil && r.Region == "us-west1" {
			t.Logf("range %d rehomed to us-west1 by its writers after %d writes: %+v", r.ID, i, r)
			break
		}
		if time.Now().After(deadline) {
			r, err := rangeOf(ctx, east, "h")
			t.Fatalf("range 101 still %+v (%v) after 60 s of writes from us-west1 alone", r, err)
		}
	}
	if r, err := rangeOf(ctx, east, "b"); err != nil || r.Region != "us-east1" {
		t.Fatalf("range 100, written from its own home: %+v, %v; want it in us-east1", r, err)
	}
	if err := west.Update(ctx, func(ctx context.Context, tx *client.Txn) error {
		v, ok, err := tx.Get(ctx, []byte("h-auto-3"))
		if err == nil && (!ok || string(v) != "w") {
			err = fmt.Errorf("h-auto-3 after the rehome: %q, %v", v, ok)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

// eastWest returns clients of c in us-east1 and us-west1.
func eastWest(t *testing.T, c *localcluster.Cluster) (east, west *client.DB) {
	t.Helper()
	east, err := c.Client("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	west, err = c.Client("us-west1")
	if err != nil {
		t.Fatal(err)
	}
	return east, west
}
