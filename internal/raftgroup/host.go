// Package raftgroup hosts the replicas of many Raft groups in one node process
// (multi-raft, DESIGN.md §2). Each replica runs the etcd raft Ready loop on its own
// goroutine; all of them share the node's Pebble engine, whose commit pipeline
// folds concurrent fsyncs into one, and the node's transport, which batches their
// messages per destination node.
package raftgroup

import (
	"context"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"golang.org/x/time/rate"

	"github.com/terroir-db/terroir/internal/storage"
	"github.com/terroir-db/terroir/internal/transport/transportpb"
)

// Sender delivers outgoing Raft messages; transport.Raft implements it.
type Sender interface {
	// Send queues m of group for m.To without blocking.
	Send(group uint64, m *raftpb.Message)
	// SendSnapshot streams a snapshot to node to: first is the header,
	// body sends the data in chunks (transport.Raft.SendSnapshot).
	SendSnapshot(ctx context.Context, to uint64, first *transportpb.SnapshotChunk, body func(send func(data []byte) error) error) error
}

// Metrics are the host's Prometheus collectors.
type Metrics struct {
	appendSync      prometheus.Histogram
	apply           prometheus.Histogram
	applied         prometheus.Counter
	proposals       prometheus.Counter
	leaderChanges   prometheus.Counter
	droppedMessages prometheus.Counter
	strayMessages   prometheus.Counter
	snapshotBytes   prometheus.Counter
	idle            prometheus.Gauge
	// heartbeatsElided counts the heartbeats a leader did not send: the
	// follower had an append from it within the heartbeat period.
	heartbeatsElided prometheus.Counter
	// commitsCoalesced counts the commit-only appends a leader held and
	// did not send: a newer append to the follower superseded them
	// (commitappend.go).
	commitsCoalesced prometheus.Counter
	// sent counts the messages handed to the transport for other nodes,
	// by raftpb.MessageType (terroir_raft_messages_sent_total's type label).
	// Local message types (raft.IsLocalMsg) have none.
	sent [numMessageTypes]prometheus.Counter
}

// numMessageTypes bounds raftpb.MessageType's values.
const numMessageTypes = int(raftpb.MessageType_MsgForgetLeader) + 1

// NewMetrics creates the collectors and registers them with reg (nil: unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		appendSync: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "terroir_raft_append_sync_seconds",
			Help:    "Time to durably write one Ready's entries and hard state (includes the fsync).",
			Buckets: prometheus.ExponentialBuckets(50e-6, 2, 14),
		}),
		apply: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "terroir_raft_apply_seconds",
			Help:    "Time to apply one Ready's committed entries to the state machine and store them (not synced).",
			Buckets: prometheus.ExponentialBuckets(10e-6, 2, 16),
		}),
		applied: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "terroir_raft_entries_applied_total", Help: "Committed log entries applied, over every replica of the node.",
		}),
		proposals: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "terroir_raft_proposals_total", Help: "Proposals accepted into a leader's log.",
		}),
		leaderChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "terroir_raft_leadership_changes_total", Help: "Changes of leader seen by the node's replicas (a new leader, or none).",
		}),
		droppedMessages: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "terroir_raft_inbox_dropped_total", Help: "Incoming Raft messages dropped because a group's inbox was full.",
		}),
		strayMessages: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "terroir_raft_stray_messages_total",
			Help: "Incoming Raft messages dropped as misaddressed: for a group not hosted here, to another replica, or from a node that is not the sender or not a replica of the group.",
		}),
		snapshotBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "terroir_raft_snapshot_sent_bytes_total", Help: "Bytes of keys and values streamed in Raft snapshots to other nodes.",
		}),
		heartbeatsElided: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "terroir_raft_heartbeats_elided_total",
			Help: "Heartbeats a leader did not send because it had sent the follower an append within the heartbeat period.",
		}),
		commitsCoalesced: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "terroir_raft_commit_appends_coalesced_total",
			Help: "Commit-only appends a leader held and did not send because a newer append to the follower superseded them.",
		}),
		idle: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "terroir_raft_replicas_idle",
			Help: "Replicas whose Raft clock runs at the idle pace (a third of the full one) after 0.5 s (a follower) or 1 s (a leader) with nothing but heartbeats and reads.",
		}),
	}
	sent := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "terroir_raft_messages_sent_total",
		Help: "Raft messages sent to other nodes' replicas, by type (MsgApp, MsgHeartbeat, ...): what the node's groups cost the network.",
	}, []string{"type"})
	for t := range m.sent {
		if mt := raftpb.MessageType(t); !raft.IsLocalMsg(mt) {
			m.sent[t] = sent.WithLabelValues(mt.String())
		}
	}
	if reg != nil {
		reg.MustRegister(m.appendSync, m.apply, m.applied, m.proposals, m.leaderChanges, m.droppedMessages, m.strayMessages, m.snapshotBytes, m.idle, m.heartbeatsElided, m.commitsCoalesced, sent)
	}
	return m
}

// Host holds a node's replicas. Add groups, then Start.
type Host struct {
	self    uint64
	e       *storage.Engine
	cfg     Config
	metrics *Metrics

	mu      sync.RWMutex
	groups  map[uint64]*Group
	sender  Sender
	started bool
	closed  bool

	// Streamed snapshots (snapshot.go).
	limiter   *rate.Limiter   // bytes per second sent
	sending   chan struct{}   // a slot per snapshot being sent
	receiving chan struct{}   // a slot per snapshot being received
	ctx       context.Context // canceled by Close: streams end
	cancel    context.CancelFunc
	wg        sync.WaitGroup // snapshots being sent
}

