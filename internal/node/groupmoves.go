package node

import (
	"context"
	"errors"
	"log/slog"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/terroir-db/terroir/internal/node/nodepb"
	"github.com/terroir-db/terroir/internal/raftgroup"
	"github.com/terroir-db/terroir/internal/storage"
	"github.com/terroir-db/terroir/internal/topology"
)

// Moves of non-range groups' replicas (DESIGN.md §12): the same sequence
// as a range's (raftgroup.Group.MoveReplica), run by the group's leader;
// the target hosts an empty replica (AddGroupReplica) that a snapshot
// fills, and the source drops its replica once a configuration leaves it
// out (by itself, or told by the leader: RemoveGroupReplica).

// MoveGroupReplica implements nodepb.NodeServer: at the group's leader, it
// moves the group's replica on from_node to to_node.
func (s *statusServer) MoveGroupReplica(ctx context.Context, req *nodepb.MoveGroupReplicaRequest) (*nodepb.MoveGroupReplicaResponse, error) {
	n := s.n
	id, from, to := req.GetGroupId(), req.GetFromNode(), req.GetToNode()
	n.mu.Lock()
	h := n.groups[id]
	n.mu.Unlock()
	switch {
	case h == nil:
		return nil, status.Errorf(codes.FailedPrecondition, "node %d hosts no replica of group %d (ranges move with Range/MoveReplica)", n.cfg.NodeID, id)
	case !h.rg.IsLeader():
		return nil, status.Errorf(codes.FailedPrecondition, "node %d does not lead group %d (leader: node %d)", n.cfg.NodeID, id, h.rg.Status().Leader)
	}
	if to, ok := n.cfg.Network.Node(to); !ok || to.Region != h.g.Region {
		return nil, status.Errorf(codes.InvalidArgument, "node %d is not a node of region %s, where group %d lives", req.GetToNode(), h.g.Region, id)
	}
	if from == n.cfg.NodeID {
		// The leader cannot remove itself mid-move: hand leadership to the
		// voter furthest along, and let the caller ask it.
		voters, _, _ := h.rg.Members()
		_, match, _, err := h.rg.Progress(ctx)
		if err != nil {
			return nil, status.Error(codes.Unavailable, err.Error())
		}
		var succ uint64
		for _, v := range voters {
			if v != from && (succ == 0 || match[v] > match[succ]) {
				succ = v
			}
		}
		if succ == 0 {
			return nil, status.Errorf(codes.InvalidArgument, "group %d has no other voter to lead it", id)
		}
		h.rg.TransferLeadership(succ)
		return nil, status.Errorf(codes.Unavailable, "node %d handed group %d's leadership to node %d before moving its own replica; ask it", n.cfg.NodeID, id, succ)
	}
	if _, busy := n.groupMoves.LoadOrStore(id, struct{}{}); busy {
		return nil, status.Errorf(codes.Unavailable, "group %d is moving a replica already", id)
	}
	defer n.groupMoves.Delete(id)
	region := h.g.Region
	_, err := h.rg.MoveReplica(ctx, from, to, raftgroup.MoveSteps{
		Host: func(ctx context.Context, node uint64, _, _ []uint64) error {
			if err := n.liveTarget(ctx, node, region); err != nil {
				return refusedTarget(err)
			}
			conn, err := n.dialer.Conn(node)
			if err != nil {
				return err
			}
			_, err = nodepb.NewNodeClient(conn).AddGroupReplica(ctx, &nodepb.AddGroupReplicaRequest{GroupId: id})
			return refusedHost(err)
		},
		Drop: n.dropRemoteGroup(h),
	})
	switch {
	case errors.Is(err, raftgroup.ErrMoveTarget):
		return nil, status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, raftgroup.ErrNotLeader):
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	case err != nil:
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	voters, _, _ := h.rg.Members()
	slices.Sort(voters)
	slog.Info("group replica moved", "group", id, "kind", h.g.Kind, "from", from, "to", to, "voters", voters)
	return &nodepb.MoveGroupReplicaResponse{Voters: voters}, nil
}

