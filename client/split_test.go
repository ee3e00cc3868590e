package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/localcluster"
	"github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/storage"
	"github.com/terroir-db/terroir/internal/topology"
)

// snapshotTotal reads every account in one strong snapshot (lock-free).
func snapshotTotal(ctx context.Context, db *client.DB) (int64, error) {
	var sum int64
	_, err := db.View(ctx, client.Strong, func(ctx context.Context, s *client.Snapshot) error {
		sum = 0
		for i := 0; i < accounts; i++ {
			v, ok, err := s.Get(ctx, account(i))
			if err != nil {
				return err
			}
			if !ok {
				return errors.New("account missing")
			}
			sum += dec(v)
		}
		return nil
	})
	return sum, err
}

// TestSplitsUnderLoad splits both ranges of examples/one-region.yaml into
// seven while clients transfer money between accounts on every range
// (DESIGN.md §11): transactions in flight across a split commit or abort
// cleanly, every locking and every snapshot read of all accounts sees the
// initial total, no transfer fails for good, and a node killed and restarted
// afterwards hosts every range again with all the data.
func TestSplitsUnderLoad(t *testing.T) {
	c, db := startCluster(t, localcluster.Options{Crashable: true})
	ctx := ctxT(t, 120*time.Second)
	fund(t, ctx, db)
	load := startBankLoad(t, ctx, c)
	splits := []string{"acct-04", "x-acct-05", "acct-10", "x-acct-13", "acct-16"}
	for _, k := range splits {
		time.Sleep(700 * time.Millisecond)
		began := time.Now()
		if err := db.AdminSplit(ctx, []byte(k)); err != nil {
			t.Fatalf("split at %s: %v", k, err)
		}
		t.Logf("split at %s in %v (%d transfers so far)", k, time.Since(began).Round(time.Millisecond), load.transfers.Load())
	}
	time.Sleep(time.Second)
	load.stop()
	t.Logf("%d transfers, %d total checks across %d splits", load.transfers.Load(), load.checks.Load(), len(splits))
	if sum, err := total(ctx, db); err != nil || sum != accounts*initialBalance {
		t.Fatalf("final total %d, %v", sum, err)
	}

	// Bad input: nothing changes.
	for _, bad := range []string{"", "acct-10", "m"} { // empty, made a boundary above, a bootstrap boundary
		if err := db.AdminSplit(ctx, []byte(bad)); !errors.Is(err, client.ErrSplitKey) {
			t.Errorf("split at %q = %v; want ErrSplitKey", bad, err)
		}
	}
	if err := db.AdminSplit(ctx, make([]byte, 5000)); !errors.Is(err, client.ErrSplitKey) {
		t.Errorf("split at a 5000-byte key = %v; want ErrSplitKey", err)
	}
	restartHostsEveryRange(t, ctx, c, db, 2+len(splits))
}

// restartHostsEveryRange kills and restarts a node, which must come back
// hosting want ranges, and checks the accounts' total after.
func restartHostsEveryRange(t *testing.T, ctx context.Context, c *localcluster.Cluster, db *client.DB, want int) {
	t.Helper()
	victim := c.NodeIDs()[0]
	if err := c.KillNode(victim); err != nil {
		t.Fatal(err)
	}
	if err := c.RestartNode(victim); err != nil {
		t.Fatal(err)
	}
	if hosted := len(c.Node(victim).RangeIDs()); hosted != want {
		t.Fatalf("node %d hosts %d ranges after a restart; want %d", victim, hosted, want)
	}
	if sum, err := total(ctx, db); err != nil || sum != accounts*initialBalance {
		t.Fatalf("total after the restart %d, %v", sum, err)
	}
}

// bankLoad is a bank workload running on a cluster: see startBankLoad.
type bankLoad struct {
	transfers, checks atomic.Int64
	stop              func() // ends the load, waits, and fails the test if it made no progress
}

