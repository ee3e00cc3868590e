package rangeserver

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/terroir-db/terroir/internal/locktable"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
)

// fakeClock is a clock a test moves by hand.
type fakeClock struct{ now time.Time }

func (c *fakeClock) Now() time.Time          { return c.now }
func (c *fakeClock) advance(d time.Duration) { c.now = c.now.Add(d) }
func meta(id byte, priority uint64) *pb.TxnMeta {
	return &pb.TxnMeta{Id: append(make([]byte, 15), id), Priority: priority}
}

func TestNextLease(t *testing.T) {
	const self, other, span = 1, 2, 100
	for _, c := range []struct {
		name      string
		current   *pb.Lease
		e         uint64
		wantStart uint64 // 0: no proposal
	}{
		{"no lease yet", &pb.Lease{}, 50, 50},
		{"own lease, far from its end", &pb.Lease{Holder: self, Start: 10, End: 160, Seq: 3}, 100, 0},
		{"own lease, renewed keeping its start", &pb.Lease{Holder: self, Start: 10, End: 140, Seq: 3}, 100, 10},
		{"own lease lapsed", &pb.Lease{Holder: self, Start: 10, End: 90, Seq: 3}, 100, 100},
		{"another's lease lapsed", &pb.Lease{Holder: other, Start: 10, End: 90, Seq: 3}, 100, 100},
		{"another's lease ends soon: queued after it", &pb.Lease{Holder: other, Start: 10, End: 130, Seq: 3}, 100, 131},
		{"another's lease far from its end", &pb.Lease{Holder: other, Start: 10, End: 170, Seq: 3}, 100, 0},
	} {
		got := nextLease(c.current, self, c.e, span, span/2)
		switch {
		case c.wantStart == 0 && got != nil:
			t.Errorf("%s: proposed %v, want nothing", c.name, got)
		case c.wantStart != 0 && got == nil:
			t.Errorf("%s: proposed nothing, want a lease from %d", c.name, c.wantStart)
		case got != nil:
			if got.GetHolder() != self || got.GetStart() != c.wantStart || got.GetEnd() != c.e+span || got.GetSeq() != c.current.GetSeq()+1 {
				t.Errorf("%s: proposed %v, want [%d, %d] seq %d", c.name, got, c.wantStart, c.e+span, c.current.GetSeq()+1)
			}
			// Leader disjointness (DESIGN.md §3.3): a successor never
			// starts inside another holder's lease.
			if c.current.GetHolder() == other && got.GetStart() <= c.current.GetEnd() && c.e <= c.current.GetEnd() {
				t.Errorf("%s: %v overlaps the current lease %v", c.name, got, c.current)
			}
		}
	}
}

// waitUnder is a txnTable.acquire wait func whose waits are bounded by ctx.
func waitUnder(ctx context.Context) func() (context.Context, context.CancelFunc) {
	return func() (context.Context, context.CancelFunc) { return ctx, func() {} }
}

