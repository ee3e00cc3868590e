package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/terroir-db/terroir/internal/node/nodepb"
	"github.com/terroir-db/terroir/internal/raftgroup"
	"github.com/terroir-db/terroir/internal/rangeserver"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/storage"
)

// Replica moves (DESIGN.md §12): the range's leaseholder asks the target
// node to host an empty replica (AddRangeReplica), adds it as a learner,
// catches it up by a streamed snapshot, promotes it and removes the old
// replica in one joint configuration change, then asks the old node to drop
// its replica (RemoveRangeReplica). A node also drops a replica as soon as
// it applies a configuration that leaves it out.

// AddRangeReplica implements nodepb.NodeServer: the node hosts an empty
// replica of the range, which names it as a learner, with no Raft
// configuration until the leader's snapshot brings one. Hosting it already
// is not an error.
func (s *statusServer) AddRangeReplica(ctx context.Context, req *nodepb.AddRangeReplicaRequest) (*nodepb.AddRangeReplicaResponse, error) {
	n := s.n
	d := req.GetRangeDescriptor()
	self, _ := n.cfg.Topology.Node(n.cfg.NodeID)
	nonVoter := slices.Contains(d.GetNonVoters(), n.cfg.NodeID)
	switch {
	case !slices.Contains(d.GetLearners(), n.cfg.NodeID) && !nonVoter:
		return nil, status.Errorf(codes.InvalidArgument, "range %d's descriptor does not name node %d as a learner", d.GetRangeId(), n.cfg.NodeID)
	case d.GetRegion() != self.Region && !nonVoter: // a non-voter may be in any region (DESIGN.md §13)
		return nil, status.Errorf(codes.InvalidArgument, "range %d is homed in %s, node %d is in %s", d.GetRangeId(), d.GetRegion(), n.cfg.NodeID, self.Region)
	}
	if r := n.Range(d.GetRangeId()); r != nil {
		hd := r.Desc()
		if hd.GetGeneration() >= d.GetGeneration() || slices.Contains(d.GetReplicas(), n.cfg.NodeID) {
			return &nodepb.AddRangeReplicaResponse{}, nil
		}
		// A replica an earlier change left behind here (it never applied
		// its removal): it goes before the new one comes.
		slog.Info("dropping a left-behind replica before hosting the range again", "node", n.cfg.NodeID, "range", d.GetRangeId(),
			"generation", hd.GetGeneration(), "new_generation", d.GetGeneration())
		n.removeReplica(r)
	}
	if err := n.awaitNoOverlap(ctx, d); err != nil {
		return nil, err
	}
	// Hosted again after it left: its tombstone goes; it is indexed so the
	// node hosts it after a restart.
	b := n.engine.NewBatch()
	_ = b.Delete(storage.RangeTombstoneKey(d.GetRangeId()), nil)
	_ = b.Set(storage.RangeIndexKey(d.GetRangeId()), nil, nil)
	if err := n.engine.Commit(b, true); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if _, err := n.addRange(d, true, true); err != nil {
		return nil, status.Errorf(codes.Unavailable, "hosting range %d: %v", d.GetRangeId(), err)
	}
	slog.Info("range replica added, waiting for its snapshot", "node", n.cfg.NodeID, "range", d.GetRangeId())
	return &nodepb.AddRangeReplicaResponse{}, nil
}

// RemoveRangeReplica implements nodepb.NodeServer: the node drops its
// replica of the range once its own descriptor, or another replica's at a
// newer generation, leaves it out. Not hosting it is not an error.
func (s *statusServer) RemoveRangeReplica(ctx context.Context, req *nodepb.RemoveRangeReplicaRequest) (*nodepb.RemoveRangeReplicaResponse, error) {
	n := s.n
	r := n.Range(req.GetRangeId())
	if r == nil {
		return &nodepb.RemoveRangeReplicaResponse{}, nil
	}
	d := r.Desc()
	if named(d, n.cfg.NodeID) {
		var newer *pb.RangeDescriptor
		for _, peer := range d.GetReplicas() {
			if peer == n.cfg.NodeID {
				continue
			}
			if pd, err := n.peerDescriptor(ctx, peer, d.GetRangeId()); err == nil && pd.GetGeneration() > d.GetGeneration() {
				newer = pd
				break
			}
		}
		if newer == nil || named(newer, n.cfg.NodeID) {
			return nil, status.Errorf(codes.FailedPrecondition, "range %d still names node %d", d.GetRangeId(), n.cfg.NodeID)
		}
	}
	n.removeReplica(r)
	return &nodepb.RemoveRangeReplicaResponse{}, nil
}

