// Package placement evaluates the operator's placement rules (DESIGN.md
// §13) against the ranges: which spans a rule homes where, which key a
// by-row rule cannot home, and whether the ranges already match a rule.
// The rules themselves live in the directories (directory.PlacementRule);
// this package is pure.
package placement

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"sort"

	"github.com/terroir-db/terroir/internal/directory"
	"github.com/terroir-db/terroir/internal/directory/directorypb"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/storage"
)

// ErrNoRegionInKey: a key under a by-row rule whose first component after
// the rule's prefix, up to '/', is not a region with data.
var ErrNoRegionInKey = errors.New("placement: the key's first component names no region")

// Span is a key span [Start, End) a rule homes in Home (End nil: to the
// end of the key space).
type Span struct {
	Start, End []byte
	Home       string
}

// Spans returns the spans rule r homes, by start key: the prefix's span
// for a home or global rule; for a by-row rule, one span per region R of
// regions, the keys prefix + R + "/" and after it.
func Spans(r *directorypb.PlacementRule, regions []string) []Span {
	p := r.GetPrefix()
	if r.GetKind() != directorypb.PlacementKind_PLACEMENT_BY_ROW {
		return []Span{{Start: slices.Clone(p), End: storage.PrefixEnd(p), Home: r.GetHome()}}
	}
	var out []Span
	for _, region := range regions {
		start := append(append(slices.Clone(p), region...), directory.RowSeparator)
		out = append(out, Span{Start: start, End: storage.PrefixEnd(start), Home: region})
	}
	sort.Slice(out, func(i, j int) bool { return bytes.Compare(out[i].Start, out[j].Start) < 0 })
	return out
}

// CheckKey returns ErrNoRegionInKey when key falls under a by-row rule of
// rules but in none of its regions' spans; nil otherwise.
func CheckKey(rules []*directorypb.PlacementRule, regions []string, key []byte) error {
	for _, r := range rules {
		if r.GetKind() != directorypb.PlacementKind_PLACEMENT_BY_ROW || !bytes.HasPrefix(key, r.GetPrefix()) {
			continue
		}
		rest := key[len(r.GetPrefix()):]
		i := bytes.IndexByte(rest, directory.RowSeparator)
		if i < 0 || !slices.Contains(regions, string(rest[:i])) {
			return fmt.Errorf("%w: %q is under the by-row rule on %q, so it must read %q + <region>/…, one of %v", ErrNoRegionInKey, key, r.GetPrefix(), r.GetPrefix(), regions)
		}
	}
	return nil
}

// Status is how far the ranges match one rule.
type Status struct {
	Rule *directorypb.PlacementRule
	// Problems lists what differs (empty: the data matches the rule): a
	// range that straddles a span's bound (a split is due), one homed in
	// another region (a rehome is due), a global range without a
	// non-voter in some region.
	Problems []string
}

// Matches reports whether the ranges match the rule.
func (s Status) Matches() bool { return len(s.Problems) == 0 }

// Check compares the ranges (descs, of every region) with rule r. regions
// are the regions with data; nodeRegion names a node's region.
func Check(r *directorypb.PlacementRule, regions []string, descs []*pb.RangeDescriptor, nodeRegion func(uint64) string) Status {
	st := Status{Rule: r}
	for _, sp := range Spans(r, regions) {
		for _, d := range descs {
			if d.GetSubsumed() || !overlaps(d, sp) {
				continue
			}
			if bytes.Compare(d.GetStartKey(), sp.Start) < 0 || sp.End != nil && (len(d.GetEndKey()) == 0 || bytes.Compare(d.GetEndKey(), sp.End) > 0) {
				st.Problems = append(st.Problems, fmt.Sprintf("range %d [%q, %q) straddles the span [%q, %q): a split is due", d.GetRangeId(), d.GetStartKey(), d.GetEndKey(), sp.Start, sp.End))
			}
			if d.GetRegion() != sp.Home {
				st.Problems = append(st.Problems, fmt.Sprintf("range %d is homed in %s, not %s: a rehome is due", d.GetRangeId(), d.GetRegion(), sp.Home))
				continue
			}
			if r.GetKind() != directorypb.PlacementKind_PLACEMENT_GLOBAL {
				continue
			}
			for _, region := range regions {
				if region != sp.Home && !slices.ContainsFunc(d.GetNonVoters(), func(n uint64) bool { return nodeRegion(n) == region }) {
					st.Problems = append(st.Problems, fmt.Sprintf("range %d has no non-voter in %s", d.GetRangeId(), region))
				}
			}
		}
	}
	return st
}

// overlaps reports whether d's span and sp share a key.
func overlaps(d *pb.RangeDescriptor, sp Span) bool {
	return (sp.End == nil || bytes.Compare(d.GetStartKey(), sp.End) < 0) && (len(d.GetEndKey()) == 0 || bytes.Compare(sp.Start, d.GetEndKey()) < 0)
}