// startBankLoad starts six clients on c: four transfer money between random
// accounts, and two check the total, one by a locking read of every account
// and one by a strong snapshot. A wrong total, or a transfer that fails
// other than ErrCommitUnknown, fails the test.
func startBankLoad(t *testing.T, ctx context.Context, c *localcluster.Cluster) *bankLoad {
	t.Helper()
	work, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	load := &bankLoad{}
	transfers, checks := &load.transfers, &load.checks
	load.stop = func() {
		cancel()
		wg.Wait()
		if transfers.Load() == 0 || checks.Load() == 0 {
			t.Fatalf("no progress: %d transfers, %d checks", transfers.Load(), checks.Load())
		}
	}
	for w := 0; w < 6; w++ {
		cdb, err := c.Client("us-east1")
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 7))
			for work.Err() == nil {
				if w < 2 { // two clients check the total: locking, then lock-free
					read := total
					if w == 1 {
						read = snapshotTotal
					}
					if sum, err := read(work, cdb); err == nil {
						checks.Add(1)
						if sum != accounts*initialBalance {
							t.Errorf("client %d read a total of %d, want %d", w, sum, accounts*initialBalance)
						}
					}
					continue
				}
				from, to := r.IntN(accounts), r.IntN(accounts)
				if from == to {
					continue
				}
				amount := int64(r.IntN(50))
				err := cdb.Update(work, func(ctx context.Context, tx *client.Txn) error {
					return transfer(ctx, tx, from, to, amount)
				})
				switch {
				case err == nil:
					transfers.Add(1)
				case work.Err() == nil && !errors.Is(err, client.ErrCommitUnknown):
					t.Errorf("transfer failed for good: %v", err)
				}
			}
		}(w)
	}
	return load
}

