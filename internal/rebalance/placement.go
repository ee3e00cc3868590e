package rebalance

import (
	"bytes"
	"fmt"
	"slices"

	"github.com/terroir-db/terroir/internal/directory/directorypb"
	"github.com/terroir-db/terroir/internal/placement"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
)

// placementSteps brings the region's ranges toward its placement rules
// (DESIGN.md §13): a range that straddles a bound of a rule's span splits
// there, and a range inside a global rule's span homed here gets a
// non-voting replica on a live node of every other region with data that
// has none. A range the queue changes already waits; non-voters count
// against MaxMoves. bounds are the spans' bounds: no merge may join ranges
// across one. Moving a span homed elsewhere (rehoming) is not planned here.
func placementSteps(v View, ranges []*pb.RangeDescriptor, settled func(*pb.RangeDescriptor) bool, moves int, cfg Config) (out []Action, bounds map[string]bool) {
	bounds = map[string]bool{}
	regions := []string{v.Region}
	for r := range v.Elsewhere {
		regions = append(regions, r)
	}
	slices.Sort(regions)
	for _, rule := range v.Placement {
		for _, sp := range placement.Spans(rule, regions) {
			bounds[string(sp.Start)] = true
			if sp.End != nil {
				bounds[string(sp.End)] = true
			}
		}
	}
	split := map[uint64]bool{}
	for _, d := range ranges {
		if !settled(d) {
			continue
		}
		for b := range bounds {
			k := []byte(b)
			if bytes.Compare(d.GetStartKey(), k) < 0 && (len(d.GetEndKey()) == 0 || bytes.Compare(k, d.GetEndKey()) < 0) && !split[d.GetRangeId()] {
				out = append(out, Action{Kind: Split, Range: d, Key: k, Why: "a placement rule's bound"})
				split[d.GetRangeId()] = true
			}
		}
	}
	for _, rule := range v.Placement {
		if rule.GetKind() != directorypb.PlacementKind_PLACEMENT_GLOBAL || rule.GetHome() != v.Region {
			continue
		}
		for _, sp := range placement.Spans(rule, regions) {
			for _, d := range ranges {
				inside := bytes.Compare(sp.Start, d.GetStartKey()) <= 0 && sp.End != nil && len(d.GetEndKey()) > 0 && bytes.Compare(d.GetEndKey(), sp.End) <= 0
				if !inside || !settled(d) || split[d.GetRangeId()] || moves >= cfg.MaxMoves {
					continue
				}
				for _, region := range regions {
					if region == v.Region {
						continue
					}
					live := v.Elsewhere[region]
					if slices.ContainsFunc(d.GetNonVoters(), func(n uint64) bool { return slices.Contains(live, n) }) || len(live) == 0 {
						continue
					}
					out = append(out, Action{Kind: AddNonVoter, Range: d, To: live[int(d.GetRangeId())%len(live)],
						Why: fmt.Sprintf("the global rule on %q wants a non-voter in %s", rule.GetPrefix(), region)})
					split[d.GetRangeId()] = true // one change per range per plan
					moves++
					break
				}
			}
		}
	}
	return out, bounds
}