// TestOrphansFollowTheClock drives the transaction table's orphan decision
// with a fake clock (DESIGN.md §10): silence past the bound makes an orphan,
// a heartbeat or a lock wait under way does not, a prepared transaction is
// handed over for resolution once, and a prepared record left by an earlier
// lease at once.
func TestOrphansFollowTheClock(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1000, 0)}
	tt := newTxnTable(clock.Now, 0)
	const bound = 2 * time.Second
	ctx := context.Background()
	active, beating, prepared, waiter := meta(1, 10), meta(2, 20), meta(3, 30), meta(4, 5)
	incs := map[byte]uint64{}
	for _, m := range []*pb.TxnMeta{active, beating, prepared} {
		inc, err := tt.acquire(m, locktable.Point([]byte{m.GetId()[15]}), locktable.Exclusive, false, waitUnder(ctx))
		if err != nil {
			t.Fatal(err)
		}
		incs[m.GetId()[15]] = inc
	}
	if err := tt.startCommit(prepared, []*pb.Write{{Key: []byte{3}}}, 1, incs[3], txnPrepared); err != nil {
		t.Fatal(err)
	}
	// The older waiter waits for the beating transaction's lock.
	acquired := make(chan error, 1)
	go func() {
		_, err := tt.acquire(waiter, locktable.Point([]byte{2}), locktable.Exclusive, false, waitUnder(ctx))
		acquired <- err
	}()
	for tt.locks.Waiters() == 0 {
		time.Sleep(time.Millisecond)
	}

	clock.advance(bound - time.Millisecond)
	if idle, undecided := tt.orphans(bound, nil); len(idle)+len(undecided) != 0 {
		t.Fatalf("orphans before the bound: %d idle, %d undecided", len(idle), len(undecided))
	}
	if tt.heartbeat(beating.GetId(), incs[2]) {
		t.Fatal("a heartbeat under the right incarnation reported lost")
	}
	if !tt.heartbeat(beating.GetId(), incs[2]+1) {
		t.Fatal("a heartbeat under another incarnation was not reported lost")
	}
	clock.advance(2 * time.Millisecond)
	leftover := &pb.PreparedRecord{Txn: meta(9, 90)}
	idle, undecided := tt.orphans(bound, []*pb.PreparedRecord{leftover})
	if len(idle) != 1 || idle[0][15] != 1 {
		t.Errorf("idle = %v; want only the silent active transaction (the waiter waits, the other beat)", idle)
	}
	for _, id := range idle {
		tt.release(id, 0) // as the leader drops them
	}
	if len(undecided) != 2 {
		t.Fatalf("undecided = %d; want the silent prepared transaction and the leftover record", len(undecided))
	}
	if _, again := tt.orphans(bound, []*pb.PreparedRecord{leftover}); len(again) != 0 {
		t.Errorf("%d transactions handed over twice while being resolved", len(again))
	}
	for _, u := range undecided {
		tt.resolved(u)
	}
	clock.advance(bound)
	if _, again := tt.orphans(bound, nil); len(again) != 2 {
		t.Errorf("after a failed resolution and another bound, %d undecided; want 2 again", len(again))
	}
	// Releasing the beating transaction's lock lets the waiter in, under
	// its own record.
	tt.release(beating.GetId(), 42)
	if err := <-acquired; err != nil {
		t.Fatal(err)
	}
	if tt.highestEpoch() != 42 {
		t.Errorf("highest epoch = %d after a commit at 42", tt.highestEpoch())
	}
	if err := tt.startCommit(active, nil, 1, incs[1], txnCommitting); !errors.Is(err, ErrLocksLost) {
		t.Errorf("commit of the transaction dropped as idle = %v; want ErrLocksLost", err)
	}
}

// TestLoadSplitKey: a range over its request rate samples its request keys
// and, after the hot period, names a key that divides them evenly; a range
// whose load sits on one key, or that cooled down, names none.
func TestLoadSplitKey(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1000, 0)}
	lt := newLoadTracker(clock.Now, 100)
	key := func(i int) []byte { return []byte{byte('a' + i%26)} }
	// 3 s at 500 requests/s over 26 keys.
	for s := 0; s < 4; s++ {
		for i := 0; i < 500; i++ {
			lt.record(key(i * 7))
			clock.advance(2 * time.Millisecond)
		}
	}
	if q := lt.QPS(); q < 400 || q > 600 {
		t.Errorf("QPS = %.0f, want about 500", q)
	}
	k := lt.splitKey(2 * time.Second)
	if len(k) != 1 || k[0] < 'g' || k[0] > 't' {
		t.Fatalf("split key %q: want one near the middle of a…z", k)
	}
	if lt.splitKey(time.Hour) != nil {
		t.Error("a split key before the range was hot long enough")
	}
	// One hot key: no key divides the load.
	lt = newLoadTracker(clock.Now, 100)
	for i := 0; i < 2000; i++ {
		lt.record([]byte("hot"))
		clock.advance(2 * time.Millisecond)
	}
	if k := lt.splitKey(time.Second); k != nil {
		t.Errorf("split key %q for a load on one key", k)
	}
	// Cooling down stops the sampling.
	clock.advance(3 * time.Second)
	lt.record([]byte("a"))
	if k := lt.splitKey(0); k != nil || lt.QPS() != 0 {
		t.Errorf("after a quiet spell: split key %q, QPS %.0f", k, lt.QPS())
	}
}

// TestInheritanceNeedsTheSameLease: a split's right-hand range starts from
// the left-hand leader's highest epoch only under the very lease both halves
// held, held by this replica, and only once; otherwise it waits for the
// global epoch like any new leaseholder (DESIGN.md §3.5, §11).
func TestInheritanceNeedsTheSameLease(t *testing.T) {
	r := &Replica{self: 1}
	for _, c := range []struct {
		name  string
		lease *pb.Lease
		ok    bool
	}{
		{"another lease", &pb.Lease{Holder: 1, Start: 6}, false},
		{"another holder", &pb.Lease{Holder: 2, Start: 5}, false},
		{"the same lease", &pb.Lease{Holder: 1, Start: 5}, true},
	} {
		r.Inherit(Inheritance{leaseStart: 5, highest: 42, set: true})
		if in, ok := r.takeInheritance(c.lease); ok != c.ok || (ok && in.highest != 42) {
			t.Errorf("%s: inherited %d, %v; want 42, %v", c.name, in.highest, ok, c.ok)
		}
		if _, ok := r.takeInheritance(c.lease); ok {
			t.Errorf("%s: inherited twice", c.name)
		}
	}
}

