// Package rebalance is a region's replicate queue (DESIGN.md §12): it
// drains the replicas of ranges and other groups, and the leases, off
// decommissioning nodes and nodes down past a bound, marks a drained node
// gone, and keeps replica counts (ranges and groups together) and lease
// counts within one of each other across the region's live nodes, so
// a node that joins fills without an operator moving anything. Plan is
// pure (a function of the registry, the descriptors and the leases); Queue
// runs it at the region's directory leader.
package rebalance

import (
	"bytes"
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/terroir-db/terroir/internal/directory/directorypb"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/routing"
)

// Kind names what an Action does.
type Kind int

const (
	// Move moves the range's replica on From to To.
	Move Kind = iota
	// Transfer moves the range's lease from From to To.
	Transfer
	// Gone marks node From gone: it hosts nothing any more.
	Gone
	// MoveGroup moves the non-range group's replica on From to To.
	MoveGroup
	// MoveNonVoter moves a non-voting replica (DESIGN.md §13) of a range
	// homed in another region from this region's node From to To (0: only
	// removes it, another node of the region holding one already).
	MoveNonVoter
	// Split splits the range at Key, a bound of a placement rule's span
	// (DESIGN.md §13).
	Split
	// AddNonVoter adds a non-voting replica of the range on node To, in
	// another region, as a global placement rule asks.
	AddNonVoter
	// Rehome moves the range's home to region Home, as a placement rule
	// asks (DESIGN.md §13).
	Rehome

	numKinds = iota
)

// Kinds lists every Kind.
var Kinds = []Kind{Move, Transfer, Gone, MoveGroup, MoveNonVoter, Split, AddNonVoter, Rehome}

// Action is one step of a plan.
type Action struct {
	Kind     Kind
	Range    *pb.RangeDescriptor // nil for Gone and MoveGroup
	Group    uint64              // MoveGroup's group
	Key      []byte              // Split's split key
	Home     string              // Rehome's region
	From, To uint64
	// Why says what the step is for, for the log.
	Why string
	// Auto: a Rehome that follows where the range's writes come from,
	// rather than a placement rule.
	Auto bool
	// Balance: the step evens counts out (rather than draining a node);
	// a lease transfer for balance waits for a moment the range holds no
	// locks, and only once the imbalance has lasted (QueueConfig.LeaseSettle).
	Balance bool
}

// View is what a plan is made from: the region's registry with liveness,
// its ranges' descriptors, and which node holds each range's lease.
type View struct {
	Nodes  []*directorypb.NodeLiveness
	Ranges []*pb.RangeDescriptor
	Leases map[uint64]uint64 // range ID → leaseholder (absent: unknown)
	// RipeRehomes are the automatic rehomes (Config.AutoRehome) whose
	// range has been a candidate long enough, by range ID (the queue's).
	RipeRehomes map[uint64]AutoRehome
	// Groups are the region's non-range groups (epoch, transaction-state,
	// directory) with their voters.
	Groups []Group
	// InFlight is what the queue is changing now.
	InFlight InFlight
	// Load is each range's size and request rate, as its leader reports
	// them (absent: unknown, so never a merge candidate).
	Load map[uint64]Load
	// Foreign are the descriptors of ranges homed in other regions that
	// have non-voting replicas (DESIGN.md §13) on this region's nodes, as
	// their directories hold them: a draining node sheds them too.
	Foreign []*pb.RangeDescriptor
	// Region is the region planned for; Placement its placement rules
	// (DESIGN.md §13), Elsewhere the live nodes of every other region with
	// data, by region, for the non-voters of global rules.
	Region    string
	Placement []*directorypb.PlacementRule
	Elsewhere map[string][]uint64
}

// Load is a range's size (bytes, estimated on disk) and request rate
// (requests/s at its leader).
type Load struct {
	Bytes uint64
	QPS   float64
	// Writes are the write transactions per second the leader committed,
	// by their coordinator's region (automatic rehoming, DESIGN.md §13).
	Writes map[string]float64
}

