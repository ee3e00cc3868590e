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
	rounds, _ := r.Stats()
	if got := served.Load(); got < int64(rounds) {
		t.Fatalf("node 1's replica answered in process %d times in %d rounds; want every round", got, rounds)
	}
	first := last
	if e, err := epoch.WaitAtLeast(ctx, r, first+3, time.Millisecond); err != nil || e < first+3 {
		t.Fatalf("the epoch did not advance past %d: %d %v", first, e, err)
	}
}