// NewHost returns an empty host for node self on engine e.
func NewHost(self uint64, e *storage.Engine, cfg Config, m *Metrics) *Host {
	if m == nil {
		m = NewMetrics(nil)
	}
	cfg = cfg.withDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	return &Host{self: self, e: e, cfg: cfg, metrics: m, groups: map[uint64]*Group{},
		limiter: rate.NewLimiter(rate.Limit(cfg.SnapshotRate), max(snapshotChunkBytes, int(cfg.SnapshotRate/10))),
		sending: make(chan struct{}, cfg.MaxSnapshots), receiving: make(chan struct{}, cfg.MaxSnapshots),
		ctx: ctx, cancel: cancel}
}

// AddGroup opens this node's replica of group id (voters are the group's replica
// IDs) over sm, recovering its Raft state from the engine. Errors wrap
// storage.ErrCorrupt when the stored state is damaged.
func (h *Host) AddGroup(id uint64, voters []uint64, sm StateMachine) (*Group, error) {
	return h.AddGroupWithLearners(id, voters, nil, sm)
}

// AddGroupWithLearners is AddGroup for a group whose first configuration
// (used only when voters is not empty) also has learners: the right-hand
// range of a split that has non-voting replicas (DESIGN.md §13).
func (h *Host) AddGroupWithLearners(id uint64, voters, learners []uint64, sm StateMachine) (*Group, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, ErrStopped
	}
	if _, dup := h.groups[id]; dup {
		return nil, fmt.Errorf("raftgroup: group %d already hosted", id)
	}
	g, err := newGroup(id, h.self, voters, learners, h.e, sm, h.cfg, h.metrics)
	if err != nil {
		return nil, err
	}
	h.groups[id] = g
	if h.started {
		g.send = h.route(g)
		go g.run()
	}
	return g, nil
}

// RemoveGroup stops this node's replica of group id and deletes its Raft
// state (a range merged away, DESIGN.md §11), durably. The group's state
// machine state is the caller's to delete. Removing a group not hosted here
// deletes whatever Raft state of it is left.
func (h *Host) RemoveGroup(id uint64) error {
	h.mu.Lock()
	g := h.groups[id]
	delete(h.groups, id)
	started := h.started
	h.mu.Unlock()
	if g != nil && started {
		g.close()
	}
	b := h.e.NewBatch()
	if err := b.DeleteRange(groupPrefix(id), storage.PrefixEnd(groupPrefix(id)), nil); err != nil {
		_ = b.Close()
		return err
	}
	return h.e.Commit(b, true)
}

// Start begins driving every group, sending through s.
func (h *Host) Start(s Sender) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sender, h.started = s, true
	for _, g := range h.groups {
		g.send = h.route(g)
		go g.run()
	}
}

// Group returns the hosted replica of group id, or nil.
func (h *Host) Group(id uint64) *Group {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.groups[id]
}

// GroupView implements transport.RaftHandler: this node's replica's view
// of group id's configuration, as it applied it.
func (h *Host) GroupView(id uint64) *transportpb.GroupResponse {
	g := h.Group(id)
	if g == nil || g.uninitialized() {
		return &transportpb.GroupResponse{}
	}
	c := g.members.Load()
	return &transportpb.GroupResponse{Hosted: true, ConfIndex: c.index, Voters: c.cs.GetVoters(),
		VotersOutgoing: c.cs.GetVotersOutgoing(), Learners: c.cs.GetLearners(), Leader: g.Status().Leader}
}

// HandleRaft implements transport.RaftHandler. It drops (and counts) a
// message for a group not hosted here, addressed to another replica, not
// from node `from` (whose certificate the transport checked), or from a
// node not of the cluster (Config.Known). It does not drop messages from
// nodes outside the configuration this replica applied: a replica that has
// not yet applied the change adding a node must still hear from it once it
// leads (Raft's terms and log checks judge the rest).
func (h *Host) HandleRaft(from uint64, msgs []*transportpb.RaftEnvelope) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	for _, env := range msgs {
		m, g := env.GetMsg(), h.groups[env.GetGroupId()]
		// Raft trusts every message it steps: a misaddressed one (a node
		// restarted on another's address) could raise a group's term or be
		// taken for a replica's reply.
		if g == nil || m == nil || m.GetTo() != h.self || m.GetFrom() != from || !h.known(from) {
			h.metrics.strayMessages.Inc()
			continue
		}
		g.step(m)
	}
}

func (h *Host) known(node uint64) bool { return h.cfg.Known == nil || h.cfg.Known(node) }

// ReportUnreachable implements transport.RaftHandler.
func (h *Host) ReportUnreachable(group, to uint64) {
	if g := h.Group(group); g != nil {
		g.report(func(rn *raft.RawNode) { rn.ReportUnreachable(to) })
	}
}

// ReportSnapshot implements transport.RaftHandler.
func (h *Host) ReportSnapshot(group, to uint64, ok bool) {
	if g := h.Group(group); g != nil {
		status := raft.SnapshotFinish
		if !ok {
			status = raft.SnapshotFailure
		}
		g.reportSnapshot(func(rn *raft.RawNode) { rn.ReportSnapshot(to, status) })
	}
}

// Close stops every group and waits for their goroutines to exit.
func (h *Host) Close() {
	h.mu.Lock()
	groups := h.groups
	started := h.started
	h.closed = true
	h.mu.Unlock()
	h.cancel() // snapshots being sent end
	if started {
		for _, g := range groups {
			g.close()
		}
	}
	h.wg.Wait()
}
