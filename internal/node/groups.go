package node

import (
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/terroir-db/terroir/internal/directory"
	"github.com/terroir-db/terroir/internal/epoch"
	"github.com/terroir-db/terroir/internal/raftgroup"
	"github.com/terroir-db/terroir/internal/storage"
	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/txnstate"
)

// The non-range groups a node hosts (DESIGN.md §12): local epoch,
// publisher, global epoch, transaction-state and directory groups. A node
// hosts those the topology names it a replica of, unless a move took its
// replica away (a tombstone, storage.GroupTombstoneKey), and those a move
// brought here (storage.GroupIndexKey). A replica that an applied
// configuration leaves out is dropped: taken out of its service, its
// drivers stopped, its Raft and state machine state deleted, a tombstone
// written.

// hostedGroup is one non-range group's replica on this node.
type hostedGroup struct {
	g      topology.Group
	rg     *raftgroup.Group
	epoch  *epoch.StateMachine // an epoch kind's state machine, else nil
	local  *epoch.Replica      // a local epoch group's advance loop, else nil
	global *epoch.Global       // the global epoch service's driver, else nil
}

// start starts the group's drivers, once the host runs.
func (h *hostedGroup) start() {
	if h.local != nil {
		h.local.Start()
	}
	if h.global != nil {
		h.global.Start()
	}
}

// close stops the group's drivers.
func (h *hostedGroup) close() {
	if h.global != nil {
		h.global.Close()
	}
	if h.local != nil {
		h.local.Close()
	}
}

// hostGroup opens this node's replica of the non-range group g and makes it
// reachable through its service. voters seed a replica with no stored
// configuration (nil: a replica a move adds, which waits for the leader's
// snapshot). The caller starts it once the host runs.
func (n *Node) hostGroup(g topology.Group, voters []uint64) (*hostedGroup, error) {
	top := n.cfg.Topology
	h := &hostedGroup{g: g}
	var err error
	switch g.Kind {
	case topology.KindLocalEpoch, topology.KindPublisher, topology.KindGlobalEpoch:
		if h.epoch, err = epoch.NewStateMachine(n.engine, g.ID); err != nil {
			return nil, err
		}
		if h.rg, err = n.host.AddGroup(g.ID, voters, h.epoch); err != nil {
			return nil, err
		}
		rg, changes := h.rg, n.metrics.epochChange.WithLabelValues(string(g.Kind))
		h.epoch.OnChange(func() bool { return rg.Status().CaughtUp }, func(d time.Duration) { changes.Observe(d.Seconds()) })
		switch g.Kind {
		case topology.KindLocalEpoch:
			h.local = epoch.NewReplica(h.rg, h.epoch, epoch.NewPace(top.LocalEpochInterval, top.LocalEpochIdleInterval))
			n.epochSrv.AddLocal(h.local)
		case topology.KindPublisher:
			quorum, err := n.reader(topology.KindPublisher, g.Region)
			if err != nil {
				return nil, err
			}
			n.epochSrv.AddPublisher(epoch.NewPublisher(h.rg, h.epoch, top.PublisherLease, quorum))
		case topology.KindGlobalEpoch:
			var targets []epoch.PublisherTarget
			for _, p := range top.GroupsOfKind(topology.KindPublisher, "") {
				targets = append(targets, epoch.PublisherTarget{Group: p.ID, Replicas: p.Replicas, Region: p.Region})
			}
			quorum, err := n.reader(topology.KindGlobalEpoch, "")
			if err != nil {
				return nil, err
			}
			h.global = epoch.NewGlobal(h.rg, h.epoch, n.dialer, targets, quorum, epoch.GlobalConfig{Tick: top.RaftTick,
				MinInterval: top.GlobalEpochMinInterval, PublisherLease: top.PublisherLease, AutoExcludeAfter: top.AutoExcludeAfter,
				IdleInterval: top.GlobalEpochIdleInterval, Observe: n.metrics.observeRound})
			n.epochSrv.AddGlobal(h.global)
		}
	case topology.KindTxnState:
		sm, err := txnstate.NewStateMachine(n.engine, g.ID)
		if err != nil {
			return nil, err
		}
		if h.rg, err = n.host.AddGroup(g.ID, voters, sm); err != nil {
			return nil, err
		}
		n.txnSrv.Add(txnstate.Replica{Group: h.rg, SM: sm})
	case topology.KindDirectory:
		sm, err := directory.NewStateMachine(n.engine, g.ID, directory.SeedFor(top, g.Region))
		if err != nil {
			return nil, err
		}
		if h.rg, err = n.host.AddGroup(g.ID, voters, sm); err != nil {
			return nil, err
		}
		n.dirSrv.Add(directory.Replica{Group: h.rg, SM: sm})
	default:
		return nil, fmt.Errorf("node: group %d has kind %q this node cannot host", g.ID, g.Kind)
	}
	id := g.ID
	h.rg.OnLeft(func() { n.dropGroup(id) })
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closing {
		return nil, raftgroup.ErrStopped // the host stops the group; its drivers never started
	}
	n.groups[id] = h
	return h, nil
}

