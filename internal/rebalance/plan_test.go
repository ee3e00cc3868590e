package rebalance

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/terroir-db/terroir/internal/directory/directorypb"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
)

func live(id uint64) *directorypb.NodeLiveness {
	return &directorypb.NodeLiveness{Node: &directorypb.NodeRecord{Id: id}, Live: true}
}

func rng(id uint64, start string, replicas ...uint64) *pb.RangeDescriptor {
	return &pb.RangeDescriptor{RangeId: id, StartKey: []byte(start), Replicas: replicas, Generation: 1}
}

func show(plan []Action) []string {
	var out []string
	for _, a := range plan {
		out = append(out, fmt.Sprintf("%s r%d %d->%d", a.Kind, a.Range.GetRangeId(), a.From, a.To))
	}
	return out
}

// apply runs plan on v as the cluster would.
func apply(v *View, plan []Action) {
	for _, a := range plan {
		switch a.Kind {
		case Move:
			for _, d := range v.Ranges {
				if d.GetRangeId() == a.Range.GetRangeId() {
					d.Replicas = append(slices.DeleteFunc(d.Replicas, func(n uint64) bool { return n == a.From }), a.To)
					if v.Leases[d.GetRangeId()] == a.From {
						v.Leases[d.GetRangeId()] = d.Replicas[0]
					}
				}
			}
		case Transfer:
			v.Leases[a.Range.GetRangeId()] = a.To
		case MoveGroup:
			for i, g := range v.Groups {
				if g.ID == a.Group {
					v.Groups[i].Voters = append(slices.DeleteFunc(slices.Clone(g.Voters), func(n uint64) bool { return n == a.From }), a.To)
				}
			}
		case Gone:
			for _, l := range v.Nodes {
				if l.GetNode().GetId() == a.From {
					l.Node.State = directorypb.NodeState_NODE_GONE
				}
			}
		}
	}
}

func counts(v View) (replicas, leases map[uint64]int) {
	replicas, leases = map[uint64]int{}, map[uint64]int{}
	for _, l := range v.Nodes {
		if l.GetLive() && l.GetNode().GetState() == directorypb.NodeState_NODE_LIVE {
			replicas[l.GetNode().GetId()], leases[l.GetNode().GetId()] = 0, 0
		}
	}
	for _, d := range v.Ranges {
		for _, r := range d.GetReplicas() {
			replicas[r]++
		}
	}
	for _, g := range v.Groups {
		for _, r := range g.Voters {
			replicas[r]++
		}
	}
	for _, h := range v.Leases {
		leases[h]++
	}
	return replicas, leases
}

func spread(m map[uint64]int) int {
	lo, hi := -1, 0
	for _, c := range m {
		if lo < 0 || c < lo {
			lo = c
		}
		hi = max(hi, c)
	}
	return hi - lo
}

