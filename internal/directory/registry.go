package directory

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"slices"

	"github.com/cockroachdb/pebble/v2"
	"google.golang.org/protobuf/proto"

	"github.com/terroir-db/terroir/internal/directory/directorypb"
	"github.com/terroir-db/terroir/internal/topology"
)

// The node registry (DESIGN.md §12): each region's directory group holds
// the records of the region's nodes — id, region, address and state (live,
// decommissioning, gone). The topology file's nodes of the region are its
// first records; a node that joins later registers itself, and a node that
// restarts at another address records it. Liveness is not replicated: the
// group's leader keeps when it last heard from each node (liveness.go).

// Errors of the registry's commands.
var (
	// ErrBadNode: a node record without an id, with a malformed address,
	// or of another region than the directory's.
	ErrBadNode = errors.New("directory: malformed node record")
	// ErrDuplicateAddr: another node of the cluster is registered at the
	// address.
	ErrDuplicateAddr = errors.New("directory: another node has that address")
	// ErrNodeGone: the node was decommissioned; its id is never used again.
	ErrNodeGone = errors.New("directory: the node is gone")
	// ErrNodeExists: a node joining with an empty store names an id the
	// cluster has registered (a replacement joins with a new id), or one
	// registered in another region.
	ErrNodeExists = errors.New("directory: the node id is registered already")
	// ErrUnknownRegion: a node joins a region the cluster does not have.
	ErrUnknownRegion = errors.New("directory: no such region")
	// ErrUnknownNode: no node of the region has the id.
	ErrUnknownNode = errors.New("directory: no such node in the region")
	// ErrTooFewNodes: the change would leave the region fewer than
	// MinLiveNodes live nodes.
	ErrTooFewNodes = errors.New("directory: the region would keep too few live nodes")
	// ErrNodeState: the node's state does not allow the change (a gone node
	// cannot come back; a live one is decommissioned before it is gone).
	ErrNodeState = errors.New("directory: the node's state does not allow that")
)

// MinLiveNodes is how many live nodes a region keeps at least: a
// decommission that would leave fewer is refused (three replicas of every
// group).
const MinLiveNodes = 3

// keyNode + node ID (8 bytes, big-endian) → NodeRecord.
const keyNode = 'm'

// SeedNodes returns the registry's first records for region: the
// topology's nodes there, live.
func SeedNodes(top *topology.Topology, region string) []*directorypb.NodeRecord {
	var out []*directorypb.NodeRecord
	for _, n := range top.Nodes {
		if n.Region == region {
			out = append(out, &directorypb.NodeRecord{Id: n.ID, Region: n.Region, Addr: n.Addr})
		}
	}
	return out
}

func (sm *StateMachine) nodeKey(id uint64) []byte {
	return sm.key(keyNode, binary.BigEndian.AppendUint64(nil, id)...)
}

func (sm *StateMachine) writeNode(b *pebble.Batch, n *directorypb.NodeRecord) error {
	v, err := proto.Marshal(n)
	if err != nil {
		return err
	}
	return b.Set(sm.nodeKey(n.GetId()), v, nil)
}

// setNodes writes the whole registry (a store seeded before the registry
// existed holds none of it yet) and makes it sm's. Callers hold sm.mu.
func (sm *StateMachine) setNodes(b *pebble.Batch, nodes []*directorypb.NodeRecord) error {
	for _, n := range nodes {
		if err := sm.writeNode(b, n); err != nil {
			return err
		}
	}
	sm.nodes = nodes
	return nil
}

func cloneNodes(ns []*directorypb.NodeRecord) []*directorypb.NodeRecord {
	out := make([]*directorypb.NodeRecord, len(ns))
	for i, n := range ns {
		out[i] = proto.CloneOf(n)
	}
	return out
}

// checkNode vets a record for this directory.
func (sm *StateMachine) checkNode(n *directorypb.NodeRecord) error {
	if n.GetId() == 0 {
		return fmt.Errorf("%w: no node id", ErrBadNode)
	}
	if n.GetRegion() != sm.region {
		return fmt.Errorf("%w: node %d is in %q, this directory is %q's", ErrBadNode, n.GetId(), n.GetRegion(), sm.region)
	}
	if _, port, err := net.SplitHostPort(n.GetAddr()); err != nil || port == "" || port == "0" {
		return fmt.Errorf("%w: node %d: address %q is not host:port", ErrBadNode, n.GetId(), n.GetAddr())
	}
	return nil
}

