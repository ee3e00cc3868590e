package ycsb

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/terroir-db/terroir/internal/latency"
)

func TestCoreWorkloads(t *testing.T) {
	for _, l := range []string{"a", "B", "c", "d", "e", "f"} {
		w, err := Core(l)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Validate(); err != nil {
			t.Errorf("workload %s: %v", l, err)
		}
	}
	if _, err := Core("g"); err == nil {
		t.Error("workload g accepted")
	}
	w, _ := Core("a")
	w.Update = 0.2
	if err := w.Validate(); err == nil {
		t.Error("proportions summing to 0.7 accepted")
	}
	w, _ = Core("e")
	counts := map[Op]int{}
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 10000; i++ {
		counts[w.pick(r.Float64())]++
	}
	if counts[OpScan] < 9300 || counts[OpInsert] < 350 || counts[OpRead] != 0 {
		t.Errorf("workload e mix over 10000 draws: %v, want ~95%% scans, ~5%% inserts", counts)
	}
}

// TestZipfianIsSkewed: item 0 of a zipfian over 1000 items draws far more
// often than uniform would, and every draw is in range.
func TestZipfianIsSkewed(t *testing.T) {
	z := newZipfian(1000)
	r := rand.New(rand.NewPCG(3, 4))
	hits := make([]int, 1000)
	const draws = 100000
	for i := 0; i < draws; i++ {
		n := z.next(r)
		if n >= 1000 {
			t.Fatalf("draw %d out of [0, 1000)", n)
		}
		hits[n]++
	}
	// With theta 0.99 over 1000 items, item 0 has probability ~1/zeta(1000) ≈ 0.13.
	if hits[0] < draws/12 || hits[0] < 20*hits[500] {
		t.Errorf("item 0 drawn %d times, item 500 %d times: not zipfian", hits[0], hits[500])
	}
}

func TestScrambledZipfianAndLatest(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	s := newScrambledZipfian()
	hot := map[uint64]int{}
	for i := 0; i < 50000; i++ {
		n := s.Next(r, 1000)
		if n >= 1000 {
			t.Fatalf("scrambled draw %d out of range", n)
		}
		hot[n]++
	}
	top := 0
	for _, c := range hot {
		top = max(top, c)
	}
	if top < 50000/100 { // uniform would give ~50 per item
		t.Errorf("hottest item drawn %d times of 50000: not skewed", top)
	}
	l := &latest{z: newZipfian(100)}
	newest := 0
	for i := 0; i < 10000; i++ {
		n := l.Next(r, 200) // the table grew to 200 records
		if n >= 200 {
			t.Fatalf("latest draw %d out of range", n)
		}
		if n >= 190 {
			newest++
		}
	}
	if newest < 5000 {
		t.Errorf("only %d of 10000 latest draws among the 10 newest records", newest)
	}
}

func TestKeySpaceSpreadsAndScansStayInPrefix(t *testing.T) {
	k := KeySpace{Prefixes: [][]byte{[]byte("a-"), []byte("n-")}}
	seen := map[byte]int{}
	for n := uint64(0); n < 100; n++ {
		key := k.Key(n)
		seen[key[0]]++
		if end := k.scanEnd(n); string(key) >= string(end) || key[0] != end[0] {
			t.Fatalf("record %d: key %q not below its scan end %q in the same prefix", n, key, end)
		}
	}
	if seen['a'] < 30 || seen['n'] < 30 {
		t.Errorf("keys over prefixes: %v", seen)
	}
}

// TestMergedRunsAreOneRun: two runs merged count both runs' operations,
// failures, retries and time, and their latencies are both runs'.
func TestMergedRunsAreOneRun(t *testing.T) {
	w, _ := Core("a")
	run := func(elapsed time.Duration, reads, updates int, d time.Duration) *Result {
		r := &Result{Workload: w, Clients: 16, Elapsed: elapsed, Retries: 1}
		for i := range r.Latency {
			r.Latency[i] = latency.New()
		}
		for range reads {
			r.Latency[OpRead].Record(d)
		}
		for range updates {
			r.Latency[OpUpdate].Record(d)
		}
		r.Failed[OpUpdate] = 2
		return r
	}
	a, b := run(time.Second, 100, 50, time.Millisecond), run(3*time.Second, 300, 150, 10*time.Millisecond)
	a.Merge(b)
	if a.Ops() != 600 || a.Elapsed != 4*time.Second || a.Retries != 2 || a.Failed[OpUpdate] != 4 {
		t.Fatalf("merged: %d ops in %v, %d retries, %d updates failed; want 600 in 4s, 2, 4", a.Ops(), a.Elapsed, a.Retries, a.Failed[OpUpdate])
	}
	if got := a.Throughput(); got != 150 {
		t.Errorf("merged throughput %.1f ops/s; want 150", got)
	}
	// A quarter of the reads took 1 ms, the rest 10 ms: the P50 is b's.
	if p50 := a.Latency[OpRead].Quantile(50); p50 < 9*time.Millisecond {
		t.Errorf("merged read P50 %v; want about 10 ms (three quarters of the reads)", p50)
	}
}