// InFlight is what the queue's earlier plans are still changing: a plan
// leaves those ranges, groups and nodes alone, and counts the replica
// moves under way against Config.MaxMoves.
type InFlight struct {
	Ranges map[uint64]bool // range ID → a move or lease transfer is under way
	Groups map[uint64]bool // group ID → a move is under way
	Gone   map[uint64]bool // node ID → being marked gone
	// Moves counts the replica moves under way that count against
	// MaxMoves (see Action.streams).
	Moves int
}

// Group is a non-range group's placement as its replicas report it.
type Group struct {
	ID     uint64
	Voters []uint64
	// Settled: no joint configuration (a learner a failed move left is
	// removed by the group's next move).
	Settled bool
}

// Config bounds a plan.
type Config struct {
	// ReplaceAfter: a node in the live state but not live for this long
	// has its replicas rebuilt on other nodes (0: never).
	ReplaceAfter time.Duration
	// MaxMoves: at most this many range replica moves at once (each
	// streams one snapshot), those under way included.
	MaxMoves int
	// MergeSize, MergeQPS: the ranges' automatic merge thresholds
	// (topology merge_size in bytes, merge_qps in requests/s; MergeSize 0:
	// no automatic merges). Neighbours under them together are moved onto
	// the same nodes, where their leader merges them (DESIGN.md §11).
	MergeSize uint64
	MergeQPS  float64
	// AutoRehome: plan to rehome the ranges of View.RipeRehomes, most of
	// whose writes have come from another region for long enough.
	AutoRehome bool
}

// maxDrainTransfers bounds the lease transfers off draining nodes in one
// plan (they run at once).
const maxDrainTransfers = 4

// node is one registered node's standing in a plan.
type node struct {
	id               uint64
	target           bool // live and in the live state: takes replicas and leases
	drain            bool // decommissioning, or down past ReplaceAfter
	decommissioning  bool
	replicas, leases int
}

