package raftgroup

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
	"google.golang.org/protobuf/proto"

	"github.com/terroir-db/terroir/internal/storage"
	"github.com/terroir-db/terroir/internal/tick"
)

// StateMachine is the replicated state a group applies its log to. Its methods are
// called only from the group's goroutine, in log order. It must also be a
// Snapshotter or Streamed (snapshot.go), which says how Raft snapshots of it
// travel.
type StateMachine interface {
	// Apply applies the committed command at index, staging every durable change
	// in b (committed together with the applied index). b is indexed: reads
	// through it see the writes of earlier commands in the same batch. The result
	// is returned to the proposer, if it waits on this replica.
	Apply(b *pebble.Batch, index uint64, cmd []byte) any
}

// PostApplier is a StateMachine that acts once the batch of its applied
// entries is in the engine (a range split starts the right-hand range's group
// then, never before the state it reads is there). PostApply runs on the
// group's goroutine after every applied batch, with the index of the batch's
// last entry: the group's applied index.
type PostApplier interface {
	PostApply(applied uint64)
}

// ConfChanger is a StateMachine that keeps state about its group's
// configuration (a range's descriptor names its replicas). ApplyConfChange
// runs on the group's goroutine when a change proposed with
// ProposeConfChange applies, with the configuration it makes and the
// payload it was proposed with, staging durable changes in b; its result
// goes to the proposer. Changes Raft makes by itself (leaving a joint
// configuration) carry no payload and are not passed on.
type ConfChanger interface {
	ApplyConfChange(b *pebble.Batch, index uint64, cs *raftpb.ConfState, payload []byte) any
}

// Errors returned by Propose.
var (
	// ErrNotLeader: this replica is not the group's leader; LeaderHint may name it.
	ErrNotLeader = errors.New("raftgroup: not the leader")
	// ErrOutcomeUnknown: leadership was lost after the proposal entered the log; it
	// may or may not apply.
	ErrOutcomeUnknown = errors.New("raftgroup: leadership lost, proposal outcome unknown")
	// ErrStopped: the group is closed or failed.
	ErrStopped = errors.New("raftgroup: group stopped")
	// ErrBusy: the leader refused the proposal (too much uncommitted data, or a
	// leadership transfer in progress); retry after a pause.
	ErrBusy = errors.New("raftgroup: leader busy, retry")
)

// Status is a point-in-time view of a replica, safe to read from any goroutine.
type Status struct {
	// Group is the group ID; Replica this replica's ID (its node ID).
	Group, Replica uint64
	// Leader is the replica this one believes leads (0 if unknown); Term its term.
	Leader, Term uint64
	// Applied is the last applied log index.
	Applied uint64
	// FirstIndex is the first index still in the replica's log: the
	// entries before it were truncated (behind a snapshot), so a follower
	// that lacks them catches up from a snapshot.
	FirstIndex uint64
	// CaughtUp is true once the replica has applied everything the group had
	// committed when the replica (re)started, as learned through a Raft ReadIndex
	// after the start. Until then its state may be older than state it served
	// before a crash (applied state is not fsync'd; it replays from the log).
	CaughtUp bool
	// Idle is true while the replica's Raft clock runs at the idle pace: a
	// third of the full one, after 0.5 s (a follower) or 1 s (the leader)
	// with nothing but heartbeats and reads (idle.go).
	Idle bool
}

type proposal struct {
	id   uint64
	data []byte
	conf *raftpb.ConfChangeV2 // a configuration change, with data as its payload
	done chan proposalResult
}

type proposalResult struct {
	val any
	err error
}

// Group is one replica of one Raft group, driven by its own goroutine through the
// etcd raft Ready loop: persist entries and hard state (fsync'd when Raft requires),
// send messages, apply committed entries, advance.
type Group struct {
	id, self uint64
	rn       *raft.RawNode
	ls       *logStore
	sm       StateMachine
	e        *storage.Engine
	send     func(group uint64, m *raftpb.Message)
	cfg      Config
	metrics  *Metrics

	inbox   chan *raftpb.Message
	props   chan *proposal
	reports chan func(*raft.RawNode)
	stop    chan struct{}
	done    chan struct{}

	waiters      map[uint64]*proposal // loop only
	leading      bool                 // loop only: raft state is leader
	nextID       uint64               // loop only
	catchUp      catchUp              // loop only
	snapMu       sync.Mutex
	snapRpts     []func(*raft.RawNode) // snapshot reports: never dropped
	poke         chan struct{}
	reads        chan *readRequest
	pending      uint64                     // loop only: last read request id (random start)
	pendingReads map[[8]byte]*readRequest   // loop only
	appliedC     chan struct{}              // closed and replaced when Applied changes
	snapIn       chan *incoming             // streamed snapshots received, for the loop
	staged       *staged                    // loop only: the received snapshot Raft may accept
	leadTicks    int                        // loop only: ticks LeadAtStart still campaigns for
	pace         idlePace                   // loop only: the Raft clock's idle pace (idle.go)
	appended     map[uint64]time.Time       // loop only: when the leader last sent each follower an append (heartbeat.go)
	commitHold   time.Duration              // LazyCommit's hold (0: none; commitappend.go)
	held         map[uint64]*raftpb.Message // loop only: the commit-only append held for each follower
	holdTimer    *time.Timer                // loop only: ends the holds (holdC while armed)
	holdC        <-chan time.Time           // loop only: holdTimer.C while a hold runs, else nil

	mu     sync.Mutex
	status Status
	err    error // why the group stopped, if it failed

	leaderChanged atomic.Pointer[chan struct{}]
	members       atomic.Pointer[configuration] // the configuration as last applied
	confInLog     atomic.Uint64                 // the log's last configuration change (logStore.confInLog)
	applied       atomic.Uint64                 // the applied index, stored after what it applied
	first         atomic.Uint64                 // the log's first index (Status.FirstIndex)
	onLeft        atomic.Pointer[func()]        // called once an applied configuration leaves this replica out
}

