package rangeserver

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/terroir-db/terroir/internal/locktable"
)

// TestALockWaitEndsAtItsBoundOrWithTheLease: a lock that must wait waits
// under the contexts Replica.lock makes for it alone. A Txn.Waits request
// dies with ErrConflict at its bound (half its request's time left), not
// at the request's deadline; an older transaction's wait ends with
// ErrLocksLost when the leadership it waited under ends. A lock that is
// free is granted without waiting.
func TestALockWaitEndsAtItsBoundOrWithTheLease(t *testing.T) {
	r := &Replica{id: 10}
	l := &leadership{txns: newTxnTable(time.Now, 0)}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	defer l.cancel()
	k := locktable.Point([]byte("k"))
	holder, younger, older := meta(2, 10), meta(3, 20), meta(1, 5)
	if _, err := l.txns.acquire(holder, k, locktable.Exclusive, false, waitUnder(context.Background())); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
	defer cancel()
	began := time.Now()
	_, err := r.lock(ctx, l, younger, k, locktable.Exclusive, true)
	took := time.Since(began)
	if !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "for a lock") {
		t.Fatalf("a Txn.Waits request behind a holder = %v; want ErrConflict at its wait bound", err)
	}
	if took < 150*time.Millisecond || took > 350*time.Millisecond {
		t.Errorf("the Txn.Waits request waited %v; want about half its 400 ms", took)
	}

	got := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := r.lock(ctx, l, older, k, locktable.Exclusive, false)
		got <- err
	}()
	for l.txns.locks.Waiters() == 0 {
		select {
		case err := <-got:
			t.Fatalf("an older transaction behind a younger holder did not wait: %v", err)
		case <-time.After(time.Millisecond):
		}
	}
	l.cancel()
	select {
	case err := <-got:
		if !errors.Is(err, ErrLocksLost) {
			t.Fatalf("a wait whose leadership ended = %v; want ErrLocksLost", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a wait whose leadership ended did not return")
	}
	if n := l.txns.locks.Waiters(); n != 0 {
		t.Errorf("%d waiters left after both waits ended", n)
	}
}
