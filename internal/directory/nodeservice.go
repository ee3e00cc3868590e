package directory

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/terroir-db/terroir/internal/directory/directorypb"
	"github.com/terroir-db/terroir/internal/security"
	"github.com/terroir-db/terroir/internal/topology"
)

// registryErrors are the registry's refusals: each crosses the wire as
// InvalidArgument (final: no replica would answer otherwise) with the
// error's text, and the client wraps the sentinel again (typedRegistryError).
var registryErrors = []error{ErrBadNode, ErrDuplicateAddr, ErrNodeGone, ErrUnknownNode, ErrTooFewNodes, ErrNodeState, ErrNodeExists, ErrUnknownRegion}

// TypedError returns an RPC's err with the registry sentinel its message
// starts with, if any, so errors.Is finds it on the caller's side.
func TypedError(err error) error {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.InvalidArgument {
		return err
	}
	for _, e := range slices.Concat(registryErrors, placementErrors) {
		if rest, ok := strings.CutPrefix(st.Message(), e.Error()); ok {
			return fmt.Errorf("%w%s", e, rest)
		}
	}
	return err
}

// leaderTerm returns group id's replica and its term if it leads; else
// FailedPrecondition, so the caller tries another replica.
func (s *Server) leaderTerm(id uint64) (Replica, uint64, error) {
	r, err := s.replica(id)
	if err != nil {
		return r, 0, err
	}
	st := r.Group.Status()
	if st.Leader != st.Replica {
		return r, 0, status.Errorf(codes.FailedPrecondition, "directory group %d: not the leader", id)
	}
	return r, st.Term, nil
}

func (s *Server) livenessOf(group uint64) *liveness {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.live[group]
	if l == nil {
		l = &liveness{}
		s.live[group] = l
	}
	return l
}

// RegisterNode implements directorypb.DirectoryServer. A node registers
// itself (a new address included); another node may only register a new
// one on its behalf (a join), never change a registered node's address.
func (s *Server) RegisterNode(ctx context.Context, req *directorypb.RegisterNodeRequest) (*directorypb.RegisterNodeResponse, error) {
	r, err := s.replica(req.GetGroupId())
	if err != nil {
		return nil, err
	}
	caller, secure := security.PeerIdentity(ctx)
	proxied := secure && caller.Node != req.GetNode().GetId()
	if cur, ok := r.SM.Node(req.GetNode().GetId()); ok && cur.GetAddr() == req.GetNode().GetAddr() && cur.GetRegion() == req.GetNode().GetRegion() {
		if _, err := s.read(ctx, req.GetGroupId()); err != nil { // registered already, as of now?
			return nil, err
		}
		if cur, ok := r.SM.Node(req.GetNode().GetId()); ok && cur.GetAddr() == req.GetNode().GetAddr() && cur.GetState() != directorypb.NodeState_NODE_GONE {
			return &directorypb.RegisterNodeResponse{}, nil
		}
	}
	_, err = s.propose(ctx, req.GetGroupId(), &directorypb.Command{Cmd: &directorypb.Command_RegisterNode{RegisterNode: &directorypb.RegisterNodeCmd{
		Node: req.GetNode(), NewNode: proxied || req.GetNewNode()}}})
	if err != nil {
		return nil, err
	}
	return &directorypb.RegisterNodeResponse{}, nil
}

// Heartbeat implements directorypb.DirectoryServer: a node heartbeats for
// itself only.
func (s *Server) Heartbeat(ctx context.Context, req *directorypb.HeartbeatRequest) (*directorypb.HeartbeatResponse, error) {
	if caller, ok := security.PeerIdentity(ctx); ok && caller.Node != req.GetNodeId() {
		return nil, status.Errorf(codes.PermissionDenied, "%s may not heartbeat for node %d", caller, req.GetNodeId())
	}
	_, term, err := s.leaderTerm(req.GetGroupId())
	if err != nil {
		return nil, err
	}
	s.livenessOf(req.GetGroupId()).beat(term, req.GetNodeId(), time.Now())
	return &directorypb.HeartbeatResponse{}, nil
}

