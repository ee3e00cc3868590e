package directory

import (
	"bytes"
	"slices"

	"github.com/cockroachdb/pebble/v2"
	"google.golang.org/protobuf/proto"

	"github.com/terroir-db/terroir/internal/directory/directorypb"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/routing"
)

// A rehomed range (DESIGN.md §13) is written to every region's directory:
// its new home's stores it, the others drop what it displaces (the entry
// of the home it left), and every copy of the placement map homes its
// span in its region.

// movedAway returns d as a directory of another region than d's home
// applies it: like a subsumed descriptor, it only displaces the older
// descriptors it overlaps.
func movedAway(d *pb.RangeDescriptor) *pb.RangeDescriptor {
	m := proto.CloneOf(d)
	m.Subsumed = true
	return m
}

// placeSpan returns pl (sorted by start key) with d's span homed in d's
// region at d's generation, and whether that changed it. Nothing changes
// when the span is homed in d's region already, or when a placement over
// part of it is of a newer generation (a later rehome decided it).
func placeSpan(pl []*directorypb.Placement, d *pb.RangeDescriptor) ([]*directorypb.Placement, bool) {
	start, end := d.GetStartKey(), d.GetEndKey()
	overlaps := func(p *directorypb.Placement) bool {
		return (len(end) == 0 || bytes.Compare(p.GetStartKey(), end) < 0) &&
			(len(p.GetEndKey()) == 0 || bytes.Compare(start, p.GetEndKey()) < 0)
	}
	same := true
	for _, p := range pl {
		if !overlaps(p) {
			continue
		}
		if p.GetGeneration() > d.GetGeneration() {
			return pl, false
		}
		same = same && p.GetRegion() == d.GetRegion()
	}
	if same {
		return pl, false
	}
	out := make([]*directorypb.Placement, 0, len(pl)+2)
	for _, p := range pl {
		if !overlaps(p) {
			out = append(out, p)
			continue
		}
		if bytes.Compare(p.GetStartKey(), start) < 0 {
			out = append(out, &directorypb.Placement{StartKey: p.GetStartKey(), EndKey: slices.Clone(start), Region: p.GetRegion(), Generation: p.GetGeneration()})
		}
		if len(end) > 0 && (len(p.GetEndKey()) == 0 || bytes.Compare(end, p.GetEndKey()) < 0) {
			out = append(out, &directorypb.Placement{StartKey: slices.Clone(end), EndKey: p.GetEndKey(), Region: p.GetRegion(), Generation: p.GetGeneration()})
		}
	}
	out = append(out, &directorypb.Placement{StartKey: slices.Clone(start), EndKey: slices.Clone(end), Region: d.GetRegion(), Generation: d.GetGeneration()})
	slices.SortFunc(out, func(a, b *directorypb.Placement) int { return bytes.Compare(a.GetStartKey(), b.GetStartKey()) })
	return out, true
}

// placedNewer reports whether a placement over part of d's span is of a
// newer generation than d: a later rehome moved the span, so d is stale
// even where no newer descriptor is stored (sm.mu held).
func (sm *StateMachine) placedNewer(d *pb.RangeDescriptor) bool {
	start, end := d.GetStartKey(), d.GetEndKey()
	for _, p := range sm.placements {
		if (len(end) == 0 || bytes.Compare(p.GetStartKey(), end) < 0) &&
			(len(p.GetEndKey()) == 0 || bytes.Compare(start, p.GetEndKey()) < 0) && p.GetGeneration() > d.GetGeneration() {
			return true
		}
	}
	return false
}

// applyPlacement homes a rehomed descriptor's span in the placement map,
// in b and in memory (sm.mu held). It reports whether the map changed.
func (sm *StateMachine) applyPlacement(b *pebble.Batch, d *pb.RangeDescriptor) (bool, error) {
	pl, changed := placeSpan(sm.placements, d)
	if !changed {
		return false, nil
	}
	for _, p := range sm.placements {
		if err := b.Delete(sm.key(keyPlacement, p.GetStartKey()...), nil); err != nil {
			return false, err
		}
	}
	for _, p := range pl {
		v, err := proto.Marshal(p)
		if err != nil {
			return false, err
		}
		if err := b.Set(sm.key(keyPlacement, p.GetStartKey()...), v, nil); err != nil {
			return false, err
		}
	}
	sm.placements = pl
	return true, nil
}

// changesElsewhere reports whether a rehomed descriptor of another region
// changes this directory (sm.mu read-held): it displaces a stored one, or
// moves its span in the placement map.
func (sm *StateMachine) changesElsewhere(d *pb.RangeDescriptor) bool {
	if _, changed := placeSpan(sm.placements, d); changed {
		return true
	}
	_, displaced, installed := routing.Install(sm.ranges, movedAway(d))
	return installed && len(displaced) > 0
}