// hostGroups opens every non-range group this store should host: the
// topology's (but those a move took away, whose leftovers it deletes) and
// those moves brought here.
func (n *Node) hostGroups() error {
	removed, err := n.engine.RemovedGroups()
	if err != nil {
		return err
	}
	for _, id := range removed { // a drop cut short by a crash leaves state
		if err := n.deleteGroup(id); err != nil {
			return err
		}
	}
	indexed, err := n.engine.IndexedGroups()
	if err != nil {
		return err
	}
	for _, g := range n.cfg.Topology.Groups {
		moved := slices.Contains(indexed, g.ID)
		if g.Kind == topology.KindRange || slices.Contains(removed, g.ID) || !moved && !slices.Contains(g.Replicas, n.cfg.NodeID) {
			continue
		}
		cs, err := raftgroup.StoredConf(n.engine, g.ID)
		if err != nil {
			return err
		}
		// Moved away, the drop cut short (or never told: the node was
		// stopping); or moved here but its first snapshot never came (the
		// move that added it failed, or fails now and removes the learner).
		if len(cs.GetVoters()) > 0 && !raftgroup.InConf(cs, n.cfg.NodeID) || moved && len(cs.GetVoters()) == 0 {
			if err := n.tombstoneGroup(g.ID); err != nil {
				return err
			}
			if err := n.deleteGroup(g.ID); err != nil {
				return err
			}
			continue
		}
		voters := g.Replicas
		if moved {
			voters = nil
		}
		if _, err := n.hostGroup(g, voters); err != nil {
			return err
		}
	}
	return nil
}

// hostedGroups returns the non-range groups hosted here, by ID.
func (n *Node) hostedGroups() []*hostedGroup {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]*hostedGroup, 0, len(n.groups))
	for _, h := range n.groups {
		out = append(out, h)
	}
	slices.SortFunc(out, func(a, b *hostedGroup) int { return int(a.g.ID) - int(b.g.ID) })
	return out
}

// dropGroup drops this node's replica of group id, which the group's
// configuration no longer names: out of its service, drivers stopped,
// tombstone, state deleted. In the background (it may run on the group's
// own goroutine, which stopping the group waits for).
func (n *Node) dropGroup(id uint64) {
	n.mu.Lock()
	h := n.groups[id]
	if h == nil || n.closing {
		n.mu.Unlock()
		return
	}
	delete(n.groups, id)
	gone := make(chan struct{})
	n.dropping[id] = gone
	n.removing.Add(1)
	n.mu.Unlock()
	switch h.g.Kind {
	case topology.KindTxnState:
		n.txnSrv.Remove(id)
	case topology.KindDirectory:
		n.dirSrv.Remove(id)
	default:
		n.epochSrv.Remove(id)
	}
	go func() {
		defer n.removing.Done()
		defer func() {
			n.mu.Lock()
			delete(n.dropping, id)
			n.mu.Unlock()
			close(gone)
		}()
		h.close()
		err := n.tombstoneGroup(id)
		if err == nil {
			err = n.deleteGroup(id)
		}
		if err != nil {
			slog.Error("node: dropping a group replica the group left", "node", n.cfg.NodeID, "group", id, "err", err)
			return
		}
		slog.Info("group replica removed", "node", n.cfg.NodeID, "group", id, "kind", h.g.Kind)
	}()
}

// tombstoneGroup durably records that group id's replica left this node.
func (n *Node) tombstoneGroup(id uint64) error {
	b := n.engine.NewBatch()
	_ = b.Set(storage.GroupTombstoneKey(id), nil, nil)
	_ = b.Delete(storage.GroupIndexKey(id), nil)
	return n.engine.Commit(b, true)
}

// deleteGroup stops group id's replica, if running, and deletes its Raft
// and state machine state.
func (n *Node) deleteGroup(id uint64) error {
	if err := n.host.RemoveGroup(id); err != nil {
		return err
	}
	return n.engine.DeleteState(id)
}