// Nodes implements directorypb.DirectoryServer: the leader answers from
// its applied state, without a ReadIndex round (address books and liveness
// need no linearizable read; the registry's own checks run in Apply).
func (s *Server) Nodes(_ context.Context, req *directorypb.NodesRequest) (*directorypb.NodesResponse, error) {
	r, term, err := s.leaderTerm(req.GetGroupId())
	if err != nil {
		return nil, err
	}
	return &directorypb.NodesResponse{Nodes: s.livenessOf(req.GetGroupId()).view(term, time.Now(), s.livenessTimeout, r.SM.Nodes())}, nil
}

// SetNodeState implements directorypb.DirectoryServer. A live node leaves
// the live state only while MinLiveNodes other nodes of the region are both
// in the live state and live (heard from within the liveness timeout). A
// leader elected less than half a liveness timeout ago has not heard from
// every node yet: it waits out that half before it refuses; if ctx ends
// first, it answers Unavailable, which the caller retries.
func (s *Server) SetNodeState(ctx context.Context, req *directorypb.SetNodeStateRequest) (*directorypb.SetNodeStateResponse, error) {
	if caller, ok := security.PeerIdentity(ctx); ok && !caller.IsNode() && req.GetState() == directorypb.NodeState_NODE_GONE {
		// Gone means drained: the replicate queue (a node) decides it.
		return nil, status.Error(codes.InvalidArgument, fmt.Errorf("%w: node %d: only the replicate queue marks a drained node gone; decommission it", ErrNodeState, req.GetNodeId()).Error())
	}
	for {
		nodes, err := s.Nodes(ctx, &directorypb.NodesRequest{GroupId: req.GetGroupId()})
		if err != nil {
			return nil, err
		}
		refusal := tooFewLeft(req, nodes.GetNodes())
		if refusal == nil {
			break
		}
		// A new leader has not heard from every live node yet: judge once
		// each has had two heartbeats' time to find it.
		wait := s.livenessOf(req.GetGroupId()).younger(time.Now(), s.livenessTimeout/2)
		if wait <= 0 {
			return nil, refusal
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			// The caller's attempt ended first (a LeaderClient's is 1 s):
			// not a refusal, so it asks again, of an older leader.
			t.Stop()
			return nil, status.Errorf(codes.Unavailable, "directory group %d: a new leader, still hearing from the region's nodes (%v)", req.GetGroupId(), ctx.Err())
		case <-t.C:
		}
	}
	_, err := s.propose(ctx, req.GetGroupId(), &directorypb.Command{Cmd: &directorypb.Command_SetNodeState{SetNodeState: &directorypb.SetNodeStateCmd{Id: req.GetNodeId(), State: req.GetState()}}})
	if err != nil {
		return nil, err
	}
	return &directorypb.SetNodeStateResponse{}, nil
}

// tooFewLeft returns ErrTooFewNodes (as InvalidArgument) if req takes a
// node out of the live state while fewer than MinLiveNodes other nodes of
// its region are in the live state and live in nodes; else nil.
func tooFewLeft(req *directorypb.SetNodeStateRequest, nodes []*directorypb.NodeLiveness) error {
	if req.GetState() == directorypb.NodeState_NODE_LIVE {
		return nil
	}
	for _, n := range nodes {
		if n.GetNode().GetId() != req.GetNodeId() || n.GetNode().GetState() != directorypb.NodeState_NODE_LIVE {
			continue
		}
		live := 0
		for _, o := range nodes {
			if o.GetNode().GetId() != req.GetNodeId() && o.GetLive() && o.GetNode().GetState() == directorypb.NodeState_NODE_LIVE {
				live++
			}
		}
		if live < MinLiveNodes {
			return status.Error(codes.InvalidArgument, fmt.Errorf("%w: %s would keep %d live nodes, it needs %d", ErrTooFewNodes, n.GetNode().GetRegion(), live, MinLiveNodes).Error())
		}
	}
	return nil
}

