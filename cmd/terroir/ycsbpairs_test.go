package main

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/terroir-db/terroir/internal/ycsb"
)

// timedStore is a ycsb.Store whose every operation takes op and appends
// the store's name to a log the two stores of a test share, at most once
// per run of operations in a row (so the log shows the order the stores
// were driven in).
type timedStore struct {
	name string
	op   time.Duration
	mu   *sync.Mutex
	log  *[]string
}

func (s *timedStore) do(ctx context.Context) error {
	s.mu.Lock()
	if n := len(*s.log); n == 0 || (*s.log)[n-1] != s.name {
		*s.log = append(*s.log, s.name)
	}
	s.mu.Unlock()
	select {
	case <-time.After(s.op):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *timedStore) Read(ctx context.Context, _ []byte) error     { return s.do(ctx) }
func (s *timedStore) Write(ctx context.Context, _, _ []byte) error { return s.do(ctx) }
func (s *timedStore) Scan(ctx context.Context, _, _ []byte, _ int) error {
	return s.do(ctx)
}
func (s *timedStore) ReadModifyWrite(ctx context.Context, _, _ []byte) error { return s.do(ctx) }
func (s *timedStore) Load(context.Context, [][]byte, [][]byte) error         { return nil }
func (s *timedStore) Retries() int64                                         { return 0 }

// TestPairsAlternateTheSystemsAndMergeEachOnesSlices: a paired run drives
// the two stores in turn, the first first in every pair, each for the
// duration split into the pairs, and returns each store's slices as one
// run of about the whole duration. A store whose operations take half as
// long as the other's does about twice its throughput. It fails if the
// stores run one after the other ("driven in order [a b]").
func TestPairsAlternateTheSystemsAndMergeEachOnesSlices(t *testing.T) {
	var mu sync.Mutex
	var log []string
	slow := &timedStore{name: "a", op: 2 * time.Millisecond, mu: &mu, log: &log}
	fast := &timedStore{name: "b", op: time.Millisecond, mu: &mu, log: &log}
	w, err := ycsb.Core("a")
	if err != nil {
		t.Fatal(err)
	}
	w.RecordCount, w.OperationCount = 100, 0 // bounded by the duration
	keys := ycsb.KeySpace{Prefixes: [][]byte{[]byte("y-")}}
	cfg := ycsb.Config{Workload: w, Clients: 4, Duration: 600 * time.Millisecond, Seed: 1}
	res, costs, err := runPairs(context.Background(), 3, [2]pairSide{{name: "a", store: slow, keys: keys}, {name: "b", store: fast, keys: keys}}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(log, " "); got != "a b a b a b" {
		t.Fatalf("driven in order [%s]; want [a b a b a b]", got)
	}
	for i, r := range res {
		if r.Elapsed < 550*time.Millisecond || r.Elapsed > 900*time.Millisecond {
			t.Errorf("side %d ran %v in all; want about 600ms (3 slices of 200ms)", i, r.Elapsed)
		}
		if costs[i] != nil {
			t.Errorf("side %d has a CPU cost without pids", i)
		}
	}
	if ratio := res[1].Throughput() / res[0].Throughput(); ratio < 1.3 {
		t.Errorf("b/a throughput %.2f×; want about 2× (its operations take half as long)", ratio)
	}
}

// TestYCSBRefusesPairsItCannotAlternate: --pairs below 1, or above 1
// without both systems, with --operations or with --every, fails before
// anything starts, saying why.
func TestYCSBRefusesPairsItCannotAlternate(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--pairs", "0"}, "--pairs 0: must be at least 1"},
		{[]string{"--pairs", "3"}, "needs --target and --versus-terroir"},
		{[]string{"--pairs", "3", "--target", "etcd://127.0.0.1:1"}, "needs --target and --versus-terroir"},
		{[]string{"--pairs", "3", "--target", "etcd://127.0.0.1:1", "--versus-terroir", "--operations", "10"}, "not with --operations"},
		{[]string{"--pairs", "3", "--target", "etcd://127.0.0.1:1", "--versus-terroir", "--every", "1s"}, "not with --every"},
	} {
		err := run(append([]string{"bench", "ycsb"}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("bench ycsb %s = %v; want an error saying %q", strings.Join(c.args, " "), err, c.want)
		}
	}
}
