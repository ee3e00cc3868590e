package directory

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/terroir-db/terroir/internal/directory/directorypb"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/storage"
	"github.com/terroir-db/terroir/internal/topology"
)

const twoRegions = `
regions: [east, west]
rtt:
  - {between: [east, west], ms: 60}
nodes:
  - {id: 1, region: east, addr: "127.0.0.1:1"}
  - {id: 2, region: west, addr: "127.0.0.1:2"}
groups:
  - {id: 5, kind: directory, region: east, replicas: [1]}
  - {id: 6, kind: directory, region: west, replicas: [2]}
  - {id: 10, kind: range, region: east, start: "", end: "g", replicas: [1]}
  - {id: 11, kind: range, region: east, start: "g", end: "m", replicas: [1]}
  - {id: 20, kind: range, region: west, start: "m", end: "t", replicas: [2]}
  - {id: 21, kind: range, region: east, start: "t", replicas: [1]}
`

func seed(t testing.TB, region string) Seed {
	t.Helper()
	top, err := topology.Parse([]byte(twoRegions))
	if err != nil {
		t.Fatal(err)
	}
	return SeedFor(top, region)
}

func open(t *testing.T, dir string, s Seed) (*storage.Engine, *StateMachine) {
	t.Helper()
	e, err := storage.Open(dir, 1)
	if err != nil {
		t.Fatal(err)
	}
	sm, err := NewStateMachine(e, 5, s)
	if err != nil {
		t.Fatal(err)
	}
	return e, sm
}

// apply applies cmd in its own committed batch and returns the result.
func apply(t *testing.T, e *storage.Engine, sm *StateMachine, cmd *directorypb.Command) any {
	t.Helper()
	data, err := proto.Marshal(cmd)
	if err != nil {
		t.Fatal(err)
	}
	b := e.NewIndexedBatch()
	res := sm.Apply(b, 0, data)
	if err := e.Commit(b, true); err != nil {
		t.Fatal(err)
	}
	return res
}

func update(descs ...*pb.RangeDescriptor) *directorypb.Command {
	return &directorypb.Command{Cmd: &directorypb.Command_Update{Update: &directorypb.UpdateCmd{Descriptors: descs}}}
}

var allocate = &directorypb.Command{Cmd: &directorypb.Command_Allocate{Allocate: &directorypb.AllocateCmd{}}}

func desc(id uint64, start, end string, gen uint64) *pb.RangeDescriptor {
	return &pb.RangeDescriptor{RangeId: id, StartKey: []byte(start), EndKey: []byte(end), Region: "east", Replicas: []uint64{1}, Generation: gen}
}

// spans renders the directory as "id[start,end)@gen" in key order.
func spans(sm *StateMachine) string {
	var parts []string
	for _, d := range sm.List() {
		parts = append(parts, fmt.Sprintf("%d[%s,%s)@%d", d.GetRangeId(), d.GetStartKey(), d.GetEndKey(), d.GetGeneration()))
	}
	return strings.Join(parts, " ")
}

func TestSeedHoldsTheRegionsRangesAndTheWholePlacementMap(t *testing.T) {
	s := seed(t, "east")
	_, sm := open(t, t.TempDir(), s)
	if got, want := spans(sm), "10[,g)@1 11[g,m)@1 21[t,)@1"; got != want {
		t.Fatalf("seeded %s, want %s", got, want)
	}
	var pl []string
	for _, p := range sm.Placements() {
		pl = append(pl, fmt.Sprintf("[%s,%s)=%s", p.GetStartKey(), p.GetEndKey(), p.GetRegion()))
	}
	if got, want := strings.Join(pl, " "), "[,m)=east [m,t)=west [t,)=east"; got != want {
		t.Fatalf("placement map %s, want %s", got, want)
	}
	for key, want := range map[string]string{"": "east", "lzz": "east", "m": "west", "szz": "west", "t": "east", "zzz": "east"} {
		if p := HomeOf(sm.Placements(), []byte(key)); p.GetRegion() != want {
			t.Errorf("HomeOf(%q) = %v, want %s", key, p, want)
		}
	}
	if w := seed(t, "west"); w.FirstID != 2*topology.MaxGroupID || s.FirstID != topology.MaxGroupID || s.LastID >= w.FirstID {
		t.Fatalf("ID blocks overlap or start wrong: east [%d, %d], west from %d", s.FirstID, s.LastID, w.FirstID)
	}
}