// OnLeft sets f to be called, on the group's goroutine, once a
// configuration change that leaves this replica out (not a voter, learner
// or outgoing voter) is applied and durable here; f must not block (stopping
// the group waits for that goroutine). Groups whose state machine tracks
// its configuration (a range's descriptor) act on it there instead.
func (g *Group) OnLeft(f func()) { g.onLeft.Store(&f) }

// configuration is a conf state and the index of the change that made it.
type configuration struct {
	index uint64
	cs    *raftpb.ConfState
}

// Config tunes a group. Zero fields take the defaults noted.
type Config struct {
	// Tick is the unit of the group's timeouts (default 10 ms): a follower
	// that hears no leader for 30–55 Ticks campaigns; a leader that hears
	// no quorum for 30 steps down (generous, so a loaded machine does not
	// flap leaders); a leader heartbeats every 10. The group's Raft clock
	// ticks once every clockTicks of it (see there).
	Tick time.Duration
	// CompactAfter is how many applied entries may accumulate before the
	// log is truncated behind a snapshot even though a follower still lacks
	// some of them (default 10000); the newest CompactAfter/2 entries are
	// kept so a follower slightly behind catches up from the log. A log
	// that every follower has is truncated sooner (logTail).
	CompactAfter uint64
	// SnapshotRate bounds the bytes per second a node sends in streamed
	// snapshots, all groups together, so that catching a replica up leaves
	// the disk and network to foreground traffic (default DefaultSnapshotRate).
	SnapshotRate float64
	// Known reports whether a node belongs to the cluster; Raft messages
	// and snapshots from any other are dropped (nil: every node). A node
	// outside a group's configuration is not dropped: a replica that has
	// not applied the change adding it must still hear from it.
	Known func(node uint64) bool
	// MaxSnapshots bounds the streamed snapshots a node sends at once, and
	// those it receives at once (default 2 each); past it a snapshot is
	// refused and Raft sends it later.
	MaxSnapshots int
}

// DefaultSnapshotRate is Config.SnapshotRate's default: 32 MiB/s.
const DefaultSnapshotRate = 32 << 20

// clockTicks is how many Config.Ticks make one tick of a group's Raft
// clock (50 ms at the default Tick); electionTicks, heartbeatTicks and
// leadRetryTicks count the Raft clock's ticks. Each tick wakes the group's
// goroutine whether or not it has anything to do: at one tick per 10 ms an
// idle three-region cluster's 39 replicas woke 3 900 times a second,
// about 8% of its CPU (`terroir bench idle`, six alternating pairs:
// 21.8–25.4% of a core at 10 ms, 20.9–23.1% at 50 ms; issue 17). Every
// timeout stays what it was; only their granularity coarsens, to 50 ms.
// A group's ticks fall clockPhase
// into each period, by node: a node's groups tick together (one wakeup),
// while two nodes' replicas of one group never do, so two followers that
// drew the same election timeout (one of 6 values, no longer one of 30)
// still do not campaign in the same instant and split the vote.
//
// electionTicks is Raft's election timeout (300 ms at the default tick):
// a follower that hears no leader for 300–550 ms campaigns, and a
// leader (CheckQuorum) that hears from no quorum for 300 ms steps down. At 600
// ms a 2-core machine saturated by three nodes lost no leader of a healthy
// group in 20 minutes of YCSB-A, where 300 ms lost 26 (scheduling waits of
// up to 0.27 s after the stores' flushes); but a frozen range leader then
// cost its region 1.5–2.7 s without a commit, past the 2 s that
// TestFrozenRangeLeaderFailover holds (DESIGN.md §12), since followers
// wait out the timeout before they campaign (issue 17). A group whose nodes
// start together elects its first leader without waiting for the timeout
// (LeadAtStart).
//
// heartbeatTicks is the leader's heartbeat period (100 ms, as etcd's
// default). Followers learn new commits from appends, not heartbeats.
// Heartbeats are most of what an idle node sends (two messages a period per
// follower of each group it leads): at 50 ms an idle three-region cluster
// spent 15% more CPU (`terroir bench idle`: a median 26.5% of a core
// against 22.6%), at 30 ms a point more again. A follower still hears
// three before it may campaign, and a leader hears every follower two or
// three times in each CheckQuorum window: only a stall of more than 200 ms
// (rather than 250 ms) between two heartbeats costs a leader, and a stall
// that long costs it at either period.
//
// leadRetryTicks is how often LeadAtStart stands again (50 ms), so that
// peers starting a moment after it join its first election.
const (
	clockTicks     = 5
	electionTicks  = 6
	heartbeatTicks = 2
	leadRetryTicks = 1
)

// clockPhase is where in each period of its Raft clock node self's
// replicas tick: a fraction of the period spread by the golden ratio, so
// that any few nodes' phases lie well apart.
func clockPhase(self uint64, period time.Duration) time.Duration {
	frac := (self * 0x9E3779B9) & 0xFFFFFFFF // 32 fractional bits
	return time.Duration((uint64(period) * frac) >> 32)
}

func (c Config) withDefaults() Config {
	if c.Tick <= 0 {
		c.Tick = 10 * time.Millisecond
	}
	if c.CompactAfter == 0 {
		c.CompactAfter = 10000
	}
	if c.SnapshotRate <= 0 {
		c.SnapshotRate = DefaultSnapshotRate
	}
	if c.MaxSnapshots <= 0 {
		c.MaxSnapshots = 2
	}
	return c
}

