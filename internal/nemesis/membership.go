package nemesis

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/terroir-db/terroir/internal/admin"
	"github.com/terroir-db/terroir/internal/directory"
	"github.com/terroir-db/terroir/internal/directory/directorypb"
	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/transport"
)

// Membership faults (DESIGN.md §12): a node joins a data region under load
// (the region's replicate queue fills it), a node is decommissioned (the
// queue drains its replicas of ranges and of every other group until the
// registry marks it gone) and stopped for good, or a replica of an epoch,
// transaction-state or directory group moves to another node.

// drainBound is how long a decommissioned node may take to be drained and
// marked gone.
const drainBound = 60 * time.Second

// replicaGCInterval is the nodes' replica GC interval: a replica that a
// kill left behind is dropped well within drainBound.
const replicaGCInterval = 2 * time.Second

// addNode joins a new node to a random data region; it returns its id (0:
// the join failed, which is an anomaly unless the cluster was busy).
func (cp *campaign) addNode(ctx context.Context, r *rand.Rand) uint64 {
	region := cp.regions[r.IntN(len(cp.regions))]
	cp.mu.Lock()
	cp.nextNode++
	id := cp.nextNode
	cp.mu.Unlock()
	if err := cp.c.JoinNode(id, region); err != nil {
		if directory.IsRegistryError(err) {
			cp.anomaly("node %d joining %s refused: %v", id, region, err)
		}
		return 0
	}
	return id
}

// drainable returns the running nodes of the data regions in regions
// keeping more than directory.MinLiveNodes nodes.
func (cp *campaign) drainable() []uint64 {
	perRegion := map[string]int{}
	var out []uint64
	for _, id := range cp.c.NodeIDs() {
		n, ok := cp.c.Net.Node(id)
		if !ok {
			continue
		}
		perRegion[n.Region]++
		if slices.Contains(cp.regions, n.Region) && !cp.decommissioned[id] {
			out = append(out, id)
		}
	}
	return slices.DeleteFunc(out, func(id uint64) bool {
		n, _ := cp.c.Net.Node(id)
		return perRegion[n.Region] <= directory.MinLiveNodes
	})
}

