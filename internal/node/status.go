package node

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc"

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

func (s *statusServer) register(g grpc.ServiceRegistrar) { nodepb.RegisterNodeServer(g, s) }

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
	led := map[*nodepb.GroupStatus]*raftgroup.Group{}
	add := func(rg *raftgroup.Group, kind, region string) *nodepb.GroupStatus {
		st := rg.Status()
		gs := &nodepb.GroupStatus{GroupId: st.Group, Kind: kind, Region: region, Leader: st.Leader, Term: st.Term, Applied: st.Applied}
		resp.Groups = append(resp.Groups, gs)
		if st.Leader == st.Replica {
			led[gs] = rg
		}
		return gs
	}
	for _, h := range n.hostedGroups() {
		gs := add(h.rg, string(h.g.Kind), h.g.Region)
		if sm := h.epoch; sm != nil {
			gs.Epoch = sm.Epoch()
			if t := sm.Changed(); !t.IsZero() {
				gs.EpochAgeMs = uint64(max(time.Since(t).Milliseconds(), 1))
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
	// Leaders answer their progress from their own goroutines: ask them
	// all at once, under one deadline; one that does not answer in time is
	// reported without it.
	pctx, cancel := context.WithTimeout(ctx, progressTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for gs, rg := range led {
		wg.Add(1)
		go func() {
			defer wg.Done()
			commit, match, ok, err := rg.Progress(pctx)
			if err != nil || !ok {
				return
			}
			gs.Commit = commit
			for id, m := range match {
				gs.Progress = append(gs.Progress, &nodepb.ReplicaProgress{Node: id, Match: m})
			}
		}()
	}
	wg.Wait()
	return resp
}