func newGroup(id, self uint64, voters, learners []uint64, e *storage.Engine, sm StateMachine, cfg Config, m *Metrics) (*Group, error) {
	_, streamed := sm.(Streamed)
	if _, copied := sm.(Snapshotter); streamed == copied {
		return nil, fmt.Errorf("raftgroup: group %d: state machine %T must be either a Snapshotter or Streamed", id, sm)
	}
	ls, err := openLogStoreConf(e, id, voters, learners)
	if err != nil {
		return nil, err
	}
	ls.streamed = streamed
	rn, err := raft.NewRawNode(&raft.Config{
		ID:                        self,
		ElectionTick:              electionTicks,
		HeartbeatTick:             heartbeatTicks,
		Storage:                   ls,
		Applied:                   ls.applied,
		MaxSizePerMsg:             1 << 20,
		MaxCommittedSizePerReady:  4 << 20,
		MaxUncommittedEntriesSize: 64 << 20,
		MaxInflightMsgs:           256,
		CheckQuorum:               true,
		PreVote:                   true,
		DisableProposalForwarding: true,
		StepDownOnRemoval:         true, // a leader the configuration left stops leading (it could no longer propose)
		Logger:                    raftLogger{group: id},
	})
	if err != nil {
		return nil, fmt.Errorf("raftgroup: group %d: %w", id, err)
	}
	g := &Group{
		id: id, self: self, rn: rn, ls: ls, sm: sm, e: e, cfg: cfg.withDefaults(), metrics: m,
		inbox:        make(chan *raftpb.Message, 4096),
		props:        make(chan *proposal, 1024),
		reports:      make(chan func(*raft.RawNode), 256),
		stop:         make(chan struct{}),
		done:         make(chan struct{}),
		waiters:      map[uint64]*proposal{},
		nextID:       rand.Uint64(),
		poke:         make(chan struct{}, 1),
		reads:        make(chan *readRequest, 256),
		pendingReads: map[[8]byte]*readRequest{},
		pending:      rand.Uint64(),
		appliedC:     make(chan struct{}),
		snapIn:       make(chan *incoming),
	}
	if lc, ok := sm.(LazyCommit); ok {
		g.commitHold = lc.CommitHold()
	}
	binary.BigEndian.PutUint64(g.catchUp.ctx[:], rand.Uint64())
	g.catchUp.applied = ls.applied
	ch := make(chan struct{})
	g.leaderChanged.Store(&ch)
	g.status = Status{Group: id, Replica: self, Applied: ls.applied}
	g.first.Store(ls.first)
	g.members.Store(&configuration{ls.ci, proto.Clone(ls.cs).(*raftpb.ConfState)})
	g.confInLog.Store(ls.confInLog)
	g.applied.Store(ls.applied)
	return g, nil
}

// uninitialized reports whether the replica has no configuration yet (one
// being added, waiting for its first snapshot).
func (g *Group) uninitialized() bool {
	cs := g.members.Load().cs
	return len(cs.GetVoters()) == 0 && len(cs.GetLearners()) == 0
}

// Members returns the group's configuration as this replica last applied
// it: voters and learners (both empty for a replica not initialized yet),
// and whether a joint change is under way.
func (g *Group) Members() (voters, learners []uint64, joint bool) {
	cs := g.members.Load().cs
	return slices.Clone(cs.GetVoters()), slices.Clone(cs.GetLearners()), len(cs.GetVotersOutgoing()) > 0
}

// Configuration returns the group's configuration as this replica last
// applied it: the log index of the configuration change that made it (0
// for the bootstrap configuration), its voters, and while a joint change
// is under way the outgoing voters (both halves must agree, DESIGN.md
// §12). A replica publishes a configuration after the effects of every
// entry before it and before those of any entry after it, so reading the
// configuration, then state, then the configuration again, and finding the
// same index, shows state applied under that configuration.
func (g *Group) Configuration() (index uint64, voters, outgoing []uint64) {
	c := g.members.Load()
	return c.index, slices.Clone(c.cs.GetVoters()), slices.Clone(c.cs.GetVotersOutgoing())
}

// ConfIndex returns the index of the configuration change that made the
// configuration this replica applied last (Configuration's, without
// copying the voters).
func (g *Group) ConfIndex() uint64 { return g.members.Load().index }

// ConfPending reports whether this replica's log holds a configuration
// change it has not applied yet: until it has, what it reports under its
// applied configuration may be older than a configuration the group has
// already committed (epoch.Reader relies on such replicas not answering).
func (g *Group) ConfPending() bool {
	return g.confInLog.Load() > g.applied.Load()
}

// Applied returns the group's applied index: every entry up to it is in the
// state machine's engine.
func (g *Group) Applied() uint64 { return g.applied.Load() }

// ID returns the group ID.
func (g *Group) ID() uint64 { return g.id }

// Status returns the replica's current status.
func (g *Group) Status() Status {
	g.mu.Lock()
	st := g.status
	g.mu.Unlock()
	st.FirstIndex = g.first.Load()
	return st
}

// RecentlyActive returns, at the leader, which members it heard from within
// the last election timeout (etcd raft's Progress.RecentActive; it counts
// itself). Errors: ErrNotLeader, ErrStopped, ctx's error.
func (g *Group) RecentlyActive(ctx context.Context) (map[uint64]bool, error) {
	ch := make(chan map[uint64]bool, 1)
	select {
	case g.reports <- func(rn *raft.RawNode) {
		st := rn.Status()
		if st.RaftState != raft.StateLeader {
			ch <- nil
			return
		}
		active := make(map[uint64]bool, len(st.Progress))
		for id, pr := range st.Progress {
			active[id] = pr.RecentActive || id == g.self
		}
		ch <- active
	}:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-g.done:
		return nil, ErrStopped
	}
	select {
	case a := <-ch:
		if a == nil {
			return nil, ErrNotLeader
		}
		return a, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-g.done:
		return nil, ErrStopped
	}
}

