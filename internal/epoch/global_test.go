package epoch_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
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
				readUntil(stop, r, h.add, h.fail)
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
	stopped := map[uint64]time.Time{}
	for _, group := range []uint64{1, 13} { // the global service, then us-east1's publisher
		leader := waitLeader(t, c, group)
		if err := c.StopNode(leader); err != nil {
			t.Fatal(err)
		}
		stopped[group] = time.Now()
		advance("killing the leader of group " + string(rune('0'+group%10)))
		if err := c.RestartNode(leader); err != nil {
			t.Fatal(err)
		}
		advance("restarting it")
	}
	stopReads()
	readsStopped := time.Now()
	wg.Wait()
	checkMonotonicWithin(t, h.reads, 1)
	t.Logf("%d publisher reads checked (%d failed during faults), global epoch reached %d", len(h.reads), h.fails, h.newest)
	for _, group := range []uint64{1, 13} {
		to := stopped[group].Add(5 * time.Second)
		if readsStopped.Before(to) {
			to = readsStopped
		}
		t.Logf("group %d's leader stopped: no publisher read completed for %v at most in the %v after (publisher_lease %v)",
			group, longestGap(h.reads, stopped[group], to).Round(time.Millisecond), to.Sub(stopped[group]).Round(time.Millisecond), c.Topology.PublisherLease)
	}
}

// longestGap returns the longest span within [from, to] in which no read
// completed.
func longestGap(reads []read, from, to time.Time) time.Duration {
	ends := []time.Time{from, to}
	for _, r := range reads {
		if r.end.After(from) && r.end.Before(to) {
			ends = append(ends, r.end)
		}
	}
	slices.SortFunc(ends, time.Time.Compare)
	var gap time.Duration
	for i := 1; i < len(ends); i++ {
		gap = max(gap, ends[i].Sub(ends[i-1]))
	}
	return gap
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
// (1 s here); reads of a region's publisher — told to the service with
// each Publish — and reads of the service itself bring back the full pace
// (an advance per publish round: about 40 ms, 70 ms under -race, over
// 140 ms while the whole suite runs beside it). It fails if background
// reads kept the full pace, or if either kind of read did not at least
// quadruple the idle pace.
func TestAnIdleGlobalEpochSlowsAndAReadRestoresThePace(t *testing.T) {
	yaml, err := os.ReadFile("../../examples/three-regions.yaml")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "topology.yaml")
	// A 1 s idle interval (which needs a 4 s publisher lease) keeps the idle
	// pace (about 2 in 2 s) far below the full pace, even when the full pace
	// slows to 14 in 2 s beside the rest of the suite on 2 cores.
	yaml = bytes.Replace(yaml, []byte("publisher_lease: 1s"), []byte("publisher_lease: 4s"), 1)
	if err := os.WriteFile(path, append([]byte("global_epoch_idle_interval: 1s\n"), yaml...), 0o600); err != nil {
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
	const idleMoves = 2 // in 2 s at the 1 s idle interval
	waitIdle := func() {
		t.Helper()
		var moved uint64
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
			if moved = advanced(2*time.Second, service.ReadBackground); moved <= 2*idleMoves {
				return // the idle pace gives about 2 in 2 s, the full pace 14–50
			}
		}
		t.Fatalf("with only background reads the global epoch still moved %d in 2 s; want the idle pace (about 2)", moved)
	}
	waitIdle()
	if moved := advanced(2*time.Second, publisher.Read); moved < 4*idleMoves {
		t.Fatalf("reads of a publisher moved the global epoch only %d in 2 s; want the full pace (about 50), at least 4 times the idle pace's %d", moved, idleMoves)
	}
	waitIdle()
	if moved := advanced(2*time.Second, service.Read); moved < 4*idleMoves {
		t.Fatalf("reads of the service moved the global epoch only %d in 2 s; want the full pace (about 50), at least 4 times the idle pace's %d", moved, idleMoves)
	}
}

// TestAServiceReadIsNeverBelowAPublishedEpoch: once a publisher shows a
// global epoch, no later read of the global epoch service returns less (a
// strong snapshot reads the service and must see every transaction that
// committed at an epoch a publisher showed before it began). It holds
// because the service publishes an epoch only once a majority of its
// replicas has applied it. The WAN is made instant and 25% of messages are
// dropped, so a leader's commit often reaches neither follower for a
// heartbeat while its publish gets through. It fails if the service
// publishes an epoch its leader alone has applied: "a read of the service
// returned 1041, after a publisher showed 1042".
func TestAServiceReadIsNeverBelowAPublishedEpoch(t *testing.T) {
	c := startThreeRegions(t)
	regions := []string{"us-east1", "us-west1", "us-central1"}
	for i, a := range regions {
		for _, b := range regions[i+1:] {
			c.Net.SetRTT(a, b, 0)
		}
	}
	stop, cancel := context.WithTimeout(context.Background(), 12*time.Second)
	defer cancel()
	var mu sync.Mutex
	var published, served []read
	record := func(r *epoch.Reader, into *[]read) {
		readUntil(stop, r, func(rd read) {
			mu.Lock()
			*into = append(*into, rd)
			mu.Unlock()
		}, nil)
	}
	var wg sync.WaitGroup
	for _, region := range regions {
		kind, of, into := topology.KindPublisher, region, &published
		if region == "us-central1" {
			kind, of, into = topology.KindGlobalEpoch, "", &served
		}
		r, err := c.Reader(kind, region, of)
		if err != nil {
			t.Fatal(err)
		}
		for range 3 {
			wg.Add(1)
			go func() { defer wg.Done(); record(r, into) }()
		}
	}
	time.Sleep(time.Second)
	c.Net.SetDropRate(0.25)
	wg.Wait()
	c.Net.Heal()
	if len(published) < 100 || len(served) < 100 {
		t.Fatalf("too few reads to check: %d of publishers, %d of the service", len(published), len(served))
	}
	if err := checkServiceNotBehind(published, served); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d publisher reads and %d service reads checked", len(published), len(served))
}

// checkServiceNotBehind returns an error naming a read of the service that
// returned less than a publisher read that completed before it started.
func checkServiceNotBehind(published, served []read) error {
	newest := newestEndedBefore(published)
	for _, s := range served {
		if m := newest(s.start); m > s.epoch {
			return fmt.Errorf("a read of the service returned %d, after a publisher showed %d", s.epoch, m)
		}
	}
	return nil
}

func TestCheckServiceNotBehindCatchesAStaleServiceRead(t *testing.T) {
	t0 := time.Now()
	published := []read{{t0, t0.Add(2), 7}, {t0.Add(3), t0.Add(5), 8}}
	ok := []read{{t0.Add(1), t0.Add(4), 7}, {t0.Add(6), t0.Add(7), 8}} // the first overlaps the read of 8
	if err := checkServiceNotBehind(published, ok); err != nil {
		t.Fatalf("rejected a valid history: %v", err)
	}
	if err := checkServiceNotBehind(published, append(ok, read{t0.Add(8), t0.Add(9), 7})); err == nil {
		t.Fatal("accepted a service read of 7 after a publisher showed 8")
	}
}
