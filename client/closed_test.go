package client_test

import (
	"bytes"
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
	pause := func(paused bool) { pauseClosing(c, 10, paused) }
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

// TestChangefeedNarrowsLargeRounds: a feed resuming from far back, whose
// first window holds more changes than a round may (RoundChanges), or more
// versions of one key than a page may (twice PageSize), narrows its rounds
// to fewer epochs and catches up: every change exactly once, in version
// order, and no round above its bound unless it spans a single epoch.
func TestChangefeedNarrowsLargeRounds(t *testing.T) {
	_, db := startCluster(t, localcluster.Options{})
	ctx := ctxT(t, 60*time.Second)
	from := closedNow(ctx, t, db)
	const hot, cold, bound = 60, 20, 10
	for i := range hot {
		putKey(ctx, t, db, "hot", fmt.Sprint(i))
	}
	for i := range cold {
		putKey(ctx, t, db, fmt.Sprintf("cold-%02d", i), "v")
	}
	// Every write acknowledged before a Linearizable snapshot is below its epoch.
	s, err := db.BeginSnapshot(ctx, client.Linearizable)
	if err != nil {
		t.Fatal(err)
	}
	end := s.Stats().Epoch - 1
	var (
		delivered, rounds, narrowed int
		round                       []client.Change
		last                        client.Change
		hotValue                    string
	)
	fctx, stop := context.WithCancel(ctx)
	defer stop()
	err = db.Changefeed(fctx, client.FeedOptions{From: from, PageSize: 4, RoundChanges: bound, Interval: 20 * time.Millisecond}, func(ev client.FeedEvent) error {
		if c := ev.Change; c != nil {
			if delivered > 0 && c.Version.Less(last.Version) {
				t.Errorf("%q at %v after %q at %v", c.Key, c.Version, last.Key, last.Version)
			}
			last, delivered = *c, delivered+1
			round = append(round, *c)
			if string(c.Key) == "hot" {
				hotValue = string(c.Value)
			}
			return nil
		}
		if len(round) > 0 {
			rounds++
			if len(round) > bound && round[0].Version.Epoch != round[len(round)-1].Version.Epoch {
				t.Errorf("a round of %d changes over epochs %d..%d, bound %d", len(round), round[0].Version.Epoch, round[len(round)-1].Version.Epoch, bound)
			}
			if len(round) <= bound {
				narrowed++
			}
		}
		round = round[:0]
		if ev.Resolved >= end {
			stop()
		}
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("changefeed ended with %v", err)
	}
	if delivered != hot+cold || hotValue != fmt.Sprint(hot-1) {
		t.Fatalf("delivered %d changes (want %d), hot ends at %q (want %d)", delivered, hot+cold, hotValue, hot-1)
	}
	if rounds < (hot+cold)/bound {
		t.Fatalf("%d changes in %d rounds: the rounds were not narrowed to %d", delivered, rounds, bound)
	}
	t.Logf("%d changes in %d rounds (%d within the bound)", delivered, rounds, narrowed)
}

// pauseClosing stops (or resumes) range id's closing of epochs on every
// node that hosts it.
func pauseClosing(c *localcluster.Cluster, id uint64, paused bool) {
	for _, n := range c.NodeIDs() {
		if r := c.Node(n).Range(id); r != nil {
			r.PauseClosing(paused)
		}
	}
}

// TestIdleRangesCloseOutsideTheirLogs: an idle range's closed epoch keeps
// rising at every replica, leader and followers alike, while its log
// grows only by its lease renewals (and the close through the log after
// each): its leader sends the closes by the side transport (DESIGN.md
// §13), not as Raft entries. Both with a publisher (the demo's topology)
// and in a regional-only deployment, where closes follow the local epoch.
func TestIdleRangesCloseOutsideTheirLogs(t *testing.T) {
	for _, tc := range []struct{ config, region, key string }{
		{"../examples/three-regions.yaml", "us-east1", "us-east1/idle"},
		{"../examples/one-region.yaml", "us-east1", "a-idle"},
	} {
		t.Run(tc.config[len("../examples/"):], func(t *testing.T) {
			c := localcluster.StartT(t, tc.config, localcluster.Options{})
			db, err := c.Client(tc.region)
			if err != nil {
				t.Fatal(err)
			}
			ctx := ctxT(t, 60*time.Second)
			putKey(ctx, t, db, tc.key, "v")
			ranges, err := db.Ranges(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var id uint64
			for _, r := range ranges {
				if bytes.Compare(r.Start, []byte(tc.key)) <= 0 && (r.End == nil || bytes.Compare([]byte(tc.key), r.End) < 0) {
					id = r.ID
				}
			}
			type state struct{ closed, applied uint64 }
			now := func() map[uint64]state {
				m := map[uint64]state{}
				for _, n := range c.NodeIDs() {
					if r := c.Node(n).Range(id); r != nil {
						closed, _ := r.ClosedEpoch(nil, nil)
						m[n] = state{closed, r.AppliedIndex()}
					}
				}
				return m
			}
			time.Sleep(500 * time.Millisecond) // the write's close applies
			before := now()
			const idle = 3 * time.Second
			time.Sleep(idle)
			after := now()
			if len(after) < 3 {
				t.Fatalf("range %d has %d replicas, want 3 or more", id, len(after))
			}
			for n, a := range after {
				b := before[n]
				rose, grew := a.closed-b.closed, a.applied-b.applied
				t.Logf("range %d at node %d over %v idle: closed epoch %d -> %d, log %d -> %d", id, n, idle, b.closed, a.closed, b.applied, a.applied)
				if rose < 10 {
					t.Errorf("node %d: the idle range's closed epoch rose by %d epochs in %v, want 10 or more", n, rose, idle)
				}
				// 30 closes through the log would add 30 entries.
				if grew > 10 {
					t.Errorf("node %d: the idle range's log grew by %d entries in %v: its closes went through it", n, grew, idle)
				}
			}
		})
	}
}

// TestCommitsLeaveTheEpochIdleAndAChangefeedAsks: commits read the local
// epoch without asking it to move (epoch.Demand), so a region that only
// commits lets it fall to the idle pace (100 ms); a changefeed, which
// waits for epochs to close, asks through ClosedEpoch and brings back the
// full pace (10 ms). It fails if a one-phase or a two-range commit kept
// the full pace, or if ClosedEpoch did not restore it.
func TestCommitsLeaveTheEpochIdleAndAChangefeedAsks(t *testing.T) {
	c, db := startCluster(t, localcluster.Options{})
	ctx := ctxT(t, 60*time.Second)
	r, err := c.EpochReader("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	// advanced returns how far the local epoch moved over d while work ran
	// again and again; the epoch is read in the background, asking nothing.
	advanced := func(d time.Duration, work func(i int) error) uint64 {
		t.Helper()
		first, err := r.ReadBackground(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for i, end := 0, time.Now().Add(d); time.Now().Before(end); i++ {
			if err := work(i); err != nil {
				t.Fatal(err)
			}
		}
		last, err := r.ReadBackground(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return last - first
	}
	commit := func(i int) error {
		if i%2 == 0 { // one range: a one-phase commit at its leader
			_, err := db.Put(ctx, []byte(fmt.Sprintf("a%d", i%50)), []byte("v"))
			return err
		}
		return db.Update(ctx, func(ctx context.Context, tx *client.Txn) error { // two ranges: the coordinator's
			if err := tx.Put(ctx, []byte(fmt.Sprintf("b%d", i%50)), []byte("v")); err != nil {
				return err
			}
			return tx.Put(ctx, []byte(fmt.Sprintf("x%d", i%50)), []byte("v"))
		})
	}
	// The cluster's start (elections, first leases) asks for the full
	// pace; once that is a PaceHold behind, only commits remain.
	var moved uint64
	idle := false
	for deadline := time.Now().Add(20 * time.Second); !idle && time.Now().Before(deadline); {
		moved = advanced(time.Second, commit)
		idle = moved <= 15 // the idle pace gives 10 a second; the full pace 100
	}
	if !idle {
		t.Fatalf("with only commits the local epoch still moved %d in a second; want the idle pace (about 10)", moved)
	}
	t.Logf("with only commits the local epoch moved %d in a second", moved)
	feed := func(int) error {
		_, err := db.ClosedEpoch(ctx, nil, nil)
		time.Sleep(20 * time.Millisecond) // a changefeed's round interval
		return err
	}
	if moved = advanced(500*time.Millisecond, feed); moved < 18 { // the idle pace gives 5
		t.Fatalf("a changefeed's ClosedEpoch moved the local epoch only %d in 500 ms; want the full pace (about 50)", moved)
	}
	t.Logf("with a changefeed's ClosedEpoch the local epoch moved %d in 500 ms", moved)
}
