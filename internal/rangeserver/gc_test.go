package rangeserver

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/storage"
)

func onePhase(id string, epoch uint64, key, value string) *pb.Command {
	return &pb.Command{Cmd: &pb.Command_OnePhase{OnePhase: &pb.OnePhaseCmd{TxnId: []byte(id), LeaseStart: 1,
		Writes: []*pb.Write{{Key: []byte(key), Value: []byte(value)}}, Version: &pb.VersionID{Epoch: epoch, Counter: 1},
		RegionalVersion: &pb.VersionID{Epoch: 100 + epoch, Counter: 1}}}}
}

func gcCmd(horizon, regional uint64, start string, maxKeys uint32, onRegional bool) *pb.Command {
	return &pb.Command{Cmd: &pb.Command_Gc{Gc: &pb.GCCmd{Horizon: horizon, RegionalHorizon: regional, StartKey: []byte(start), MaxKeys: maxKeys, Regional: onRegional}}}
}

// versionsOf renders the epochs stored for key in ks, newest first.
func versionsOf(t *testing.T, sm *StateMachine, ks Keyspace, key string) string {
	t.Helper()
	var out []string
	below := storage.VersionID{Epoch: 1 << 40}
	for {
		v, _, _, err := sm.Get(ks, []byte(key), below)
		if err != nil {
			t.Fatal(err)
		}
		if v.ID == (storage.VersionID{}) {
			return strings.Join(out, ",")
		}
		out = append(out, fmt.Sprint(v.ID.Epoch))
		below = v.ID
	}
}

// TestGCCollectsInChunksAndRaisesTheThreshold: a GC command raises the
// range's threshold (never lowers it), collects the data and then the
// regional copies chunk by chunk, and reads below the threshold are
// refused naming it; the threshold survives a restart and a split hands it
// to the right-hand range.
func TestGCCollectsInChunksAndRaisesTheThreshold(t *testing.T) {
	sm := openSM(t, 1)
	apply(t, sm, leaseCmd(1, 1, 100, 1, 0))
	for i, key := range []string{"a", "b", "c"} {
		apply(t, sm, onePhase(key+"1", 3, key, "old"), onePhase(key+"2", 5, key, "mid"), onePhase(key+"3", uint64(8+i), key, "new"))
	}
	if err := sm.checkSnapshotAge(Versions, 1); err != nil {
		t.Fatalf("a range never collected refused a read at epoch 1: %v", err)
	}
	res := apply(t, sm, gcCmd(7, 104, "", 2, false))[0].(Applied)
	if res.GC == nil || res.GC.Stats.Keys != 2 || res.GC.Stats.Versions != 2 || string(res.GC.Resume) != "c" {
		t.Fatalf("first chunk: %+v; want 2 keys, 2 versions, resume at c", res.GC)
	}
	res = apply(t, sm, gcCmd(7, 104, "c", 2, false))[0].(Applied)
	if res.GC == nil || res.GC.Stats.Versions != 1 || res.GC.Resume != nil {
		t.Fatalf("second chunk: %+v; want 1 version, done", res.GC)
	}
	if got := versionsOf(t, sm, Versions, "a"); got != "8,5" {
		t.Fatalf("a's versions after GC below 7: %s, want 8,5", got)
	}
	if got := versionsOf(t, sm, RegionalVersions, "a"); got != "108,105,103" {
		t.Fatalf("the data chunk touched the regional copies: %s", got)
	}
	res = apply(t, sm, gcCmd(7, 104, "", 0, true))[0].(Applied)
	if got := versionsOf(t, sm, RegionalVersions, "a"); got != "108,105,103" || res.GC.Stats.Versions != 0 {
		t.Fatalf("regional copies after GC below 104: %s (%+v), want all kept (103 is the newest below 104)", got, res.GC)
	}
	apply(t, sm, gcCmd(7, 106, "", 0, true))
	if got := versionsOf(t, sm, RegionalVersions, "a"); got != "108,105" {
		t.Fatalf("regional copies after GC below 106: %s, want 108,105", got)
	}
	// A lower horizon later does not lower the threshold.
	apply(t, sm, gcCmd(4, 101, "", 0, false))
	if th := sm.GCThreshold(); th.GetHorizon() != 7 || th.GetRegionalHorizon() != 106 {
		t.Fatalf("threshold %v, want 7 and 106", th)
	}
	err := sm.checkSnapshotAge(Versions, 6)
	if !errors.Is(err, ErrSnapshotTooOld) || !strings.Contains(err.Error(), "below epoch 7") {
		t.Fatalf("a read at 6 below a threshold of 7: %v, want ErrSnapshotTooOld naming 7", err)
	}
	if err := sm.checkSnapshotAge(Versions, 7); err != nil {
		t.Fatalf("a read at the threshold: %v", err)
	}
	if err := sm.checkSnapshotAge(RegionalVersions, 105); !errors.Is(err, ErrSnapshotTooOld) {
		t.Fatalf("a regional read at 105 below 106: %v", err)
	}

	// Restart: the threshold is read back.
	again, err := NewStateMachine(sm.e, &pb.RangeDescriptor{RangeId: 10, Generation: 1})
	if err != nil {
		t.Fatal(err)
	}
	if th := again.GCThreshold(); th.GetHorizon() != 7 || th.GetRegionalHorizon() != 106 {
		t.Fatalf("threshold after a restart %v, want 7 and 106", th)
	}
	// A split hands it to the right-hand range.
	split := apply(t, again, &pb.Command{Cmd: &pb.Command_Split{Split: &pb.SplitCmd{SplitKey: []byte("b"), RightRangeId: 11, Generation: 1}}})[0].(Applied)
	if split.Split == nil {
		t.Fatalf("split: %+v", split)
	}
	right, err := NewStateMachine(sm.e, split.Split.Right)
	if err != nil {
		t.Fatal(err)
	}
	if err := right.checkSnapshotAge(Versions, 6); !errors.Is(err, ErrSnapshotTooOld) {
		t.Fatalf("the right-hand range of a split serves a read below the threshold: %v", err)
	}
}

