package client_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/localcluster"
)

// startFeed runs a changefeed over the whole key space from now into a
// feedConsumer, until the test ends.
func startFeed(t *testing.T, ctx context.Context, db *client.DB) *feedConsumer {
	t.Helper()
	from := closedNow(ctx, t, db)
	cons := &feedConsumer{t: t, state: map[string]string{}, resolved: from}
	fctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- db.Changefeed(fctx, client.FeedOptions{From: from, Interval: 20 * time.Millisecond}, cons.apply)
	}()
	t.Cleanup(func() {
		stop()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("changefeed ended with %v", err)
		}
	})
	return cons
}

// closedNow returns the key space's closed epoch once it is above 0: an
// epoch whose state is known, for a feed to start after.
func closedNow(ctx context.Context, t *testing.T, db *client.DB) uint64 {
	t.Helper()
	for {
		c, err := db.ClosedEpoch(ctx, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if c > 0 {
			return c
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// resolvedNow returns the consumer's resolved epoch and the value it holds
// for key.
func (f *feedConsumer) resolvedNow(key string) (uint64, string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := f.state[key]
	return f.resolved, v, ok
}

// catchUp waits until the feed resolved every epoch a Linearizable snapshot
// taken now reads.
func catchUp(ctx context.Context, t *testing.T, db *client.DB, f *feedConsumer) {
	t.Helper()
	s, err := db.BeginSnapshot(ctx, client.Linearizable)
	if err != nil {
		t.Fatal(err)
	}
	waitResolved(ctx, t, f, s.Stats().Epoch-1)
}

// TestClosedEpochWaitsForPreparedTransactions: a two-phase commit whose
// coordinator stalls after every participant prepared (its version epoch
// already bounded by what the participants replied) holds its ranges'
// closed epochs back until its outcome applies (DESIGN.md §13, condition
// 3), so the changefeed delivers its writes, above the resolved epoch of
// their time, instead of resolving past them and losing them.
func TestClosedEpochWaitsForPreparedTransactions(t *testing.T) {
	_, db := startCluster(t, localcluster.Options{})
	ctx := ctxT(t, 60*time.Second)
	cons := startFeed(t, ctx, db)
	catchUp(ctx, t, db, cons)

	const stall = 800 * time.Millisecond // under orphan_after (2 s): the coordinator comes back and commits
	var stalled atomic.Int32
	db.SetStallHook(func([]byte, []uint64) time.Duration {
		if stalled.Add(1) == 1 {
			return stall
		}
		return 0
	})
	before, _, _ := cons.resolvedNow("")
	for round := range 3 {
		stalled.Store(0)
		keys := []string{fmt.Sprintf("a-closed-%d", round), fmt.Sprintf("x-closed-%d", round)} // ranges 10 and 11
		err := db.Update(ctx, func(ctx context.Context, tx *client.Txn) error {
			for _, k := range keys {
				if err := tx.Put(ctx, []byte(k), []byte("v")); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if stalled.Load() == 0 {
			t.Fatal("the commit never reached the stall: the test shows nothing")
		}
		catchUp(ctx, t, db, cons)
		for _, k := range keys {
			if r, v, ok := cons.resolvedNow(k); !ok || v != "v" {
				t.Errorf("round %d: resolved epoch %d, the feed never delivered %s (a close passed the prepared transaction)", round, r, k)
			}
		}
	}
	db.SetStallHook(nil)
	after, _, _ := cons.resolvedNow("")
	t.Logf("resolved epochs %d → %d across three stalled commits", before, after)
}

// TestPausedClosingHoldsTheFeedBack: while a range's leaders close no
// epoch, the feed resolves nothing past the range's closed epoch and a
// read above it is refused rather than served; once closing resumes, the
// writes made meanwhile are all delivered.
func TestPausedClosingHoldsTheFeedBack(t *testing.T) {
	c, db := startCluster(t, localcluster.Options{})
	ctx := ctxT(t, 60*time.Second)
	cons := startFeed(t, ctx, db)
	catchUp(ctx, t, db, cons)
	pause := func(paused bool) {
		for _, id := range c.NodeIDs() {
			if r := c.Node(id).Range(10); r != nil {
				r.PauseClosing(paused)
			}
		}
	}
	pause(true)
	time.Sleep(300 * time.Millisecond) // a close under way when paused has applied
	held, _, _ := cons.resolvedNow("")
	for i := range 20 {
		putKey(ctx, t, db, fmt.Sprintf("a-paused-%02d", i), "v")
		putKey(ctx, t, db, fmt.Sprintf("x-paused-%02d", i), "v") // range 11 goes on closing
	}
	time.Sleep(500 * time.Millisecond)
	if r, _, ok := cons.resolvedNow("a-paused-00"); r != held || ok {
		t.Fatalf("range 10 closes nothing, yet the feed resolved %d (held at %d) and delivered its write: %v", r, held, ok)
	}
	// A closed-epoch read above the closed epoch + 1 waits, it is not served.
	if _, err := closedReadAbove(ctx, db, held+5); !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("a read above the closed epoch: %v, want ErrUnavailable", err)
	}
	pause(false)
	catchUp(ctx, t, db, cons)
	for i := range 20 {
		for _, k := range []string{fmt.Sprintf("a-paused-%02d", i), fmt.Sprintf("x-paused-%02d", i)} {
			if _, v, ok := cons.resolvedNow(k); !ok || v != "v" {
				t.Errorf("%s never delivered after closing resumed", k)
			}
		}
	}
}

// closedReadAbove reads key "a" of range 10 as of epoch at from the closed
// epochs, giving up after 300 ms.
func closedReadAbove(ctx context.Context, db *client.DB, at uint64) (client.SnapshotStats, error) {
	ctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	return db.ViewAt(ctx, at, func(ctx context.Context, s *client.Snapshot) error {
		_, _, err := s.Get(ctx, []byte("a"))
		return err
	})
}