// applyRegister adds a node, or records a registered node's new address.
// Errors (nothing changes): ErrBadNode, ErrDuplicateAddr, ErrNodeGone.
func (sm *StateMachine) applyRegister(b *pebble.Batch, c *directorypb.RegisterNodeCmd) any {
	n := c.GetNode()
	if err := sm.checkNode(n); err != nil {
		return err
	}
	sm.mu.Lock()
	defer sm.mu.Unlock()
	i, found := sm.findNode(n.GetId())
	for _, o := range sm.nodes {
		if o.GetId() != n.GetId() && o.GetAddr() == n.GetAddr() && o.GetState() != directorypb.NodeState_NODE_GONE {
			return fmt.Errorf("%w: node %d is registered at %s", ErrDuplicateAddr, o.GetId(), o.GetAddr())
		}
	}
	rec := &directorypb.NodeRecord{Id: n.GetId(), Region: sm.region, Addr: n.GetAddr()}
	if found {
		cur := sm.nodes[i]
		switch {
		case cur.GetState() == directorypb.NodeState_NODE_GONE:
			return fmt.Errorf("%w: node %d was decommissioned", ErrNodeGone, n.GetId())
		case c.GetNewNode() && cur.GetAddr() == n.GetAddr():
			return nil // a join repeated: registered already
		case c.GetNewNode():
			return fmt.Errorf("%w: node %d is registered at %s", ErrNodeExists, n.GetId(), cur.GetAddr())
		}
		rec.State = cur.GetState()
	}
	nodes := slices.Clone(sm.nodes)
	if found {
		nodes[i] = rec
	} else {
		nodes = slices.Insert(nodes, i, rec)
	}
	return sm.setNodes(b, nodes)
}

// applySetNodeState moves a node to a new state: live ⇄ decommissioning →
// gone. Errors (nothing changes): ErrUnknownNode, ErrNodeState, and
// ErrTooFewNodes when a live node leaves the region with fewer than
// MinLiveNodes live ones (the leader also counts liveness before it
// proposes; this check holds against concurrent decommissions).
func (sm *StateMachine) applySetNodeState(b *pebble.Batch, c *directorypb.SetNodeStateCmd) any {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	i, found := sm.findNode(c.GetId())
	if !found {
		return fmt.Errorf("%w: node %d (region %s)", ErrUnknownNode, c.GetId(), sm.region)
	}
	cur, next := sm.nodes[i].GetState(), c.GetState()
	if err := checkTransition(c.GetId(), cur, next); err != nil {
		return err
	}
	if cur == directorypb.NodeState_NODE_LIVE && next != cur {
		live := 0
		for _, o := range sm.nodes {
			if o.GetId() != c.GetId() && o.GetState() == directorypb.NodeState_NODE_LIVE {
				live++
			}
		}
		if live < MinLiveNodes {
			return fmt.Errorf("%w: %s would keep %d live nodes, it needs %d", ErrTooFewNodes, sm.region, live, MinLiveNodes)
		}
	}
	nodes := slices.Clone(sm.nodes)
	nodes[i] = proto.CloneOf(nodes[i])
	nodes[i].State = next
	return sm.setNodes(b, nodes)
}

// checkTransition vets a state change: live ⇄ decommissioning → gone; the
// same state again is not an error.
func checkTransition(id uint64, cur, next directorypb.NodeState) error {
	if _, known := directorypb.NodeState_name[int32(next)]; !known {
		return fmt.Errorf("%w: node %d cannot become state %d", ErrNodeState, id, next)
	}
	ok := cur == next ||
		cur == directorypb.NodeState_NODE_LIVE && next == directorypb.NodeState_NODE_DECOMMISSIONING ||
		cur == directorypb.NodeState_NODE_DECOMMISSIONING && next != directorypb.NodeState_NODE_DECOMMISSIONING
	if !ok || cur == directorypb.NodeState_NODE_GONE && next != cur {
		return fmt.Errorf("%w: node %d is %s, it cannot become %s", ErrNodeState, id, StateName(cur), StateName(next))
	}
	return nil
}

// StateName is the operator's word for a node state: live,
// decommissioning, gone.
func StateName(s directorypb.NodeState) string {
	switch s {
	case directorypb.NodeState_NODE_LIVE:
		return "live"
	case directorypb.NodeState_NODE_DECOMMISSIONING:
		return "decommissioning"
	case directorypb.NodeState_NODE_GONE:
		return "gone"
	}
	return s.String()
}

// findNode returns where node id is in sm.nodes (by id), or where it
// would go. Callers hold sm.mu.
func (sm *StateMachine) findNode(id uint64) (int, bool) {
	return slices.BinarySearchFunc(sm.nodes, id, func(n *directorypb.NodeRecord, id uint64) int { return cmp.Compare(n.GetId(), id) })
}

// Nodes returns the region's registry, by id.
func (sm *StateMachine) Nodes() []*directorypb.NodeRecord {
	sm.mu.RLock()
	defer sm.mu.RUnlock()
	return cloneNodes(sm.nodes)
}

// Node returns node id's record, if the region registered it.
func (sm *StateMachine) Node(id uint64) (*directorypb.NodeRecord, bool) {
	sm.mu.RLock()
	defer sm.mu.RUnlock()
	i, ok := sm.findNode(id)
	if !ok {
		return nil, false
	}
	return proto.CloneOf(sm.nodes[i]), true
}

func sortNodes(ns []*directorypb.NodeRecord) {
	slices.SortFunc(ns, func(a, b *directorypb.NodeRecord) int { return cmp.Compare(a.GetId(), b.GetId()) })
}