// TestPlanFillsJoinersAndDrains: repeated plans bring a region whose two
// nodes just joined to replica and lease counts within one; a
// decommissioning node is drained and then marked gone; a node down past
// ReplaceAfter is drained; ranges moving already are left alone; each plan
// moves at most MaxMoves replicas.
func TestPlanFillsJoinersAndDrains(t *testing.T) {
	v := View{Nodes: []*directorypb.NodeLiveness{live(1), live(2), live(3), live(4), live(5)}, Leases: map[uint64]uint64{},
		Groups: []Group{{ID: 1, Voters: []uint64{1, 2, 3}, Settled: true}, {ID: 2, Voters: []uint64{1, 2, 3}, Settled: true}}}
	for i := range 10 {
		v.Ranges = append(v.Ranges, rng(uint64(10+i), fmt.Sprintf("k%02d", i), 1, 2, 3))
		v.Leases[uint64(10+i)] = 1
	}
	cfg := Config{MaxMoves: 2, ReplaceAfter: time.Minute}
	for round := 0; ; round++ {
		plan := Plan(v, cfg)
		if len(plan) == 0 {
			break
		}
		moves := 0
		for _, a := range plan {
			if a.Kind == Move {
				moves++
			}
		}
		if moves > cfg.MaxMoves {
			t.Fatalf("round %d moves %d replicas: %v", round, moves, show(plan))
		}
		apply(&v, plan)
		if round > 100 {
			t.Fatalf("no balance after 100 rounds: last plan %v", show(plan))
		}
	}
	rep, lea := counts(v)
	if spread(rep) > 1 || spread(lea) > 1 {
		t.Fatalf("settled with replicas %v, leases %v", rep, lea)
	}
	t.Logf("balanced: replicas %v, leases %v", rep, lea)

	// Node 4 decommissions: drained, then gone.
	v.Nodes[3].Node.State = directorypb.NodeState_NODE_DECOMMISSIONING
	for round := 0; v.Nodes[3].GetNode().GetState() != directorypb.NodeState_NODE_GONE; round++ {
		plan := Plan(v, cfg)
		for _, a := range plan {
			if a.Kind == Move && a.To == 4 || a.Kind == Transfer && a.To == 4 {
				t.Fatalf("plan gives decommissioning node 4 something: %v", show(plan))
			}
		}
		apply(&v, plan)
		if round > 100 {
			t.Fatal("node 4 never gone")
		}
	}
	for _, d := range v.Ranges {
		if slices.Contains(d.GetReplicas(), 4) || len(d.GetReplicas()) != 3 {
			t.Fatalf("after the drain range %d has replicas %v", d.GetRangeId(), d.GetReplicas())
		}
	}
	// Node 1 decommissions: its ranges' and groups' replicas move (one
	// change per group per plan, to the node with the fewest group
	// replicas), and it is gone only once no group names it; a group in
	// the middle of a move is left alone until it settles.
	v.Nodes[0].Node.State = directorypb.NodeState_NODE_DECOMMISSIONING
	v.Groups[1].Settled = false
	for round := 0; round < 100; round++ {
		plan := Plan(v, cfg)
		for _, a := range plan {
			switch {
			case a.Kind == Gone && slices.ContainsFunc(v.Groups, func(g Group) bool { return slices.Contains(g.Voters, 1) }):
				t.Fatalf("node 1 marked gone while a group names it: %v", v.Groups)
			case a.Kind == MoveGroup && (a.Group == 2 && !v.Groups[1].Settled || a.To == 1 || a.To == 4 || slices.Contains(v.Groups[a.Group-1].Voters, a.To)):
				t.Fatalf("bad group move %v with groups %v", a, v.Groups)
			}
		}
		apply(&v, plan)
		if round == 10 {
			v.Groups[1].Settled = true
		}
	}
	if st := v.Nodes[0].GetNode().GetState(); st != directorypb.NodeState_NODE_GONE {
		t.Fatalf("node 1 is %v after its drain; groups %v", st, v.Groups)
	}
	for _, g := range v.Groups {
		if slices.Contains(g.Voters, 1) || len(g.Voters) != 3 {
			t.Fatalf("after the drain group %d has voters %v", g.ID, g.Voters)
		}
	}

	// Node 6 joins; node 5 goes down: nothing moves until ReplaceAfter,
	// then it drains.
	v.Nodes = append(v.Nodes, live(6))
	v.Nodes[4].Live, v.Nodes[4].SinceHeartbeatMs = false, 30_000
	for _, a := range Plan(v, cfg) {
		if a.From == 5 {
			t.Fatalf("moved off node 5 after 30 s down: %v", a)
		}
	}
	v.Nodes[4].SinceHeartbeatMs = 61_000
	plan := Plan(v, cfg)
	if len(plan) == 0 || plan[0].Kind != Move || plan[0].From != 5 {
		t.Fatalf("node 5 down past ReplaceAfter: plan %v; want moves off it", show(plan))
	}
	// A range with a learner a failed move left still drains (its move
	// removes the learner first); a subsumed range, or a group in a joint
	// change, is left alone.
	for _, d := range v.Ranges {
		d.Learners = []uint64{9}
	}
	if plan := Plan(v, cfg); len(plan) == 0 || plan[0].Kind != Move || plan[0].From != 5 {
		t.Fatalf("ranges with leftover learners on a node to drain: plan %v; want moves off node 5", show(plan))
	}
	for _, d := range v.Ranges {
		d.Subsumed = true
	}
	for i := range v.Groups {
		v.Groups[i].Settled = false
	}
	if plan := Plan(v, cfg); len(plan) != 0 {
		t.Fatalf("subsumed ranges and groups in joint changes: plan %v; want none", show(plan))
	}
}