// startTuned starts examples/one-region.yaml with tune applied to its
// topology, closed when t ends, and returns it with a us-east1 client.
func startTuned(t *testing.T, tune func(*topology.Topology), opts localcluster.Options) (*localcluster.Cluster, *client.DB) {
	t.Helper()
	top, err := topology.Load("../examples/one-region.yaml")
	if err != nil {
		t.Fatal(err)
	}
	tune(top)
	c, err := localcluster.Start(top, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	db, err := c.Client("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	return c, db
}

// TestAutomaticSplitByLoadAndMergeBack: with split_qps lowered to 40, reads
// spread over range 10's keys make it split by itself at keys that divide
// the load; once the load stops, the ranges merge back by themselves (under
// merge_qps for merge_delay), and every key still reads back.
func TestAutomaticSplitByLoadAndMergeBack(t *testing.T) {
	c, db := startTuned(t, func(top *topology.Topology) { top.SplitQPS, top.MergeQPS, top.MergeDelay = 40, 10, 2*time.Second }, localcluster.Options{})
	ctx := ctxT(t, 60*time.Second)
	keys := make([][]byte, 26)
	for i := range keys {
		keys[i] = []byte{byte('a' + i%12), byte('a' + i)} // all in range 10: [, m)
	}
	if err := db.Update(ctx, func(ctx context.Context, tx *client.Txn) error {
		for _, k := range keys {
			if err := tx.Put(ctx, k, k); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Four readers, so the rate passes split_qps even on a loaded machine
	// (a race-enabled CI run of every package at once).
	deadline := time.Now().Add(30 * time.Second)
	lctx, stopLoad := context.WithDeadline(ctx, deadline)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := w; lctx.Err() == nil; r += 4 {
				k := keys[r%len(keys)]
				var v []byte
				err := db.Update(lctx, func(ctx context.Context, tx *client.Txn) (err error) {
					v, _, err = tx.Get(ctx, k)
					return err
				})
				if lctx.Err() == nil && (err != nil || string(v) != string(k)) {
					t.Errorf("read %s = %q, %v", k, v, err)
					return
				}
			}
		}()
	}
	ranges := 0
	for time.Now().Before(deadline) {
		if ranges = len(c.Node(c.NodeIDs()[0]).RangeIDs()); ranges >= 4 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	stopLoad()
	wg.Wait()
	if ranges < 4 {
		t.Fatalf("%d ranges after 30 s at over 40 requests/s: no automatic split by load", ranges)
	}
	t.Logf("%d ranges under load", ranges)

	// Once cold for merge_delay, the ranges the load made merge back; the
	// boundary of the topology file stays.
	began := time.Now()
	if n := rangeCountWithin(c, 2, 30*time.Second); n != 2 {
		t.Fatalf("%d ranges 30 s after the load stopped; want them merged back into 2", n)
	}
	t.Logf("merged back into 2 ranges %v after the load stopped", time.Since(began).Round(100*time.Millisecond))
	for _, k := range keys {
		var v []byte
		if err := db.Update(ctx, func(ctx context.Context, tx *client.Txn) (err error) {
			v, _, err = tx.Get(ctx, k)
			return err
		}); err != nil || string(v) != string(k) {
			t.Fatalf("after the merges, read %s = %q, %v", k, v, err)
		}
	}
}

// TestAutomaticSplitBySize: with split_size lowered to 1 MiB (and small
// memtables, so the data reaches files, which the size estimate counts),
// range 10 splits by itself once its data passes it, at a key of its data,
// and every key reads back.
func TestAutomaticSplitBySize(t *testing.T) {
	c, db := startTuned(t, func(top *topology.Topology) {
		top.SplitSize, top.SplitQPS, top.MergeSize, top.MergeQPS = 1<<20, 0, 0, 0
	},
		localcluster.Options{CacheSize: storage.MinCacheSize})
	ctx := ctxT(t, 60*time.Second)
	var keys []string
	values := map[string][]byte{} // 10 KiB each, random: compression leaves their size on disk
	rnd := rand.NewChaCha8([32]byte{1})
	for i := range 320 { // 3.2 MiB, all in range 10: [, m)
		k := fmt.Sprintf("%c-%04d", 'a'+i%12, i)
		keys, values[k] = append(keys, k), make([]byte, 10<<10)
		_, _ = rnd.Read(values[k])
	}
	for batch := range slices.Chunk(keys, 8) {
		if err := db.Update(ctx, func(ctx context.Context, tx *client.Txn) error {
			for _, k := range batch {
				if err := tx.Put(ctx, []byte(k), values[k]); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	var left *rangepb.RangeDescriptor
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if d := newestDesc(c, 10); d != nil && string(d.GetEndKey()) != "m" {
			left = d
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("range 10 holds 3.2 MiB 30 s after the writes and never split by size (split_size 1 MiB)")
		}
	}
	// The split key is a key of the data (TestMidKeySplitsTheDataInHalf
	// checks it is the middle one); range 10 may have split again since.
	t.Logf("range 10 split at %q", left.GetEndKey())
	if _, ok := values[string(left.GetEndKey())]; !ok || string(left.GetEndKey()) == keys[0] {
		t.Errorf("range 10 split at %q: not a key written after the first", left.GetEndKey())
	}
	for _, k := range keys {
		var v []byte
		if err := db.Update(ctx, func(ctx context.Context, tx *client.Txn) (err error) {
			v, _, err = tx.Get(ctx, []byte(k))
			return err
		}); err != nil || !bytes.Equal(v, values[k]) {
			t.Fatalf("after the split, read %s: %d bytes, %v", k, len(v), err)
		}
	}
}

// TestTransactionsKeepTheirLocksAcrossASplit: t1 reads x and writes z; the
// range splits below both, so their locks go to the right-hand range, with
// t1's record and incarnation (DESIGN.md §11); t2, which writes x, must wait
// for t1 there. t1 then writes y on the left and commits across both
// halves, and t2 commits after it: x is t2's, y is x as t1 read it. t3,
// which locked only w below the split key, outlives several heartbeats after
// the split (which tell its coordinator the range changed) and commits too.
func TestTransactionsKeepTheirLocksAcrossASplit(t *testing.T) {
	_, db := startCluster(t, localcluster.Options{})
	ctx := ctxT(t, 30*time.Second)
	x, y, z := []byte("g-x"), []byte("b-y"), []byte("h-z") // all in range 10 [, m)
	if err := db.Update(ctx, func(ctx context.Context, tx *client.Txn) error {
		return errors.Join(tx.Put(ctx, x, []byte("100")), tx.Put(ctx, y, []byte("0")))
	}); err != nil {
		t.Fatal(err)
	}
	t1 := db.Begin()
	if v, _, err := t1.Get(ctx, x); err != nil || string(v) != "100" {
		t.Fatalf("t1 read x = %q, %v", v, err)
	}
	if err := t1.Put(ctx, z, []byte("t1")); err != nil {
		t.Fatal(err)
	}
	t3 := db.Begin()
	if _, _, err := t3.Get(ctx, []byte("a-w")); err != nil {
		t.Fatal(err)
	}
	if err := db.AdminSplit(ctx, []byte("f")); err != nil {
		t.Fatal(err)
	}
	t2 := make(chan error, 1)
	go func() {
		t2 <- db.Update(ctx, func(ctx context.Context, tx *client.Txn) error {
			return tx.Put(ctx, x, []byte("150"))
		})
	}()
	time.Sleep(200 * time.Millisecond)                    // t2 meets t1's lock on x at the right-hand range
	if err := t1.Put(ctx, y, []byte("100")); err != nil { // y = x as t1 read it
		t.Fatalf("t1's write on the left after the split: %v", err)
	}
	if _, err := t1.Commit(ctx); err != nil {
		t.Fatalf("t1, whose locks went to the right-hand range with it, could not commit: %v", err)
	}
	if err := <-t2; err != nil {
		t.Fatalf("t2: %v", err)
	}
	time.Sleep(1500 * time.Millisecond) // three heartbeats of t3 (orphan_after 2 s / 4)
	if err := t3.Put(ctx, []byte("a-w"), []byte("t3")); err != nil {
		t.Fatalf("t3, locked only below the split key: %v", err)
	}
	if _, err := t3.Commit(ctx); err != nil {
		t.Fatalf("t3, locked only below the split key, could not commit after the split: %v", err)
	}
	expectValues(t, ctx, db, map[string]string{"g-x": "150", "b-y": "100", "h-z": "t1"})
}

// TestNodeDownDuringASplit: a node is down while its ranges split; restarted,
// it applies the splits from its log, hosts every new range and serves their
// data (it leads them after the others stop).
func TestNodeDownDuringASplit(t *testing.T) {
	c, db := startCluster(t, localcluster.Options{Crashable: true})
	ctx := ctxT(t, 60*time.Second)
	if err := db.Update(ctx, func(ctx context.Context, tx *client.Txn) error {
		return errors.Join(tx.Put(ctx, []byte("b"), []byte("1")), tx.Put(ctx, []byte("d"), []byte("2")), tx.Put(ctx, []byte("x"), []byte("3")))
	}); err != nil {
		t.Fatal(err)
	}
	down := c.NodeIDs()[2]
	if err := c.KillNode(down); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"c", "w"} {
		if err := db.AdminSplit(ctx, []byte(k)); err != nil {
			t.Fatalf("split at %s with node %d down: %v", k, down, err)
		}
	}
	if err := c.RestartNode(down); err != nil {
		t.Fatal(err)
	}
	n, deadline := 0, time.Now().Add(15*time.Second)
	for ; n < 4 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		n = len(c.Node(down).RangeIDs())
	}
	if n != 4 {
		t.Fatalf("node %d hosts %d ranges after catching up; want 4", down, n)
	}
	// Leave only the restarted node and one other: every range needs its
	// replica on the restarted node to serve.
	for _, id := range c.NodeIDs() {
		if id != down && id != c.NodeIDs()[0] {
			if err := c.StopNode(id); err != nil {
				t.Fatal(err)
			}
		}
	}
	expectValues(t, ctx, db, map[string]string{"b": "1", "d": "2", "x": "3"})
}

// expectValues reads each key in a locking transaction and reports any whose
// value is not the one wanted.
func expectValues(t *testing.T, ctx context.Context, db *client.DB, want map[string]string) {
	t.Helper()
	for k, w := range want {
		var v []byte
		if err := db.Update(ctx, func(ctx context.Context, tx *client.Txn) (err error) {
			v, _, err = tx.Get(ctx, []byte(k))
			return err
		}); err != nil || string(v) != w {
			t.Errorf("%s = %q, %v; want %s", k, v, err, w)
		}
	}
}
