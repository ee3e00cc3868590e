package epoch

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/terroir-db/terroir/internal/epoch/epochpb"
	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/transport"
)

// fakeReplicas answers a Reader's ReadEpoch requests in place of a group's
// replicas: each node reports its epoch under the bootstrap configuration,
// or fails, or hangs until the request's context ends.
type fakeReplicas struct {
	mu     sync.Mutex
	epochs map[uint64]uint64
	failed map[uint64]bool
	hung   map[uint64]bool
	delay  map[uint64]time.Duration // how long a node takes to answer
	asked  map[uint64]int
}

func newFakeReplicas(epochs map[uint64]uint64) *fakeReplicas {
	return &fakeReplicas{epochs: epochs, failed: map[uint64]bool{}, hung: map[uint64]bool{}, delay: map[uint64]time.Duration{}, asked: map[uint64]int{}}
}

func (f *fakeReplicas) serve(ctx context.Context, id uint64, _ *epochpb.ReadEpochRequest) (*epochpb.ReadEpochResponse, error) {
	f.mu.Lock()
	f.asked[id]++
	e, failed, hung, delay := f.epochs[id], f.failed[id], f.hung[id], f.delay[id]
	f.mu.Unlock()
	if delay > 0 && !transport.SleepCtx(ctx, delay) {
		return nil, ctx.Err()
	}
	switch {
	case hung:
		<-ctx.Done()
		return nil, ctx.Err()
	case failed:
		return nil, errors.New("replica down")
	}
	return &epochpb.ReadEpochResponse{Epoch: e}, nil
}

// settle waits, at most a second, until the nodes have got want requests
// in all: an ask sent on a goroutine of its own may still be on its way
// when the read it served has returned.
func (f *fakeReplicas) settle(want int) {
	total := func() int {
		f.mu.Lock()
		defer f.mu.Unlock()
		n := 0
		for _, c := range f.asked {
			n += c
		}
		return n
	}
	for deadline := time.Now().Add(time.Second); total() < want && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
}

// counts returns how many requests each node got, and forgets them.
func (f *fakeReplicas) counts() map[uint64]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.asked
	f.asked = map[uint64]int{}
	return out
}

// fakeReader is a Reader of a 3-voter group on nodes 1–3, running on node
// 1 (whose replica answers in process), whose requests f answers.
func fakeReader(t *testing.T, f *fakeReplicas) *Reader {
	r := NewReader(nil, topology.Group{ID: 1, Region: "r", Replicas: []uint64{1, 2, 3}})
	r.call = f.serve
	r.ServeLocally(1, func(ctx context.Context, req *epochpb.ReadEpochRequest) (*epochpb.ReadEpochResponse, error) {
		return f.serve(ctx, 1, req)
	})
	t.Cleanup(r.Close)
	return r
}

// TestAReadAsksABareMajorityFirst: replicas that agree are asked two at a
// time, this node's and one other, always the same one; a read pays
// for the third only when one of the two fails, hangs past hedgeAfter, or
// disagrees, and then still returns what a majority reports. Only the
// first read asks all three: one per demandEvery does (demandDue). It
// fails if every read asks all three replicas ("asked map[1:20 2:20
// 3:20]").
func TestAReadAsksABareMajorityFirst(t *testing.T) {
	f := newFakeReplicas(map[uint64]uint64{1: 50, 2: 50, 3: 50})
	r := fakeReader(t, f)
	r.demandEvery = time.Hour
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	read := func(want uint64) {
		t.Helper()
		if e, err := r.Read(ctx); err != nil || e != want {
			t.Fatalf("read %d, %v; want %d", e, err, want)
		}
	}
	const reads = 20
	for i := 0; i < reads; i++ {
		read(50)
	}
	// A read whose two replies took over hedgeAfter (at least 1 ms: a
	// loaded machine's scheduling delay) asked the third too, as it should: each
	// such hedge adds one ask of a third replica. Beyond those, and the
	// first read's, none.
	hedges := r.Stats().Hedges
	f.settle(2*reads + 1 + int(hedges))
	got := f.counts()
	if got[1] != reads || got[2]+got[3] != reads+1+int(hedges) || hedges > reads/4 {
		t.Fatalf("agreeing replicas: asked %v with %d hedges; want %d reads of node 1, as many of nodes 2 and 3 with one more and one per hedge, and few hedges", got, hedges, reads)
	}
	other := r.preferred.Load()
	third := 5 - other // of nodes 2 and 3, the one not preferred

	f.mu.Lock()
	f.failed[other] = true
	f.mu.Unlock()
	read(50) // node 1 and the third
	if got := f.counts(); got[third] != 1 {
		t.Fatalf("with node %d down: asked %v; want the third, node %d, too", other, got, third)
	}
	if p := r.preferred.Load(); p != third {
		t.Fatalf("preferred %d after it agreed; want %d", p, third)
	}

	f.mu.Lock()
	f.failed[other] = false
	f.hung[third] = true
	f.mu.Unlock()
	began := time.Now()
	read(50) // node 1 and, after hedgeAfter, node `other`
	if took := time.Since(began); took < hedgeMin {
		t.Fatalf("with node %d hung the read took %v; it should have waited %v before asking the third", third, took, hedgeMin)
	}
	if got := f.counts(); got[other] != 1 {
		t.Fatalf("with node %d hung: asked %v; want node %d after the hedge", third, got, other)
	}

	f.mu.Lock()
	f.hung[third] = false
	f.epochs = map[uint64]uint64{1: 51, 2: 50, 3: 50} // node 1 applied 51 first
	f.mu.Unlock()
	read(50) // 1 and `other` split: the third sides with `other`
	if got := f.counts(); got[1]+got[2]+got[3] != 3 {
		t.Fatalf("split replicas: asked %v; want all three once", got)
	}
	st := r.Stats()
	splits, after := st.Splits, st.Hedges
	if splits != 0 || after-hedges != 3 {
		t.Fatalf("splits %d, hedges %d since the agreeing reads; want 0 and 3 (a failure, a hang, a disagreement: one each, however late the replies)", splits, after-hedges)
	}
}