// TestPlanLeavesAMergeItsReplicas: a range whose right-hand neighbour is
// subsumed keeps its replicas, even on a draining node, until the merge
// finishes; the plan drains it once the neighbour is gone. It fails if the
// plan moves the absorbing range (the merge could never finish).
func TestPlanLeavesAMergeItsReplicas(t *testing.T) {
	v := View{Nodes: []*directorypb.NodeLiveness{live(1), live(2), live(3), live(4)}, Leases: map[uint64]uint64{10: 1, 11: 1}}
	left, right := rng(10, "a", 1, 2, 3), rng(11, "m", 1, 2, 3)
	left.EndKey, right.Subsumed = []byte("m"), true
	v.Ranges = []*pb.RangeDescriptor{left, right}
	v.Nodes[2].Node.State = directorypb.NodeState_NODE_DECOMMISSIONING
	for _, a := range Plan(v, Config{MaxMoves: 2}) {
		if a.Kind == Move {
			t.Fatalf("the plan moves a replica while range 10 absorbs range 11: %v", show([]Action{a}))
		}
	}
	v.Ranges = v.Ranges[:1] // merged
	left.EndKey = nil
	if got := show(Plan(v, Config{MaxMoves: 2})); !slices.Contains(got, "move r10 3->4") {
		t.Fatalf("after the merge the plan does not drain node 3: %v", got)
	}
}

// TestPlanSettlesFromAnyPlacement: from random placements of ranges, with
// up to four other groups on the first three nodes, plans settle (an empty
// plan) within a bounded number of rounds, with replica counts (ranges and
// groups together) and lease counts within one across the nodes.
func TestPlanSettlesFromAnyPlacement(t *testing.T) {
	for seed := range uint64(200) {
		r := rand.New(rand.NewPCG(seed, 0))
		nodes := 3 + r.IntN(5)
		v := View{Leases: map[uint64]uint64{}}
		for id := 1; id <= nodes; id++ {
			v.Nodes = append(v.Nodes, live(uint64(id)))
		}
		for i := range 1 + r.IntN(20) {
			perm := r.Perm(nodes)[:3]
			d := rng(uint64(10+i), fmt.Sprintf("k%02d", i), uint64(perm[0]+1), uint64(perm[1]+1), uint64(perm[2]+1))
			v.Ranges = append(v.Ranges, d)
			v.Leases[d.GetRangeId()] = d.Replicas[r.IntN(3)]
		}
		for i := range r.IntN(5) { // epoch, txn-state, directory groups: on the first three nodes, as bootstrapped
			v.Groups = append(v.Groups, Group{ID: uint64(1 + i), Voters: []uint64{1, 2, 3}, Settled: true})
		}
		rounds := 0
		for ; rounds < 500; rounds++ {
			plan := Plan(v, Config{MaxMoves: 2})
			if len(plan) == 0 {
				break
			}
			apply(&v, plan)
		}
		rep, lea := counts(v)
		if rounds == 500 || spread(rep) > 1 || spread(lea) > 1 {
			t.Errorf("seed %d (%d nodes, %d ranges): after %d rounds replicas %v, leases %v", seed, nodes, len(v.Ranges), rounds, rep, lea)
		}
	}
}