// Plan returns the steps that bring v closer to balance, most urgent
// first: replicas off draining nodes, leases off draining nodes, marking
// drained decommissioning nodes gone, then moves that put merge
// candidates (mergePairs) on the same nodes, then replica moves (of a range, or
// of a group when no range can go; neither with a replica on a node that is
// down) and one lease transfer from the fullest target to the emptiest
// while they differ by more than one. A group in a
// joint configuration, and a range or group the queue changes already
// (v.InFlight), are left alone.
func Plan(v View, cfg Config) []Action {
	byID := map[uint64]*node{}
	var targets []*node
	for _, l := range v.Nodes {
		rec := l.GetNode()
		n := &node{id: rec.GetId()}
		switch rec.GetState() {
		case directorypb.NodeState_NODE_LIVE:
			n.target = l.GetLive()
			n.drain = !l.GetLive() && cfg.ReplaceAfter > 0 && time.Duration(l.GetSinceHeartbeatMs())*time.Millisecond >= cfg.ReplaceAfter
		case directorypb.NodeState_NODE_DECOMMISSIONING:
			n.drain, n.decommissioning = true, true
		}
		byID[n.id] = n
		if n.target {
			targets = append(targets, n)
		}
	}
	ranges := slices.Clone(v.Ranges)
	slices.SortFunc(ranges, func(a, b *pb.RangeDescriptor) int { return bytes.Compare(a.GetStartKey(), b.GetStartKey()) })
	for _, d := range ranges {
		for _, r := range d.GetReplicas() {
			if n := byID[r]; n != nil {
				n.replicas++
			}
		}
		if n := byID[v.Leases[d.GetRangeId()]]; n != nil {
			n.leases++
		}
	}
	for _, d := range v.Foreign { // and a non-voter of another region's range
		for _, r := range d.GetNonVoters() {
			if n := byID[r]; n != nil {
				n.replicas++
			}
		}
	}
	for _, g := range v.Groups { // a replica is a replica, of a range or of another group
		for _, r := range g.Voters {
			if n := byID[r]; n != nil {
				n.replicas++
			}
		}
	}
	var out []Action
	moves := v.InFlight.Moves
	// emptiest returns the target with the fewest replicas (then leases)
	// that d does not name and that is not excluded.
	emptiest := func(d *pb.RangeDescriptor, count func(*node) int) *node {
		var best *node
		for _, t := range targets {
			if slices.Contains(d.GetReplicas(), t.id) {
				continue
			}
			if best == nil || count(t) < count(best) || count(t) == count(best) && t.id < best.id {
				best = t
			}
		}
		return best
	}
	replicaCount := func(n *node) int { return n.replicas }
	// A learner a failed move left does not hold a range back: its next
	// move removes it first. A range the queue changes already waits. So
	// does one whose right-hand neighbour is subsumed: its leader finishes
	// that merge only while both are on the same nodes, and the subsumed
	// range cannot move (rangeserver.AdminMerge), so a move would leave
	// the merge, and the keys the directory still routes to the subsumed
	// range, stuck for good.
	subsumedAt := map[string]bool{} // start keys of subsumed ranges
	for _, d := range ranges {
		if d.GetSubsumed() {
			subsumedAt[string(d.GetStartKey())] = true
		}
	}
	settled := func(d *pb.RangeDescriptor) bool {
		absorbing := len(d.GetEndKey()) > 0 && subsumedAt[string(d.GetEndKey())]
		return !d.GetSubsumed() && !absorbing && len(d.GetRehomeVoters()) == 0 && !v.InFlight.Ranges[d.GetRangeId()]
	}

	moving := map[uint64]bool{} // ranges this plan changes already: one change per range
	// Replicas off draining nodes.
	for _, d := range ranges {
		if !settled(d) {
			continue
		}
		for _, r := range d.GetReplicas() {
			n := byID[r]
			if n == nil || !n.drain || moves >= cfg.MaxMoves {
				continue
			}
			if t := emptiest(d, replicaCount); t != nil {
				out = append(out, Action{Kind: Move, Range: d, From: r, To: t.id, Why: drainWhy(n)})
				t.replicas++
				n.replicas--
				moves++
				moving[d.GetRangeId()] = true
				break // one change per range per plan
			}
		}
	}
	// Non-voting replicas of other regions' ranges off draining nodes.
	for _, d := range v.Foreign {
		if v.InFlight.Ranges[d.GetRangeId()] || moving[d.GetRangeId()] {
			continue
		}
		for _, r := range d.GetNonVoters() {
			n := byID[r]
			if n == nil || !n.drain || moves >= cfg.MaxMoves {
				continue
			}
			if slices.ContainsFunc(d.GetNonVoters(), func(x uint64) bool { t := byID[x]; return t != nil && t.target }) {
				// The region keeps one (an earlier move added it, and its
				// removal of this one failed): only remove.
				out = append(out, Action{Kind: MoveNonVoter, Range: d, From: r, Why: drainWhy(n)})
				n.replicas--
				moving[d.GetRangeId()] = true
				break
			}
			var best *node
			for _, t := range targets {
				if best == nil || t.replicas < best.replicas || t.replicas == best.replicas && t.id < best.id {
					best = t
				}
			}
			if best != nil {
				out = append(out, Action{Kind: MoveNonVoter, Range: d, From: r, To: best.id, Why: drainWhy(n)})
				best.replicas++
				n.replicas--
				moves++
				moving[d.GetRangeId()] = true
				break
			}
		}
	}
	// Leases off draining nodes (a replica that moves hands its lease
	// over by itself; this covers a lease whose replica waits its turn).
	transfers := 0
	for _, d := range ranges {
		n := byID[v.Leases[d.GetRangeId()]]
		if n == nil || !n.drain || !settled(d) || moving[d.GetRangeId()] || transfers >= maxDrainTransfers {
			continue
		}
		if t := leastLeased(d, byID, n.id); t != nil {
			out = append(out, Action{Kind: Transfer, Range: d, From: n.id, To: t.id, Why: drainWhy(n)})
			t.leases++
			n.leases--
			transfers++
		}
	}
	// Non-range groups' replicas off draining nodes, to the target with
	// the fewest of them (they are few and small: not counted against
	// MaxMoves).
	groupCount := map[uint64]int{}
	for _, g := range v.Groups {
		for _, r := range g.Voters {
			groupCount[r]++
		}
	}
	for _, g := range v.Groups {
		if !g.Settled || v.InFlight.Groups[g.ID] {
			continue
		}
		for _, r := range g.Voters {
			n := byID[r]
			if n == nil || !n.drain {
				continue
			}
			var best *node
			for _, t := range targets {
				if !slices.Contains(g.Voters, t.id) && (best == nil || groupCount[t.id] < groupCount[best.id] ||
					groupCount[t.id] == groupCount[best.id] && (t.replicas < best.replicas || t.replicas == best.replicas && t.id < best.id)) {
					best = t
				}
			}
			if best != nil {
				out = append(out, Action{Kind: MoveGroup, Group: g.ID, From: r, To: best.id, Why: drainWhy(n)})
				groupCount[best.id]++
				groupCount[r]--
				break // one change per group per plan
			}
		}
	}
	// Drained decommissioning nodes are gone.
	for _, l := range v.Nodes {
		n := byID[l.GetNode().GetId()]
		// A group whose placement is unknown, or in a joint change, may
		// still name it as a voter.
		if n.decommissioning && !v.InFlight.Gone[n.id] && !slices.ContainsFunc(v.Groups, func(g Group) bool { return !g.Settled || slices.Contains(g.Voters, n.id) }) &&
			!namedAnywhere(ranges, n.id) && !namedAnywhere(v.Foreign, n.id) && !holdsLease(v.Leases, n.id) {
			out = append(out, Action{Kind: Gone, From: n.id, Why: "drained"})
		}
	}
	if len(out) > 0 {
		return out
	}
	// Placement rules: ranges split at their spans' bounds, and the ranges
	// of a global rule homed here given a non-voter in every other region.
	placed, bounds := placementSteps(v, ranges, settled, moves, cfg)
	out = append(out, placed...)
	for _, a := range placed {
		if a.streams() {
			moves++
		}
	}
	if len(out) > 0 || len(targets) < 2 {
		return out
	}
	// Merge candidates: the right-hand range's replicas move to its left
	// neighbour's nodes, one per pair per plan (in a chain, a range that
	// moves now is no pair's left until it has); once on the same nodes,
	// the right one's lease joins the left's, where the leader merges
	// them. Until they merge, balance leaves both alone.
	pairs := slices.DeleteFunc(mergePairs(ranges, v.Load, cfg), func(p [2]*pb.RangeDescriptor) bool { return bounds[string(p[1].GetStartKey())] })
	candidate := map[uint64]bool{}
	colocating := map[uint64]bool{}
	for _, p := range pairs {
		l, r := p[0], p[1]
		candidate[l.GetRangeId()], candidate[r.GetRangeId()] = true, true
		if moves >= cfg.MaxMoves || !settled(l) || !settled(r) || colocating[l.GetRangeId()] || routing.SameNodes(l.GetReplicas(), r.GetReplicas()) {
			continue
		}
		from, to := uint64(0), uint64(0)
		for _, x := range r.GetReplicas() {
			if !slices.Contains(l.GetReplicas(), x) {
				from = x
				break
			}
		}
		for _, y := range l.GetReplicas() {
			if n := byID[y]; n != nil && n.target && !slices.Contains(r.GetReplicas(), y) {
				to = y
				break
			}
		}
		if from == 0 || to == 0 {
			continue
		}
		out = append(out, Action{Kind: Move, Range: r, From: from, To: to, Balance: true,
			Why: fmt.Sprintf("colocate with range %d for a merge", l.GetRangeId())})
		colocating[r.GetRangeId()] = true
		moves++
	}
	if len(out) > 0 {
		return out
	}
	for _, p := range pairs {
		l, r := p[0], p[1]
		lh, rh := v.Leases[l.GetRangeId()], v.Leases[r.GetRangeId()]
		if n := byID[lh]; n != nil && n.target && rh != 0 && rh != lh && settled(r) && routing.SameNodes(l.GetReplicas(), r.GetReplicas()) {
			out = append(out, Action{Kind: Transfer, Range: r, From: rh, To: lh,
				Why: fmt.Sprintf("gather the lease with range %d's for a merge", l.GetRangeId())})
		}
	}
	if len(out) > 0 {
		return out
	}
	// Balance replicas (of ranges and of the other groups together): moves
	// from the fullest target to the emptiest, up to MaxMoves, each of
	// another range, or of a group when no range can go.
	moved := map[uint64]bool{}
	movedGroup := map[uint64]bool{}
	// A range or group with a replica on a node that is down waits for the
	// drain (ReplaceAfter) to replace that one: a balance move of another
	// would take it through a joint configuration that needs a quorum of
	// the old voters and of the new, each with one voter down.
	up := func(replicas []uint64) bool {
		return !slices.ContainsFunc(replicas, func(r uint64) bool { n := byID[r]; return n == nil || !n.target })
	}
	for moves < cfg.MaxMoves {
		full, empty := extremes(targets, replicaCount)
		if full.replicas-empty.replicas <= 1 {
			break
		}
		if i := slices.IndexFunc(ranges, func(d *pb.RangeDescriptor) bool {
			return settled(d) && !moved[d.GetRangeId()] && !candidate[d.GetRangeId()] && up(d.GetReplicas()) &&
				slices.Contains(d.GetReplicas(), full.id) && !slices.Contains(d.GetReplicas(), empty.id)
		}); i >= 0 {
			d := ranges[i]
			out = append(out, Action{Kind: Move, Range: d, From: full.id, To: empty.id, Why: "balance replicas", Balance: true})
			moved[d.GetRangeId()] = true
		} else if i := slices.IndexFunc(v.Groups, func(g Group) bool {
			return g.Settled && !v.InFlight.Groups[g.ID] && !movedGroup[g.ID] && up(g.Voters) &&
				slices.Contains(g.Voters, full.id) && !slices.Contains(g.Voters, empty.id)
		}); i >= 0 {
			out = append(out, Action{Kind: MoveGroup, Group: v.Groups[i].ID, From: full.id, To: empty.id, Why: "balance replicas", Balance: true})
			movedGroup[v.Groups[i].ID] = true
		} else {
			break
		}
		full.replicas--
		empty.replicas++
		moves++
	}
	if len(out) > 0 {
		return out
	}
	// Balance leases: one transfer from the target with the most leases
	// that can give one to a replica of the same range with at least two
	// fewer.
	byLeases := slices.Clone(targets)
	slices.SortFunc(byLeases, func(a, b *node) int { return cmp.Or(cmp.Compare(b.leases, a.leases), cmp.Compare(a.id, b.id)) })
	for _, from := range byLeases {
		for _, d := range ranges {
			if v.Leases[d.GetRangeId()] != from.id || !settled(d) || candidate[d.GetRangeId()] {
				continue
			}
			if t := leastLeased(d, byID, from.id); t != nil && from.leases-t.leases > 1 {
				out = append(out, Action{Kind: Transfer, Range: d, From: from.id, To: t.id, Why: "balance leases", Balance: true})
				return out
			}
		}
	}
	// No direct transfer helps (the emptiest nodes are no replicas of the
	// fullest's ranges): hand one lease to a replica with one fewer that
	// can pass one of its own on to a replica with two fewer, which the
	// next plan does. Each pair of steps lowers the sum of squared lease
	// counts, so plans settle.
	for _, from := range byLeases {
		for _, d := range ranges {
			if v.Leases[d.GetRangeId()] != from.id || !settled(d) || candidate[d.GetRangeId()] {
				continue
			}
			for _, m := range d.GetReplicas() {
				mid := byID[m]
				if mid == nil || !mid.target || mid.leases != from.leases-1 {
					continue
				}
				for _, d2 := range ranges {
					if d2 == d || v.Leases[d2.GetRangeId()] != m || !settled(d2) || candidate[d2.GetRangeId()] {
						continue
					}
					if t := leastLeased(d2, byID, m); t != nil && t.id != from.id && from.leases-t.leases > 1 {
						out = append(out, Action{Kind: Transfer, Range: d, From: from.id, To: m, Why: "balance leases (by way of the next hop)", Balance: true})
						return out
					}
				}
			}
		}
	}
	return out
}