// decommission decommissions a drainable node, waits until the registry
// marks it gone and then stops it; it reports whether it did. A drain that
// does not finish within drainBound, or a gone node that a range still
// names, is an anomaly.
func (cp *campaign) decommission(ctx context.Context, r *rand.Rand) bool {
	cands := cp.drainable()
	if len(cands) == 0 {
		return false
	}
	id := cands[r.IntN(len(cands))]
	cp.decommissioned[id] = true // drained or not, never picked again
	n, _ := cp.c.Net.Node(id)
	d := cp.c.Dialer(n.Region)
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err := admin.SetNodeState(sctx, d, cp.c.Topology, n.Region, id, directorypb.NodeState_NODE_DECOMMISSIONING)
	cancel()
	switch {
	case errors.Is(err, directory.ErrTooFewNodes):
		return false // some node of the region is down meanwhile
	case err != nil:
		if ctx.Err() == nil && directory.IsRegistryError(err) {
			cp.anomaly("decommissioning node %d: %v", id, err)
		}
		return false
	}
	deadline := time.Now().Add(drainBound)
	for {
		rows, err := admin.Nodes(ctx, d, cp.c.Topology)
		gone := err == nil && slices.ContainsFunc(rows, func(row admin.NodeRow) bool { return row.ID == id && row.State == "gone" })
		if gone {
			break
		}
		if ctx.Err() != nil {
			return false
		}
		if time.Now().After(deadline) {
			cp.anomaly("decommissioned node %d not drained within %v; it still holds: %s", id, drainBound, cp.holdings(ctx, id))
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
	if nd := cp.c.Node(id); nd != nil {
		for _, rid := range nd.RangeIDs() {
			if rg := nd.Range(rid); rg != nil && slices.Contains(rg.Desc().GetReplicas(), id) {
				cp.anomaly("gone node %d is still a replica of range %d (%v)", id, rid, rg.Desc().GetReplicas())
			}
		}
	}
	if err := cp.c.StopNode(id); err != nil {
		cp.anomaly("stopping gone node %d: %v", id, err)
	}
	return true
}

// holdings describes what keeps node from being marked gone: the ranges
// naming it (as their running replicas see them), the groups naming it,
// its leases, what it reports hosting, and the last step each queue
// failed.
func (cp *campaign) holdings(ctx context.Context, node uint64) string {
	var out []string
	seen := map[uint64]bool{}
	for _, nid := range cp.c.NodeIDs() {
		n := cp.c.Node(nid)
		if n == nil {
			continue
		}
		for _, rid := range n.RangeIDs() {
			if seen[rid] {
				continue
			}
			seen[rid] = true
			d := cp.rangeByID(rid)
			switch {
			case d == nil:
			case slices.Contains(d.GetReplicas(), node):
				out = append(out, fmt.Sprintf("range %d voter %v", rid, d.GetReplicas()))
			case slices.Contains(d.GetLearners(), node):
				out = append(out, fmt.Sprintf("range %d learner %v+%v", rid, d.GetReplicas(), d.GetLearners()))
			case slices.Contains(d.GetNonVoters(), node):
				out = append(out, fmt.Sprintf("range %d non-voter %v+%v", rid, d.GetReplicas(), d.GetNonVoters()))
			}
			if rg := n.Range(rid); rg != nil && rg.LeaderHint() == node && nid == node {
				out = append(out, fmt.Sprintf("range %d lease", rid))
			}
		}
	}
	for _, nid := range cp.c.NodeIDs() {
		if n := cp.c.Node(nid); n != nil {
			if st, ok := n.QueueStats(); ok {
				if st.LastFailed != "" {
					out = append(out, fmt.Sprintf("node %d's queue last failed: %s", nid, st.LastFailed))
				}
				if len(st.Running) > 0 {
					out = append(out, fmt.Sprintf("node %d's queue runs: %s", nid, strings.Join(st.Running, ", ")))
				}
			}
		}
	}
	if n := cp.c.Node(node); n != nil {
		for _, g := range n.Status(ctx).GetGroups() {
			out = append(out, fmt.Sprintf("hosted %s group %d", g.GetKind(), g.GetGroupId()))
		}
	}
	for _, g := range cp.cfg.Topology.Groups {
		if g.Kind == topology.KindRange {
			continue
		}
		var running []uint64
		for _, id := range cp.c.NodeIDs() {
			if nn, ok := cp.c.Net.Node(id); ok && nn.Region == g.Region {
				running = append(running, id)
			}
		}
		if v, err := transport.LocateGroup(ctx, cp.c.Dialer(g.Region), g.ID, running); err == nil &&
			(slices.Contains(v.Voters, node) || slices.Contains(v.Learners, node)) {
			out = append(out, fmt.Sprintf("group %d voters %v learners %v joint %v", g.ID, v.Voters, v.Learners, v.Joint))
		}
	}
	return strings.Join(out, "; ")
}

// checkQuorums records an anomaly for every group of which fewer than a
// majority of voters run, as the group's replicas on running nodes see its
// configuration (the leader's view first): once a fault is healed, every
// group must be able to commit again.
func (cp *campaign) checkQuorums() {
	type view struct {
		voters []uint64
		leader bool
	}
	views := map[uint64]view{}
	for _, id := range cp.c.NodeIDs() {
		n := cp.c.Node(id)
		if n == nil {
			continue
		}
		ids := n.RangeIDs()
		for _, g := range cp.cfg.Topology.Groups {
			if g.Kind != topology.KindRange {
				ids = append(ids, g.ID) // hosted here or not: moves change it
			}
		}
		for _, gid := range ids {
			g := n.Group(gid)
			if g == nil {
				continue
			}
			voters, _, joint := g.Members()
			if joint || len(voters) == 0 {
				continue // a change under way, or a replica waiting for its first snapshot
			}
			if v, ok := views[gid]; !ok || !v.leader && g.IsLeader() {
				views[gid] = view{voters: voters, leader: g.IsLeader()}
			}
		}
	}
	cp.mu.Lock()
	cp.sum.QuorumChecks++
	cp.mu.Unlock()
	for gid, v := range views {
		running := 0
		for _, id := range v.voters {
			if cp.c.Node(id) != nil {
				running++
			}
		}
		if running <= len(v.voters)/2 {
			cp.anomaly("group %d has %d of its voters %v running: no majority", gid, running, v.voters)
		}
	}
}

// moveGroup moves the replica of a random non-range group on one of its
// voters to a running node of the group's region that is not one and was
// not picked for decommissioning (a drain that outlived drainBound leaves
// such a node running, and the registry refuses it as a target), through
// the operator's path (admin.MoveGroupReplica); it reports whether it did.
// A move refused as bad is an anomaly: the campaign picked it from the
// group's own view.
func (cp *campaign) moveGroup(ctx context.Context, r *rand.Rand) bool {
	var groups []topology.Group
	for _, g := range cp.cfg.Topology.Groups {
		if g.Kind != topology.KindRange {
			groups = append(groups, g)
		}
	}
	g := groups[r.IntN(len(groups))]
	d := cp.c.Dialer(g.Region)
	var running []uint64
	for _, id := range cp.c.NodeIDs() {
		if n, ok := cp.c.Net.Node(id); ok && n.Region == g.Region {
			running = append(running, id)
		}
	}
	v, err := transport.LocateGroup(ctx, d, g.ID, running)
	if err != nil || v.Joint {
		return false
	}
	targets := slices.DeleteFunc(slices.Clone(running), func(id uint64) bool {
		return slices.Contains(v.Voters, id) || cp.decommissioned[id] // a decommissioning node is refused as a target
	})
	if len(targets) == 0 {
		return false
	}
	from, to := v.Voters[r.IntN(len(v.Voters))], targets[r.IntN(len(targets))]
	mctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := admin.MoveGroupReplica(mctx, d, cp.cfg.Topology, g.ID, from, to); err != nil {
		if errors.Is(err, admin.ErrBadGroupMove) {
			cp.anomaly("moving group %d's replica %d → %d refused: %v", g.ID, from, to, err)
		}
		return false
	}
	return true
}