// Progress returns, at the leader, its commit index and each replica's
// matched log index (ok false elsewhere). It asks the group's goroutine, so
// it waits at most for one Ready cycle, bounded by ctx.
// Errors: ErrStopped, ctx's error.
func (g *Group) Progress(ctx context.Context) (commit uint64, match map[uint64]uint64, ok bool, err error) {
	type answer struct {
		commit uint64
		match  map[uint64]uint64
		ok     bool
	}
	ch := make(chan answer, 1)
	select {
	case g.reports <- func(rn *raft.RawNode) {
		st := rn.Status()
		a := answer{commit: st.GetCommit(), ok: st.RaftState == raft.StateLeader}
		if a.ok {
			a.match = make(map[uint64]uint64, len(st.Progress))
			for id, pr := range st.Progress {
				a.match[id] = pr.Match
			}
		}
		ch <- a
	}:
	case <-ctx.Done():
		return 0, nil, false, ctx.Err()
	case <-g.done:
		return 0, nil, false, ErrStopped
	}
	select {
	case a := <-ch:
		return a.commit, a.match, a.ok, nil
	case <-ctx.Done():
		return 0, nil, false, ctx.Err()
	case <-g.done:
		return 0, nil, false, ErrStopped
	}
}

// IsLeader reports whether this replica currently believes it leads the group.
func (g *Group) IsLeader() bool {
	st := g.Status()
	return st.Leader == g.self
}

// LeaderChanged returns a channel closed at the next change of leader or term.
func (g *Group) LeaderChanged() <-chan struct{} { return *g.leaderChanged.Load() }

// Err returns why the group stopped, or nil while it runs.
func (g *Group) Err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

// Propose replicates cmd through the group's log and waits until this replica
// applies it, returning the state machine's result. Only the leader accepts
// proposals (ErrNotLeader otherwise). ErrOutcomeUnknown means leadership moved
// while the command was in flight. The wait is bounded by ctx.
func (g *Group) Propose(ctx context.Context, cmd []byte) (any, error) {
	p := &proposal{data: cmd, done: make(chan proposalResult, 1)}
	select {
	case g.props <- p:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-g.done:
		return nil, ErrStopped
	}
	select {
	case r := <-p.done:
		return r.val, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-g.done:
		return nil, ErrStopped
	}
}

// ProposeConfChange replicates a configuration change through the group's
// log (etcd raft's joint consensus: several changes at once enter a joint
// configuration, which Raft leaves by itself once it applies, unless
// cc.Transition says otherwise) and waits until this replica applies it,
// returning the state machine's ApplyConfChange result for payload. Only
// the leader accepts it (ErrNotLeader). Raft takes one change at a time:
// a change proposed while another has not applied is dropped, and the
// wait ends with ctx. Errors as Propose.
func (g *Group) ProposeConfChange(ctx context.Context, cc *raftpb.ConfChangeV2, payload []byte) (any, error) {
	cc = proto.Clone(cc).(*raftpb.ConfChangeV2)
	p := &proposal{data: payload, conf: cc, done: make(chan proposalResult, 1)}
	select {
	case g.props <- p:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-g.done:
		return nil, ErrStopped
	}
	select {
	case r := <-p.done:
		return r.val, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-g.done:
		return nil, ErrStopped
	}
}

// ReadIndex waits until this replica has applied every entry committed when the
// call began (a Raft ReadIndex round with a quorum, then the local apply), so a
// read of the state machine after it returns is linearizable. Bounded by ctx;
// ErrStopped if the group stops.
func (g *Group) ReadIndex(ctx context.Context) error {
	r := &readRequest{done: make(chan uint64, 1)}
	select {
	case g.reads <- r:
	case <-ctx.Done():
		return ctx.Err()
	case <-g.done:
		return ErrStopped
	}
	var index uint64
	select {
	case index = <-r.done:
	case <-ctx.Done():
		return ctx.Err()
	case <-g.done:
		return ErrStopped
	}
	for {
		ch := g.appliedCh()
		if g.Status().Applied >= index {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		case <-g.done:
			return ErrStopped
		}
	}
}

type readRequest struct {
	ctx  [8]byte
	done chan uint64 // receives the read index
}

// appliedCh returns a channel closed at the next change of the applied index.
func (g *Group) appliedCh() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.appliedC
}

// step hands an incoming message to the group's goroutine; it drops the message if
// the inbox is full (Raft retransmits).
func (g *Group) step(m *raftpb.Message) {
	select {
	case g.inbox <- m:
	default:
		g.metrics.droppedMessages.Inc()
	}
}

// report hands f to the group's goroutine, dropping it if the queue is full:
// for unreachable reports that only delays a probe.
func (g *Group) report(f func(*raft.RawNode)) {
	select {
	case g.reports <- f:
	default:
	}
}

// TransferLeadership asks the group's leader to hand leadership to replica
// to (a follower forwards the request to the leader it knows). It returns at
// once; the transfer may not happen (raft abandons it after an election
// timeout). A leader first sends the commit-only appends it holds
// (commitappend.go), so that the replica it hands over to knows every
// commit when it takes over (a transferred range lease is applied and
// committed before its leadership moves) rather than one round later.
func (g *Group) TransferLeadership(to uint64) {
	g.report(func(rn *raft.RawNode) {
		g.releaseHeld()
		rn.TransferLeader(to)
	})
}

