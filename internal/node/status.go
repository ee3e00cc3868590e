package node

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/terroir-db/terroir/internal/epoch"
	"github.com/terroir-db/terroir/internal/node/nodepb"
	"github.com/terroir-db/terroir/internal/raftgroup"
	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/version"
)

// progressTimeout bounds asking one group's goroutine for its progress.
const progressTimeout = 200 * time.Millisecond

// statusServer serves nodepb.Node for a node.
type statusServer struct {
	nodepb.UnimplementedNodeServer
	n *Node
}

func (s *statusServer) register(g *grpc.Server) { nodepb.RegisterNodeServer(g, s) }

// Status implements nodepb.NodeServer: the node and every replica it hosts,
// read from memory (the leaders' progress from their Raft goroutines).
func (s *statusServer) Status(ctx context.Context, _ *nodepb.StatusRequest) (*nodepb.StatusResponse, error) {
	return s.n.Status(ctx), nil
}

// Status reports the node and its replicas: each group's leader, term,
// applied index and, where this node leads, the commit index and every
// replica's match; each epoch group's epoch; each range's status.
func (n *Node) Status(ctx context.Context) *nodepb.StatusResponse {
	self, _ := n.cfg.Topology.Node(n.cfg.NodeID)
	resp := &nodepb.StatusResponse{NodeId: n.cfg.NodeID, Region: self.Region, Version: version.String(),
		StartedUnixMs: n.started.UnixMilli(), HttpAddr: n.HTTPAddr()}
	epochs := map[uint64]*epoch.StateMachine{}
	for _, e := range n.epochGroups() {
		epochs[e.group.ID] = e.sm
	}
	// Leaders answer their progress from their own goroutines: ask them
	// all at once, under one deadline.
	pctx, cancel := context.WithTimeout(ctx, progressTimeout)
	defer cancel()
	var wg sync.WaitGroup
	add := func(rg *raftgroup.Group, kind, region string) *nodepb.GroupStatus {
		gs := &nodepb.GroupStatus{}
		resp.Groups = append(resp.Groups, gs)
		wg.Add(1)
		go func() { defer wg.Done(); groupStatus(pctx, rg, kind, region, gs) }()
		return gs
	}
	for _, g := range n.cfg.Topology.GroupsOn(n.cfg.NodeID) {
		if g.Kind == topology.KindRange {
			continue
		}
		if rg := n.Group(g.ID); rg != nil {
			gs := add(rg, string(g.Kind), g.Region)
			if sm := epochs[g.ID]; sm != nil {
				gs.Epoch = sm.Epoch()
				if t := sm.Changed(); !t.IsZero() {
					gs.EpochAgeMs = uint64(max(time.Since(t).Milliseconds(), 1))
				}
			}
		}
	}
	for _, r := range n.rangeReplicas() {
		st := r.Status()
		resp.Ranges = append(resp.Ranges, st)
		if rg := n.Group(st.GetRangeDescriptor().GetRangeId()); rg != nil {
			add(rg, string(topology.KindRange), st.GetRangeDescriptor().GetRegion())
		}
	}
	wg.Wait()
	return resp
}

// groupStatus fills gs with rg's status and, at its leader, the progress
// of every replica (left out if the group does not answer before ctx ends).
func groupStatus(ctx context.Context, rg *raftgroup.Group, kind, region string, gs *nodepb.GroupStatus) {
	st := rg.Status()
	gs.GroupId, gs.Kind, gs.Region, gs.Leader, gs.Term, gs.Applied = st.Group, kind, region, st.Leader, st.Term, st.Applied
	if st.Leader == st.Replica {
		commit, match, ok, err := rg.Progress(ctx)
		if err == nil && ok {
			gs.Commit = commit
			for id, m := range match {
				gs.Progress = append(gs.Progress, &nodepb.ReplicaProgress{Node: id, Match: m})
			}
		}
	}
}
