package client_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/localcluster"
)

// getIn reads key in a snapshot in mode and returns its value and the stats.
func getIn(ctx context.Context, t *testing.T, db *client.DB, mode client.SnapshotMode, key string) (string, client.SnapshotStats) {
	t.Helper()
	var v []byte
	st, err := db.View(ctx, mode, func(ctx context.Context, s *client.Snapshot) error {
		var err error
		v, _, err = s.Get(ctx, []byte(key))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return string(v), st
}

// TestFollowerReadsSeeEarlierCommits: with followers preferred, strong
// snapshots started after a commit see it though a follower serves them
// from its closed epoch (DESIGN.md §13), from the home region and from
// another; the Serializable modes are served by followers too.
func TestFollowerReadsSeeEarlierCommits(t *testing.T) {
	c := localcluster.StartT(t, "../examples/three-regions.yaml", localcluster.Options{})
	ctx := ctxT(t, 120*time.Second)
	east, west := eastWest(t, c)
	for _, db := range []*client.DB{east, west} {
		db.SetFollowerReads(client.FollowerReadsPreferred)
	}
	served, fellBack := 0, 0
	for i := range 12 {
		want := fmt.Sprint(i)
		putKey(ctx, t, east, "b-follower", want)
		for _, db := range []*client.DB{east, west} {
			got, st := getIn(ctx, t, db, client.Strong, "b-follower")
			if got != want {
				t.Fatalf("round %d: a strong snapshot after the commit read %q, want %q (stats %+v)", i, got, want, st)
			}
			served += st.FollowerReads
			fellBack += st.FollowerFallbacks
		}
	}
	t.Logf("strong reads: %d served by followers, %d went on to the leader", served, fellBack)
	if served < 12 {
		t.Fatalf("followers served only %d of 24 strong reads: the test shows little", served)
	}
	for _, mode := range []client.SnapshotMode{client.Serializable, client.SerializableStale} {
		n := 0
		for range 5 {
			_, st := getIn(ctx, t, east, mode, "b-follower")
			n += st.FollowerReads
		}
		if n == 0 {
			t.Errorf("no %v read was served by a follower", mode)
		}
	}
	// The default policy sends SerializableStale reads to a follower as near
	// as the leader, and Strong ones to the leader.
	east.SetFollowerReads(client.FollowerReadsNearest)
	getIn(ctx, t, east, client.Strong, "b-follower") // learns the leader
	if _, st := getIn(ctx, t, east, client.Strong, "b-follower"); st.FollowerReads+st.FollowerFallbacks != 0 {
		t.Errorf("nearest policy, strong read in the home region: %+v, want the leader's", st)
	}
	n, fb := 0, 0
	for range 20 {
		_, st := getIn(ctx, t, east, client.SerializableStale, "b-follower")
		n, fb = n+st.FollowerReads, fb+st.FollowerFallbacks
	}
	t.Logf("nearest policy, stale reads: %d served by followers, %d went on to the leader", n, fb)
	if n == 0 {
		t.Error("nearest policy: no SerializableStale read was served by a follower")
	}
	east.SetFollowerReads(client.FollowerReadsOff)
	for range 3 {
		if _, st := getIn(ctx, t, east, client.SerializableStale, "b-follower"); st.FollowerReads+st.FollowerFallbacks != 0 {
			t.Errorf("follower reads off: %+v", st)
		}
	}
}

// TestFollowerReadWaitsForTheClosedEpoch: while range 100's leader closes
// no epoch, no replica serves a read above its closed epoch + 1: a strong
// snapshot after a commit goes to the leader and sees the commit. Once
// closing resumes, followers serve again.
func TestFollowerReadWaitsForTheClosedEpoch(t *testing.T) {
	c := localcluster.StartT(t, "../examples/three-regions.yaml", localcluster.Options{})
	ctx := ctxT(t, 120*time.Second)
	db, err := c.Client("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	db.SetFollowerReads(client.FollowerReadsPreferred)
	putKey(ctx, t, db, "b-paused", "before")
	pause := func(paused bool) { pauseClosing(c, 100, paused) }
	pause(true)
	time.Sleep(500 * time.Millisecond) // a close under way when paused has applied
	for i := range 5 {
		want := fmt.Sprint("paused-", i)
		putKey(ctx, t, db, "b-paused", want)
		got, st := getIn(ctx, t, db, client.Strong, "b-paused")
		if got != want {
			t.Fatalf("closing paused: a strong snapshot after the commit read %q, want %q (stats %+v)", got, want, st)
		}
		if st.FollowerReads != 0 || st.FollowerFallbacks == 0 {
			t.Fatalf("closing paused: %+v, want the read refused by the follower and served by the leader", st)
		}
	}
	pause(false)
	deadline := time.Now().Add(10 * time.Second)
	for {
		putKey(ctx, t, db, "b-paused", "after")
		got, st := getIn(ctx, t, db, client.Strong, "b-paused")
		if got != "after" {
			t.Fatalf("closing resumed: read %q, want after", got)
		}
		if st.FollowerReads == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("closing resumed, yet no follower served a strong read in 10 s (last %+v)", st)
		}
	}
}