// TestTheHedgeWaitsForTheSlowTail: an attempt asks the third voter only
// once it has taken twice the reader's recent time to decide (within
// [hedgeMin, hedgeMax]), so replicas that all answer in 3 ms (a loaded
// machine) cost two asks a read, not three; and a replica that then hangs
// costs one read the wait before the hedge, after which the reader
// prefers the one that answered. It fails with a fixed 1 ms hedge
// ("30 reads hedged 30 times").
func TestTheHedgeWaitsForTheSlowTail(t *testing.T) {
	const slow = 3 * time.Millisecond
	f := newFakeReplicas(map[uint64]uint64{1: 50, 2: 50, 3: 50})
	f.delay[2], f.delay[3] = slow, slow
	r := fakeReader(t, f)
	r.demandEvery = time.Hour
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	read := func() {
		t.Helper()
		if e, err := r.Read(ctx); err != nil || e != 50 {
			t.Fatalf("read %d, %v; want 50", e, err)
		}
	}
	if got := r.hedgeAfter(); got != hedgeMin {
		t.Fatalf("a reader that has decided nothing hedges after %v; want %v", got, hedgeMin)
	}
	read() // the first read asks every voter (demandDue): no hedge to time
	const reads = 30
	before := r.Stats().Hedges
	for range reads {
		read()
	}
	after := r.Stats().Hedges
	// The first bare attempt hedges after hedgeMin, as nothing has been
	// timed yet; from then on the wait is twice ~3 ms, capped at 5 ms. A
	// reply late past that (a loaded CI machine) hedges too, rarely.
	if hedged := after - before; hedged > reads/3 {
		t.Fatalf("%d reads hedged %d times with every replica answering in %v; want at most %d", reads, hedged, slow, reads/3)
	}
	if got := r.hedgeAfter(); got < 2*slow-slow/2 && got != hedgeMax {
		t.Fatalf("after reads that took about %v, the hedge waits %v; want about twice that, at most %v", slow, got, hedgeMax)
	}
	f.settle(1 + 2*reads + int(after-before))
	f.counts()

	other := r.preferred.Load()
	third := 5 - other
	f.mu.Lock()
	f.hung[other] = true
	f.mu.Unlock()
	wait := r.hedgeAfter()
	began := time.Now()
	read()
	if took := time.Since(began); took < wait {
		t.Fatalf("with node %d hung the read took %v; it should have waited %v before asking node %d", other, took, wait, third)
	}
	if got := f.counts(); got[third] != 1 {
		t.Fatalf("with node %d hung: asked %v; want node %d after the hedge", other, got, third)
	}
	if p := r.preferred.Load(); p != third {
		t.Fatalf("preferred %d after node %d hung; want %d, which answered", p, other, third)
	}
}