// AddGroupReplica implements nodepb.NodeServer: the node hosts an empty
// replica of a non-range group of its region, which joins as a learner and
// waits for the leader's snapshot. Hosting it already is not an error.
func (s *statusServer) AddGroupReplica(ctx context.Context, req *nodepb.AddGroupReplicaRequest) (*nodepb.AddGroupReplicaResponse, error) {
	n := s.n
	id := req.GetGroupId()
	g, ok := n.cfg.Topology.Group(id)
	self, _ := n.cfg.Topology.Node(n.cfg.NodeID)
	switch {
	case !ok || g.Kind == topology.KindRange:
		return nil, status.Errorf(codes.InvalidArgument, "group %d is not a non-range group of the topology", id)
	case g.Region != self.Region:
		return nil, status.Errorf(codes.InvalidArgument, "group %d lives in %s, node %d is in %s", id, g.Region, n.cfg.NodeID, self.Region)
	}
	n.hosting.Lock()
	defer n.hosting.Unlock()
	n.mu.Lock()
	hosted, closing, dropping := n.groups[id] != nil, n.closing, n.dropping[id]
	n.mu.Unlock()
	if dropping != nil { // a replica that left moments ago: let its drop finish first
		select {
		case <-dropping:
		case <-ctx.Done():
			return nil, status.Errorf(codes.Unavailable, "node %d is still dropping its earlier replica of group %d", n.cfg.NodeID, id)
		}
		n.mu.Lock()
		hosted, closing = n.groups[id] != nil, n.closing
		n.mu.Unlock()
	}
	switch {
	case closing:
		return nil, status.Errorf(codes.Unavailable, "node %d is stopping", n.cfg.NodeID)
	case hosted:
		return &nodepb.AddGroupReplicaResponse{}, nil
	}
	// Whatever a replica that left here kept goes; indexed so the node
	// hosts it after a restart.
	if err := n.deleteGroup(id); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	b := n.engine.NewBatch()
	_ = b.Delete(storage.GroupTombstoneKey(id), nil)
	_ = b.Set(storage.GroupIndexKey(id), nil, nil)
	if err := n.engine.Commit(b, true); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	h, err := n.hostGroup(g, nil)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "hosting group %d: %v", id, err)
	}
	h.start()
	slog.Info("group replica added, waiting for its snapshot", "node", n.cfg.NodeID, "group", id, "kind", g.Kind)
	return &nodepb.AddGroupReplicaResponse{}, nil
}

// RemoveGroupReplica implements nodepb.NodeServer: the node drops its
// replica of the group once its own configuration, or the leader's at
// conf_index when this replica has not applied that far, leaves it out.
// Not hosting it is not an error.
func (s *statusServer) RemoveGroupReplica(_ context.Context, req *nodepb.RemoveGroupReplicaRequest) (*nodepb.RemoveGroupReplicaResponse, error) {
	n := s.n
	id := req.GetGroupId()
	n.mu.Lock()
	h := n.groups[id]
	n.mu.Unlock()
	if h == nil {
		return &nodepb.RemoveGroupReplicaResponse{}, nil
	}
	ci, voters, outgoing := h.rg.Configuration()
	_, learners, _ := h.rg.Members()
	named := slices.Contains(voters, n.cfg.NodeID) || slices.Contains(outgoing, n.cfg.NodeID) || slices.Contains(learners, n.cfg.NodeID)
	if named && ci >= req.GetConfIndex() {
		return nil, status.Errorf(codes.FailedPrecondition, "group %d's configuration at %d still names node %d", id, ci, n.cfg.NodeID)
	}
	n.dropGroup(id)
	return &nodepb.RemoveGroupReplicaResponse{}, nil
}

// dropRemoteGroup returns a move's Drop step for group h: node drops its
// replica, which h's configuration (as this leader applied it) leaves out.
func (n *Node) dropRemoteGroup(h *hostedGroup) func(ctx context.Context, node uint64) error {
	id := h.g.ID
	return func(ctx context.Context, node uint64) error {
		conn, err := n.dialer.Conn(node)
		if err != nil {
			return err
		}
		ci, _, _ := h.rg.Configuration()
		_, err = nodepb.NewNodeClient(conn).RemoveGroupReplica(ctx, &nodepb.RemoveGroupReplicaRequest{GroupId: id, ConfIndex: ci})
		if err != nil {
			slog.Warn("moved group replica not removed yet", "group", id, "node", node, "err", err)
		}
		return err
	}
}