// RegisterNode adds node to the region's registry, or records its new
// address; newNode (a join) refuses an id registered at another address.
// Errors: ErrBadNode, ErrDuplicateAddr (within the region), ErrNodeGone,
// ErrNodeExists; nothing changes.
func (c *Client) RegisterNode(ctx context.Context, node *directorypb.NodeRecord, newNode bool) error {
	return TypedError(c.lc.Call(ctx, func(ctx context.Context, conn grpc.ClientConnInterface) error {
		_, err := directorypb.NewDirectoryClient(conn).RegisterNode(ctx, &directorypb.RegisterNodeRequest{GroupId: c.group, Node: node, NewNode: newNode})
		return err
	}))
}

// Heartbeat tells the region's directory leader that node is live.
func (c *Client) Heartbeat(ctx context.Context, node uint64) error {
	return c.lc.Call(ctx, func(ctx context.Context, conn grpc.ClientConnInterface) error {
		_, err := directorypb.NewDirectoryClient(conn).Heartbeat(ctx, &directorypb.HeartbeatRequest{GroupId: c.group, NodeId: node})
		return err
	})
}

// Nodes returns the region's registry, by id, with each node's liveness as
// the directory's leader sees it.
func (c *Client) Nodes(ctx context.Context) ([]*directorypb.NodeLiveness, error) {
	var out []*directorypb.NodeLiveness
	err := c.lc.Call(ctx, func(ctx context.Context, conn grpc.ClientConnInterface) error {
		resp, err := directorypb.NewDirectoryClient(conn).Nodes(ctx, &directorypb.NodesRequest{GroupId: c.group})
		out = resp.GetNodes()
		return err
	})
	return out, err
}

// SetNodeState moves node to state. Errors: ErrUnknownNode, ErrNodeState,
// ErrTooFewNodes; nothing changes.
func (c *Client) SetNodeState(ctx context.Context, node uint64, state directorypb.NodeState) error {
	return TypedError(c.lc.Call(ctx, func(ctx context.Context, conn grpc.ClientConnInterface) error {
		_, err := directorypb.NewDirectoryClient(conn).SetNodeState(ctx, &directorypb.SetNodeStateRequest{GroupId: c.group, NodeId: node, State: state})
		return err
	}))
}

// IsRegistryError reports whether err is one of the registry's refusals.
func IsRegistryError(err error) bool {
	for _, e := range registryErrors {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// Registry reads every region's registry at once and returns the records
// of those that answered, by region then id, with one error per region
// that did not (joined).
func (d *Directories) Registry(ctx context.Context) ([]*directorypb.NodeLiveness, error) {
	lists := make([][]*directorypb.NodeLiveness, len(d.regions))
	errs := make([]error, len(d.regions))
	var wg sync.WaitGroup
	for i, r := range d.regions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if lists[i], errs[i] = d.byRegion[r].Nodes(ctx); errs[i] != nil {
				errs[i] = fmt.Errorf("region %s's registry: %w", r, errs[i])
			}
		}()
	}
	wg.Wait()
	return slices.Concat(lists...), errors.Join(errs...)
}

// RegisteredNodes returns every node of the registries that answer, gone
// ones included (transport.Network.AddLookup); it fails only when none
// does.
func (d *Directories) RegisteredNodes(ctx context.Context) ([]topology.Node, error) {
	recs, err := d.Registry(ctx)
	if len(recs) == 0 && err != nil {
		return nil, err
	}
	out := make([]topology.Node, 0, len(recs))
	for _, l := range recs {
		rec := l.GetNode()
		out = append(out, topology.Node{ID: rec.GetId(), Region: rec.GetRegion(), Addr: rec.GetAddr()})
	}
	return out, nil
}