// mergePairs returns the neighbours (ranges in key order) that the
// leader would merge once on the same nodes: together under MergeSize
// bytes and MergeQPS requests/s, the boundary not an operator's (sticky).
func mergePairs(ranges []*pb.RangeDescriptor, load map[uint64]Load, cfg Config) [][2]*pb.RangeDescriptor {
	if cfg.MergeSize == 0 {
		return nil
	}
	var out [][2]*pb.RangeDescriptor
	for i := 0; i+1 < len(ranges); i++ {
		l, r := ranges[i], ranges[i+1]
		ll, ok1 := load[l.GetRangeId()]
		rl, ok2 := load[r.GetRangeId()]
		if !ok1 || !ok2 || r.GetSticky() || !bytes.Equal(l.GetEndKey(), r.GetStartKey()) || l.GetRegion() != r.GetRegion() || !routing.SameNodes(l.GetNonVoters(), r.GetNonVoters()) ||
			ll.Bytes+rl.Bytes >= cfg.MergeSize || cfg.MergeQPS > 0 && ll.QPS+rl.QPS >= cfg.MergeQPS {
			continue
		}
		out = append(out, [2]*pb.RangeDescriptor{l, r})
	}
	return out
}

// streams reports whether a counts against Config.MaxMoves: a range's
// replica move, or a group's for balance (a group's moves to drain are
// few and small, and go first).
// String describes a for a log line or a status: its kind, what it
// changes, from and to where, and why.
func (a Action) String() string {
	switch a.Kind {
	case Gone:
		return fmt.Sprintf("%s node %d (%s)", a.Kind, a.From, a.Why)
	case MoveGroup:
		return fmt.Sprintf("%s group %d %d→%d (%s)", a.Kind, a.Group, a.From, a.To, a.Why)
	}
	return fmt.Sprintf("%s range %d %d→%d (%s)", a.Kind, a.Range.GetRangeId(), a.From, a.To, a.Why)
}

