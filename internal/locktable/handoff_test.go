package locktable

import (
	"errors"
	"testing"
)

// TestSplitOffHandsOverEveryLockAtOrAboveTheKey: a split at m hands the
// right-hand table every lock at or above m — points, whole range locks, and
// the upper part of one that straddles m — with their modes; the left keeps
// the rest, wakes the waiters above m, and forgets a transaction left with
// nothing. Installed in a new table, the locks conflict as before.
func TestSplitOffHandsOverEveryLockAtOrAboveTheKey(t *testing.T) {
	left := New()
	a, b, c := txn(1), txn(2), txn(0)
	mustAcquire(t, left, a, Point([]byte("b")), Exclusive)
	mustAcquire(t, left, a, Point([]byte("n")), Shared)
	mustAcquire(t, left, a, rng("c", "p"), Shared)
	mustAcquire(t, left, b, rng("q", "z"), Exclusive)
	waiting := acquireAsync(left, c, Point([]byte("r")), Exclusive) // c is older: it waits for b
	waitWaiters(t, left, 1)

	handed := left.SplitOff([]byte("m"))
	want := map[string]bool{"1 n shared": true, "1 [m, p) shared": true, "2 [q, z) exclusive": true}
	if len(handed) != len(want) {
		t.Fatalf("handed %d locks %v; want %v", len(handed), handed, want)
	}
	for _, g := range handed {
		name := string(g.Span.Key)
		if g.Span.EndKey != nil {
			name = "[" + string(g.Span.Key) + ", " + string(g.Span.EndKey) + ")"
		}
		if k := string(rune('0'+g.Txn.Priority)) + " " + name + " " + g.Mode.String(); !want[k] {
			t.Errorf("handed %q, not one of %v", k, want)
		}
	}
	if n := left.HeldBy(a.ID); n != 2 { // b, and [c, m)
		t.Errorf("a holds %d spans on the left; want 2", n)
	}
	if left.HeldBy(b.ID) != 0 || len(left.SpansOf(b.ID)) != 0 {
		t.Errorf("b still holds %v on the left", left.SpansOf(b.ID))
	}
	if !left.Holds(a.ID, rng("c", "m"), Shared) {
		t.Errorf("a lost the part [c, m) of its range lock")
	}
	if err := <-waiting; err != nil { // woken: nothing above m is held here now
		t.Fatalf("the waiter above m: %v", err)
	}

	right := New()
	right.Install(handed)
	if right.HeldBy(a.ID) != 2 || right.HeldBy(b.ID) != 1 {
		t.Fatalf("right holds a: %d, b: %d spans; want 2 and 1", right.HeldBy(a.ID), right.HeldBy(b.ID))
	}
	// The handed locks conflict as they did: a younger writer under a's
	// shared [m, p) or b's exclusive [q, z) dies (wait-die).
	if err := right.Acquire(ctxT(t), txn(4), Point([]byte("o")), Exclusive); !errors.Is(err, ErrWouldDie) {
		t.Fatalf("a younger writer under a handed shared lock = %v; want ErrWouldDie", err)
	}
	if err := right.Acquire(ctxT(t), txn(5), Point([]byte("s")), Exclusive); !errors.Is(err, ErrWouldDie) {
		t.Fatalf("a younger writer under b's handed exclusive lock = %v; want ErrWouldDie", err)
	}
}
