package epoch_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/terroir-db/terroir/internal/epoch"
	"github.com/terroir-db/terroir/internal/localcluster"
	"github.com/terroir-db/terroir/internal/topology"
)

func startThreeRegions(t *testing.T) *localcluster.Cluster {
	t.Helper()
	return localcluster.StartT(t, "../../examples/three-regions.yaml", localcluster.Options{})
}

// readPublishers reads both regions' publishers from clients in those regions,
// recording every completed read, until stop.
func readPublishers(t *testing.T, c *localcluster.Cluster, h *history, stop context.Context) *sync.WaitGroup {
	t.Helper()
	var wg sync.WaitGroup
	for _, region := range []string{"us-east1", "us-west1"} {
		r, err := c.Reader(topology.KindPublisher, region, region)
		if err != nil {
			t.Fatal(err)
		}
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func(r *epoch.Reader) {
				defer wg.Done()
				for stop.Err() == nil {
					ctx, cancel := context.WithTimeout(stop, time.Second)
					start := time.Now()
					e, err := r.Read(ctx)
					end := time.Now()
					cancel()
					if err == nil {
						h.add(read{start, end, e})
					} else if !errors.Is(err, context.Canceled) {
						h.mu.Lock()
						h.fails++
						h.mu.Unlock()
					}
				}
			}(r)
		}
	}
	return &wg
}

// TestGlobalEpochInvariantUnderKills: no publisher read, in either region,
// returns less than an earlier completed read minus one, while the global epoch
// service's leader and a publisher's leader are killed and restarted.
func TestGlobalEpochInvariantUnderKills(t *testing.T) {
	c := startThreeRegions(t)
	h := &history{}
	stop, stopReads := context.WithCancel(context.Background())
	wg := readPublishers(t, c, h, stop)
	advance := func(what string) {
		t.Helper()
		h.mu.Lock()
		from := h.newest
		h.mu.Unlock()
		deadline := time.Now().Add(20 * time.Second)
		for {
			h.mu.Lock()
			now := h.newest
			h.mu.Unlock()
			if now >= from+5 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("after %s the global epoch did not advance 5 times in 20 s (at %d)", what, now)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	advance("start")
	for _, group := range []uint64{1, 13} { // the global service, then us-east1's publisher
		leader := waitLeader(t, c, group)
		if err := c.StopNode(leader); err != nil {
			t.Fatal(err)
		}
		advance("killing the leader of group " + string(rune('0'+group%10)))
		if err := c.RestartNode(leader); err != nil {
			t.Fatal(err)
		}
		advance("restarting it")
	}
	stopReads()
	wg.Wait()
	checkMonotonicWithin(t, h.reads, 1)
	t.Logf("%d publisher reads checked (%d failed during faults), global epoch reached %d", len(h.reads), h.fails, h.newest)
}

// TestPublisherRefusesWhenCutOff: with the global epoch service gone, a
// publisher stops serving within publisher_lease, and serves again once it returns.
func TestPublisherRefusesWhenCutOff(t *testing.T) {
	c := startThreeRegions(t)
	r, err := c.Reader(topology.KindPublisher, "us-east1", "us-east1")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		if e, err := r.Read(ctx); err == nil && e > 3 {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("publisher never served")
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.Net.CutRegion("us-central1")
	cutAt := time.Now()
	lease := c.Topology.PublisherLease
	var refusedAfter time.Duration
	for {
		rctx, rcancel := context.WithTimeout(ctx, 200*time.Millisecond)
		_, err := r.Read(rctx)
		rcancel()
		if err != nil {
			refusedAfter = time.Since(cutAt)
			break
		}
		if time.Since(cutAt) > lease+time.Second {
			t.Fatalf("publisher still serving %v after the global service was cut off (lease %v)", time.Since(cutAt), lease)
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.Net.Heal()
	for {
		if _, err := r.Read(ctx); err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("publisher did not serve again after the cut healed")
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("publisher refused %v after the cut (publisher_lease %v), served again after healing", refusedAfter, lease)
}

// TestAnIdleGlobalEpochSlowsAndAReadRestoresThePace: while only background
// reads reach the global epoch, the service advances every idle interval
// (250 ms here); reads of a region's publisher — told to the service with
// each Publish — and reads of the service itself bring back the full pace
// (an advance per publish round: about 40 ms, 70 ms under -race on a busy
// machine). It fails if background reads kept the full pace, or if either
// kind of read did not restore it.
func TestAnIdleGlobalEpochSlowsAndAReadRestoresThePace(t *testing.T) {
	yaml, err := os.ReadFile("../../examples/three-regions.yaml")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "topology.yaml")
	if err := os.WriteFile(path, append([]byte("global_epoch_idle_interval: 250ms\n"), yaml...), 0o600); err != nil {
		t.Fatal(err)
	}
	c := localcluster.StartT(t, path, localcluster.Options{})
	service, err := c.Reader(topology.KindGlobalEpoch, "us-central1", "")
	if err != nil {
		t.Fatal(err)
	}
	publisher, err := c.Reader(topology.KindPublisher, "us-east1", "us-east1")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// advanced returns how far the global epoch moved over d while read
	// reads every 20 ms.
	advanced := func(d time.Duration, read func(context.Context) (uint64, error)) uint64 {
		first, err := service.ReadBackground(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
			if _, err := read(ctx); err != nil {
				t.Fatal(err)
			}
		}
		last, err := service.ReadBackground(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("the global epoch moved %d in %v", last-first, d)
		return last - first
	}
	waitIdle := func() {
		t.Helper()
		var moved uint64
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
			if moved = advanced(2*time.Second, service.ReadBackground); moved <= 12 {
				return // the idle pace gives about 8 in 2 s, the full pace 28–50
			}
		}
		t.Fatalf("with only background reads the global epoch still moved %d in 2 s; want the idle pace (about 8)", moved)
	}
	waitIdle()
	if moved := advanced(2*time.Second, publisher.Read); moved < 20 {
		t.Fatalf("reads of a publisher moved the global epoch only %d in 2 s; want the full pace (about 50)", moved)
	}
	waitIdle()
	if moved := advanced(2*time.Second, service.Read); moved < 20 {
		t.Fatalf("reads of the service moved the global epoch only %d in 2 s; want the full pace (about 50)", moved)
	}
}