// TestPlanColocatesMergeCandidates: two small, cold neighbours on
// different nodes get the right one's replica moved to the left's nodes
// (where their leader merges them); once colocated, balance leaves them
// together; neighbours too large, too busy, or split by an operator are
// not colocated.
func TestPlanColocatesMergeCandidates(t *testing.T) {
	cfg := Config{MaxMoves: 2, MergeSize: 1000, MergeQPS: 10}
	view := func(right *pb.RangeDescriptor, load Load) View {
		return View{
			Nodes:  []*directorypb.NodeLiveness{live(1), live(2), live(3), live(4)},
			Ranges: []*pb.RangeDescriptor{{RangeId: 1, StartKey: nil, EndKey: []byte("m"), Replicas: []uint64{1, 2, 3}, Generation: 1}, right},
			Leases: map[uint64]uint64{1: 1, 2: 2},
			Load:   map[uint64]Load{1: {Bytes: 100}, 2: load},
		}
	}
	right := func(sticky bool, replicas ...uint64) *pb.RangeDescriptor {
		return &pb.RangeDescriptor{RangeId: 2, StartKey: []byte("m"), Replicas: replicas, Generation: 1, Sticky: sticky}
	}
	plan := Plan(view(right(false, 2, 3, 4), Load{Bytes: 100, QPS: 1}), cfg)
	if got := show(plan); len(got) != 1 || got[0] != "move r2 4->1" {
		t.Errorf("small neighbours on [1 2 3] and [2 3 4]: plan %v; want move r2 4->1", got)
	}
	for name, v := range map[string]View{
		"too large":           view(right(false, 2, 3, 4), Load{Bytes: 900}),
		"too busy":            view(right(false, 2, 3, 4), Load{Bytes: 100, QPS: 10}),
		"an operator's split": view(right(true, 2, 3, 4), Load{Bytes: 100}),
		"load unknown":        {Nodes: view(nil, Load{}).Nodes, Ranges: view(right(false, 2, 3, 4), Load{}).Ranges, Leases: map[uint64]uint64{1: 1, 2: 2}},
	} {
		for _, a := range Plan(v, cfg) {
			if a.Kind == Move && a.Range.GetRangeId() == 2 || a.Kind == Move && a.Range.GetRangeId() == 1 {
				t.Errorf("%s: plan moves %s r%d %d->%d (%s)", name, a.Kind, a.Range.GetRangeId(), a.From, a.To, a.Why)
			}
		}
	}
	// Colocated, the right one's lease joins the left's.
	if got := show(Plan(view(right(false, 1, 2, 3), Load{Bytes: 100}), cfg)); len(got) != 1 || got[0] != "transfer r2 2->1" {
		t.Errorf("colocated merge candidates, leases on 1 and 2: plan %v; want transfer r2 2->1", got)
	}
	// Then they stay together even while node 4 is empty (six replicas
	// on three nodes, none on the fourth; two leases on node 1).
	together := view(right(false, 1, 2, 3), Load{Bytes: 100})
	together.Leases[2] = 1
	if plan := Plan(together, cfg); len(plan) != 0 {
		t.Errorf("colocated merge candidates with one leaseholder: plan %v; want none", show(plan))
	}
	// A chain a|b|c of small ranges on three placements: b moves onto
	// a's nodes; c waits for b to settle (it would move onto b's old ones).
	chain := View{
		Nodes: []*directorypb.NodeLiveness{live(1), live(2), live(3), live(4), live(5)},
		Ranges: []*pb.RangeDescriptor{
			{RangeId: 1, EndKey: []byte("g"), Replicas: []uint64{1, 2, 3}, Generation: 1},
			{RangeId: 2, StartKey: []byte("g"), EndKey: []byte("p"), Replicas: []uint64{2, 3, 4}, Generation: 1},
			{RangeId: 3, StartKey: []byte("p"), Replicas: []uint64{3, 4, 5}, Generation: 1},
		},
		Leases: map[uint64]uint64{1: 1, 2: 2, 3: 3},
		Load:   map[uint64]Load{1: {Bytes: 10}, 2: {Bytes: 10}, 3: {Bytes: 10}},
	}
	if got := show(Plan(chain, cfg)); len(got) != 1 || got[0] != "move r2 4->1" {
		t.Errorf("a chain of three candidates: plan %v; want only move r2 4->1", got)
	}
	// Too large to merge, the same placement balances onto node 4.
	if plan := Plan(view(right(false, 1, 2, 3), Load{Bytes: 2000}), cfg); len(plan) == 0 {
		t.Error("neighbours too large to merge, node 4 empty: no balancing move")
	}
}

