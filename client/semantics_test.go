package client_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/localcluster"
)

// TestLockWaitingOlderTransactionKeepsItsLocks: an older transaction holds a
// lock in one range and waits 10 s for a younger one's lock in another — 30
// times the leaders' orphan bound. Waiting is not silence, and heartbeats
// keep both alive (DESIGN.md §10): once the younger commits, the older gets
// its lock and commits with every lock it took.
//
// Locks live in the leaseholder's memory, so a range leader that loses
// its Raft leadership loses them and the transaction aborts, as it should.
// Under the suite's -race load on two cores, a leader once went 300 ms
// without hearing its followers and stepped down (CheckQuorum) mid-wait.
// Raft's timeouts are not what this test is about: its cluster runs them
// at twice the default (raft_tick 20ms: 600 ms to an election).
func TestLockWaitingOlderTransactionKeepsItsLocks(t *testing.T) {
	src, err := os.ReadFile("../examples/one-region.yaml")
	if err != nil {
		t.Fatal(err)
	}
	slow := bytes.Replace(src, []byte("raft_tick: 10ms"), []byte("raft_tick: 20ms"), 1)
	if bytes.Equal(slow, src) {
		t.Fatal("examples/one-region.yaml sets no raft_tick of 10ms to slow down")
	}
	path := filepath.Join(t.TempDir(), "one-region-slow-raft.yaml")
	if err := os.WriteFile(path, slow, 0o644); err != nil {
		t.Fatal(err)
	}
	c := localcluster.StartT(t, path, localcluster.Options{OrphanAfter: 300 * time.Millisecond})
	db, err := c.Client("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 60*time.Second)
	held, contended := []byte("a-held"), []byte("x-contended") // ranges 10 and 11
	older, younger := db.Begin(), db.Begin()
	if err := older.Put(ctx, held, []byte("older")); err != nil {
		t.Fatal(err)
	}
	if err := younger.Put(ctx, contended, []byte("younger")); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- older.Put(ctx, contended, []byte("older")) }()
	select {
	case err := <-waited:
		t.Fatalf("the older transaction did not wait for the younger's lock: %v", err)
	case <-time.After(10 * time.Second):
	}
	if _, err := younger.Commit(ctx); err != nil {
		t.Fatalf("the younger transaction, idle 10 s with heartbeats, failed to commit: %v", err)
	}
	if err := <-waited; err != nil {
		t.Fatalf("the older transaction's lock wait ended with %v", err)
	}
	if _, err := older.Commit(ctx); err != nil {
		t.Fatalf("the older transaction, after waiting 10 s, failed to commit: %v", err)
	}
	for _, k := range [][]byte{held, contended} {
		if v, _, err := readOnce(ctx, db, string(k)); err != nil || v != "older" {
			t.Errorf("%s = %q, %v; want older", k, v, err)
		}
	}
}

// TestFailedStepEndsTheTransaction: after a step fails (here wait-die kills
// the younger of two writers of one key), every later step and Commit return
// ErrAborted, and nothing the transaction wrote is committed. Bad input,
// refused before any request, ends nothing.
func TestFailedStepEndsTheTransaction(t *testing.T) {
	_, db := startCluster(t, localcluster.Options{})
	ctx := ctxT(t, 30*time.Second)
	older, younger := db.Begin(), db.Begin()
	if err := older.Put(ctx, []byte("k"), []byte("older")); err != nil {
		t.Fatal(err)
	}
	if err := younger.Put(ctx, nil, []byte("v")); !errors.Is(err, client.ErrEmptyKey) {
		t.Fatalf("Put of an empty key = %v; want ErrEmptyKey", err)
	}
	if err := younger.Put(ctx, []byte("j"), []byte("younger")); err != nil {
		t.Fatalf("a step after bad input failed: %v", err)
	}
	if err := younger.Put(ctx, []byte("k"), []byte("younger")); !errors.Is(err, client.ErrConflict) {
		t.Fatalf("the younger writer of k got %v; want ErrConflict (wait-die)", err)
	}
	if err := younger.Put(ctx, []byte("j2"), []byte("younger")); !errors.Is(err, client.ErrAborted) {
		t.Errorf("Put after the failed step = %v; want ErrAborted", err)
	}
	if _, _, err := younger.Get(ctx, []byte("j")); !errors.Is(err, client.ErrAborted) {
		t.Errorf("Get after the failed step = %v; want ErrAborted", err)
	}
	if _, err := younger.Scan(ctx, []byte("a"), nil, 0); !errors.Is(err, client.ErrAborted) {
		t.Errorf("Scan after the failed step = %v; want ErrAborted", err)
	}
	if _, err := younger.Commit(ctx); !errors.Is(err, client.ErrAborted) {
		t.Fatalf("Commit after the failed step = %v; want ErrAborted", err)
	}
	if _, err := younger.Commit(ctx); !errors.Is(err, client.ErrTxnFinished) {
		t.Errorf("a second Commit = %v; want ErrTxnFinished", err)
	}
	if _, err := older.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if v, ok, err := readOnce(ctx, db, "j"); err != nil || ok {
		t.Fatalf("j = %q (found %v, %v): the failed transaction's write was committed", v, ok, err)
	}
}

// TestVersionAndSnapshotAfterFinish: Commit returns the client's own Version
// type, ordered by commit; a finished snapshot refuses writes with
// ErrTxnFinished, an open one with ErrReadOnly.
func TestVersionAndSnapshotAfterFinish(t *testing.T) {
	_, db := startCluster(t, localcluster.Options{})
	ctx := ctxT(t, 30*time.Second)
	var vs []client.Version
	for i := 0; i < 2; i++ {
		tx := db.Begin()
		if err := tx.Put(ctx, []byte("v"), []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
		v, err := tx.Commit(ctx)
		if err != nil {
			t.Fatal(err)
		}
		vs = append(vs, v)
	}
	if !vs[0].Less(vs[1]) || vs[1].Less(vs[0]) || vs[0].Counter == 0 {
		t.Errorf("versions %v then %v: want increasing, counters from 1", vs[0], vs[1])
	}
	s, err := db.BeginSnapshot(ctx, client.Serializable)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, []byte("v"), nil); !errors.Is(err, client.ErrReadOnly) {
		t.Errorf("Put in an open snapshot = %v; want ErrReadOnly", err)
	}
	if _, err := s.Finish(); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, []byte("v"), nil); !errors.Is(err, client.ErrTxnFinished) {
		t.Errorf("Put in a finished snapshot = %v; want ErrTxnFinished", err)
	}
	if err := s.Delete(ctx, []byte("v")); !errors.Is(err, client.ErrTxnFinished) {
		t.Errorf("Delete in a finished snapshot = %v; want ErrTxnFinished", err)
	}
}