// StartLeader returns the voter that should lead the group when it starts
// with no leader known: the one at position id mod n of its n voters in
// ascending order, which spreads the first leaders of a node's groups over
// its peers. It returns 0 for a replica not initialized yet.
func (g *Group) StartLeader() uint64 {
	voters := g.members.Load().cs.GetVoters()
	if len(voters) == 0 {
		return 0
	}
	voters = slices.Clone(voters)
	slices.Sort(voters)
	return voters[g.id%uint64(len(voters))]
}

// LeadAtStart has this replica, a voter, stand for election now and again
// every leadRetryTicks (50 ms) until the group knows a leader, for at most
// one election timeout (300 ms): the replica its node chose to lead the
// group first, as the node starts (a cluster's bootstrap or restart). The
// repeats reach peers that start after it; a peer that hears from a leader
// ignores them (PreVote, CheckQuorum), so they never unseat one. Without it
// a starting group elects only after an election timeout. A call on a
// replica that is not a voter does nothing.
func (g *Group) LeadAtStart() {
	if !slices.Contains(g.members.Load().cs.GetVoters(), g.self) {
		return
	}
	g.report(func(rn *raft.RawNode) {
		g.leadTicks = electionTicks
		g.campaignFirst(rn)
	})
}

// campaignFirst is LeadAtStart's campaign, on the group's goroutine: one
// while no leader is known and this replica is not already asking for votes.
func (g *Group) campaignFirst(rn *raft.RawNode) {
	st := rn.BasicStatus()
	switch {
	case st.Lead != raft.None || st.RaftState == raft.StateLeader:
		g.leadTicks = 0
	case st.RaftState != raft.StateCandidate:
		_ = rn.Campaign()
	}
}

// Campaign asks this replica to start an election now (a new group's
// replica on the node that should lead it, DESIGN.md §11), without waiting
// for the election timeout. Best effort.
func (g *Group) Campaign() {
	g.report(func(rn *raft.RawNode) { _ = rn.Campaign() })
}

// reportSnapshot queues a snapshot outcome. It is never dropped: a lost failure
// report would leave the follower paused in snapshot state for good. It never
// blocks, since it may be called from the group's own goroutine.
func (g *Group) reportSnapshot(f func(*raft.RawNode)) {
	g.snapMu.Lock()
	g.snapRpts = append(g.snapRpts, f)
	g.snapMu.Unlock()
	select {
	case g.poke <- struct{}{}:
	default:
	}
}

func (g *Group) runSnapshotReports() {
	g.snapMu.Lock()
	rpts := g.snapRpts
	g.snapRpts = nil
	g.snapMu.Unlock()
	for _, f := range rpts {
		f(g.rn)
	}
}

// setApplied publishes the applied index and whether the replica has caught up.
func (g *Group) setApplied(index uint64) {
	g.catchUp.applied = index
	g.applied.Store(index)
	g.mu.Lock()
	g.status.Applied = index
	g.status.CaughtUp = g.catchUp.done()
	close(g.appliedC)
	g.appliedC = make(chan struct{})
	g.mu.Unlock()
}

// catchUp tracks the ReadIndex a replica issues after it starts: it has caught up
// once it applied the commit index the group had when the read was served.
type catchUp struct {
	ctx       [8]byte // identifies our ReadIndex request
	target    uint64
	known     bool
	requested int // ticks since the request, 0 if none is outstanding
	applied   uint64
}

func (c *catchUp) done() bool { return c.known && c.applied >= c.target }

// maybeRequest, called every tick, issues the ReadIndex once a leader is known,
// and reissues it after 10 ticks without an answer.
func (c *catchUp) maybeRequest(rn *raft.RawNode, leader uint64) {
	if c.known || leader == 0 {
		return
	}
	if c.requested > 0 && c.requested < 10 {
		c.requested++
		return
	}
	c.requested = 1
	rn.ReadIndex(c.ctx[:])
}

func (c *catchUp) onReadState(rs raft.ReadState) {
	if !c.known && bytes.Equal(rs.RequestCtx, c.ctx[:]) {
		c.target, c.known = rs.Index, true
	}
}

func (g *Group) close() {
	select {
	case <-g.stop:
	default:
		close(g.stop)
	}
	<-g.done
}

const drainLimit = 512

func (g *Group) run() {
	defer close(g.done)
	period := clockTicks * g.cfg.Tick
	ticker := tick.NewTickerPhase(period, clockPhase(g.self, period))
	defer ticker.Stop()
	for {
		select {
		case <-g.stop:
			g.failWaiters(ErrStopped)
			g.dropStaged()
			g.dropHeld()
			g.wake()
			return
		case <-g.holdC:
			g.releaseHeld()
		case <-ticker.C:
			ticker.Next()
			tick, idled := g.pace.period(g.mayIdle)
			if idled {
				g.setIdle(true)
			}
			if tick {
				g.rn.Tick()
			}
			g.catchUp.maybeRequest(g.rn, g.status.Leader)
			if g.leadTicks > 0 {
				if g.leadTicks--; g.leadTicks%leadRetryTicks == 0 {
					g.campaignFirst(g.rn)
				}
			}
		case m := <-g.inbox:
			g.stepLocal(m)
		case p := <-g.props:
			g.propose(p)
		case f := <-g.reports:
			g.wake()
			f(g.rn)
		case <-g.poke:
		case r := <-g.reads:
			g.readIndex(r)
		case in := <-g.snapIn:
			g.wake()
			g.takeSnapshot(in)
		}
		g.runSnapshotReports()
		g.drain()
		for g.rn.HasReady() {
			if err := g.handleReady(g.rn.Ready()); err != nil {
				slog.Error("raft group stopped: storage failure", "group", g.id, "replica", g.self, "err", err)
				g.mu.Lock()
				g.err = err
				g.mu.Unlock()
				g.failWaiters(ErrStopped)
				g.dropStaged()
				g.dropHeld()
				g.wake()
				return
			}
		}
		g.dropStaged() // a snapshot Raft would accept is in the Ready just handled
	}
}

