package client_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/localcluster"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestSingleKeyTransactions: DB.Put, DB.Get and DB.Delete are transactions
// of one round trip each; what one writes the next reads, versions grow, and
// bad input is refused before anything is sent.
func TestSingleKeyTransactions(t *testing.T) {
	_, db := startCluster(t, localcluster.Options{})
	ctx := ctxT(t, 30*time.Second)
	if _, ok, err := db.Get(ctx, []byte("apple")); err != nil || ok {
		t.Fatalf("Get of a missing key: found %v, %v", ok, err)
	}
	v1, err := db.Put(ctx, []byte("apple"), []byte("red"))
	if err != nil || v1 == (client.Version{}) {
		t.Fatalf("Put: %v %v", v1, err)
	}
	if v, ok, err := db.Get(ctx, []byte("apple")); err != nil || !ok || string(v) != "red" {
		t.Fatalf("Get after Put: %q %v %v", v, ok, err)
	}
	v2, err := db.Put(ctx, []byte("apple"), []byte("green"))
	if err != nil || !v1.Less(v2) {
		t.Fatalf("second Put: version %v after %v, %v", v2, v1, err)
	}
	// An interactive transaction sees the single-key writes, and they see its.
	if err := db.Update(ctx, func(ctx context.Context, tx *client.Txn) error {
		v, _, err := tx.Get(ctx, []byte("apple"))
		if err == nil && string(v) != "green" {
			t.Errorf("Update read %q, want green", v)
		}
		if err == nil {
			err = tx.Put(ctx, []byte("yak"), []byte("hairy"))
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if v, ok, err := db.Get(ctx, []byte("yak")); err != nil || !ok || string(v) != "hairy" {
		t.Fatalf("Get of another range's key: %q %v %v", v, ok, err)
	}
	v3, err := db.Delete(ctx, []byte("apple"))
	if err != nil || !v2.Less(v3) {
		t.Fatalf("Delete: version %v after %v, %v", v3, v2, err)
	}
	if _, ok, err := db.Get(ctx, []byte("apple")); err != nil || ok {
		t.Fatalf("Get after Delete: found %v, %v", ok, err)
	}
	for name, err := range map[string]error{
		"empty key":       errOf(db.Put(ctx, nil, []byte("x"))),
		"long key":        errOf(db.Put(ctx, bytes.Repeat([]byte("k"), client.MaxKeySize+1), nil)),
		"long value":      errOf(db.Put(ctx, []byte("k"), make([]byte, client.MaxValueSize+1))),
		"empty key, read": errOf3(db.Get(ctx, nil)),
		"empty key, del":  errOf(db.Delete(ctx, nil)),
	} {
		want := map[string]error{"empty key": client.ErrEmptyKey, "long key": client.ErrKeyTooLarge,
			"long value": client.ErrValueTooLarge, "empty key, read": client.ErrEmptyKey, "empty key, del": client.ErrEmptyKey}[name]
		if !errors.Is(err, want) {
			t.Errorf("%s: %v, want %v", name, err, want)
		}
	}
	if _, ok, _ := db.Get(ctx, []byte("k")); ok {
		t.Fatal("a refused Put wrote")
	}
}

func errOf(_ client.Version, err error) error  { return err }
func errOf3(_ []byte, _ bool, err error) error { return err }

// TestSingleKeyTransactionsTakeLocks: a single-key read or write waits for
// (or, being younger, retries behind) an open transaction that holds the
// key's exclusive lock, so it never reads an uncommitted value nor
// overwrites under a writer; once the writer commits, the read sees its
// value and the later write wins.
func TestSingleKeyTransactionsTakeLocks(t *testing.T) {
	_, db := startCluster(t, localcluster.Options{})
	ctx := ctxT(t, 30*time.Second)
	k := []byte("acct")
	if _, err := db.Put(ctx, k, []byte("100")); err != nil {
		t.Fatal(err)
	}
	held := db.Begin()
	if err := held.Put(ctx, k, []byte("150")); err != nil {
		t.Fatal(err)
	}
	// While held is open, a read must not return: not the committed 100
	// (held could still commit before it in the serial order only if the
	// read waited), and never the uncommitted 150.
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	v, _, err := db.Get(short, k)
	cancel()
	if err == nil {
		t.Fatalf("Get returned %q while another transaction held the key's exclusive lock", v)
	}
	got := make(chan error, 2)
	var read []byte
	go func() {
		var err error
		read, _, err = db.Get(ctx, k)
		got <- err
	}()
	go func() {
		_, err := db.Put(ctx, k, []byte("200"))
		got <- err
	}()
	time.Sleep(100 * time.Millisecond)
	if _, err := held.Commit(ctx); err != nil {
		t.Fatalf("the lock holder could not commit: %v", err)
	}
	for range 2 {
		if err := <-got; err != nil {
			t.Fatal(err)
		}
	}
	if string(read) != "150" && string(read) != "200" {
		t.Fatalf("Get read %q, want the holder's 150 or the later Put's 200", read)
	}
	if v, _, err := db.Get(ctx, k); err != nil || string(v) != "200" {
		t.Fatalf("final value %q %v, want 200 (the Put ran after the holder)", v, err)
	}
}

// TestOnePhaseReadsNeedTakeLocks: a one-phase commit that names reads but
// took its locks earlier is refused as a bad request, writing nothing.
func TestOnePhaseReadsNeedTakeLocks(t *testing.T) {
	c, db := startCluster(t, localcluster.Options{})
	ctx := ctxT(t, 30*time.Second)
	if _, err := db.Put(ctx, []byte("b"), []byte("x")); err != nil { // range 10 serves
		t.Fatal(err)
	}
	rc, meta := rawTxn(t, c)
	_, err := rc.CommitOnePhase(ctx, &pb.OnePhaseRequest{RangeId: 10, Txn: meta, Reads: [][]byte{[]byte("a")},
		Writes: []*pb.Write{{Key: []byte("a"), Value: []byte("x")}}})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("reads without take_locks: %v, want InvalidArgument", err)
	}
	resp, err := rc.CommitOnePhase(ctx, &pb.OnePhaseRequest{RangeId: 10, Txn: meta, TakeLocks: true, Reads: [][]byte{[]byte("a")}})
	if err != nil || len(resp.GetReads()) != 1 || resp.GetReads()[0].GetFound() {
		t.Fatalf("then a read with take_locks: %v %v, want one read of nothing", resp, err)
	}
	if _, err := rc.CommitOnePhase(ctx, &pb.OnePhaseRequest{RangeId: 10, Txn: meta, TakeLocks: true}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("take_locks with no read and no write: %v, want InvalidArgument", err)
	}
}

// TestACopyOfATransactionSentWholeDoesNotRunTwice: a leader runs a
// transaction ID sent whole once; a copy (a retransmission) is refused with
// AlreadyExists and writes nothing, so a write cannot apply twice.
func TestACopyOfATransactionSentWholeDoesNotRunTwice(t *testing.T) {
	c, db := startCluster(t, localcluster.Options{})
	ctx := ctxT(t, 30*time.Second)
	if _, err := db.Put(ctx, []byte("b"), []byte("x")); err != nil { // range 10 serves
		t.Fatal(err)
	}
	rc, meta := rawTxn(t, c)
	req := &pb.OnePhaseRequest{RangeId: 10, Txn: meta, TakeLocks: true, Writes: []*pb.Write{{Key: []byte("dup"), Value: []byte("1")}}}
	first, err := rc.CommitOnePhase(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Put(ctx, []byte("dup"), []byte("2")); err != nil {
		t.Fatal(err)
	}
	if _, err := rc.CommitOnePhase(ctx, req); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("a copy of a transaction sent whole: %v, want AlreadyExists", err)
	}
	if v, _, err := db.Get(ctx, []byte("dup")); err != nil || string(v) != "2" {
		t.Fatalf("after the copy: %q %v, want the later write 2 (the copy of %v must not apply)", v, err, first.GetVersion())
	}
}

// TestAWaitingSingleKeyTransactionDiesBeforeItsDeadline: a transaction of
// one key sent whole may wait for any lock holder, but only for part of its
// request's time: it then fails as a conflict (Aborted: nothing written,
// retry), not at its deadline, which would leave a write's outcome unknown.
func TestAWaitingSingleKeyTransactionDiesBeforeItsDeadline(t *testing.T) {
	c, db := startCluster(t, localcluster.Options{})
	ctx := ctxT(t, 30*time.Second)
	k := []byte("held")
	held := db.Begin()
	if err := held.Put(ctx, k, []byte("holder")); err != nil {
		t.Fatal(err)
	}
	rc, meta := rawTxn(t, c) // younger than held: wait-die alone would kill it at once
	short, cancel := context.WithTimeout(ctx, 1200*time.Millisecond)
	defer cancel()
	began := time.Now()
	_, err := rc.CommitOnePhase(short, &pb.OnePhaseRequest{RangeId: 10, Txn: meta, TakeLocks: true,
		Writes: []*pb.Write{{Key: k, Value: []byte("waiter")}}})
	took := time.Since(began)
	if status.Code(err) != codes.Aborted {
		t.Fatalf("after %v: %v, want Aborted (a conflict) before the 1.2 s deadline", took, err)
	}
	if took < 300*time.Millisecond {
		t.Fatalf("died after %v: it should have waited for the holder, up to half its time", took)
	}
	if _, err := held.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if v, _, err := db.Get(ctx, k); err != nil || string(v) != "holder" {
		t.Fatalf("after the holder committed: %q %v, want holder (the waiter wrote nothing)", v, err)
	}
}