// TestPlanDrainsForeignNonVoters: a decommissioning node that hosts
// non-voting replicas of other regions' ranges (DESIGN.md §13) has each
// moved to a live node of its region that hosts none of that range, and
// is marked gone only once it hosts none.
func TestPlanDrainsForeignNonVoters(t *testing.T) {
	dec := live(6)
	dec.Node.State = directorypb.NodeState_NODE_DECOMMISSIONING
	foreign := &pb.RangeDescriptor{RangeId: 100, StartKey: []byte("a"), Region: "us-east1", Replicas: []uint64{1, 2, 3}, NonVoters: []uint64{6}, Generation: 3}
	other := &pb.RangeDescriptor{RangeId: 101, StartKey: []byte("g"), Region: "us-east1", Replicas: []uint64{1, 2, 3}, NonVoters: []uint64{4}, Generation: 3}
	v := View{Nodes: []*directorypb.NodeLiveness{live(4), live(5), dec, live(7)},
		Ranges: []*pb.RangeDescriptor{rng(200, "m", 4, 5, 7)}, Leases: map[uint64]uint64{200: 4},
		Foreign: []*pb.RangeDescriptor{foreign, other}}
	plan := Plan(v, Config{MaxMoves: 2})
	want := []string{"move non-voter r100 6->5"} // node 5 hosts the fewest replicas
	if got := show(plan); !slices.Equal(got, want) {
		t.Fatalf("plan %v, want %v", got, want)
	}
	// Under way, it is not planned again, and the node is not gone yet.
	v.InFlight = InFlight{Ranges: map[uint64]bool{100: true}, Moves: 1}
	if got := show(Plan(v, Config{MaxMoves: 2})); len(got) != 0 {
		t.Fatalf("with the move in flight: plan %v, want none", got)
	}
	v.InFlight = InFlight{}
	// An earlier move added one on node 5 and failed to remove node 6's:
	// only the removal is left.
	foreign.NonVoters = []uint64{6, 5}
	if got := show(Plan(v, Config{MaxMoves: 2})); !slices.Equal(got, []string{"move non-voter r100 6->0"}) {
		t.Fatalf("a non-voter on a live node already: plan %v, want only the removal", got)
	}
	foreign.NonVoters = []uint64{5}
	if got := show(Plan(v, Config{MaxMoves: 2})); !slices.Equal(got, []string{"gone r0 6->0"}) {
		t.Fatalf("drained: plan %v, want node 6 gone", got)
	}
}