// drain takes whatever else is waiting, so one Ready (one fsync) covers it all.
func (g *Group) drain() {
	for i := 0; i < drainLimit; i++ {
		select {
		case m := <-g.inbox:
			g.stepLocal(m)
		case p := <-g.props:
			g.propose(p)
		case f := <-g.reports:
			g.wake()
			f(g.rn)
		case r := <-g.reads:
			g.readIndex(r)
		default:
			return
		}
	}
}

func (g *Group) stepLocal(m *raftpb.Message) {
	if wakes(m.GetType()) {
		g.wake()
	}
	if m.GetType() == raftpb.MsgApp && m.GetIndex() == 0 && g.uninitialized() {
		// The log from its start, to a replica still waiting for its first
		// snapshot: applying it from an empty configuration would fail (a
		// leader whose log still starts at 1 truncates it soon).
		return
	}
	if err := g.rn.Step(m); err != nil && !errors.Is(err, raft.ErrStepPeerNotFound) && !errors.Is(err, raft.ErrStepLocalMsg) {
		slog.Debug("raft step", "group", g.id, "err", err)
	}
}

func (g *Group) propose(p *proposal) {
	g.wake()
	g.nextID++
	p.id = g.nextID
	data := make([]byte, 8+len(p.data))
	binary.BigEndian.PutUint64(data, p.id)
	copy(data[8:], p.data)
	var err error
	if p.conf != nil {
		p.conf.Context = data
		err = g.rn.ProposeConfChange(p.conf)
	} else {
		err = g.rn.Propose(data)
	}
	if err != nil {
		if errors.Is(err, raft.ErrProposalDropped) {
			err = ErrNotLeader
			if g.leading {
				err = ErrBusy
			}
		}
		p.done <- proposalResult{err: err}
		return
	}
	g.metrics.proposals.Inc()
	g.waiters[p.id] = p
}

// readIndex issues a ReadIndex for r. Requests that get no answer (no leader, a
// lost message) are abandoned to the caller's context.
func (g *Group) readIndex(r *readRequest) {
	g.pending++
	binary.BigEndian.PutUint64(r.ctx[:], g.pending) // unique per replica run
	g.pendingReads[r.ctx] = r
	g.rn.ReadIndex(r.ctx[:])
}

// wake returns the Raft clock to its full pace (idle.go).
func (g *Group) wake() {
	if g.pace.wake() {
		g.setIdle(false)
	}
}

// setIdle records whether the Raft clock runs at the idle pace.
func (g *Group) setIdle(idle bool) {
	if idle {
		g.metrics.idle.Inc()
	} else {
		g.metrics.idle.Dec()
	}
	g.mu.Lock()
	g.status.Idle = idle
	g.mu.Unlock()
}

func (g *Group) failWaiters(err error) {
	for id, p := range g.waiters {
		p.done <- proposalResult{err: err}
		delete(g.waiters, id)
	}
}

func (g *Group) handleReady(rd raft.Ready) error {
	if rd.SoftState != nil || len(rd.Entries) > 0 || len(rd.CommittedEntries) > 0 || !raft.IsEmptySnap(rd.Snapshot) {
		g.wake()
	}
	if rd.SoftState != nil {
		g.onSoftState(rd.SoftState)
	}
	if !raft.IsEmptyHardState(rd.HardState) {
		g.mu.Lock()
		g.status.Term = rd.HardState.GetTerm()
		g.mu.Unlock()
	}
	// A leader sends before it persists, so its fsync overlaps the followers'
	// (Raft thesis §10.2.1): etcd raft counts the leader's own entries toward
	// the commit quorum only after Advance, i.e. after they are durable. Anyone
	// else may be sending votes, which must follow the durable hard state.
	early := g.leading
	if early {
		g.sendAll(rd.Messages)
	}
	b := g.e.NewBatch()
	sync := rd.MustSync
	if !raft.IsEmptySnap(rd.Snapshot) {
		b = g.e.NewIndexedBatch() // Restore may read back what it staged
		ci, body, err := splitSnapshotData(rd.Snapshot.GetData())
		if err != nil {
			return err
		}
		if isStreamed(rd.Snapshot.GetData()) {
			if err := g.installStreamed(rd.Snapshot.GetMetadata().GetIndex()); err != nil {
				return err
			}
		}
		if err := g.ls.installSnapshot(b, rd.Snapshot); err != nil {
			return err
		}
		// Until the snapshot's index counts as applied (the deferred
		// setApplied), the replica shows a configuration change pending: a
		// reply between the new configuration and the restored state must
		// not pair one with the other.
		g.ls.confInLog = max(g.ls.confInLog, rd.Snapshot.GetMetadata().GetIndex())
		g.confInLog.Store(g.ls.confInLog)
		g.members.Store(&configuration{ci, proto.Clone(rd.Snapshot.GetMetadata().GetConfState()).(*raftpb.ConfState)})
		if sm, ok := g.sm.(Snapshotter); ok {
			if err := sm.Restore(b, body); err != nil {
				return err
			}
		}
		sync = true
		defer g.setApplied(rd.Snapshot.GetMetadata().GetIndex())
	}
	for _, rs := range rd.ReadStates {
		g.catchUp.onReadState(rs)
		var id [8]byte
		copy(id[:], rs.RequestCtx)
		if r, ok := g.pendingReads[id]; ok {
			delete(g.pendingReads, id)
			r.done <- rs.Index
		}
	}
	if len(rd.ReadStates) > 0 {
		g.setApplied(g.ls.applied)
	}
	if err := g.ls.append(b, rd.Entries); err != nil {
		return err
	}
	g.confInLog.Store(g.ls.confInLog) // before the entries are acknowledged
	if rd.HardState != nil && !raft.IsEmptyHardState(rd.HardState) {
		if err := g.ls.setHardState(b, rd.HardState); err != nil {
			return err
		}
	}
	if b.Empty() {
		_ = b.Close()
	} else {
		start := time.Now()
		if err := g.e.Commit(b, sync); err != nil {
			return err
		}
		if sync {
			g.metrics.appendSync.Observe(time.Since(start).Seconds())
		}
	}
	if !early {
		g.sendAll(rd.Messages)
	}
	if len(rd.CommittedEntries) > 0 {
		start := time.Now()
		if err := g.apply(rd.CommittedEntries); err != nil {
			return err
		}
		g.metrics.apply.Observe(time.Since(start).Seconds())
		g.metrics.applied.Add(float64(len(rd.CommittedEntries)))
	}
	g.rn.Advance(rd)
	err := g.maybeCompact()
	g.first.Store(g.ls.first)
	return err
}