// TestTickReusesAFreshEpochFarFromRenewal: a leaseholder's tick skips the
// epoch read only while its lease is active, a fresh read is younger than
// epochRefresh, and renewal stays out of reach at twice the seen rate.
func TestTickReusesAFreshEpochFarFromRenewal(t *testing.T) {
	at := time.Unix(1000, 0)
	read := epochReading{at: at, epoch: 500, perSec: 100} // 100 epochs/s: one per 10 ms
	ours := &pb.Lease{Holder: 1, Start: 450, End: 600}
	const renew = 50
	for _, tc := range []struct {
		name  string
		read  epochReading
		after time.Duration
		lease *pb.Lease
		cur   uint64
		want  bool
	}{
		{"fresh read, far from renewal", read, 20 * time.Millisecond, ours, 500, true},
		{"read too old", read, epochRefresh, ours, 500, false},
		{"rate unknown", epochReading{at: at, epoch: 500}, 20 * time.Millisecond, ours, 500, false},
		// 500 + 2·100·0.09 + 2 + 50 = 570 < 600: still far.
		{"older read, still far", read, 90 * time.Millisecond, ours, 500, true},
		// 540 + 4 + 2 + 50 = 596 < 600: far; at 545 it is not.
		{"nearly due", read, 20 * time.Millisecond, ours, 540, true},
		{"due", read, 20 * time.Millisecond, ours, 545, false},
		{"another's lease", read, 20 * time.Millisecond, &pb.Lease{Holder: 2, Start: 450, End: 600}, 500, false},
		{"lease not yet active", read, 20 * time.Millisecond, &pb.Lease{Holder: 1, Start: 520, End: 620}, 500, false},
		{"clock went back", read, -time.Millisecond, ours, 500, false},
	} {
		if got := tc.read.reusable(at.Add(tc.after), tc.lease, 1, tc.cur, renew); got != tc.want {
			t.Errorf("%s: reusable %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestYoungerWaitsForAOnePhaseCommit: once a transaction starts its
// one-phase commit it takes no more locks, so a younger one that conflicts
// with it waits for its release instead of dying (as for a prepared one),
// while before that point it still dies (wait-die).
func TestYoungerWaitsForAOnePhaseCommit(t *testing.T) {
	tt := newTxnTable(time.Now, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	older, younger := meta(1, 10), meta(2, 20)
	k := locktable.Point([]byte("k"))
	inc, err := tt.acquire(older, k, locktable.Exclusive, false, waitUnder(ctx))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tt.acquire(younger, k, locktable.Exclusive, false, waitUnder(ctx)); !errors.Is(err, ErrConflict) {
		t.Fatalf("younger against an executing holder: %v, want ErrConflict", err)
	}
	if err := tt.startCommit(older, []*pb.Write{{Key: []byte("k")}}, 1, inc, txnCommitting); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		_, err := tt.acquire(younger, k, locktable.Exclusive, false, waitUnder(ctx))
		got <- err
	}()
	for tt.locks.Waiters() == 0 {
		select {
		case err := <-got:
			t.Fatalf("younger against a one-phase commit did not wait: %v", err)
		case <-time.After(time.Millisecond):
		}
	}
	tt.release(older.GetId(), 7)
	if err := <-got; err != nil {
		t.Fatalf("younger against a one-phase commit: %v, want the lock once it released", err)
	}
}

// TestASizeSplitsMiddleIsReadOncePerGeneration: the middle key found for
// a split by size is reused while the range's generation holds; a range
// found without a middle is read again only once it grew by an eighth of
// split_size, and any new generation reads it again.
func TestASizeSplitsMiddleIsReadOncePerGeneration(t *testing.T) {
	const split = 800
	var q splitQueue
	if _, ok := q.cachedMid(1, 1000, split); ok {
		t.Fatal("a middle before any was found")
	}
	q.midGen, q.midSize, q.midKey = 1, 1000, []byte("m")
	if k, ok := q.cachedMid(1, 5000, split); !ok || string(k) != "m" {
		t.Errorf("same generation: %q, %v; want m", k, ok)
	}
	if _, ok := q.cachedMid(2, 1000, split); ok {
		t.Error("a middle reused at a new generation")
	}
	q.midKey = nil
	if k, ok := q.cachedMid(1, 1099, split); !ok || k != nil {
		t.Errorf("no middle, grown by less than an eighth: %q, %v; want none, cached", k, ok)
	}
	if _, ok := q.cachedMid(1, 1100, split); ok {
		t.Error("no middle, grown by an eighth of split_size: not read again")
	}
}