// named reports whether d names node as a replica, learner or non-voter.
func named(d *pb.RangeDescriptor, node uint64) bool {
	return slices.Contains(d.GetReplicas(), node) || slices.Contains(d.GetLearners(), node) || slices.Contains(d.GetNonVoters(), node)
}

// onReplicasChanged runs on every replica once a configuration change of
// its range is durable here: the leader publishes the new descriptor, and
// a node the change left out drops its replica.
func (n *Node) onReplicasChanged(c rangeserver.ReplicasChanged) {
	r := n.Range(c.Desc.GetRangeId())
	if r == nil {
		return
	}
	if r.LeaderHint() == n.cfg.NodeID {
		n.publish(c.Desc)
	}
	if !raftgroup.InConf(c.Conf, n.cfg.NodeID) {
		n.removeReplica(r)
	}
}

// removeReplica stops the node's replica r of a range that no longer names
// this node and deletes it: its Raft and range-local state, and its data in
// the shared key spaces, which no other range here owns. A tombstone keeps
// the node from hosting it again after a restart, until a move brings it
// back (AddRangeReplica).
func (n *Node) removeReplica(r *rangeserver.Replica) {
	id := r.ID()
	n.mu.Lock()
	defer n.mu.Unlock()
	i := slices.Index(n.ranges, r)
	if i < 0 || n.closing {
		return
	}
	n.ranges = slices.Delete(n.ranges, i, i+1)
	n.rangeSrv.Remove(id)
	n.removingRanges[id] = r.Desc()
	n.removing.Add(1)
	go func() { // not on the range's apply loop: stopping r waits for it
		defer n.removing.Done()
		defer func() {
			n.mu.Lock()
			delete(n.removingRanges, id)
			n.mu.Unlock()
		}()
		r.Close()
		err := n.tombstone(id, r.Desc())
		if err == nil {
			err = n.dropRange(id)
		}
		if err != nil {
			slog.Error("node: removing a replica the range left", "node", n.cfg.NodeID, "range", id, "err", err)
			return
		}
		slog.Info("range replica removed", "node", n.cfg.NodeID, "range", id)
	}()
}

// overlapWait bounds AddRangeReplica's wait for a replica in the way to
// go (removal takes a Raft group's stop and one batch).
const overlapWait = 5 * time.Second

