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
// against MaxMoves. A range homed here inside a span a rule homes in another
// region is rehomed there (a rehome counts as a move). bounds are the
// spans' bounds: no merge may join ranges across one.
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
	// A range inside a span homed elsewhere moves there, once it lies
	// inside the span (after the split above).
	for _, rule := range v.Placement {
		for _, sp := range placement.Spans(rule, regions) {
			if sp.Home == v.Region {
				continue
			}
			for _, d := range ranges {
				if !inside(d, sp) || !settled(d) || split[d.GetRangeId()] || moves >= cfg.MaxMoves {
					continue
				}
				out = append(out, Action{Kind: Rehome, Range: d, Home: sp.Home,
					Why: fmt.Sprintf("the rule on %q homes [%q, %q) in %s", rule.GetPrefix(), sp.Start, sp.End, sp.Home)})
				split[d.GetRangeId()] = true
				moves++
			}
		}
	}
	if cfg.AutoRehome {
		for _, d := range ranges {
			want, ok := v.RipeRehomes[d.GetRangeId()]
			if !ok || !settled(d) || split[d.GetRangeId()] || moves >= cfg.MaxMoves {
				continue
			}
			out = append(out, Action{Kind: Rehome, Range: d, Home: want.Region, Auto: true, Why: want.Why})
			split[d.GetRangeId()] = true
			moves++
		}
	}
	for _, rule := range v.Placement {
		if rule.GetKind() != directorypb.PlacementKind_PLACEMENT_GLOBAL || rule.GetHome() != v.Region {
			continue
		}
		for _, sp := range placement.Spans(rule, regions) {
			for _, d := range ranges {
				if !inside(d, sp) || !settled(d) || split[d.GetRangeId()] || moves >= cfg.MaxMoves {
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

// inside reports whether d's span lies inside sp.
func inside(d *pb.RangeDescriptor, sp placement.Span) bool {
	return bytes.Compare(sp.Start, d.GetStartKey()) <= 0 && sp.End != nil && len(d.GetEndKey()) > 0 && bytes.Compare(d.GetEndKey(), sp.End) <= 0
}

// Automatic rehoming (DESIGN.md §13): a range whose writes come mostly
// from one other region moves there.
const (
	// AutoRehomeShare is the least share of a range's write transactions
	// that must come from one other region.
	AutoRehomeShare = 0.75
	// AutoRehomeMinRate is the least rate of them, per second: a range
	// written rarely stays where it is.
	AutoRehomeMinRate = 1.0
)

// AutoRehome is where a range's writes would take it, and why.
type AutoRehome struct {
	Region, Why string
}

// AutoRehomeCandidates returns, by range ID, the ranges of v homed in
// v.Region and under no placement rule at least AutoRehomeShare and
// AutoRehomeMinRate of whose writes come from one other data region, and
// that region. The queue plans a Rehome for one only once it has been a
// candidate for that region for QueueConfig.AutoRehomeAfter (View.RipeRehomes).
func AutoRehomeCandidates(v View) map[uint64]AutoRehome {
	regions := []string{v.Region}
	for r := range v.Elsewhere {
		regions = append(regions, r)
	}
	slices.Sort(regions)
	out := map[uint64]AutoRehome{}
	for _, d := range v.Ranges {
		if d.GetSubsumed() || d.GetRegion() != v.Region || ruled(v.Placement, regions, d) {
			continue
		}
		w := v.Load[d.GetRangeId()].Writes
		var total float64
		for _, rate := range w {
			total += rate
		}
		for _, region := range regions {
			if rate := w[region]; region != v.Region && rate >= AutoRehomeMinRate && rate >= AutoRehomeShare*total {
				out[d.GetRangeId()] = AutoRehome{Region: region, Why: fmt.Sprintf("%.0f%% of its %.1f writes/s come from %s", 100*rate/total, total, region)}
				break
			}
		}
	}
	return out
}

// ruled reports whether a span of a placement rule overlaps d.
func ruled(rules []*directorypb.PlacementRule, regions []string, d *pb.RangeDescriptor) bool {
	for _, rule := range rules {
		for _, sp := range placement.Spans(rule, regions) {
			if (sp.End == nil || bytes.Compare(d.GetStartKey(), sp.End) < 0) && (len(d.GetEndKey()) == 0 || bytes.Compare(sp.Start, d.GetEndKey()) < 0) {
				return true
			}
		}
	}
	return false
}