// TestPlanFollowsPlacementRules: a global rule homed here splits the
// range holding its span at both bounds, one split per range per plan,
// gives the range inside the span a non-voter in the other region, and
// keeps merges from joining ranges across a bound.
func TestPlanFollowsPlacementRules(t *testing.T) {
	rule := &directorypb.PlacementRule{Prefix: []byte("b/cfg/"), Kind: directorypb.PlacementKind_PLACEMENT_GLOBAL, Home: "us-east1"}
	d := rng(100, "", 1, 2, 3)
	d.EndKey = []byte("g")
	v := View{Region: "us-east1", Nodes: []*directorypb.NodeLiveness{live(1), live(2), live(3)}, Ranges: []*pb.RangeDescriptor{d},
		Leases: map[uint64]uint64{100: 1}, Placement: []*directorypb.PlacementRule{rule}, Elsewhere: map[string][]uint64{"us-west1": {4, 5}}}
	cfg := Config{MaxMoves: 2, MergeSize: 1 << 20}
	plan := Plan(v, cfg)
	if len(plan) != 1 || plan[0].Kind != Split || string(plan[0].Key) != "b/cfg/" && string(plan[0].Key) != "b/cfg0" {
		t.Fatalf("first plan %v, want one split at a bound of the rule's span", show(plan))
	}
	// After both splits: the range inside the span gets a non-voter in
	// us-west1, and the small neighbours are not merged across a bound.
	left, mid, right := rng(100, "", 1, 2, 3), rng(101, "b/cfg/", 1, 2, 3), rng(102, "b/cfg0", 1, 2, 3)
	left.EndKey, mid.EndKey, right.EndKey = []byte("b/cfg/"), []byte("b/cfg0"), []byte("g")
	v.Ranges = []*pb.RangeDescriptor{left, mid, right}
	v.Leases = map[uint64]uint64{100: 1, 101: 2, 102: 3}
	v.Load = map[uint64]Load{100: {Bytes: 10}, 101: {Bytes: 10}, 102: {Bytes: 10}}
	plan = Plan(v, cfg)
	if got := show(plan); len(got) != 1 || plan[0].Kind != AddNonVoter || plan[0].Range.GetRangeId() != 101 || (plan[0].To != 4 && plan[0].To != 5) {
		t.Fatalf("after the splits: plan %v, want a non-voter of range 101 on node 4 or 5", got)
	}
	mid.NonVoters = []uint64{plan[0].To}
	if got := show(Plan(v, cfg)); len(got) != 0 {
		t.Fatalf("matched: plan %v, want nothing (no merge across the rule's bounds)", got)
	}
	// A home rule for the span in us-west1 rehomes the range inside it
	// there, and no other; one mid-rehome (naming its new voters) is left alone.
	v.Placement = []*directorypb.PlacementRule{{Prefix: []byte("b/cfg/"), Kind: directorypb.PlacementKind_PLACEMENT_HOME, Home: "us-west1"}}
	if got := Plan(v, cfg); len(got) != 1 || got[0].Kind != Rehome || got[0].Range.GetRangeId() != 101 || got[0].Home != "us-west1" {
		t.Fatalf("a home rule in us-west1: plan %v, want range 101 rehomed to us-west1", show(got))
	}
	mid.RehomeVoters = []uint64{4, 5, 6}
	if got := Plan(v, cfg); slices.ContainsFunc(got, func(a Action) bool { return a.Range.GetRangeId() == 101 }) {
		t.Fatalf("range 101 mid-rehome: plan %v, want nothing for it", show(got))
	}
	mid.RehomeVoters = nil
	v.Placement = []*directorypb.PlacementRule{rule}
	// Without the rule, the neighbours would merge.
	v.Placement = nil
	mid.NonVoters = nil
	if got := show(Plan(v, cfg)); len(got) == 0 {
		t.Fatal("without the rule, small neighbours planned nothing: the bound check shows nothing")
	}
}

