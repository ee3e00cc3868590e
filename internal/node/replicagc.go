package node

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/terroir-db/terroir/internal/raftgroup"
	"github.com/terroir-db/terroir/internal/rangeserver"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/transport"
)

// Replica GC (DESIGN.md §12). A replica drops itself when it applies a
// configuration that leaves it out (onReplicasChanged, Group.OnLeft), and
// a move asks the old node to drop its replica (RemoveRangeReplica,
// RemoveGroupReplica). A replica whose node was down or cut off while a
// change removed it gets neither: the group's leader no longer sends it
// entries, and the move's request failed. It would be hosted for good,
// and its node could never be marked gone. So every node, every
// Config.ReplicaGCInterval, asks the other nodes of its region (and, for
// a non-voting replica of a range homed elsewhere, that range's voters)
// for their descriptors and group configurations, and drops each
// replica of its own that a newer one leaves out (a voter, only once the
// group has left the joint configuration that removed it: leftRangeGroup).
// Dropping a range replica deletes its span's data on this node, so no
// replica whose span overlaps it is hosted here meanwhile (AddRangeReplica
// waits: awaitNoOverlap).

// defaultReplicaGCInterval is Config.ReplicaGCInterval's default.
const defaultReplicaGCInterval = 10 * time.Second

// replicaGCTimeout bounds one node's answer to the replica GC.
const replicaGCTimeout = 2 * time.Second

// collectReplicas runs the replica GC of this node, in region, every
// interval until the node stops.
func (n *Node) collectReplicas(region string, interval time.Duration) {
	for transport.SleepCtx(n.stopped, interval) {
		n.gcRangeReplicas(n.stopped, region)
		n.gcGroupReplicas(n.stopped)
		n.removeLeftoverLearners(n.stopped)
	}
}

// learnerTimeout bounds the removal of one group's leftover learners.
const learnerTimeout = 10 * time.Second

// removeLeftoverLearners removes, from the ranges and groups this node
// leads, the learners that moves cut short left behind (the leader's half
// of the replica GC: a node named only as a learner is never drained). A
// move under way is left alone (the range's move claim, the group's move
// at this node).
func (n *Node) removeLeftoverLearners(ctx context.Context) {
	for _, r := range n.rangeReplicas() {
		if len(r.Desc().GetLearners()) == 0 || r.LeaderHint() != n.cfg.NodeID {
			continue
		}
		lctx, cancel := context.WithTimeout(ctx, learnerTimeout)
		if err := r.RemoveLeftoverLearners(lctx); err != nil && !errors.Is(err, rangeserver.ErrNotLeaseholder) {
			slog.Info("replica GC: removing a range's leftover learners", "node", n.cfg.NodeID, "range", r.ID(), "err", err)
		}
		cancel()
	}
	for _, h := range n.hostedGroups() {
		if _, learners, _ := h.rg.Members(); h.g.Kind == topology.KindRange || len(learners) == 0 || !h.rg.IsLeader() {
			continue
		}
		if _, busy := n.groupMoves.LoadOrStore(h.g.ID, struct{}{}); busy {
			continue
		}
		lctx, cancel := context.WithTimeout(ctx, learnerTimeout)
		if err := h.rg.RemoveLearners(lctx, raftgroup.MoveSteps{Drop: n.dropRemoteGroup(h)}); err != nil {
			slog.Info("replica GC: removing a group's leftover learners", "node", n.cfg.NodeID, "group", h.g.ID, "err", err)
		}
		cancel()
		n.groupMoves.Delete(h.g.ID)
	}
}

// gcRangeReplicas drops this node's range replicas that a newer descriptor,
// as any other node of the region holds it, leaves out; it returns the
// ranges dropped. A replica that is its range's leader, takes part in a
// merge, or changed since it was examined is kept.
func (n *Node) gcRangeReplicas(ctx context.Context, region string) []uint64 {
	self := n.cfg.NodeID
	var peers []uint64
	for _, p := range n.dialer.RegionNodes(region, nil) {
		if p != self {
			peers = append(peers, p)
		}
	}
	for _, r := range n.rangeReplicas() {
		if d := r.Desc(); d.GetRegion() != region { // a non-voting replica (DESIGN.md §13): its voters know
			for _, p := range d.GetReplicas() {
				if !slices.Contains(peers, p) {
					peers = append(peers, p)
				}
			}
		}
	}
	newest := map[uint64]*pb.RangeDescriptor{}
	for _, sts := range n.rangesOf(ctx, peers, replicaGCTimeout) {
		for _, st := range sts {
			d := st.GetRangeDescriptor()
			if cur := newest[d.GetRangeId()]; cur == nil || d.GetGeneration() > cur.GetGeneration() {
				newest[d.GetRangeId()] = d
			}
		}
	}
	for _, r := range n.rangeReplicas() {
		// A range no peer hosts may have been rehomed away while this node
		// was down (DESIGN.md §13): the directories know where it went.
		if d := r.Desc(); newest[d.GetRangeId()] == nil && !d.GetSubsumed() && len(d.GetReplicas()) > 1 {
			if nd := n.directoryDescriptor(ctx, d); nd != nil {
				newest[d.GetRangeId()] = nd
			}
		}
	}
	var dropped []uint64
	for _, r := range n.rangeReplicas() {
		d := r.Desc()
		nd := newest[d.GetRangeId()]
		if nd == nil || nd.GetGeneration() <= d.GetGeneration() || named(nd, self) || d.GetSubsumed() || r.LeaderHint() == self {
			continue
		}
		if r.Desc().GetGeneration() != d.GetGeneration() {
			continue // a snapshot (a move bringing it back) just arrived
		}
		if !n.leftRangeGroup(ctx, r.ID(), nd) {
			continue
		}
		slog.Info("replica GC: dropping a range replica a newer descriptor leaves out", "node", self, "range", d.GetRangeId(),
			"generation", d.GetGeneration(), "newer_generation", nd.GetGeneration(), "replicas", nd.GetReplicas())
		n.removeReplica(r)
		dropped = append(dropped, d.GetRangeId())
	}
	return dropped
}