// awaitNoOverlap waits until no replica this node hosts or is removing
// overlaps d's span (other than d's own range, hosted), so that a removal's
// deletion of its span cannot take data of d's new replica. Errors:
// codes.Unavailable when one stays in the way (a replica a change left
// behind, until the replica GC drops it) past overlapWait or ctx.
func (n *Node) awaitNoOverlap(ctx context.Context, d *pb.RangeDescriptor) error {
	deadline := time.Now().Add(overlapWait)
	for {
		var clash *pb.RangeDescriptor
		n.mu.Lock()
		for _, r := range n.ranges {
			if od := r.Desc(); od.GetRangeId() != d.GetRangeId() && overlaps(od, d) {
				clash = od
			}
		}
		for _, od := range n.removingRanges {
			if overlaps(od, d) {
				clash = od
			}
		}
		n.mu.Unlock()
		if clash == nil {
			return nil
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return status.Errorf(codes.Unavailable, "node %d still holds range %d over [%q, %q), which range %d's span overlaps (a replica left behind, until the replica GC drops it)",
				n.cfg.NodeID, clash.GetRangeId(), clash.GetStartKey(), clash.GetEndKey(), d.GetRangeId())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// overlaps reports whether a's and b's spans share a key (an empty end key:
// the end of the key space).
func overlaps(a, b *pb.RangeDescriptor) bool {
	before := func(end, start []byte) bool { return len(end) > 0 && bytes.Compare(end, start) <= 0 }
	return !before(a.GetEndKey(), b.GetStartKey()) && !before(b.GetEndKey(), a.GetStartKey())
}

// tombstone durably records that range id left this node, and deletes its
// data in d's span (none if d is nil), except where another range hosted
// here holds it (a replica left behind may overlap one hosted since).
func (n *Node) tombstone(id uint64, d *pb.RangeDescriptor) error {
	b := n.engine.NewBatch()
	_ = b.Set(storage.RangeTombstoneKey(id), nil, nil)
	_ = b.Delete(storage.RangeIndexKey(id), nil)
	if d != nil {
		var others []*pb.RangeDescriptor
		for _, r := range n.rangeReplicas() {
			if r.ID() != id {
				others = append(others, r.Desc())
			}
		}
		for _, part := range uncovered(d.GetStartKey(), d.GetEndKey(), others) {
			for _, sp := range dataSpans(&pb.RangeDescriptor{StartKey: part[0], EndKey: part[1]}) {
				if err := b.DeleteRange(sp[0], sp[1], nil); err != nil {
					_ = b.Close()
					return err
				}
			}
		}
	}
	return n.engine.Commit(b, true)
}

// uncovered returns the parts of [start, end) that none of others' spans
// covers, in key order (an empty end key: the end of the key space).
func uncovered(start, end []byte, others []*pb.RangeDescriptor) [][2][]byte {
	// endBefore: end key a (empty: infinite) is at or before key b.
	endBefore := func(a, b []byte) bool { return len(a) > 0 && bytes.Compare(a, b) <= 0 }
	spans := slices.Clone(others)
	slices.SortFunc(spans, func(a, b *pb.RangeDescriptor) int { return bytes.Compare(a.GetStartKey(), b.GetStartKey()) })
	var out [][2][]byte
	cur := start
	for _, o := range spans {
		if endBefore(end, cur) && len(end) > 0 {
			break // nothing left
		}
		if endBefore(o.GetEndKey(), cur) || (len(end) > 0 && bytes.Compare(o.GetStartKey(), end) >= 0) {
			continue // o ends before what is left, or starts past it
		}
		if bytes.Compare(o.GetStartKey(), cur) > 0 {
			out = append(out, [2][]byte{cur, o.GetStartKey()})
		}
		if len(o.GetEndKey()) == 0 {
			return out // o covers the rest
		}
		if bytes.Compare(o.GetEndKey(), cur) > 0 {
			cur = o.GetEndKey()
		}
	}
	if len(end) == 0 || bytes.Compare(cur, end) < 0 {
		out = append(out, [2][]byte{cur, end})
	}
	return out
}

// dropMoved deletes, at start, a replica of range id whose stored
// descriptor no longer names this node (its removal was cut short): its
// Raft and range-local state, a tombstone, and its data if it has a stored
// span (a replica added but never filled has none).
func (n *Node) dropMoved(id uint64) error {
	sm, err := rangeserver.NewStateMachine(n.engine, &pb.RangeDescriptor{RangeId: id})
	if err != nil {
		return err
	}
	d := sm.Descriptor()
	if d.GetGeneration() == 0 {
		d = nil // no stored descriptor: no data either
	}
	if err := n.tombstone(id, d); err != nil {
		return err
	}
	return n.dropRange(id)
}

func dataSpans(d *pb.RangeDescriptor) [][2][]byte {
	if d == nil {
		return nil
	}
	return rangeserver.DataSpans(d)
}

// addReplica asks node to host an empty replica of d
// (rangeserver.Config.AddReplica), once its region's registry shows it live
// (liveTarget's errors).
func (n *Node) addReplica(ctx context.Context, node uint64, d *pb.RangeDescriptor) error {
	region := d.GetRegion()
	if slices.Contains(d.GetNonVoters(), node) { // in another region (DESIGN.md §13)
		nd, ok := n.dialer.Network().Resolve(node)
		if !ok || nd.Region == region {
			return fmt.Errorf("%w: node %d is unknown or in range %d's home region %s: a non-voter goes to another region", raftgroup.ErrMoveTarget, node, d.GetRangeId(), region)
		}
		region = nd.Region
	}
	if err := n.liveTarget(ctx, node, region); err != nil {
		return refusedTarget(err)
	}
	conn, err := n.dialer.Conn(node)
	if err != nil {
		return err
	}
	_, err = nodepb.NewNodeClient(conn).AddRangeReplica(ctx, &nodepb.AddRangeReplicaRequest{RangeDescriptor: proto.CloneOf(d)})
	return refusedHost(err)
}

// refusedHost marks a node's refusal to host a replica (InvalidArgument:
// the request does not fit it) as raftgroup.ErrMoveTarget; other errors
// stay as they are.
func refusedHost(err error) error {
	if status.Code(err) == codes.InvalidArgument {
		return fmt.Errorf("%w: %w", raftgroup.ErrMoveTarget, err)
	}
	return err
}

// removeRemote asks node to drop its replica of range id
// (rangeserver.Config.RemoveReplica).
func (n *Node) removeRemote(ctx context.Context, node, id uint64) error {
	conn, err := n.dialer.Conn(node)
	if err != nil {
		return err
	}
	_, err = nodepb.NewNodeClient(conn).RemoveRangeReplica(ctx, &nodepb.RemoveRangeReplicaRequest{RangeId: id})
	return err
}

var errNotNamed = errors.New("the range's descriptor does not name this node")
