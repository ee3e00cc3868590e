package rangeserver

import (
	"context"
	"testing"
	"time"

	"github.com/terroir-db/terroir/internal/epoch"
	"github.com/terroir-db/terroir/internal/locktable"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
)

// fixedReading is a Reading that answers epochs at once.
func fixedReading(epochs ...uint64) epoch.Reading {
	return func(context.Context) ([]uint64, error) { return epochs, nil }
}

// TestAReadAheadFollowsEveryLock: a commit may use the epochs read ahead
// for its transaction only if no lock acquisition of the transaction began
// after the read did (invariant 4: every lock before any epoch), under the
// home it was read in, once, and never while an acquisition is under way.
func TestAReadAheadFollowsEveryLock(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	home, other := &Home{Region: "us-east1"}, &Home{Region: "us-west1"}
	k := func(s string) locktable.Span { return locktable.Point([]byte(s)) }
	lock := func(t *testing.T, tt *txnTable, m *pb.TxnMeta, key string) {
		t.Helper()
		if _, err := tt.acquire(m, k(key), locktable.Exclusive, false, waitUnder(ctx)); err != nil {
			t.Fatal(err)
		}
	}
	// lockedAhead is a table where txn 1 locked a and then read ahead.
	lockedAhead := func(t *testing.T) (*txnTable, *pb.TxnMeta) {
		tt, m := newTxnTable(time.Now, 0), meta(1, 10)
		lock(t, tt, m, "a")
		rec, seq, ok := tt.beginAhead(m.GetId())
		if !ok {
			t.Fatal("no read ahead after a granted lock")
		}
		tt.setAhead(rec, &readAhead{seq: seq, home: home, reading: fixedReading(5, 6)})
		return tt, m
	}

	t.Run("used after the last lock", func(t *testing.T) {
		tt, m := lockedAhead(t)
		if got := tt.takeAhead(m.GetId(), home); got == nil {
			t.Fatal("the read ahead that follows every lock was not offered to the commit")
		}
		if got := tt.takeAhead(m.GetId(), home); got != nil {
			t.Fatal("a read ahead was offered twice")
		}
		if _, _, ok := tt.beginAhead(m.GetId()); ok {
			t.Fatal("a transaction read ahead twice at one leader")
		}
	})
	t.Run("a later lock voids it", func(t *testing.T) {
		tt, m := lockedAhead(t)
		lock(t, tt, m, "b")
		if got := tt.takeAhead(m.GetId(), home); got != nil {
			t.Fatal("epochs read before the transaction's last lock were offered to its commit")
		}
	})
	t.Run("a lock begun while the read began voids it", func(t *testing.T) {
		tt, m := newTxnTable(time.Now, 0), meta(1, 10)
		lock(t, tt, m, "a")
		rec, seq, _ := tt.beginAhead(m.GetId())
		lock(t, tt, m, "b")
		tt.setAhead(rec, &readAhead{seq: seq, home: home, reading: fixedReading(5, 6)})
		if got := tt.takeAhead(m.GetId(), home); got != nil {
			t.Fatal("a read begun before the transaction's last lock was offered to its commit")
		}
	})
	t.Run("another home voids it", func(t *testing.T) {
		tt, m := lockedAhead(t)
		if got := tt.takeAhead(m.GetId(), other); got != nil {
			t.Fatal("epochs read in the range's former home were offered to a commit after a rehome")
		}
	})
	t.Run("not while a lock is awaited", func(t *testing.T) {
		tt := newTxnTable(time.Now, 0)
		older, younger := meta(1, 10), meta(2, 20)
		lock(t, tt, older, "a")
		lock(t, tt, younger, "b")
		got := make(chan error, 1)
		go func() { // the older waits for the younger's lock on b
			_, err := tt.acquire(older, k("b"), locktable.Exclusive, false, waitUnder(ctx))
			got <- err
		}()
		for tt.locks.Waiters() == 0 {
			time.Sleep(time.Millisecond)
		}
		if _, _, ok := tt.beginAhead(older.GetId()); ok {
			t.Fatal("a read ahead began while the transaction still awaited a lock")
		}
		tt.release(younger.GetId(), 0)
		if err := <-got; err != nil {
			t.Fatal(err)
		}
		if _, _, ok := tt.beginAhead(older.GetId()); !ok {
			t.Fatal("no read ahead once the awaited lock was granted")
		}
	})
	t.Run("a recreated record does not take it", func(t *testing.T) {
		tt, m := newTxnTable(time.Now, 0), meta(1, 10)
		lock(t, tt, m, "a")
		rec, seq, _ := tt.beginAhead(m.GetId())
		tt.release(m.GetId(), 0) // dropped (an orphan, say), then locking again
		lock(t, tt, m, "a")
		tt.setAhead(rec, &readAhead{seq: seq, home: home, reading: fixedReading(5, 6)})
		if got := tt.takeAhead(m.GetId(), home); got != nil {
			t.Fatal("a read ahead for a dropped record was offered to its successor's commit")
		}
	})
}