// TestSeedIsWrittenOnce: a directory that changed is read back as it
// changed after a restart, whatever the topology seeds.
func TestSeedIsWrittenOnce(t *testing.T) {
	dir := t.TempDir()
	e, sm := open(t, dir, seed(t, "east"))
	if res := apply(t, e, sm, update(desc(10, "", "c", 2), desc(1_000_000_000, "c", "g", 2))); res != uint32(2) {
		t.Fatalf("split: %v", res)
	}
	id := apply(t, e, sm, allocate)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e, sm = open(t, dir, seed(t, "east"))
	defer e.Close()
	if got, want := spans(sm), "10[,c)@2 1000000000[c,g)@2 11[g,m)@1 21[t,)@1"; got != want {
		t.Fatalf("after restart %s, want %s (the seed came back)", got, want)
	}
	if again := apply(t, e, sm, allocate); again != id.(uint64)+1 {
		t.Fatalf("allocated %v after a restart, then %v before it: IDs are not monotonic", again, id)
	}
}

// TestUpdateKeepsTheNewestShape drives a split, a merge, and the stale and
// subsumed descriptors that arrive late, through the directory's rule.
func TestUpdateKeepsTheNewestShape(t *testing.T) {
	e, sm := open(t, t.TempDir(), seed(t, "east"))
	defer e.Close()
	for _, step := range []struct {
		name  string
		descs []*pb.RangeDescriptor
		n     uint32
		want  string
	}{
		{"split of 11 at j", []*pb.RangeDescriptor{desc(11, "g", "j", 2), desc(30, "j", "m", 2)}, 2, "10[,g)@1 11[g,j)@2 30[j,m)@2 21[t,)@1"},
		{"the split again (a retry)", []*pb.RangeDescriptor{desc(11, "g", "j", 2), desc(30, "j", "m", 2)}, 2, "10[,g)@1 11[g,j)@2 30[j,m)@2 21[t,)@1"},
		{"11 before the split, late", []*pb.RangeDescriptor{desc(11, "g", "m", 1)}, 0, "10[,g)@1 11[g,j)@2 30[j,m)@2 21[t,)@1"},
		{"merge of 11 and 30", []*pb.RangeDescriptor{desc(11, "g", "m", 3), {RangeId: 30, StartKey: []byte("j"), EndKey: []byte("m"), Region: "east", Generation: 2, Subsumed: true}}, 1, "10[,g)@1 11[g,m)@3 21[t,)@1"},
		{"30 before the merge, late", []*pb.RangeDescriptor{desc(30, "j", "m", 2)}, 0, "10[,g)@1 11[g,m)@3 21[t,)@1"},
		{"a subsumed 21 alone leaves a gap", []*pb.RangeDescriptor{{RangeId: 21, StartKey: []byte("t"), Region: "east", Generation: 2, Subsumed: true}}, 1, "10[,g)@1 11[g,m)@3"},
	} {
		res := apply(t, e, sm, update(step.descs...))
		if res != step.n || spans(sm) != step.want {
			t.Fatalf("%s: installed %v, directory %s; want %d, %s", step.name, res, spans(sm), step.n, step.want)
		}
	}
	if got := sm.Lookup([]byte("u"), 4); len(got) != 0 {
		t.Fatalf("Lookup in the gap = %v, want none", got)
	}
	if got := sm.Lookup([]byte("a"), 4); len(got) != 2 || got[0].GetRangeId() != 10 || got[1].GetRangeId() != 11 {
		t.Fatalf("Lookup(a, 4) = %v, want ranges 10 and 11", got)
	}
	if got := sm.Lookup([]byte("h"), 1); len(got) != 1 || got[0].GetRangeId() != 11 {
		t.Fatalf("Lookup(h, 1) = %v, want range 11 alone", got)
	}
	for _, c := range []struct {
		d       *pb.RangeDescriptor
		changes bool
	}{{desc(11, "g", "m", 3), false}, {desc(11, "g", "m", 2), false}, {desc(11, "g", "m", 4), true}, {desc(40, "t", "", 1), true}} {
		if got, err := sm.Changes(c.d); err != nil || got != c.changes {
			t.Errorf("Changes(%v) = %v, %v; want %v", c.d, got, err, c.changes)
		}
	}
	// A descriptor of range 10 elsewhere in the key space (no replica
	// makes one; a bad writer could) leaves one descriptor of range 10, in
	// memory as in the store.
	if res := apply(t, e, sm, update(desc(10, "v", "w", 2))); res != uint32(1) {
		t.Fatalf("moving range 10: %v", res)
	}
	if got, want := spans(sm), "11[g,m)@3 10[v,w)@2"; got != want {
		t.Fatalf("after moving range 10: %s, want %s", got, want)
	}
	reloaded, err := NewStateMachine(e, 5, seed(t, "east"))
	if err != nil {
		t.Fatal(err)
	}
	if spans(reloaded) != spans(sm) {
		t.Fatalf("the store holds %s, memory %s", spans(reloaded), spans(sm))
	}
}