func (g *Group) sendAll(msgs []*raftpb.Message) {
	now := time.Now()
	for _, m := range msgs {
		if !g.holdCommit(m) {
			g.sendOne(m, now)
		}
	}
}

// sendOne sends m, unless it is a heartbeat the follower does not need
// (elide); now is the send's time.
func (g *Group) sendOne(m *raftpb.Message, now time.Time) {
	if g.elide(m, now) {
		g.metrics.heartbeatsElided.Inc()
		return
	}
	if t := int(m.GetType()); m.GetTo() != g.self && t < numMessageTypes && g.metrics.sent[t] != nil {
		g.metrics.sent[t].Inc()
	}
	g.send(g.id, m)
}

func (g *Group) onSoftState(ss *raft.SoftState) {
	g.leading = ss.RaftState == raft.StateLeader
	if !g.leading {
		g.dropHeld()
	}
	g.mu.Lock()
	was := g.status.Leader
	g.status.Leader = ss.Lead
	g.mu.Unlock()
	if was != ss.Lead {
		g.metrics.leaderChanges.Inc()
		if ss.Lead == g.self {
			slog.Info("became leader", "group", g.id, "replica", g.self)
		}
		if was == g.self {
			g.failWaiters(ErrOutcomeUnknown)
		}
		// Reads sent to the old leader will not be answered; their callers'
		// contexts end them.
		clear(g.pendingReads)
		old := g.leaderChanged.Load()
		ch := make(chan struct{})
		g.leaderChanged.Store(&ch)
		close(*old)
	}
}

type delivered struct {
	p   *proposal
	val any
}

func (g *Group) apply(ents []*raftpb.Entry) error {
	if len(ents) == 0 {
		return nil
	}
	b := g.e.NewIndexedBatch()
	var results []delivered
	left, changed := false, false
	for _, ent := range ents {
		switch ent.GetType() {
		case raftpb.EntryNormal:
			data := ent.GetData()
			if len(data) < 8 {
				continue // the empty entry a new leader appends
			}
			val := g.sm.Apply(b, ent.GetIndex(), data[8:])
			if p, ok := g.waiters[binary.BigEndian.Uint64(data)]; ok {
				delete(g.waiters, p.id)
				results = append(results, delivered{p, val})
			}
		case raftpb.EntryConfChange, raftpb.EntryConfChangeV2:
			cc, err := decodeConfChange(ent)
			if err != nil {
				return err
			}
			cs := g.rn.ApplyConfChange(cc)
			if err := g.ls.setConfState(b, cs, ent.GetIndex()); err != nil {
				return err
			}
			g.members.Store(&configuration{ent.GetIndex(), proto.Clone(cs).(*raftpb.ConfState)})
			left, changed = !InConf(cs, g.self), true
			if c := cc.AsV2().GetContext(); len(c) >= 8 {
				var val any
				if ch, ok := g.sm.(ConfChanger); ok {
					val = ch.ApplyConfChange(b, ent.GetIndex(), cs, c[8:])
				}
				if p, ok := g.waiters[binary.BigEndian.Uint64(c)]; ok {
					delete(g.waiters, p.id)
					results = append(results, delivered{p, val})
				}
			}
		}
	}
	last := ents[len(ents)-1].GetIndex()
	if err := g.ls.setApplied(b, last); err != nil {
		return err
	}
	// Not synced: the next synced append makes it durable, and until then the
	// entries replay from the log after a crash.
	if err := g.e.Commit(b, false); err != nil {
		return err
	}
	g.setApplied(last)
	if pa, ok := g.sm.(PostApplier); ok {
		pa.PostApply(last)
	}
	if _, copied := g.sm.(Snapshotter); copied && changed && g.ls.truncIdx > 0 {
		// The stored snapshot predates the new configuration: a learner it
		// adds would refuse it (a snapshot must name its receiver). Take
		// one now, keeping the log as it is.
		if err := g.compact(last, g.ls.truncIdx); err != nil {
			return err
		}
	}
	if f := g.onLeft.Load(); left && f != nil {
		(*f)()
	}
	for _, r := range results {
		r.p.done <- proposalResult{val: r.val}
	}
	return nil
}

// InConf reports whether cs names id as a voter, learner or outgoing voter.
func InConf(cs *raftpb.ConfState, id uint64) bool {
	return slices.Contains(cs.GetVoters(), id) || slices.Contains(cs.GetLearners(), id) ||
		slices.Contains(cs.GetVotersOutgoing(), id) || slices.Contains(cs.GetLearnersNext(), id)
}