// leftRangeGroup reports whether this node's replica of range id is out
// of the range's Raft group for good, now that the newer descriptor nd
// leaves it out. A replica that is a voter of the configuration it applied
// was removed through a joint configuration, and the descriptor changes as
// the group enters it, before the group leaves it: until then the group
// needs a quorum of the outgoing voters, this one among them, to commit
// anything, leaving included. Dropped then (its node not yet having
// applied the joint change, so that its descriptor is older than the
// leader's), with another old voter down, it would leave the range in the
// joint configuration for good, with no leader and no lease. So a voter is
// dropped only once the nodes of nd's region show a configuration that
// leaves it out (leftOut), as a group's replica is (gcGroupReplicas). A
// learner, or a replica with no configuration yet, was removed by a single
// change: nd suffices.
func (n *Node) leftRangeGroup(ctx context.Context, id uint64, nd *pb.RangeDescriptor) bool {
	rg := n.Group(id)
	if rg == nil {
		return true
	}
	index, voters, outgoing := rg.Configuration()
	if !slices.Contains(voters, n.cfg.NodeID) && !slices.Contains(outgoing, n.cfg.NodeID) {
		return true
	}
	lctx, cancel := context.WithTimeout(ctx, replicaGCTimeout)
	defer cancel()
	v, err := transport.LocateGroup(lctx, n.dialer, id, n.dialer.RegionNodes(nd.GetRegion(), nd.GetReplicas()))
	return err == nil && leftOut(n.cfg.NodeID, index, v)
}

// leftOut reports whether v, the newest configuration a group's replicas
// applied, leaves replica self out for good, self having applied the one
// made at index: v is newer and names self nowhere, as a voter of either
// half of a joint configuration (v.Voters holds both) or as a learner.
// An applied configuration is a committed one, so no quorum needs self
// again.
func leftOut(self, index uint64, v transport.GroupView) bool {
	return v.ConfIndex > index && !slices.Contains(v.Voters, self) && !slices.Contains(v.Learners, self)
}

// directoryDescriptor returns the newest descriptor of d's range that a
// region's directory holds at d's start key (nil: none answers with it).
func (n *Node) directoryDescriptor(ctx context.Context, d *pb.RangeDescriptor) *pb.RangeDescriptor {
	var best *pb.RangeDescriptor
	for _, region := range n.dirs.Regions() {
		lctx, cancel := context.WithTimeout(ctx, replicaGCTimeout)
		ds, err := n.dirs.Of(region).Lookup(lctx, d.GetStartKey(), 1)
		cancel()
		if err != nil {
			continue
		}
		for _, o := range ds {
			if o.GetRangeId() == d.GetRangeId() && (best == nil || o.GetGeneration() > best.GetGeneration()) {
				best = o
			}
		}
	}
	return best
}

// gcGroupReplicas drops this node's replicas of non-range groups whose
// configuration, newer on another node of the group's region, leaves this
// node out (neither voter nor learner: a move bringing it back makes it a
// learner first); it returns the groups dropped. A replica with no configuration
// yet (a learner waiting for its snapshot), a leader, or one whose
// configuration changed since it was examined is kept.
func (n *Node) gcGroupReplicas(ctx context.Context) []uint64 {
	self := n.cfg.NodeID
	var dropped []uint64
	for _, h := range n.hostedGroups() {
		if h.g.Kind == topology.KindRange || h.rg.IsLeader() {
			continue
		}
		index, voters, outgoing := h.rg.Configuration()
		if !slices.Contains(voters, self) && !slices.Contains(outgoing, self) {
			continue // no configuration yet, or a learner: its leader still sends to it
		}
		lctx, cancel := context.WithTimeout(ctx, replicaGCTimeout)
		v, err := transport.LocateGroup(lctx, n.dialer, h.g.ID, n.dialer.RegionNodes(h.g.Region, h.g.Replicas))
		cancel()
		if err != nil || !leftOut(self, index, v) || h.rg.ConfIndex() != index {
			continue
		}
		slog.Info("replica GC: dropping a group replica a newer configuration leaves out", "node", self, "group", h.g.ID,
			"kind", h.g.Kind, "conf_index", index, "newer_conf_index", v.ConfIndex, "voters", v.Voters)
		n.dropGroup(h.g.ID)
		dropped = append(dropped, h.g.ID)
	}
	return dropped
}

// rangesOf asks each of nodes, in parallel and each within timeout, for
// the replicas it hosts (the Range service's Ranges); a node that does not
// answer is left out of the result.
func (n *Node) rangesOf(ctx context.Context, nodes []uint64, timeout time.Duration) map[uint64][]*pb.RangeStatus {
	var mu sync.Mutex
	out := map[uint64][]*pb.RangeStatus{}
	var wg sync.WaitGroup
	for _, id := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := n.dialer.Conn(id)
			if err != nil {
				return
			}
			rctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			resp, err := pb.NewRangeClient(conn).Ranges(rctx, &pb.RangesRequest{})
			if err != nil {
				return
			}
			mu.Lock()
			out[id] = resp.GetRanges()
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}
