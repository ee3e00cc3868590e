package storage

import (
	"fmt"
	"testing"
	"time"
)

// TestCrashLosesWhatWasNotSynced: across repeated crashes (with memtable
// flushes in between, so tables and the MANIFEST change too), everything
// committed with sync survives, as does everything committed before a synced
// commit; what was committed after the last synced commit is lost; and the
// store always reopens.
func TestCrashLosesWhatWasNotSynced(t *testing.T) {
	dir := t.TempDir()
	key := func(round, i int) []byte { return fmt.Appendf(nil, "r%02d-%05d", round, i) }
	for round := range 5 {
		e, err := OpenCrashable(dir, 1)
		if err != nil {
			t.Fatalf("round %d: reopening after a crash: %v", round, err)
		}
		for r := range round {
			// Earlier rounds: keys 0..99 were synced (by key 99's commit), 100..149 not.
			for _, c := range []struct {
				i    int
				want bool
			}{{0, true}, {50, true}, {99, true}, {100, false}, {149, false}, {1000, false}} {
				if v, err := e.Get(key(r, c.i)); err != nil || (v != nil) != c.want {
					t.Fatalf("round %d: key %s present = %v (err %v), want %v", round, key(r, c.i), v != nil, err, c.want)
				}
			}
		}
		for i := range 150 {
			b := e.NewBatch()
			_ = b.Set(key(round, i), make([]byte, 512), nil)
			if err := e.Commit(b, i == 99); err != nil {
				t.Fatal(err)
			}
			if i == 60 && round%2 == 1 {
				if err := e.db.Flush(); err != nil { // a table and a MANIFEST edit, synced
					t.Fatal(err)
				}
			}
		}
		e.Crash()
		// Work after the crash instant reaches nothing on disk.
		b := e.NewBatch()
		_ = b.Set(key(round, 1000), []byte("after"), nil)
		if err := e.Commit(b, true); err != nil {
			t.Fatal(err)
		}
		if err := e.db.Flush(); err != nil {
			t.Fatal(err)
		}
		if err := e.Close(); err != nil {
			t.Fatalf("round %d: closing after the crash: %v", round, err)
		}
	}
}

// TestCrashOfPlainEngineIsClose: an engine not opened crashable keeps what
// was committed without sync across Crash and Close.
func TestCrashOfPlainEngineIsClose(t *testing.T) {
	dir := t.TempDir()
	e, err := Open(dir, 1)
	if err != nil {
		t.Fatal(err)
	}
	b := e.NewBatch()
	_ = b.Set([]byte("k"), []byte("v"), nil)
	if err := e.Commit(b, false); err != nil {
		t.Fatal(err)
	}
	e.Crash()
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if e, err = Open(dir, 1); err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if v, err := e.Get([]byte("k")); err != nil || string(v) != "v" {
		t.Fatalf("Get = %q, %v", v, err)
	}
}

// A held store's synced commits wait for the hold; Release lets them
// through; a crash ends a hold, and what was held is lost, what was
// released is kept.
func TestHeldSyncsWaitAndACrashLosesThem(t *testing.T) {
	dir := t.TempDir()
	e, err := OpenCrashable(dir, 1)
	if err != nil {
		t.Fatal(err)
	}
	hold := e.HoldSyncs()
	if hold == nil {
		t.Fatal("HoldSyncs on a crashable engine returned nil")
	}
	commit := func(key string) chan error {
		synced := make(chan error, 1)
		go func() {
			b := e.NewBatch()
			_ = b.Set([]byte(key), []byte("v"), nil)
			synced <- e.Commit(b, true)
		}()
		return synced
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("after 5 s: %s", what)
			}
		}
	}
	syncedA := commit("a")
	waitFor("no fsync came to the hold", func() bool { return hold.Waiting() > 0 })
	select {
	case err := <-syncedA:
		t.Fatalf("a's synced commit returned while the store's fsyncs were held (err %v)", err)
	case <-time.After(50 * time.Millisecond):
	}
	hold.Release()
	if err := <-syncedA; err != nil {
		t.Fatal(err)
	}
	hold = e.HoldSyncs()
	syncedB := commit("b")
	waitFor("b's fsync was not held", func() bool { return hold.Waiting() > 0 })
	e.Crash()
	if err := <-syncedB; err != nil {
		t.Fatal(err)
	}
	hold.Release() // after the crash: nothing to release
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if e, err = Open(dir, 1); err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for key, want := range map[string]bool{"a": true, "b": false} {
		if v, err := e.Get([]byte(key)); err != nil || (v != nil) != want {
			t.Errorf("after the crash: %s present = %v (err %v), want %v", key, v != nil, err, want)
		}
	}
}
