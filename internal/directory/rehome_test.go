package directory

import (
	"fmt"
	"strings"
	"testing"

	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/storage"
)

// placements renders the placement map as "[start,end)region@gen".
func placements(sm *StateMachine) string {
	var parts []string
	for _, p := range sm.Placements() {
		parts = append(parts, fmt.Sprintf("[%s,%s)%s@%d", p.GetStartKey(), p.GetEndKey(), p.GetRegion(), p.GetGeneration()))
	}
	return strings.Join(parts, " ")
}

// TestRehomedDescriptorMovesBetweenDirectories: a rehomed range's
// descriptor (DESIGN.md §13) is stored by its new home's directory and
// removes the old entry from the directory of the home it left; both homes
// its span in their placement map, over older generations only, and the
// store holds what memory does.
func TestRehomedDescriptorMovesBetweenDirectories(t *testing.T) {
	dir := t.TempDir()
	e, east := open(t, dir, seed(t, "east"))
	we, west := open(t, t.TempDir(), seed(t, "west"))
	defer we.Close()
	moved := &pb.RangeDescriptor{RangeId: 11, StartKey: []byte("g"), EndKey: []byte("m"), Region: "west", Replicas: []uint64{2}, Generation: 4, Rehomed: true}
	for _, step := range []struct {
		name string
		e    *directoryAt
		want string
	}{
		{"east, the home it left", &directoryAt{e, east}, "10[,g)@1 21[t,)@1"},
		{"west, its new home", &directoryAt{we, west}, "11[g,m)@4 20[m,t)@1"},
	} {
		if ch, err := step.e.sm.Changes(moved); err != nil || !ch {
			t.Fatalf("%s: Changes = %v, %v; want true", step.name, ch, err)
		}
		if res := apply(t, step.e.e, step.e.sm, update(moved)); res != uint32(2) && res != uint32(1) {
			t.Fatalf("%s: update = %v", step.name, res)
		}
		if got := spans(step.e.sm); got != step.want {
			t.Fatalf("%s: directory %s, want %s", step.name, got, step.want)
		}
		if got, want := placements(step.e.sm), "[,g)east@0 [g,m)west@4 [m,t)west@0 [t,)east@0"; got != want {
			t.Fatalf("%s: placement map %s, want %s", step.name, got, want)
		}
		if ch, err := step.e.sm.Changes(moved); err != nil || ch {
			t.Fatalf("%s: Changes of the same again = %v, %v; want false", step.name, ch, err)
		}
	}
	// An older rehome of the span (a stale writer) changes nothing.
	stale := &pb.RangeDescriptor{RangeId: 11, StartKey: []byte("g"), EndKey: []byte("m"), Region: "east", Replicas: []uint64{1}, Generation: 3, Rehomed: true}
	apply(t, e, east, update(stale))
	if got, want := placements(east), "[,g)east@0 [g,m)west@4 [m,t)west@0 [t,)east@0"; got != want {
		t.Fatalf("after a stale rehome: placement map %s, want %s", got, want)
	}
	if got, want := spans(east), "10[,g)@1 21[t,)@1"; got != want {
		t.Fatalf("after a stale rehome: directory %s, want %s", got, want)
	}
	// Back to east, at a newer generation, after a split in west.
	back := &pb.RangeDescriptor{RangeId: 11, StartKey: []byte("g"), EndKey: []byte("j"), Region: "east", Replicas: []uint64{1}, Generation: 6, Rehomed: true}
	apply(t, e, east, update(back))
	if got, want := placements(east), "[,g)east@0 [g,j)east@6 [j,m)west@4 [m,t)west@0 [t,)east@0"; got != want {
		t.Fatalf("after rehoming back: placement map %s, want %s", got, want)
	}
	_ = e.Close()
	e2, reloaded := open(t, dir, seed(t, "east"))
	defer e2.Close()
	if placements(reloaded) != placements(east) || spans(reloaded) != spans(east) {
		t.Fatalf("the store holds %s / %s, memory %s / %s", placements(reloaded), spans(reloaded), placements(east), spans(east))
	}
}

type directoryAt struct {
	e  *storage.Engine
	sm *StateMachine
}