// TestMergeKeepsTheLargerThreshold: the merged range refuses reads below
// either half's threshold, and a subsumed range takes no GC.
func TestMergeKeepsTheLargerThreshold(t *testing.T) {
	e, err := storage.Open(t.TempDir(), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	left, _ := NewStateMachine(e, &pb.RangeDescriptor{RangeId: 10, EndKey: []byte("m"), Region: "r", Generation: 3})
	right, _ := NewStateMachine(e, &pb.RangeDescriptor{RangeId: 11, StartKey: []byte("m"), Region: "r", Generation: 5})
	apply(t, left, leaseCmd(1, 1, 100, 1, 0), gcCmd(4, 0, "", 0, false))
	apply(t, right, leaseCmd(1, 1, 100, 1, 0), gcCmd(9, 0, "", 0, false))
	rd := apply(t, right, &pb.Command{Cmd: &pb.Command_Subsume{Subsume: &pb.SubsumeCmd{Generation: 5, LeaseStart: 1}}})[0].(Applied).Subsumed
	if res := apply(t, right, gcCmd(12, 0, "", 0, false))[0].(Applied); !res.Rejected {
		t.Fatalf("a subsumed range applied a GC: %+v", res)
	}
	m := apply(t, left, &pb.Command{Cmd: &pb.Command_Merge{Merge: &pb.MergeCmd{Generation: 3, LeaseStart: 1, Right: rd, RightGc: right.GCThreshold()}}})[0].(Applied)
	if m.Merge == nil {
		t.Fatalf("merge: %+v", m)
	}
	if th := left.GCThreshold(); th.GetHorizon() != 9 {
		t.Fatalf("merged threshold %v, want the right half's 9", th)
	}
}

// TestHorizonIsTheEpochOfTTLAgo: the horizon is the newest sample at least
// the TTL old, and older samples are dropped.
func TestHorizonIsTheEpochOfTTLAgo(t *testing.T) {
	var q gcQueue
	t0 := time.Unix(1000, 0)
	for i := range 10 {
		q.samples = append(q.samples, epochSample{at: t0.Add(time.Duration(i) * time.Second), data: uint64(100 + i), regional: uint64(500 + i)})
	}
	if _, ok := q.horizonAt(t0.Add(3*time.Second), 4*time.Second); ok {
		t.Fatal("a horizon before any sample is the TTL old")
	}
	h, ok := q.horizonAt(t0.Add(7500*time.Millisecond), 4*time.Second)
	if !ok || h.data != 103 || h.regional != 503 || len(q.samples) != 7 {
		t.Fatalf("horizon %+v (%v) with %d samples left; want epoch 103 (3.5 s → the sample at 3 s) and 7 samples", h, ok, len(q.samples))
	}
	if gcEvery(4*time.Hour) != 5*time.Minute || gcEvery(time.Second) != gcCheck || gcEvery(16*time.Second) != 2*time.Second {
		t.Fatalf("gcEvery: %v %v %v", gcEvery(4*time.Hour), gcEvery(time.Second), gcEvery(16*time.Second))
	}
}
