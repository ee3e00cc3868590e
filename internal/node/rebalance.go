package node

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/terroir-db/terroir/internal/admin"
	"github.com/terroir-db/terroir/internal/coordinator"
	"github.com/terroir-db/terroir/internal/directory/directorypb"
	"github.com/terroir-db/terroir/internal/node/nodepb"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/rebalance"
	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/transport"
)

// regionCluster is the node's region as its replicate queue sees it
// (rebalance.Cluster): the queue runs where the region's directory leads.
type regionCluster struct {
	n      *Node
	region string

	mu    sync.Mutex
	coord *coordinator.Coordinator // for the queue's moves and transfers; made on first use
}

var _ rebalance.Cluster = (*regionCluster)(nil)

// Leads implements rebalance.Cluster.
func (c *regionCluster) Leads() bool {
	for _, g := range c.n.cfg.Topology.GroupsOfKind(topology.KindDirectory, c.region) {
		if rg := c.n.Group(g.ID); rg != nil && rg.IsLeader() {
			return true
		}
	}
	return false
}

// viewTimeout bounds each node's report of its replicas to a View.
const viewTimeout = 2 * time.Second

// View implements rebalance.Cluster: the registry and descriptors from the
// region's directory, the leases from each live node's own report.
func (c *regionCluster) View(ctx context.Context) (rebalance.View, error) {
	dir := c.n.dirs.Of(c.region)
	nodes, err := dir.Nodes(ctx)
	if err != nil {
		return rebalance.View{}, err
	}
	ranges, err := dir.List(ctx)
	if err != nil {
		return rebalance.View{}, err
	}
	v := rebalance.View{Nodes: nodes, Ranges: ranges, Leases: map[uint64]uint64{}, Load: map[uint64]rebalance.Load{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, g := range c.n.cfg.Topology.Groups {
		if g.Kind == topology.KindRange || g.Region != c.region {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			gv, err := transport.LocateGroup(ctx, c.n.dialer, g.ID, c.n.dialer.RegionNodes(c.region, g.Replicas))
			mu.Lock()
			defer mu.Unlock()
			if err != nil { // unknown placement: not settled, so left alone
				v.Groups = append(v.Groups, rebalance.Group{ID: g.ID})
				return
			}
			v.Groups = append(v.Groups, rebalance.Group{ID: g.ID, Voters: gv.Voters, Settled: !gv.Joint})
		}()
	}
	var live []uint64
	for _, l := range nodes {
		if l.GetLive() && l.GetNode().GetState() != directorypb.NodeState_NODE_GONE {
			live = append(live, l.GetNode().GetId())
		}
	}
	leases := c.n.rangesOf(ctx, live, viewTimeout)
	wg.Wait()
	for id, sts := range leases {
		for _, st := range sts {
			if st.GetLeader() {
				v.Leases[st.GetRangeDescriptor().GetRangeId()] = id
				v.Load[st.GetRangeDescriptor().GetRangeId()] = rebalance.Load{Bytes: st.GetSizeBytes(), QPS: st.GetQps(), Writes: st.GetWritesByRegion()}
			}
		}
	}
	// Other regions' ranges with non-voters here (DESIGN.md §13), from
	// their directories: a node that is down reports nothing, and one may
	// still host a non-voter its range has removed.
	mine := map[uint64]bool{}
	for _, l := range nodes {
		mine[l.GetNode().GetId()] = true
	}
	v.Region, v.Elsewhere = c.region, map[string][]uint64{}
	if v.Placement, err = dir.PlacementRules(ctx); err != nil {
		return rebalance.View{}, err
	}
	for _, region := range c.n.dirs.Regions() {
		if region == c.region {
			continue
		}
		other := c.n.dirs.Of(region)
		descs, err := other.List(ctx)
		if err != nil {
			return rebalance.View{}, fmt.Errorf("the %s directory: %w", region, err)
		}
		theirs, err := other.Nodes(ctx)
		if err != nil {
			return rebalance.View{}, fmt.Errorf("the %s directory: %w", region, err)
		}
		v.Elsewhere[region] = []uint64{}
		for _, l := range theirs {
			if l.GetLive() && l.GetNode().GetState() == directorypb.NodeState_NODE_LIVE {
				v.Elsewhere[region] = append(v.Elsewhere[region], l.GetNode().GetId())
			}
		}
		for _, d := range descs {
			if slices.ContainsFunc(d.GetNonVoters(), func(n uint64) bool { return mine[n] }) {
				v.Foreign = append(v.Foreign, d)
			}
		}
	}
	return v, nil
}

func (c *regionCluster) coordinator() (*coordinator.Coordinator, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.coord == nil {
		co, err := coordinator.New(c.n.cfg.Topology, c.region, c.n.dialer)
		if err != nil {
			return nil, err
		}
		c.coord = co
	}
	return c.coord, nil
}

// MoveReplica implements rebalance.Cluster.
func (c *regionCluster) MoveReplica(ctx context.Context, key []byte, from, to uint64) error {
	co, err := c.coordinator()
	if err != nil {
		return err
	}
	_, err = co.MoveReplica(ctx, key, from, to)
	return err
}

// MoveNonVoter implements rebalance.Cluster: the new non-voter is added
// (and caught up) before the old one is removed; to 0 only removes.
func (c *regionCluster) MoveNonVoter(ctx context.Context, key []byte, from, to uint64) error {
	co, err := c.coordinator()
	if err != nil {
		return err
	}
	if to != 0 {
		if _, err := co.ChangeNonVoter(ctx, key, to, false); err != nil {
			return err
		}
	}
	_, err = co.ChangeNonVoter(ctx, key, from, true)
	return err
}

// Split implements rebalance.Cluster.
func (c *regionCluster) Split(ctx context.Context, key []byte) error {
	co, err := c.coordinator()
	if err != nil {
		return err
	}
	_, _, err = co.SplitRange(ctx, key)
	return err
}

// AddNonVoter implements rebalance.Cluster.
func (c *regionCluster) AddNonVoter(ctx context.Context, key []byte, to uint64) error {
	co, err := c.coordinator()
	if err != nil {
		return err
	}
	_, err = co.ChangeNonVoter(ctx, key, to, false)
	return err
}

// Rehome implements rebalance.Cluster.
func (c *regionCluster) Rehome(ctx context.Context, key []byte, region string) error {
	co, err := c.coordinator()
	if err != nil {
		return err
	}
	_, _, err = co.Rehome(ctx, key, region)
	return err
}

// MoveGroupReplica implements rebalance.Cluster.
func (c *regionCluster) MoveGroupReplica(ctx context.Context, group, from, to uint64) error {
	_, err := admin.MoveGroupReplica(ctx, c.n.dialer, c.n.cfg.Topology, group, from, to)
	return err
}

// TransferLease implements rebalance.Cluster.
func (c *regionCluster) TransferLease(ctx context.Context, key []byte, to uint64, ifIdle bool) error {
	co, err := c.coordinator()
	if err != nil {
		return err
	}
	if ifIdle {
		_, _, err = co.TransferLeaseIfIdle(ctx, key, to)
	} else {
		_, _, err = co.TransferLease(ctx, key, to)
	}
	return err
}

// MarkGone implements rebalance.Cluster: once the node itself, if it
// answers, hosts no range replica (the directory's descriptors may lag a
// change under way).
func (c *regionCluster) MarkGone(ctx context.Context, id uint64) error {
	if conn, err := c.n.dialer.Conn(id); err == nil {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		resp, err := pb.NewRangeClient(conn).Ranges(rctx, &pb.RangesRequest{})
		cancel()
		if err == nil && len(resp.GetRanges()) > 0 {
			return fmt.Errorf("node %d still hosts range %d", id, resp.GetRanges()[0].GetRangeDescriptor().GetRangeId())
		}
		rctx, cancel = context.WithTimeout(ctx, time.Second)
		st, err := nodepb.NewNodeClient(conn).Status(rctx, &nodepb.StatusRequest{})
		cancel()
		for _, g := range st.GetGroups() {
			if err == nil && g.GetKind() != string(topology.KindRange) {
				return fmt.Errorf("node %d still hosts group %d (%s)", id, g.GetGroupId(), g.GetKind())
			}
		}
	}
	return c.n.dirs.Of(c.region).SetNodeState(ctx, id, directorypb.NodeState_NODE_GONE)
}

// close stops the queue's coordinator, if it made one.
func (c *regionCluster) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.coord != nil {
		c.coord.Close()
	}
}
