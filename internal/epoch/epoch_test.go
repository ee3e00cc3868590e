package epoch_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/terroir-db/terroir/internal/epoch"
	"github.com/terroir-db/terroir/internal/localcluster"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// read is one completed ReadEpoch with its real-time interval.
type read struct {
	start, end time.Time
	epoch      uint64
}

// history collects reads from concurrent clients.
type history struct {
	mu      sync.Mutex
	reads   []read
	fails   int
	lastErr error  // the last failed read's
	newest  uint64 // the largest epoch read so far
}

// waitAdvance waits until the reads in h show 10 more advances and hold
// has passed (so reads meet the state a test set up), failing after 10 s.
func (h *history) waitAdvance(t *testing.T, what string, hold time.Duration) {
	t.Helper()
	newest := func() (uint64, error) {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.newest, h.lastErr
	}
	from, _ := newest()
	since := time.Now()
	for e, err := newest(); e < from+10 || time.Since(since) < hold; e, err = newest() {
		if time.Since(since) > 10*time.Second {
			t.Fatalf("after %s the epoch read did not advance 10 times in 10 s (stuck at %d; last error %v)", what, e, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// readContinuously starts `each` goroutines on each of `clients` epoch
// readers of us-east1, recording every read in h until ctx ends; wg counts
// them.
func readContinuously(t *testing.T, ctx context.Context, c *localcluster.Cluster, h *history, clients, each int, wg *sync.WaitGroup) {
	t.Helper()
	for client := 0; client < clients; client++ {
		r, err := c.EpochReader("us-east1")
		if err != nil {
			t.Fatal(err)
		}
		for g := 0; g < each; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				readUntil(ctx, r, h.add, h.fail)
			}()
		}
	}
}

// fail records a failed read.
func (h *history) fail(err error) {
	h.mu.Lock()
	h.fails++
	h.lastErr = err
	h.mu.Unlock()
}

func (h *history) add(r read) {
	h.mu.Lock()
	h.reads = append(h.reads, r)
	h.newest = max(h.newest, r.epoch)
	h.mu.Unlock()
}

// checkMonotonic asserts invariant 1 of DESIGN.md §3: no read returns less than a
// read that completed before it started.
func checkMonotonic(t *testing.T, reads []read) { checkMonotonicWithin(t, reads, 0) }

// checkMonotonicWithin asserts that no read returns less than slack below a read
// that completed before it started (slack 1 is the global epoch invariant, §3.2).
func checkMonotonicWithin(t *testing.T, reads []read, slack uint64) {
	t.Helper()
	newest := newestEndedBefore(reads)
	for _, r := range reads {
		if m := newest(r.start); m > r.epoch+slack {
			t.Fatalf("monotonicity violated: read started %v returned %d, but a read completed before it returned %d",
				r.start.Format(time.StampMicro), r.epoch, m)
		}
	}
}

// newestEndedBefore returns a lookup of the largest epoch among the reads
// that ended strictly before a time (0 if none).
func newestEndedBefore(reads []read) func(time.Time) uint64 {
	byEnd := slices.SortedFunc(slices.Values(reads), func(a, b read) int { return a.end.Compare(b.end) })
	prefixMax := make([]uint64, len(byEnd))
	var m uint64
	for i, r := range byEnd {
		m = max(m, r.epoch)
		prefixMax[i] = m
	}
	return func(t time.Time) uint64 {
		n, _ := slices.BinarySearchFunc(byEnd, t, func(r read, t time.Time) int { return r.end.Compare(t) })
		if n == 0 {
			return 0
		}
		return prefixMax[n-1]
	}
}

// readUntil reads r, one read at a time, until stop, giving each completed
// read to done and each failure but stop's to failed (if not nil).
func readUntil(stop context.Context, r *epoch.Reader, done func(read), failed func(error)) {
	for stop.Err() == nil {
		ctx, cancel := context.WithTimeout(stop, time.Second)
		start := time.Now()
		e, err := r.Read(ctx)
		end := time.Now()
		cancel()
		switch {
		case err == nil:
			done(read{start, end, e})
		case failed != nil && !errors.Is(err, context.Canceled):
			failed(err)
		}
	}
}

func TestCheckMonotonicCatchesViolation(t *testing.T) {
	t0 := time.Now()
	ok := []read{{t0, t0.Add(2), 5}, {t0.Add(1), t0.Add(3), 4}, {t0.Add(4), t0.Add(5), 5}}
	checkMonotonic(t, ok) // overlapping reads may disagree
	bad := append(ok, read{t0.Add(6), t0.Add(7), 4})
	ft := &testing.T{}
	done := make(chan struct{})
	go func() { defer close(done); checkMonotonic(ft, bad) }()
	<-done
	if !ft.Failed() {
		t.Fatal("checker accepted a read that went backwards")
	}
}

func startCluster(t *testing.T) *localcluster.Cluster {
	t.Helper()
	return localcluster.StartT(t, "../../examples/one-region.yaml", localcluster.Options{CompactAfter: 200})
}

func waitLeader(t *testing.T, c *localcluster.Cluster, group uint64) uint64 {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if id := c.Leader(group); id != 0 {
			return id
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("group %d elected no leader in 10s", group)
	return 0
}

// TestMonotonicUnderFaults records every read of two client processes (8
// goroutines each) while the epoch group's leader is killed and restarted, a
// follower is restarted, and the new leader is cut off and healed.
func TestMonotonicUnderFaults(t *testing.T) {
	c := startCluster(t)
	const group = 1
	leader := waitLeader(t, c, group)

	h := &history{}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	readContinuously(t, ctx, c, h, 2, 8, &wg)
	waitAdvance := func(what string) { t.Helper(); h.waitAdvance(t, what, 300*time.Millisecond) }
	waitAdvance("start")
	if err := c.StopNode(leader); err != nil {
		t.Fatal(err)
	}
	waitAdvance("killing the leader")
	if err := c.RestartNode(leader); err != nil {
		t.Fatal(err)
	}
	waitAdvance("restarting the old leader")

	newLeader := waitLeader(t, c, group)
	follower := uint64(1)
	for follower == newLeader {
		follower++
	}
	if err := c.StopNode(follower); err != nil {
		t.Fatal(err)
	}
	if err := c.RestartNode(follower); err != nil {
		t.Fatal(err)
	}
	waitAdvance("restarting a follower")

	c.Net.CutNode(newLeader)
	waitAdvance("cutting off the leader")
	c.Net.Heal()
	waitAdvance("healing the partition")

	stop()
	wg.Wait()
	if len(h.reads) < 100 {
		t.Fatalf("only %d reads completed", len(h.reads))
	}
	checkMonotonic(t, h.reads)
	t.Logf("%d reads checked, %d failed (unavailable during faults), final epoch %d", len(h.reads), h.fails, h.newest)
}

// TestLaggingReplicaCatchesUpBySnapshot stops a follower long enough for the log
// to be compacted past it, then checks it rejoins and serves a current epoch.
func TestLaggingReplicaCatchesUpBySnapshot(t *testing.T) {
	c := startCluster(t) // CompactAfter 200 entries: 2 s of epochs
	leader := waitLeader(t, c, 1)
	follower := uint64(1)
	for follower == leader {
		follower++
	}
	if err := c.StopNode(follower); err != nil {
		t.Fatal(err)
	}
	r, err := c.EpochReader("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	before, err := r.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for {
		e, err := r.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if e > before+300 { // past a compaction (every 200 entries)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := c.RestartNode(follower); err != nil {
		t.Fatal(err)
	}
	target, _ := r.Read(ctx)
	rep := c.Node(follower).EpochReplica(1)
	for rep.Epoch() < target {
		if ctx.Err() != nil {
			t.Fatalf("restarted follower stuck at epoch %d, cluster at %d", rep.Epoch(), target)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The follower must now be part of a majority: stop another node and read.
	other := uint64(1)
	for other == follower || other == c.Leader(1) {
		other++
	}
	if err := c.StopNode(other); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Read(ctx); err != nil {
		t.Fatalf("read with the caught-up follower in the majority: %v", err)
	}
}
