package epoch_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/terroir-db/terroir/internal/epoch"
	"github.com/terroir-db/terroir/internal/epoch/epochpb"
)

// TestServeLocallyAsksTheLocalReplicaInProcess: a reader told that node 1's
// replica answers in process asks it there, never by RPC, and its reads
// stay monotonic and advance. Here serve counts and relays to node 1 by
// RPC, so the answer is the replica's own.
func TestServeLocallyAsksTheLocalReplicaInProcess(t *testing.T) {
	c := startCluster(t)
	waitLeader(t, c, 1)
	r, err := c.EpochReader("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	var served atomic.Int64
	r.ServeLocally(1, func(ctx context.Context, req *epochpb.ReadEpochRequest) (*epochpb.ReadEpochResponse, error) {
		served.Add(1)
		conn, err := c.Dialer("us-east1").Conn(1)
		if err != nil {
			return nil, err
		}
		return epochpb.NewEpochClient(conn).ReadEpoch(ctx, req)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var last uint64
	for i := 0; i < 20; i++ {
		e, err := r.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if e < last {
			t.Fatalf("read %d after %d", e, last)
		}
		last = e
		time.Sleep(5 * time.Millisecond)
	}
	rounds := r.Stats().Rounds
	if got := served.Load(); got < int64(rounds) {
		t.Fatalf("node 1's replica answered in process %d times in %d rounds; want every round", got, rounds)
	}
	first := last
	if e, err := epoch.WaitAtLeast(ctx, r, first+3, time.Millisecond); err != nil || e < first+3 {
		t.Fatalf("the epoch did not advance past %d: %d %v", first, e, err)
	}
}

// TestAnIdleRegionsEpochSlowsAndAReadRestoresThePace: while only background
// reads reach the local epoch group (leaseholders keeping their leases), its
// leader advances at the idle pace (100 ms); reads that ask for the epoch
// bring back the full pace (10 ms) at once. It fails if background reads
// kept the full pace, or if the pace never came back.
func TestAnIdleRegionsEpochSlowsAndAReadRestoresThePace(t *testing.T) {
	c := startCluster(t)
	waitLeader(t, c, 1)
	r, err := c.EpochReader("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// advanced returns how far the epoch moved over d, read by read.
	advanced := func(d time.Duration, read func(context.Context) (uint64, error)) uint64 {
		first, err := read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		last := first
		for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
			if last, err = read(ctx); err != nil {
				t.Fatal(err)
			}
		}
		return last - first
	}
	// The cluster's start (elections, first leases) asks for the full
	// pace; once that is a PaceHold behind, only background reads remain.
	idle := false
	var moved uint64
	for deadline := time.Now().Add(15 * time.Second); !idle && time.Now().Before(deadline); {
		moved = advanced(time.Second, r.ReadBackground)
		idle = moved <= 15 // the idle pace gives 10 a second; the full pace 100
	}
	if !idle {
		t.Fatalf("with only background reads the epoch still moved %d in a second; want the idle pace (about 10)", moved)
	}
	if moved = advanced(500*time.Millisecond, r.Read); moved < 18 { // the idle pace gives 5
		t.Fatalf("reads asking for the epoch moved it only %d in 500 ms; want the full pace (about 50)", moved)
	}
}
