package admin

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/terroir-db/terroir/internal/directory"
	"github.com/terroir-db/terroir/internal/directory/directorypb"
	"github.com/terroir-db/terroir/internal/node/nodepb"
	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/transport"
)

// NodeRow is one registered node, for `terroir admin node list` (DESIGN.md
// §12).
type NodeRow struct {
	ID     uint64 `json:"id"`
	Region string `json:"region"`
	Addr   string `json:"addr"`
	// State: live, decommissioning or gone (the registry's).
	State string `json:"state"`
	// Live: its region's directory leader heard from it within the
	// liveness timeout; SinceHeartbeat is how long ago it last did.
	Live           bool          `json:"live"`
	SinceHeartbeat time.Duration `json:"since_heartbeat"`
	// Replicas: the replicas it hosts, of every kind of group; Ranges:
	// those of ranges; Leases: the ranges it serves as leaseholder. All -1
	// when it did not answer.
	Replicas int `json:"replicas"`
	Ranges   int `json:"ranges"`
	Leases   int `json:"leases"`
}

// Nodes returns every region's registered nodes, by region then id, with
// each one's replica and lease counts as it reports them (each asked at
// once, bounded by NodeStatusTimeout). It also teaches d's network the
// registry's addresses. It fails when a region's registry does not answer
// before ctx ends.
func Nodes(ctx context.Context, d *transport.Dialer, top *topology.Topology) ([]NodeRow, error) {
	dirs := directory.NewDirectories(top, d)
	var rows []NodeRow
	var book []topology.Node
	registry, err := dirs.Registry(ctx)
	if err != nil {
		return nil, err
	}
	for _, l := range registry {
		n := l.GetNode()
		rows = append(rows, NodeRow{ID: n.GetId(), Region: n.GetRegion(), Addr: n.GetAddr(), State: directory.StateName(n.GetState()),
			Live: l.GetLive(), SinceHeartbeat: time.Duration(l.GetSinceHeartbeatMs()) * time.Millisecond, Replicas: -1, Ranges: -1, Leases: -1})
		book = append(book, topology.Node{ID: n.GetId(), Region: n.GetRegion(), Addr: n.GetAddr()})
	}
	d.Network().SetNodes(book)
	var wg sync.WaitGroup
	for i := range rows {
		if rows[i].State == directory.StateName(directorypb.NodeState_NODE_GONE) {
			continue
		}
		wg.Add(1)
		go func(row *NodeRow) {
			defer wg.Done()
			conn, err := d.Conn(row.ID)
			if err != nil {
				return
			}
			nctx, cancel := context.WithTimeout(ctx, NodeStatusTimeout)
			defer cancel()
			st, err := nodepb.NewNodeClient(conn).Status(nctx, &nodepb.StatusRequest{})
			if err != nil {
				return
			}
			row.Replicas, row.Ranges, row.Leases = len(st.GetGroups()), len(st.GetRanges()), 0
			for _, r := range st.GetRanges() {
				if r.GetLeader() {
					row.Leases++
				}
			}
		}(&rows[i])
	}
	wg.Wait()
	return rows, ctx.Err()
}

// SetNodeState moves node id of region through the registry's states
// (directorypb.NodeState); a decommissioned node's replicas of ranges and
// of every other group are moved off by the region's replicate queue.
// Errors: directory.ErrUnknownRegion, and the registry's refusals
// (ErrUnknownNode, ErrNodeState, ErrTooFewNodes); nothing changes.
func SetNodeState(ctx context.Context, d *transport.Dialer, top *topology.Topology, region string, id uint64, state directorypb.NodeState) error {
	dir := directory.NewDirectories(top, d).Of(region)
	if dir == nil {
		return fmt.Errorf("%w: %q", directory.ErrUnknownRegion, region)
	}
	return dir.SetNodeState(ctx, id, state)
}
