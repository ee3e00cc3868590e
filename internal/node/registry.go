package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/terroir-db/terroir/internal/directory"
	"github.com/terroir-db/terroir/internal/directory/directorypb"
	"github.com/terroir-db/terroir/internal/raftgroup"
	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/transport"
)

// The node registry from a node's side (DESIGN.md §12): each node registers
// its address with its region's directory when it starts (a restart at a
// new address records it), heartbeats the directory's leader, and keeps the
// network's node book current from every region's registry, so nodes that
// joined or moved are reachable.

// bookRefresh is how often a node reads every region's registry into the
// network's node book.
const bookRefresh = 5 * time.Second

// keepRegistered registers the node, then heartbeats its region's
// directory every liveness timeout / 4, until the node stops.
func (n *Node) keepRegistered() {
	self, _ := n.cfg.Topology.Node(n.cfg.NodeID)
	dir := n.dirs.Of(self.Region)
	if dir == nil {
		return // a region without a directory homes no data and takes no replicas
	}
	every := n.cfg.Topology.LivenessTimeout / 4
	rec := &directorypb.NodeRecord{Id: n.cfg.NodeID, Region: self.Region, Addr: n.addr()}
	registered := false
	for {
		if !registered {
			ctx, cancel := context.WithTimeout(n.stopped, every)
			err := dir.RegisterNode(ctx, rec, false)
			cancel()
			switch {
			case err == nil:
				registered = true
			case directory.IsRegistryError(err):
				slog.Error("node: the registry refuses this node", "node", n.cfg.NodeID, "addr", rec.GetAddr(), "err", err)
				registered = true // it will not change its mind; heartbeats still tell who is up
			}
		}
		ctx, cancel := context.WithTimeout(n.stopped, every)
		err := dir.Heartbeat(ctx, n.cfg.NodeID)
		cancel()
		wait := every
		if err != nil {
			// The region counts this node live only once its leader heard
			// from it: try again soon (a leader being elected, at start).
			wait = min(every, heartbeatRetry)
		}
		if !transport.SleepCtx(n.stopped, wait) {
			return
		}
	}
}

// heartbeatRetry is how soon a node heartbeats again after one failed.
const heartbeatRetry = 100 * time.Millisecond

// refreshBook reads every region's registry into the network's node book
// every bookRefresh, until the node stops (apart from the heartbeats: a
// region that does not answer delays no heartbeat).
func (n *Node) refreshBook() {
	for transport.SleepCtx(n.stopped, bookRefresh) {
		ctx, cancel := context.WithTimeout(n.stopped, bookRefresh)
		if nodes, err := n.dirs.RegisteredNodes(ctx); err == nil {
			n.cfg.Network.SetNodes(nodes)
		}
		cancel()
	}
}

// liveTarget checks that node may take a replica: registered in region,
// in the live state, and live by its region's directory leader. A leader
// that has not heard from the node since it took over (within the
// liveness timeout) hears from it within a heartbeat interval if it is up:
// liveTarget waits that long before it refuses. Errors wrap
// directory.ErrUnknownNode, ErrNodeState or ErrNodeNotLive.
func (n *Node) liveTarget(ctx context.Context, node uint64, region string) error {
	dir := n.dirs.Of(region)
	if dir == nil {
		return fmt.Errorf("%w: region %s has no registry", directory.ErrUnknownRegion, region)
	}
	timeout := n.cfg.Topology.LivenessTimeout
	deadline := time.Now().Add(timeout/4 + timeout/8) // a heartbeat interval, and some
	for {
		nodes, err := dir.Nodes(ctx)
		if err != nil {
			return err
		}
		i := slices.IndexFunc(nodes, func(l *directorypb.NodeLiveness) bool { return l.GetNode().GetId() == node })
		if i < 0 {
			return fmt.Errorf("%w: node %d (region %s)", directory.ErrUnknownNode, node, region)
		}
		l := nodes[i]
		since := time.Duration(l.GetSinceHeartbeatMs()) * time.Millisecond
		switch {
		case l.GetNode().GetState() != directorypb.NodeState_NODE_LIVE:
			return fmt.Errorf("%w: node %d is %s", directory.ErrNodeState, node, directory.StateName(l.GetNode().GetState()))
		case l.GetLive():
			return nil
		case since >= timeout || time.Now().After(deadline):
			return fmt.Errorf("%w: node %d has not heartbeated for %v", ErrNodeNotLive, node, since)
		}
		if !transport.SleepCtx(ctx, 50*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// refusedTarget marks liveTarget's verdicts on the node (unknown, not in
// the live state, not live) as raftgroup.ErrMoveTarget: a move to it is
// refused, not retried. Its other errors (the registry unreadable) stay.
func refusedTarget(err error) error {
	if errors.Is(err, ErrNodeNotLive) || errors.Is(err, directory.ErrUnknownNode) || errors.Is(err, directory.ErrNodeState) || errors.Is(err, directory.ErrUnknownRegion) {
		return fmt.Errorf("%w: %w", raftgroup.ErrMoveTarget, err)
	}
	return err
}

// ErrNodeNotLive: the node's region has not heard from it within the
// liveness timeout.
var ErrNodeNotLive = errors.New("node: the node is not live")

// registeredTopology returns top with the registry's addresses for its
// nodes and the registry's other nodes added (gone ones left out).
func registeredTopology(top *topology.Topology, recs []*directorypb.NodeRecord) (*topology.Topology, error) {
	addrs := map[uint64]string{}
	var added []topology.Node
	seen := map[uint64]bool{}
	for _, r := range recs {
		if seen[r.GetId()] {
			continue
		}
		seen[r.GetId()] = true
		switch _, ok := top.Node(r.GetId()); {
		case ok:
			addrs[r.GetId()] = r.GetAddr()
		case r.GetState() != directorypb.NodeState_NODE_GONE:
			added = append(added, topology.Node{ID: r.GetId(), Region: r.GetRegion(), Addr: r.GetAddr()})
		}
	}
	top = top.WithAddrs(addrs)
	for _, nd := range added {
		var err error
		if top, err = top.WithNode(nd); err != nil {
			return nil, err
		}
	}
	return top, nil
}