// TestHedgeAfterIsTwiceTheTimeToDecideWithinItsBounds: the wait before a
// hedge follows the moving mean of the time to decide, within
// [hedgeMin, hedgeMax].
func TestHedgeAfterIsTwiceTheTimeToDecideWithinItsBounds(t *testing.T) {
	r := NewReader(nil, topology.Group{ID: 1, Region: "r", Replicas: []uint64{1, 2, 3}})
	defer r.Close()
	for _, tc := range []struct {
		decided []time.Duration
		want    time.Duration
	}{
		{nil, hedgeMin},
		{[]time.Duration{100 * time.Microsecond}, hedgeMin},
		{[]time.Duration{1500 * time.Microsecond}, 3 * time.Millisecond},
		{[]time.Duration{time.Second}, hedgeMax},
		// One slow attempt among fast ones moves the mean by an eighth.
		{[]time.Duration{time.Millisecond, 9 * time.Millisecond}, 4 * time.Millisecond},
	} {
		r.decideNs.Store(0)
		for _, d := range tc.decided {
			r.observeDecide(d)
		}
		if got := r.hedgeAfter(); got != tc.want {
			t.Errorf("after attempts that took %v: hedge after %v, want %v", tc.decided, got, tc.want)
		}
	}
}

// TestAReadThatAsksReachesEveryVoterOncePerPeriod: a read that asks for
// the epoch (Read) asks every voter once per demandEvery, so the group's
// leader, whichever voter it is, hears the demand and keeps the full pace;
// background reads never do. It fails if reads that ask reach only a bare
// majority: "the first read asked 2 replicas; want all 3".
func TestAReadThatAsksReachesEveryVoterOncePerPeriod(t *testing.T) {
	f := newFakeReplicas(map[uint64]uint64{1: 50, 2: 50, 3: 50})
	r := fakeReader(t, f)
	r.demandEvery = time.Hour
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	asks := func(what string, read func(context.Context) (uint64, error), want int) {
		t.Helper()
		before := r.Stats().Hedges
		if _, err := read(ctx); err != nil {
			t.Fatal(err)
		}
		// A bare majority's reply later than hedgeAfter (a loaded
		// machine) asks the third voter too: an ask of all three.
		if after := r.Stats().Hedges; after > before {
			want = 3
		}
		f.settle(want)
		got := f.counts()
		if n := got[1] + got[2] + got[3]; n != want {
			t.Fatalf("%s asked %d replicas (%v); want %d", what, n, got, want)
		}
	}
	for range 3 {
		asks("a background read", r.ReadBackground, 2)
	}
	asks("the first read", r.Read, 3)
	asks("the next read", r.Read, 2)
	r.demandEvery = 10 * time.Millisecond
	time.Sleep(20 * time.Millisecond)
	asks("a read a period later", r.Read, 3)
	r.demandEvery = time.Hour
	asks("a background read", r.ReadBackground, 2)
	asks("a read", r.Read, 2)
}

// TestFirstAsksCoversEveryConfiguration: a bare majority of a single
// half, led by this node and the preferred voter; every voter at once for
// a joint configuration or a group under three voters.
func TestFirstAsksCoversEveryConfiguration(t *testing.T) {
	r := NewReader(nil, topology.Group{ID: 1, Region: "r", Replicas: []uint64{1, 2, 3}})
	defer r.Close()
	r.ServeLocally(3, func(context.Context, *epochpb.ReadEpochRequest) (*epochpb.ReadEpochResponse, error) { return nil, nil })
	for _, tc := range []struct {
		name      string
		halves    [][]uint64
		preferred uint64
		want      []uint64
	}{
		{"three voters, none preferred", [][]uint64{{1, 2, 3}}, 0, []uint64{3, 1}},
		{"three voters, 2 preferred", [][]uint64{{1, 2, 3}}, 2, []uint64{3, 2}},
		{"preferred voter gone", [][]uint64{{1, 3, 4}}, 2, []uint64{3, 1}},
		{"five voters", [][]uint64{{1, 2, 3, 4, 5}}, 5, []uint64{3, 5, 1}},
		{"self not a voter", [][]uint64{{1, 2, 4}}, 4, []uint64{4, 1}},
		{"joint", [][]uint64{{1, 2, 3}, {1, 2, 4}}, 0, nil},
		{"two voters", [][]uint64{{1, 3}}, 0, nil},
	} {
		got := r.firstAsks(config{index: 1, halves: tc.halves}, tc.preferred)
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: first asks %v, want %v", tc.name, got, tc.want)
		}
	}
}