// TestAutoRehomeCandidates: a range most of whose writes come from one
// other region is a candidate to move there, unless a placement rule
// covers it or the share or the rate is too low; Plan rehomes only the
// ripe ones, and a candidate not yet ripe holds back no other step.
func TestAutoRehomeCandidates(t *testing.T) {
	a, b := rng(100, "", 1, 2, 3), rng(101, "g", 1, 2, 3)
	a.EndKey, b.EndKey = []byte("g"), []byte("m")
	a.Region, b.Region = "us-east1", "us-east1"
	v := View{Region: "us-east1", Nodes: []*directorypb.NodeLiveness{live(1), live(2), live(3)}, Ranges: []*pb.RangeDescriptor{a, b},
		Leases: map[uint64]uint64{100: 1, 101: 2}, Elsewhere: map[string][]uint64{"us-west1": {4, 5, 6}},
		Load: map[uint64]Load{100: {Writes: map[string]float64{"us-west1": 6, "us-east1": 4}}, 101: {Writes: map[string]float64{"us-west1": 9, "us-east1": 1}}}}
	got := AutoRehomeCandidates(v)
	if len(got) != 1 || got[101].Region != "us-west1" {
		t.Fatalf("candidates %v, want range 101 to us-west1 alone (range 100's share is 60%%)", got)
	}
	v.Load[101] = Load{Writes: map[string]float64{"us-west1": 0.5}}
	if got := AutoRehomeCandidates(v); len(got) != 0 {
		t.Fatalf("at 0.5 writes/s: candidates %v, want none", got)
	}
	v.Load[101] = Load{Writes: map[string]float64{"us-west1": 9, "us-east1": 1}}
	v.Placement = []*directorypb.PlacementRule{{Prefix: []byte("h/"), Kind: directorypb.PlacementKind_PLACEMENT_HOME, Home: "us-east1"}}
	if got := AutoRehomeCandidates(v); len(got) != 0 {
		t.Fatalf("under a placement rule: candidates %v, want none", got)
	}
	v.Placement = nil
	cfg := Config{MaxMoves: 2, AutoRehome: true}
	if plan := Plan(v, cfg); slices.ContainsFunc(plan, func(a Action) bool { return a.Kind == Rehome }) {
		t.Fatalf("no ripe rehome: plan %v", show(plan))
	}
	v.RipeRehomes = AutoRehomeCandidates(v)
	plan := Plan(v, cfg)
	if len(plan) != 1 || plan[0].Kind != Rehome || plan[0].Range.GetRangeId() != 101 || plan[0].Home != "us-west1" || !plan[0].Auto {
		t.Fatalf("ripe: plan %v, want range 101 rehomed to us-west1", show(plan))
	}
}

// TestPlanBalancesNoRangeWithAReplicaDown: while node 3 is down (not yet
// past ReplaceAfter), balance moves no replica of a range or group that
// has one on node 3, since the move's joint configuration would need a
// quorum of the old voters and of the new, each with node 3 down; the
// ranges whose replicas are all up still balance onto the empty node 5.
func TestPlanBalancesNoRangeWithAReplicaDown(t *testing.T) {
	down := live(3)
	down.Live, down.SinceHeartbeatMs = false, 10_000
	v := View{Nodes: []*directorypb.NodeLiveness{live(1), live(2), down, live(4), live(5)}, Leases: map[uint64]uint64{},
		Ranges: []*pb.RangeDescriptor{rng(10, "a", 1, 2, 3), rng(11, "b", 1, 2, 3), rng(12, "c", 1, 2, 4), rng(13, "d", 1, 2, 4)},
		Groups: []Group{{ID: 1, Voters: []uint64{1, 2, 3}, Settled: true}}}
	plan := Plan(v, Config{MaxMoves: 2, ReplaceAfter: time.Minute})
	for _, a := range plan {
		if a.Kind == Move && a.Range.GetRangeId() < 12 || a.Kind == MoveGroup {
			t.Fatalf("plan %v moves a replica of a range or group with one on down node 3", show(plan))
		}
	}
	if len(plan) == 0 || plan[0].Kind != Move || plan[0].To != 5 {
		t.Fatalf("plan %v; want ranges 12 and 13 balanced onto node 5", show(plan))
	}
	t.Logf("plan: %v", show(plan))

	// No range can go: only the group whose voters are all up moves.
	v.Ranges = v.Ranges[:2]
	v.Groups = append(v.Groups, Group{ID: 2, Voters: []uint64{1, 2, 4}, Settled: true})
	plan = Plan(v, Config{MaxMoves: 2, ReplaceAfter: time.Minute})
	if len(plan) == 0 || slices.ContainsFunc(plan, func(a Action) bool { return a.Kind != MoveGroup || a.Group != 2 }) {
		t.Fatalf("plan %v; want only group 2's replica moved", plan)
	}
}
