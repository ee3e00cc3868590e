package client_test

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/directory"
	"github.com/terroir-db/terroir/internal/localcluster"
)

// feedConsumer applies a changefeed to a map, as a downstream store would,
// and checks what the feed promises (DESIGN.md §14): changes in version-id
// order, each above the last resolved epoch and at or below the next one;
// and, at every resolved epoch after funding, a bank total intact.
type feedConsumer struct {
	t *testing.T

	mu       sync.Mutex
	state    map[string]string
	resolved uint64
	last     client.Change
	pending  int // changes since the last resolved epoch
	rounds   int
	funded   bool
}

func (f *feedConsumer) apply(ev client.FeedEvent) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c := ev.Change; c != nil {
		if c.Version.Epoch <= f.resolved {
			f.t.Errorf("change of %q at %v after resolved epoch %d", c.Key, c.Version, f.resolved)
		}
		if f.pending > 0 && c.Version.Less(f.last.Version) {
			f.t.Errorf("change of %q at %v after one at %v: not in version order", c.Key, c.Version, f.last.Version)
		}
		f.last, f.pending = *c, f.pending+1
		if c.Tombstone {
			delete(f.state, string(c.Key))
		} else {
			f.state[string(c.Key)] = string(c.Value)
		}
		return nil
	}
	if ev.Resolved <= f.resolved {
		f.t.Errorf("resolved epoch %d after %d", ev.Resolved, f.resolved)
	}
	if f.pending > 0 && f.last.Version.Epoch > ev.Resolved {
		f.t.Errorf("change at %v delivered before resolved epoch %d", f.last.Version, ev.Resolved)
	}
	f.resolved, f.pending, f.rounds = ev.Resolved, 0, f.rounds+1
	if f.funded {
		var sum int64
		for i := 0; i < accounts; i++ {
			v, ok := f.state[string(account(i))]
			if !ok {
				f.t.Errorf("resolved %d: account %d missing from the feed's state", ev.Resolved, i)
				return nil
			}
			sum += dec([]byte(v))
		}
		if sum != accounts*initialBalance {
			f.t.Errorf("resolved %d: the feed's state holds a total of %d, want %d", ev.Resolved, sum, accounts*initialBalance)
		}
	}
	return nil
}

// TestChangefeedHoldsTheSnapshotState: a changefeed over the whole key
// space, started before the accounts were funded, runs while clients
// transfer money, a range splits and a range leader is killed. A consumer
// applying it holds an intact bank total at every resolved epoch, and, once
// the writers stop, exactly the state of a snapshot at its resolved epoch + 1.
func TestChangefeedHoldsTheSnapshotState(t *testing.T) {
	c, db := startCluster(t, localcluster.Options{Crashable: true})
	ctx := ctxT(t, 120*time.Second)
	from := closedNow(ctx, t, db)
	cons := &feedConsumer{t: t, state: map[string]string{}, resolved: from}
	fctx, stopFeed := context.WithCancel(ctx)
	feedDone := make(chan error, 1)
	go func() {
		feedDone <- db.Changefeed(fctx, client.FeedOptions{From: from, Interval: 20 * time.Millisecond, PageSize: 7}, cons.apply)
	}()
	fund(t, ctx, db)
	funded, err := db.BeginSnapshot(ctx, client.Linearizable)
	if err != nil {
		t.Fatal(err)
	}
	waitResolved(ctx, t, cons, funded.Stats().Epoch-1)
	cons.mu.Lock()
	cons.funded = true
	cons.mu.Unlock()

	load := startBankLoad(t, ctx, c)
	time.Sleep(time.Second)
	if err := db.AdminSplit(ctx, []byte("acct-10")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	const rangeID = 10 // holds the "a…" accounts
	if err := c.KillNode(c.Leader(rangeID)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	load.stop()

	final, err := db.BeginSnapshot(ctx, client.Linearizable)
	if err != nil {
		t.Fatal(err)
	}
	want, err := final.Scan(ctx, nil, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	waitResolved(ctx, t, cons, final.Stats().Epoch-1)
	stopFeed()
	if err := <-feedDone; !errors.Is(err, context.Canceled) {
		t.Fatalf("changefeed ended with %v", err)
	}
	cons.mu.Lock()
	defer cons.mu.Unlock()
	if len(cons.state) != len(want) {
		t.Errorf("the feed's state has %d keys, the snapshot %d", len(cons.state), len(want))
	}
	for _, kv := range want {
		if got, ok := cons.state[string(kv.Key)]; !ok || !bytes.Equal([]byte(got), kv.Value) {
			t.Errorf("%q: the feed's state has %q (%v), the snapshot %q", kv.Key, got, ok, kv.Value)
		}
	}
	t.Logf("%d transfers; %d resolved epochs; %d keys", load.transfers.Load(), cons.rounds, len(want))
}

func waitResolved(ctx context.Context, t *testing.T, f *feedConsumer, e uint64) {
	t.Helper()
	for {
		f.mu.Lock()
		r := f.resolved
		f.mu.Unlock()
		if r >= e {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the changefeed never resolved epoch %d (at %d)", e, r)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// TestChangefeedBelowTheGCHorizonIsRefused: a feed from an epoch GC has
// collected fails with ErrSnapshotTooOld, delivers nothing and leaves no
// protection behind; bad spans are refused.
func TestChangefeedBelowTheGCHorizonIsRefused(t *testing.T) {
	c, db, ctx := startWithClient(t, "../examples/one-region.yaml")
	old := snapshotAfter(ctx, t, db, "f", "v1")
	putKey(ctx, t, db, "f", "v2")
	dirs := directory.NewDirectories(c.Topology, c.Dialer("us-east1"))
	if err := dirs.SetGCTTL(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	waitTooOld(ctx, t, old, "f")
	delivered := 0
	err := db.Changefeed(ctx, client.FeedOptions{From: old.Stats().Epoch - 1}, func(client.FeedEvent) error { delivered++; return nil })
	if !errors.Is(err, client.ErrSnapshotTooOld) || delivered != 0 {
		t.Fatalf("a feed below the GC horizon: %v after %d events; want ErrSnapshotTooOld and none", err, delivered)
	}
	err = db.Changefeed(ctx, client.FeedOptions{All: true}, func(client.FeedEvent) error { delivered++; return nil })
	if !errors.Is(err, client.ErrSnapshotTooOld) || delivered != 0 {
		t.Fatalf("a feed of all history after GC: %v after %d events; want ErrSnapshotTooOld and none", err, delivered)
	}
	pol, err := dirs.Of("us-east1").GCPolicy(ctx)
	if err != nil || len(pol.GetProtections()) != 0 {
		t.Fatalf("protections after refused feeds: %v %v; want none", pol.GetProtections(), err)
	}
	if err := db.Changefeed(ctx, client.FeedOptions{Start: []byte("b"), End: []byte("a")}, func(client.FeedEvent) error { return nil }); !errors.Is(err, client.ErrInvalidRange) {
		t.Fatalf("a feed over [b, a): %v, want ErrInvalidRange", err)
	}
}