// TestBadDescriptorsAreRefusedWhole: an update with one bad descriptor
// changes nothing and says which and why.
func TestBadDescriptorsAreRefusedWhole(t *testing.T) {
	e, sm := open(t, t.TempDir(), seed(t, "east"))
	defer e.Close()
	before := spans(sm)
	good := desc(10, "", "c", 2)
	for name, c := range map[string]struct {
		d    *pb.RangeDescriptor
		says string
	}{
		"no id":        {desc(0, "c", "g", 2), "no range ID"},
		"inverted":     {desc(12, "g", "c", 2), "is not after start"},
		"empty span":   {desc(12, "g", "g", 2), "is not after start"},
		"other region": {&pb.RangeDescriptor{RangeId: 20, StartKey: []byte("m"), EndKey: []byte("t"), Region: "west", Generation: 2}, `homed in "west"`},
		"generation 0": {desc(12, "c", "g", 0), "generation 0"},
	} {
		res := apply(t, e, sm, update(good, c.d))
		err, ok := res.(error)
		if !ok || !errors.Is(err, ErrBadDescriptor) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v, want ErrBadDescriptor saying %q", name, res, c.says)
		}
		if _, err := sm.Changes(c.d); !errors.Is(err, ErrBadDescriptor) {
			t.Errorf("%s: Changes = %v, want ErrBadDescriptor", name, err)
		}
	}
	b := e.NewIndexedBatch()
	if res := sm.Apply(b, 0, []byte{0xff, 0xff}); !errors.Is(res.(error), ErrBadCommand) {
		t.Errorf("garbage command: %v, want ErrBadCommand", res)
	}
	if res := sm.Apply(b, 0, nil); !errors.Is(res.(error), ErrBadCommand) {
		t.Errorf("empty command: %v, want ErrBadCommand", res)
	}
	_ = b.Close()
	if got := spans(sm); got != before {
		t.Fatalf("refused updates changed the directory: %s, was %s", got, before)
	}
}

func TestAllocateHandsOutTheRegionsBlockOnce(t *testing.T) {
	s := seed(t, "east")
	s.LastID = s.FirstID + 2 // a block of three
	e, sm := open(t, t.TempDir(), s)
	defer e.Close()
	for i := range uint64(3) {
		if got := apply(t, e, sm, allocate); got != s.FirstID+i {
			t.Fatalf("allocation %d = %v, want %d", i, got, s.FirstID+i)
		}
	}
	if res := apply(t, e, sm, allocate); !errors.Is(res.(error), ErrIDsExhausted) {
		t.Fatalf("allocation past the block: %v, want ErrIDsExhausted", res)
	}
}

// TestSnapshotRestoresEverything: a replica restored from a snapshot holds
// the same descriptors, placement map and allocator, and a damaged snapshot
// is refused as corrupt.
func TestSnapshotRestoresEverything(t *testing.T) {
	e, sm := open(t, t.TempDir(), seed(t, "east"))
	defer e.Close()
	apply(t, e, sm, update(desc(11, "g", "j", 2), desc(30, "j", "m", 2)))
	next := apply(t, e, sm, allocate).(uint64) + 1
	snap, err := sm.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	// Another store, seeded from another region, then restored.
	e2, other := open(t, t.TempDir(), seed(t, "west"))
	defer e2.Close()
	b := e2.NewIndexedBatch()
	if err := other.Restore(b, snap); err != nil {
		t.Fatal(err)
	}
	if err := e2.Commit(b, true); err != nil {
		t.Fatal(err)
	}
	if spans(other) != spans(sm) || len(other.Placements()) != 3 {
		t.Fatalf("restored %s with %d placements, want %s with 3", spans(other), len(other.Placements()), spans(sm))
	}
	if got := apply(t, e2, other, allocate); got != next {
		t.Fatalf("restored allocator hands out %v, want %d", got, next)
	}
	b = e2.NewIndexedBatch()
	defer b.Close()
	if err := other.Restore(b, []byte{0xff, 0x01}); !errors.Is(err, storage.ErrCorrupt) {
		t.Fatalf("damaged snapshot: %v, want storage.ErrCorrupt", err)
	}
}