func decodeConfChange(ent *raftpb.Entry) (raftpb.ConfChangeI, error) {
	if ent.GetType() == raftpb.EntryConfChange {
		var cc raftpb.ConfChange
		if err := proto.Unmarshal(ent.GetData(), &cc); err != nil {
			return nil, fmt.Errorf("%w: conf change at %d: %v", storage.ErrCorrupt, ent.GetIndex(), err)
		}
		return &cc, nil
	}
	var cc raftpb.ConfChangeV2
	if err := proto.Unmarshal(ent.GetData(), &cc); err != nil {
		return nil, fmt.Errorf("%w: conf change at %d: %v", storage.ErrCorrupt, ent.GetIndex(), err)
	}
	return &cc, nil
}

func (g *Group) maybeCompact() error {
	applied := g.ls.applied
	if g.ls.truncIdx == 0 && applied > 0 {
		// Every replica's log, not only the leader's, starts after its first
		// entry: whoever leads when a replica is added sends it a snapshot,
		// never the log from its start (whose first configuration is not
		// in it), as CockroachDB starts range logs past an initial index.
		return g.truncateLogStart()
	}
	if applied < g.ls.first {
		return nil
	}
	if applied-g.ls.first >= g.cfg.CompactAfter {
		return g.compact(applied, applied-g.cfg.CompactAfter/2)
	}
	if applied < g.ls.first+2*logTail {
		return nil // nothing to truncate in logTail's steps: skip the progress visit
	}
	if to := g.caughtUpThrough(applied); to >= g.ls.first+logTail {
		return g.compact(applied, to)
	}
	return nil
}

// logTail is how many applied entries a replica keeps in its log once
// every follower has them, and the fewest it truncates at once.
//
// A log entry is written twice to the store (the entry, then the state it
// applies), and deleted once truncated. Truncated while its memtable is
// still unflushed, it never reaches a table: the flush drops it under the
// range deletion. Kept for CompactAfter/2 entries (megabytes of a busy
// range's log), every entry was flushed and then compacted down the LSM
// until the deletion met it: with 4 KiB rows under YCSB-A, about 6 KiB
// flushed and 17 KiB compacted per operation (issue 17). 256 entries are a
// fraction of a second of a busy range's log, against the seconds a
// memtable takes to fill, and enough for a new leader to catch up a
// follower slightly behind from its log.
const logTail = 256

// caughtUpThrough returns the index through which the log may be
// truncated without costing any replica a snapshot: logTail entries
// short of applied and, on a leader, no further than any follower's match
// (a follower that is down, or still catching up, holds it back, and then
// only CompactAfter bounds the log, as before). applied must be at least
// logTail.
func (g *Group) caughtUpThrough(applied uint64) uint64 {
	to := applied - logTail
	if g.leading {
		g.rn.WithProgress(func(id uint64, _ raft.ProgressType, pr tracker.Progress) {
			if id != g.self {
				to = min(to, pr.Match)
			}
		})
	}
	return to
}

// truncateLogStart drops the log's first entry behind a snapshot at the
// applied index, if the log was never truncated.
func (g *Group) truncateLogStart() error {
	if g.ls.truncIdx > 0 {
		return nil
	}
	if g.ls.applied == 0 {
		return fmt.Errorf("raftgroup: group %d has applied nothing yet", g.id)
	}
	return g.compact(g.ls.applied, 1)
}

// compact records a snapshot at applied (of the state machine, unless it
// is Streamed) and truncates the log through truncateTo.
func (g *Group) compact(applied, truncateTo uint64) error {
	data := streamedMarker // a Streamed group's state is in the engine already
	if sm, ok := g.sm.(Snapshotter); ok {
		var err error
		if data, err = sm.Snapshot(); err != nil {
			return err
		}
	}
	b := g.e.NewBatch()
	if err := g.ls.compact(b, applied, truncateTo, data); err != nil {
		_ = b.Close()
		return err
	}
	// Ordered after the applied state in the WAL, so it never survives without it.
	return g.e.Commit(b, false)
}

// raftLogger routes etcd raft's logs to slog at debug level (errors stay errors).
type raftLogger struct{ group uint64 }

func (l raftLogger) Debug(v ...any)              { l.log(slog.LevelDebug, fmt.Sprint(v...)) }
func (l raftLogger) Debugf(f string, v ...any)   { l.log(slog.LevelDebug, fmt.Sprintf(f, v...)) }
func (l raftLogger) Info(v ...any)               { l.log(slog.LevelDebug, fmt.Sprint(v...)) }
func (l raftLogger) Infof(f string, v ...any)    { l.log(slog.LevelDebug, fmt.Sprintf(f, v...)) }
func (l raftLogger) Warning(v ...any)            { l.log(slog.LevelWarn, fmt.Sprint(v...)) }
func (l raftLogger) Warningf(f string, v ...any) { l.log(slog.LevelWarn, fmt.Sprintf(f, v...)) }
func (l raftLogger) Error(v ...any)              { l.log(slog.LevelError, fmt.Sprint(v...)) }
func (l raftLogger) Errorf(f string, v ...any)   { l.log(slog.LevelError, fmt.Sprintf(f, v...)) }
func (l raftLogger) Fatal(v ...any)              { panic(fmt.Sprint(v...)) }
func (l raftLogger) Fatalf(f string, v ...any)   { panic(fmt.Sprintf(f, v...)) }
func (l raftLogger) Panic(v ...any)              { panic(fmt.Sprint(v...)) }
func (l raftLogger) Panicf(f string, v ...any)   { panic(fmt.Sprintf(f, v...)) }
func (l raftLogger) log(level slog.Level, msg string) {
	slog.Log(context.Background(), level, msg, "component", "raft", "group", l.group)
}
