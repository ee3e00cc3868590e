package node

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/terroir-db/terroir/internal/directory/directorypb"
	"github.com/terroir-db/terroir/internal/rangeserver"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/topology"
)

// The node's side of rehoming a range (DESIGN.md §13): where a replica of
// a range homed in a region reads its epochs, which of the region's nodes
// become a rehomed range's voters, and telling the directories.

// homeOf returns what this node's replica of a range homed in region
// reads there (rangeserver.Config.HomeOf): the region's local epoch and
// publisher, the global epoch service, this node's own region's publisher
// when it is not the home, the region's GC policy and range-ID allocator.
// It fails for a region the topology gives no local epoch group.
func (n *Node) homeOf(region string) (rangeserver.Home, error) {
	top := n.cfg.Topology
	h := rangeserver.Home{Region: region, GCPolicy: n.gcPolicyOf(region), NewRangeID: n.rangeIDAllocator(region)}
	local, err := n.reader(topology.KindLocalEpoch, region)
	if err != nil {
		return h, err
	}
	h.Local = local
	if pub, err := n.reader(topology.KindPublisher, region); err == nil {
		h.Publisher = pub // else regional-only
	}
	if gg := top.GroupsOfKind(topology.KindGlobalEpoch, ""); len(gg) > 0 {
		svc, err := n.reader(topology.KindGlobalEpoch, gg[0].Region)
		if err != nil {
			return h, err
		}
		h.Service = svc
	}
	if here := n.dialer.Self().Region; here != region && h.Publisher != nil {
		if near, err := n.reader(topology.KindPublisher, here); err == nil {
			h.Near = near // a non-voting replica (DESIGN.md §13)
		}
	}
	return h, nil
}

// pickVoters returns as many live nodes of region as the range d
// describes has voters (rangeserver.Config.PickVoters): its non-voters
// there first, then the others by id. It fails if the region has fewer.
func (n *Node) pickVoters(ctx context.Context, region string, d *pb.RangeDescriptor) ([]uint64, error) {
	dir := n.dirs.Of(region)
	if dir == nil {
		return nil, fmt.Errorf("region %q has no directory group", region)
	}
	recs, err := dir.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	var live []uint64
	for _, l := range recs {
		if l.GetLive() && l.GetNode().GetState() == directorypb.NodeState_NODE_LIVE && l.GetNode().GetRegion() == region {
			live = append(live, l.GetNode().GetId())
		}
	}
	nonVoter := func(id uint64) int {
		if slices.Contains(d.GetNonVoters(), id) {
			return 0
		}
		return 1
	}
	slices.SortFunc(live, func(a, b uint64) int { return cmp.Or(cmp.Compare(nonVoter(a), nonVoter(b)), cmp.Compare(a, b)) })
	want := len(d.GetReplicas())
	if len(live) < want {
		return nil, fmt.Errorf("region %s has %d live nodes (%v); range %d has %d voters", region, len(live), live, d.GetRangeId(), want)
	}
	return live[:want], nil
}

// writeRehomed writes a rehomed range's descriptor to every region's
// directory, its new home's first (rangeserver.Config.Rehomed).
func (n *Node) writeRehomed(ctx context.Context, d *pb.RangeDescriptor) error {
	return n.writeDescriptors(ctx, []*pb.RangeDescriptor{d})
}
