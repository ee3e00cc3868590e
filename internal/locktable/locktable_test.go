package locktable

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

func txn(n uint64) Txn {
	var id TxnID
	id[0], id[15] = byte(n>>8), byte(n)
	return Txn{ID: id, Priority: n}
}

func rng(lo, hi string) Span { return Span{Key: []byte(lo), EndKey: []byte(hi)} }

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func mustAcquire(t *testing.T, tb *Table, x Txn, s Span, m Mode) {
	t.Helper()
	if err := tb.Acquire(ctxT(t), x, s, m); err != nil {
		t.Fatalf("txn %d %v %q: %v", x.Priority, m, s.Key, err)
	}
}

// acquireAsync starts an acquisition and returns its result channel.
func acquireAsync(tb *Table, x Txn, s Span, m Mode) chan error {
	ch := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ch <- tb.Acquire(ctx, x, s, m)
	}()
	return ch
}

func waitWaiters(t *testing.T, tb *Table, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for tb.Waiters() != n {
		if time.Now().After(deadline) {
			t.Fatalf("waiters = %d, want %d", tb.Waiters(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestSharedLocksAreCompatible(t *testing.T) {
	tb := New()
	mustAcquire(t, tb, txn(1), Point([]byte("a")), Shared)
	mustAcquire(t, tb, txn(2), Point([]byte("a")), Shared)
	mustAcquire(t, tb, txn(3), rng("a", "z"), Shared)
	if tb.Len() != 3 {
		t.Fatalf("Len = %d, want 3", tb.Len())
	}
}

func TestYoungerDiesOlderWaits(t *testing.T) {
	tb := New()
	mustAcquire(t, tb, txn(5), Point([]byte("k")), Exclusive)
	// Younger than the holder: dies at once.
	if err := tb.Acquire(ctxT(t), txn(9), Point([]byte("k")), Shared); !errors.Is(err, ErrWouldDie) {
		t.Fatalf("younger request = %v, want ErrWouldDie", err)
	}
	// Older than the holder: waits until the holder releases.
	ch := acquireAsync(tb, txn(2), Point([]byte("k")), Exclusive)
	waitWaiters(t, tb, 1)
	select {
	case err := <-ch:
		t.Fatalf("older request returned %v while the lock was held", err)
	default:
	}
	tb.ReleaseAll(txn(5).ID)
	if err := <-ch; err != nil {
		t.Fatalf("older request after release: %v", err)
	}
	if !tb.Holds(txn(2).ID, Point([]byte("k")), Exclusive) {
		t.Fatal("older transaction does not hold the lock it waited for")
	}
}

// TestTryAcquireNeverWaits: TryAcquire grants what Acquire would grant at
// once, dies where it would die, and where Acquire would wait returns
// ErrWouldWait with nothing taken or queued.
func TestTryAcquireNeverWaits(t *testing.T) {
	tb := New()
	k := Point([]byte("k"))
	if err := tb.TryAcquire(txn(5), k, Exclusive); err != nil {
		t.Fatalf("free key: TryAcquire = %v, want it granted", err)
	}
	if !tb.Holds(txn(5).ID, k, Exclusive) {
		t.Fatal("TryAcquire returned nil and holds nothing")
	}
	if err := tb.TryAcquire(txn(9), k, Shared); !errors.Is(err, ErrWouldDie) {
		t.Fatalf("younger than the holder: TryAcquire = %v, want ErrWouldDie", err)
	}
	if err := tb.TryAcquire(txn(2), k, Exclusive); !errors.Is(err, ErrWouldWait) {
		t.Fatalf("older than the holder: TryAcquire = %v, want ErrWouldWait", err)
	}
	if tb.Waiters() != 0 || tb.Holds(txn(2).ID, k, Shared) {
		t.Fatalf("after ErrWouldWait: %d waiters, txn 2 holds %v; want none queued, nothing held", tb.Waiters(), tb.Holds(txn(2).ID, k, Shared))
	}
	if err := tb.TryAcquire(txn(2), rng("z", "a"), Shared); !errors.Is(err, ErrInvalidSpan) {
		t.Fatalf("inverted span: TryAcquire = %v, want ErrInvalidSpan", err)
	}
	tb.ReleaseAll(txn(5).ID)
	if err := tb.TryAcquire(txn(2), k, Exclusive); err != nil {
		t.Fatalf("after the holder released: TryAcquire = %v, want it granted", err)
	}
}

func TestYoungerWaitsForPreparedHolder(t *testing.T) {
	tb := New()
	mustAcquire(t, tb, txn(5), Point([]byte("k")), Exclusive)
	tb.MarkPrepared(txn(5).ID)
	ch := acquireAsync(tb, txn(9), Point([]byte("k")), Shared)
	waitWaiters(t, tb, 1)
	tb.ReleaseAll(txn(5).ID)
	if err := <-ch; err != nil {
		t.Fatalf("younger request behind a prepared holder = %v, want it to wait and succeed", err)
	}
	// The mark ends with the transaction: a new txn 5 lock makes younger requests die again.
	tb.ReleaseAll(txn(9).ID)
	mustAcquire(t, tb, txn(5), Point([]byte("k")), Exclusive)
	if err := tb.Acquire(ctxT(t), txn(9), Point([]byte("k")), Shared); !errors.Is(err, ErrWouldDie) {
		t.Fatalf("after release the prepared mark stayed: %v", err)
	}
}

func TestRangeLockExcludesPhantoms(t *testing.T) {
	tb := New()
	mustAcquire(t, tb, txn(5), rng("b", "d"), Shared) // a scan of [b, d)
	if err := tb.Acquire(ctxT(t), txn(7), Point([]byte("c")), Exclusive); !errors.Is(err, ErrWouldDie) {
		t.Fatalf("younger insert into a scanned range = %v, want ErrWouldDie", err)
	}
	mustAcquire(t, tb, txn(7), Point([]byte("d")), Exclusive) // the end is exclusive
	mustAcquire(t, tb, txn(7), Point([]byte("a")), Exclusive)
	ch := acquireAsync(tb, txn(3), Point([]byte("bb")), Exclusive) // older insert waits
	waitWaiters(t, tb, 1)
	tb.ReleaseAll(txn(5).ID)
	if err := <-ch; err != nil {
		t.Fatal(err)
	}
	// A range request meets point locks inside it.
	if err := tb.Acquire(ctxT(t), txn(8), rng("a", "c"), Shared); !errors.Is(err, ErrWouldDie) {
		t.Fatalf("younger scan over exclusive point locks = %v, want ErrWouldDie", err)
	}
}

func TestUpgradeAndReentry(t *testing.T) {
	tb := New()
	mustAcquire(t, tb, txn(1), Point([]byte("k")), Shared)
	mustAcquire(t, tb, txn(1), Point([]byte("k")), Shared)
	mustAcquire(t, tb, txn(1), Point([]byte("k")), Exclusive) // sole holder: upgrade
	if !tb.Holds(txn(1).ID, Point([]byte("k")), Exclusive) || tb.Len() != 1 {
		t.Fatalf("upgrade: holds=%v len=%d", tb.Holds(txn(1).ID, Point([]byte("k")), Exclusive), tb.Len())
	}
	mustAcquire(t, tb, txn(1), Point([]byte("k")), Shared) // weaker: no-op
	if !tb.Holds(txn(1).ID, Point([]byte("k")), Exclusive) {
		t.Fatal("a shared re-request downgraded the exclusive lock")
	}
	// Upgrade while an older reader shares the key: the younger upgrader dies.
	tb2 := New()
	mustAcquire(t, tb2, txn(1), Point([]byte("k")), Shared)
	mustAcquire(t, tb2, txn(2), Point([]byte("k")), Shared)
	if err := tb2.Acquire(ctxT(t), txn(2), Point([]byte("k")), Exclusive); !errors.Is(err, ErrWouldDie) {
		t.Fatalf("younger upgrade beside an older reader = %v, want ErrWouldDie", err)
	}
}

func TestOlderWaiterIsNotStarvedByYoungerReaders(t *testing.T) {
	tb := New()
	mustAcquire(t, tb, txn(5), Point([]byte("k")), Shared)
	ch := acquireAsync(tb, txn(3), Point([]byte("k")), Exclusive) // older writer waits
	waitWaiters(t, tb, 1)
	if err := tb.Acquire(ctxT(t), txn(9), Point([]byte("k")), Shared); !errors.Is(err, ErrWouldDie) {
		t.Fatalf("younger reader behind an older waiting writer = %v, want ErrWouldDie", err)
	}
	tb.ReleaseAll(txn(5).ID)
	if err := <-ch; err != nil {
		t.Fatal(err)
	}
}

func TestWaitIsBoundedByContext(t *testing.T) {
	tb := New()
	mustAcquire(t, tb, txn(5), Point([]byte("k")), Exclusive)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := tb.Acquire(ctx, txn(1), Point([]byte("k")), Exclusive); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire past its deadline = %v, want DeadlineExceeded", err)
	}
	if tb.Waiters() != 0 {
		t.Fatalf("an abandoned wait stayed registered (%d waiters)", tb.Waiters())
	}
}

func TestInvalidAndEmptySpans(t *testing.T) {
	tb := New()
	if err := tb.Acquire(ctxT(t), txn(1), rng("z", "a"), Shared); !errors.Is(err, ErrInvalidSpan) {
		t.Fatalf("inverted range = %v, want ErrInvalidSpan", err)
	}
	mustAcquire(t, tb, txn(1), rng("m", "m"), Exclusive)
	if tb.Len() != 0 {
		t.Fatalf("an empty range took a lock")
	}
}

func TestSnapshotWaitNeverDelaysWriters(t *testing.T) {
	tb := New()
	mustAcquire(t, tb, txn(5), Point([]byte("k")), Exclusive)
	mustAcquire(t, tb, txn(6), Point([]byte("m")), Exclusive)
	done := make(chan error, 1)
	go func() { done <- tb.WaitNoExclusive(ctxT(t), rng("a", "z")) }()
	waitWaiters(t, tb, 1)
	// With a snapshot waiting on [a, z), any transaction still locks inside it at once.
	mustAcquire(t, tb, txn(900), Point([]byte("q")), Exclusive)
	mustAcquire(t, tb, txn(901), rng("c", "d"), Shared)
	tb.ReleaseAll(txn(5).ID)
	select {
	case err := <-done:
		t.Fatalf("snapshot wait ended (%v) while txn 6, a holder when it began, still holds its lock", err)
	case <-time.After(20 * time.Millisecond):
	}
	// Txn 900 locked after the wait began: it is not waited for (it commits
	// at a later epoch than the snapshot's), so writers cannot starve a snapshot.
	tb.ReleaseAll(txn(6).ID)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !tb.Holds(txn(900).ID, Point([]byte("q")), Exclusive) {
		t.Fatal("txn 900 lost its lock")
	}
	// Shared locks do not hold a snapshot back.
	if err := tb.WaitNoExclusive(ctxT(t), Point([]byte("c"))); err != nil {
		t.Fatal(err)
	}
}

// TestStressNoConflictingGrantsNoDeadlock runs many transactions taking random
// locks; a shadow model checks that no two conflicting locks are ever held at
// once, and every transaction finishes (no deadlock) well inside the deadline.
func TestStressNoConflictingGrantsNoDeadlock(t *testing.T) {
	tb := New()
	type held struct {
		span Span
		mode Mode
	}
	var mu sync.Mutex
	holding := map[TxnID][]held{}
	check := func(x Txn, s Span, m Mode) error {
		for id, hs := range holding {
			if id == x.ID {
				continue
			}
			for _, h := range hs {
				if h.span.overlaps(s) && conflicts(h.mode, m) {
					return fmt.Errorf("txn %d granted %v %q while another holds %v %q", x.Priority, m, s.Key, h.mode, h.span.Key)
				}
			}
		}
		return nil
	}
	var prio sync.Mutex
	next := uint64(0)
	newTxn := func() Txn { prio.Lock(); defer prio.Unlock(); next++; return txn(next) }
	errs := make(chan error, 16)
	var wg sync.WaitGroup
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func(seed uint64) {
			defer wg.Done()
			r := rand.New(rand.NewPCG(seed, seed))
			for i := 0; i < 200; i++ {
				x := newTxn()
				ops := 4
				if r.IntN(4) == 0 { // a single-key transaction sent whole: it may wait for anyone
					x.Waits, ops = true, 1
				}
			attempt:
				for try := 0; try < 50; try++ {
					for op := 0; op < ops; op++ {
						k := fmt.Sprintf("k%02d", r.IntN(20))
						s, m := Point([]byte(k)), Shared
						if r.IntN(2) == 0 {
							m = Exclusive
						}
						if r.IntN(5) == 0 {
							s, m = rng(k, k+"~"), Shared
						}
						ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
						err := tb.Acquire(ctx, x, s, m)
						cancel()
						if errors.Is(err, ErrWouldDie) {
							mu.Lock()
							delete(holding, x.ID)
							tb.ReleaseAll(x.ID)
							mu.Unlock()
							continue attempt // restart with the same priority
						}
						if err != nil {
							errs <- fmt.Errorf("txn %d: %w (deadlock?)", x.Priority, err)
							return
						}
						mu.Lock()
						if err := check(x, s, m); err != nil {
							mu.Unlock()
							errs <- err
							return
						}
						holding[x.ID] = append(holding[x.ID], held{s, m})
						mu.Unlock()
					}
					break
				}
				mu.Lock()
				delete(holding, x.ID)
				tb.ReleaseAll(x.ID)
				mu.Unlock()
			}
		}(uint64(w))
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if tb.Len() != 0 || tb.Waiters() != 0 {
		t.Fatalf("after all transactions: %d locks, %d waiters", tb.Len(), tb.Waiters())
	}
}

// A request marked Waits (it holds nothing else) waits for an older holder
// instead of dying, where an unmarked one dies.
func TestWaitsRequestWaitsForAnOlderHolder(t *testing.T) {
	tb := New()
	k := Point([]byte("k"))
	mustAcquire(t, tb, txn(1), k, Exclusive)
	if err := tb.Acquire(ctxT(t), txn(5), k, Shared); !errors.Is(err, ErrWouldDie) {
		t.Fatalf("younger, unmarked: %v, want ErrWouldDie", err)
	}
	w := txn(6)
	w.Waits = true
	got := acquireAsync(tb, w, k, Shared)
	waitWaiters(t, tb, 1)
	tb.ReleaseAll(txn(1).ID)
	if err := <-got; err != nil {
		t.Fatalf("younger, marked Waits: %v, want the lock once the holder released", err)
	}
}

// A request marked Waits queues behind an older waiter rather than
// overtaking it, and looks again when that waiter gives up: here the holder
// it could share with stays, so nothing is released to wake it.
func TestWaitsRequestQueuesBehindAnOlderWaiterUntilItGivesUp(t *testing.T) {
	tb := New()
	k := Point([]byte("k"))
	mustAcquire(t, tb, txn(5), k, Shared) // the holder, younger than the waiter
	ctx, cancel := context.WithCancel(ctxT(t))
	older := make(chan error, 1)
	go func() { older <- tb.Acquire(ctx, txn(2), k, Exclusive) }()
	waitWaiters(t, tb, 1)
	w := txn(9)
	w.Waits = true
	got := acquireAsync(tb, w, k, Shared)
	waitWaiters(t, tb, 2)
	select {
	case err := <-got:
		t.Fatalf("Waits request overtook an older waiter: %v", err)
	default:
	}
	cancel()
	if err := <-older; !errors.Is(err, context.Canceled) {
		t.Fatalf("older waiter: %v", err)
	}
	if err := <-got; err != nil {
		t.Fatalf("Waits request after the older waiter gave up: %v, want the shared lock", err)
	}
}

// A request marked Waits that queued behind an older waiter looks again when
// that waiter, woken by a release that does not touch the Waits request's
// key, dies: nothing else would ever wake it.
func TestWaitsRequestLooksAgainWhenTheWaiterAheadDies(t *testing.T) {
	tb := New()
	mustAcquire(t, tb, txn(10), Point([]byte("m")), Shared) // younger than the waiter ahead
	ahead := acquireAsync(tb, txn(5), rng("a", "z"), Exclusive)
	waitWaiters(t, tb, 1)
	w := txn(20)
	w.Waits = true
	got := acquireAsync(tb, w, Point([]byte("q")), Shared) // conflicts only with the waiter ahead
	waitWaiters(t, tb, 2)
	mustAcquire(t, tb, txn(1), Point([]byte("b")), Shared) // older than the waiter ahead, which yields to no one younger
	tb.ReleaseAll(txn(10).ID)                              // wakes the waiter ahead, which now meets txn 1 and dies
	select {
	case err := <-ahead:
		if !errors.Is(err, ErrWouldDie) {
			t.Fatalf("waiter ahead: %v, want ErrWouldDie", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter ahead was not woken")
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("Waits request after the waiter ahead died: %v, want the shared lock", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Waits request still waits after the waiter ahead died: a lost wakeup")
	}
}
