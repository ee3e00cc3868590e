package directory

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/terroir-db/terroir/internal/directory/directorypb"
)

func setTTL(ttl time.Duration) *directorypb.Command {
	return &directorypb.Command{Cmd: &directorypb.Command_SetGcTtl{SetGcTtl: &directorypb.SetGCTTLCmd{GcTtlMs: uint64(ttl.Milliseconds())}}}
}

func protect(id string, epoch uint64, ttl time.Duration) *directorypb.Command {
	return &directorypb.Command{Cmd: &directorypb.Command_Protect{Protect: &directorypb.ProtectCmd{
		Protection: &directorypb.Protection{Id: id, Epoch: epoch, TtlMs: uint64(ttl.Milliseconds()), Description: "test"}}}}
}

func release(ids ...string) *directorypb.Command {
	return &directorypb.Command{Cmd: &directorypb.Command_Release{Release: &directorypb.ReleaseCmd{Ids: ids}}}
}

// protections renders them as "id@epoch#renewals" by id.
func protections(sm *StateMachine) string {
	var parts []string
	for _, p := range sm.Protections() {
		parts = append(parts, fmt.Sprintf("%s@%d#%d", p.GetId(), p.GetEpoch(), p.GetRenewals()))
	}
	return strings.Join(parts, " ")
}

// TestGCPolicyIsReplicatedStateThatSurvivesRestarts: the gc_ttl and the
// protections are set, renewed and released by commands, and a restarted
// replica and a restored snapshot hold the same.
func TestGCPolicyIsReplicatedStateThatSurvivesRestarts(t *testing.T) {
	dir := t.TempDir()
	e, sm := open(t, dir, seed(t, "east"))
	if sm.GCTTL() != 0 || protections(sm) != "" {
		t.Fatalf("fresh directory: gc_ttl %v, protections %q; want none set", sm.GCTTL(), protections(sm))
	}
	for _, cmd := range []*directorypb.Command{setTTL(90 * time.Second), protect("b", 7, time.Minute), protect("a", 9, time.Minute),
		protect("b", 8, time.Minute), protect("c", 3, time.Minute), release("c", "unknown")} {
		if res, isErr := apply(t, e, sm, cmd).(error); isErr {
			t.Fatalf("%v: %v", cmd, res)
		}
	}
	const want = "a@9#0 b@8#1"
	if got := protections(sm); got != want || sm.GCTTL() != 90*time.Second {
		t.Fatalf("protections %q, gc_ttl %v; want %q, 1m30s", got, sm.GCTTL(), want)
	}
	snap, err := sm.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e, sm = open(t, dir, seed(t, "east"))
	defer e.Close()
	if got := protections(sm); got != want || sm.GCTTL() != 90*time.Second {
		t.Fatalf("after a restart: protections %q, gc_ttl %v; want %q, 1m30s", got, sm.GCTTL(), want)
	}
	e2, other := open(t, t.TempDir(), seed(t, "west"))
	defer e2.Close()
	b := e2.NewIndexedBatch()
	if err := other.Restore(b, snap); err != nil {
		t.Fatal(err)
	}
	if err := e2.Commit(b, true); err != nil {
		t.Fatal(err)
	}
	if got := protections(other); got != want || other.GCTTL() != 90*time.Second {
		t.Fatalf("restored: protections %q, gc_ttl %v; want %q, 1m30s", got, other.GCTTL(), want)
	}
	apply(t, e, sm, setTTL(0))
	if sm.GCTTL() != 0 {
		t.Fatalf("gc_ttl reset to the topology's: %v, want 0", sm.GCTTL())
	}
}

// TestBadGCPolicyIsRefusedAndChangesNothing: a gc_ttl below the minimum
// (snapshots would fail while they run) or above the maximum, and a
// protection without an id or with a ttl out of bounds, are typed
// refusals that leave the state as it was.
func TestBadGCPolicyIsRefusedAndChangesNothing(t *testing.T) {
	e, sm := open(t, t.TempDir(), seed(t, "east"))
	defer e.Close()
	apply(t, e, sm, setTTL(time.Hour))
	apply(t, e, sm, protect("a", 5, time.Minute))
	for _, c := range []struct {
		cmd  *directorypb.Command
		want error
	}{
		{setTTL(500 * time.Millisecond), ErrBadGCTTL},
		{setTTL(2 * MaxGCTTL), ErrBadGCTTL},
		{protect("", 5, time.Minute), ErrBadProtection},
		{protect("  ", 5, time.Minute), ErrBadProtection},
		{protect("b", 5, 100*time.Millisecond), ErrBadProtection},
		{protect("a", 1, 48*time.Hour), ErrBadProtection},
		{&directorypb.Command{Cmd: &directorypb.Command_Protect{Protect: &directorypb.ProtectCmd{}}}, ErrBadProtection},
	} {
		res := apply(t, e, sm, c.cmd)
		if err, _ := res.(error); !errors.Is(err, c.want) {
			t.Errorf("%v: %v, want %v", c.cmd, res, c.want)
		}
	}
	if got := protections(sm); got != "a@5#0" || sm.GCTTL() != time.Hour {
		t.Fatalf("after refusals: protections %q, gc_ttl %v; want a@5#0, 1h", got, sm.GCTTL())
	}
}

// TestProtectionsExpireOnTheObserversClock: a protection lives while its
// renewals count moves; one idle for its ttl, as the observing replica
// measured it, is expired; a new observer (a restart, a new leader) starts
// every protection's idle time afresh.
func TestProtectionsExpireOnTheObserversClock(t *testing.T) {
	p := func(renewals uint64) []*directorypb.Protection {
		return []*directorypb.Protection{{Id: "a", Epoch: 1, TtlMs: 1000, Renewals: renewals}}
	}
	var w renewalWatch
	t0 := time.Unix(1000, 0)
	check := func(ps []*directorypb.Protection, at time.Duration, wantExpired bool, wantIdle time.Duration) {
		t.Helper()
		st := w.observe(5, ps, t0.Add(at))
		if len(st) != 1 || st[0].GetExpired() != wantExpired || st[0].GetIdleMs() != uint64(wantIdle.Milliseconds()) {
			t.Fatalf("at %v: %v, want expired %v idle %v", at, st, wantExpired, wantIdle)
		}
	}
	check(p(0), 0, false, 0)
	check(p(0), 900*time.Millisecond, false, 900*time.Millisecond)
	check(p(1), 1500*time.Millisecond, false, 0) // renewed
	check(p(1), 2400*time.Millisecond, false, 900*time.Millisecond)
	check(p(1), 2500*time.Millisecond, true, time.Second)
	var fresh renewalWatch
	if st := fresh.observe(5, p(1), t0.Add(time.Hour)); st[0].GetExpired() {
		t.Fatalf("a new observer found a protection expired at once: %v", st)
	}
	if st := w.observe(5, nil, t0.Add(time.Hour)); len(st) != 0 || len(w.seen[5]) != 0 {
		t.Fatalf("released protections still watched: %v", w.seen[5])
	}
}
