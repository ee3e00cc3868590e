package epoch_test

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/terroir-db/terroir/internal/epoch"
	"github.com/terroir-db/terroir/internal/epoch/epochpb"
)

// goroutineID returns the calling goroutine's id, from its stack's first
// line ("goroutine 42 [running]:"): a test's way to tell goroutines apart.
func goroutineID(t *testing.T) uint64 {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	f := bytes.Fields(buf)
	if len(f) < 2 {
		t.Errorf("unexpected stack %q", buf)
		return 0
	}
	id, err := strconv.ParseUint(string(f[1]), 10, 64)
	if err != nil {
		t.Errorf("unexpected stack %q: %v", buf, err)
	}
	return id
}

// TestAReaderAsksAReplicaOnTheSameGoroutine: rounds one after another ask
// a replica from one goroutine that lives as long as the reader, not from a
// new goroutine per request, whose stack would grow anew each time (issue
// 17). The local replica's hook records the goroutine each request runs
// on. It fails if every request starts a goroutine ("40 requests ran on 40
// goroutines").
func TestAReaderAsksAReplicaOnTheSameGoroutine(t *testing.T) {
	c := startCluster(t)
	waitLeader(t, c, 1)
	r, err := c.EpochReader("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	on := map[uint64]int{}
	r.ServeLocally(1, func(ctx context.Context, req *epochpb.ReadEpochRequest) (*epochpb.ReadEpochResponse, error) {
		id := goroutineID(t)
		mu.Lock()
		on[id]++
		mu.Unlock()
		conn, err := c.Dialer("us-east1").Conn(1)
		if err != nil {
			return nil, err
		}
		return epochpb.NewEpochClient(conn).ReadEpoch(ctx, req)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const reads = 40
	for i := 0; i < reads; i++ {
		if _, err := r.Read(ctx); err != nil {
			t.Fatal(err)
		}
		// The round's other replies (and a straggler's) come in meanwhile:
		// its asker is idle again before the next round.
		time.Sleep(2 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	n := 0
	for _, c := range on {
		n += c
	}
	// A round that finds the asker still busy with a slow earlier request
	// runs on a goroutine of its own, and a loaded machine retries and
	// hedges more (CI once saw 108 requests on 14 goroutines). So the bound
	// is relative to the requests made: a goroutine per request gives one
	// request per goroutine, the asker at least four.
	if n < reads || len(on)*4 > n {
		t.Fatalf("%d requests ran on %d goroutines; want at least %d requests, at least 4 per goroutine", n, len(on), reads)
	}
}

// TestStartAllReadsWhileTheCallerWorks: StartAll's reads are under way
// when it returns, so the caller's work overlaps them. Its results are
// ReadAll's: a nil source reads 0, each source's error is joined, and a
// Source that is not a *Reader is read too (on a goroutine).
func TestStartAllReadsWhileTheCallerWorks(t *testing.T) {
	c := startCluster(t)
	waitLeader(t, c, 1)
	r, err := c.EpochReader("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	before, err := r.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rounds := r.Stats().Rounds
	wait := epoch.StartAll(ctx, r, nil, fixedSource{e: 7})
	// The read must be under way without wait being called: its round runs.
	deadline := time.Now().Add(5 * time.Second)
	for {
		if now := r.Stats().Rounds; now > rounds {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("StartAll's read did not start before its wait was called")
		}
		time.Sleep(time.Millisecond)
	}
	got, err := wait()
	if err != nil {
		t.Fatal(err)
	}
	if got[0] < before || got[1] != 0 || got[2] != 7 {
		t.Fatalf("StartAll read %v; want [≥%d 0 7]", got, before)
	}
	broken := errors.New("broken source")
	if _, err := epoch.StartAll(ctx, r, fixedSource{err: broken})(); !errors.Is(err, broken) {
		t.Fatalf("a source's error was not returned: %v", err)
	}
	r.Close()
	if _, err := epoch.StartAll(ctx, r)(); !errors.Is(err, epoch.ErrReaderClosed) {
		t.Fatalf("a closed reader's read: %v, want ErrReaderClosed", err)
	}
}

// fixedSource is a Source that is not a *Reader: it returns e, or err.
type fixedSource struct {
	e   uint64
	err error
}

func (s fixedSource) Read(context.Context) (uint64, error) { return s.e, s.err }

// TestAtLeastHearsAReplicaWhenItApplies: AtLeast asks each replica once and
// hears it the moment it applies the epoch (the replica waits for it),
// instead of asking again after backing off (issue 17: a publisher's
// acknowledgement, and so the global epoch's interval, waited for the
// retries). Each of 20 AtLeasts waits for the next local epoch, 10 ms
// away. It fails if AtLeast polls: "20 AtLeasts retried 102 attempts".
func TestAtLeastHearsAReplicaWhenItApplies(t *testing.T) {
	c := startCluster(t)
	pacer, err := c.EpochReader("us-east1") // its reads keep the full pace
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.EpochReader("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n = 20
	for range n {
		cur, err := pacer.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.AtLeast(ctx, cur+1); err != nil {
			t.Fatal(err)
		}
		if e, err := pacer.Read(ctx); err != nil || e < cur+1 {
			t.Fatalf("after AtLeast(%d) a read returned %d, %v", cur+1, e, err)
		}
	}
	if splits := r.Stats().Splits; splits >= n/2 {
		t.Fatalf("%d AtLeasts retried %d attempts; a replica asked should answer once it applies the epoch", n, splits)
	}
}