func (a Action) streams() bool {
	return a.Kind == Move || a.Kind == MoveNonVoter || a.Kind == AddNonVoter || a.Kind == Rehome || a.Kind == MoveGroup && a.Balance
}

func drainWhy(n *node) string {
	if n.decommissioning {
		return "decommissioning"
	}
	return "down past replace_after"
}

// leastLeased returns d's replica other than holder that is a target with
// the fewest leases, or nil.
func leastLeased(d *pb.RangeDescriptor, byID map[uint64]*node, holder uint64) *node {
	var best *node
	for _, r := range d.GetReplicas() {
		n := byID[r]
		if r == holder || n == nil || !n.target {
			continue
		}
		if best == nil || n.leases < best.leases || n.leases == best.leases && n.id < best.id {
			best = n
		}
	}
	return best
}

// extremes returns the targets with the most and the fewest by count
// (ties: the lowest id).
func extremes(targets []*node, count func(*node) int) (full, empty *node) {
	full = slices.MaxFunc(targets, func(a, b *node) int { return cmp.Or(cmp.Compare(count(a), count(b)), cmp.Compare(b.id, a.id)) })
	empty = slices.MinFunc(targets, func(a, b *node) int { return cmp.Or(cmp.Compare(count(a), count(b)), cmp.Compare(a.id, b.id)) })
	return full, empty
}

// namedAnywhere reports whether any range names id as a replica or learner.
func namedAnywhere(ranges []*pb.RangeDescriptor, id uint64) bool {
	for _, d := range ranges {
		if slices.Contains(d.GetReplicas(), id) || slices.Contains(d.GetLearners(), id) || slices.Contains(d.GetNonVoters(), id) {
			return true
		}
	}
	return false
}

func holdsLease(leases map[uint64]uint64, id uint64) bool {
	for _, h := range leases {
		if h == id {
			return true
		}
	}
	return false
}

// String names the kind for logs.
func (k Kind) String() string {
	switch k {
	case Move:
		return "move"
	case Transfer:
		return "transfer"
	case Gone:
		return "gone"
	case MoveGroup:
		return "move group"
	case MoveNonVoter:
		return "move non-voter"
	case Split:
		return "split"
	case AddNonVoter:
		return "add non-voter"
	case Rehome:
		return "rehome"
	}
	return "unknown"
}
