package epoch

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/terroir-db/terroir/internal/epoch/epochpb"
	"github.com/terroir-db/terroir/internal/raftgroup"
	"github.com/terroir-db/terroir/internal/tick"
)

// Replica is one node's replica of a local epoch group: the counter plus,
// while this replica leads, the loop that advances it at its pace.
type Replica struct {
	group *raftgroup.Group
	sm    *StateMachine
	pace  *Pace

	ctx    context.Context // canceled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// NewReplica ties sm to its Raft group, advanced at pace. Call Start once
// the group runs, and Server.AddLocal to serve its reads.
func NewReplica(group *raftgroup.Group, sm *StateMachine, pace *Pace) *Replica {
	ctx, cancel := context.WithCancel(context.Background())
	return &Replica{group: group, sm: sm, pace: pace, ctx: ctx, cancel: cancel}
}

// Start begins the advance loop (DESIGN.md §2: the leader advances every
// interval, or at the idle interval while no reader asks for more: Pace).
func (r *Replica) Start() {
	r.wg.Add(1)
	go r.advanceLoop()
}

// Close stops the advance loop and waits for it.
func (r *Replica) Close() {
	r.cancel()
	r.wg.Wait()
}

// Epoch returns this replica's applied epoch (not linearizable on its own).
func (r *Replica) Epoch() uint64 { return r.sm.Epoch() }

func (r *Replica) advanceLoop() {
	defer r.wg.Done()
	interval := r.pace.Interval()
	t := tick.NewTicker(interval)
	defer t.Stop()
	var last time.Time // when this replica's last advance began
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-t.C:
			t.Next()
		}
		st := r.group.Status()
		if st.Leader != st.Replica || !st.CaughtUp {
			continue
		}
		now := time.Now()
		if !r.pace.Due(now, last) {
			continue
		}
		last = now
		// One advance in flight at a time; a slow commit delays the next tick
		// rather than queueing a burst.
		ctx, cancel := context.WithTimeout(r.ctx, 20*interval+time.Second)
		_, err := r.group.Propose(ctx, EncodeAdvance(r.sm.Epoch()))
		cancel()
		if err != nil && !errors.Is(err, raftgroup.ErrNotLeader) && !errors.Is(err, context.Canceled) {
			slog.Debug("epoch advance failed", "group", r.group.ID(), "err", err)
		}
	}
}

// served is one epoch-like replica the server answers for.
type served struct {
	group  *raftgroup.Group
	sm     *StateMachine
	pub    *Publisher // nil unless a publisher
	demand *Demand    // the reads it serves ask for its epoch to move (nil: no pace)
}

// Server answers the Epoch service for every epoch, publisher and global epoch
// replica a node hosts.
type Server struct {
	epochpb.UnimplementedEpochServer

	mu       sync.RWMutex
	replicas map[uint64]served
	observe  atomic.Pointer[RoundObserver] // Publish's phases (nil: none)
}

// NewServer returns a server with no replicas.
func NewServer() *Server { return &Server{replicas: map[uint64]served{}} }

// ObserveRounds makes o receive the phases of the Publish calls this
// server handles as a publisher's leader (PhasePublisherCommit,
// PhasePublisherCertify); nil stops it.
func (s *Server) ObserveRounds(o RoundObserver) {
	if o == nil {
		s.observe.Store(nil)
		return
	}
	s.observe.Store(&o)
}

// AddLocal makes a local epoch replica readable through the server; the
// reads it serves set its pace (Demand).
func (s *Server) AddLocal(r *Replica) {
	s.mu.Lock()
	s.replicas[r.group.ID()] = served{group: r.group, sm: r.sm, demand: &r.pace.Demand}
	s.mu.Unlock()
}

// AddGlobal makes a global epoch service replica readable through the
// server; the reads it serves set its pace (Demand).
func (s *Server) AddGlobal(g *Global) {
	s.mu.Lock()
	s.replicas[g.group.ID()] = served{group: g.group, sm: g.sm, demand: &g.demand}
	s.mu.Unlock()
}

// AddPublisher makes a publisher replica readable and publishable.
func (s *Server) AddPublisher(p *Publisher) {
	s.mu.Lock()
	s.replicas[p.group.ID()] = served{group: p.group, sm: p.sm, pub: p, demand: &p.demand}
	s.mu.Unlock()
}

// Remove takes group id's replica out of the server (it left this node):
// later calls for it fail with NotFound.
func (s *Server) Remove(id uint64) {
	s.mu.Lock()
	delete(s.replicas, id)
	s.mu.Unlock()
}

// Register installs the Epoch service on g.
func (s *Server) Register(g grpc.ServiceRegistrar) { epochpb.RegisterEpochServer(g, s) }

func (s *Server) lookup(id uint64) (served, error) {
	s.mu.RLock()
	r, ok := s.replicas[id]
	s.mu.RUnlock()
	if !ok {
		return r, status.Errorf(codes.NotFound, "epoch group %d is not hosted here", id)
	}
	return r, nil
}

// maxEpochWait bounds how long ReadEpoch waits for its at_least epoch.
const maxEpochWait = time.Second

// ReadEpoch implements epochpb.EpochServer: the replica's applied epoch with
// the configuration it was applied under; with at_least and wait_us, once
// the replica has applied at_least or waited wait_us (at most maxEpochWait,
// or until ctx ends). It fails with NotFound for a group
// the node does not host, and Unavailable while the replica replays its log,
// while it applies a configuration change, or, for a publisher, once it has
// not been updated for its lease.
func (s *Server) ReadEpoch(ctx context.Context, req *epochpb.ReadEpochRequest) (*epochpb.ReadEpochResponse, error) {
	r, err := s.lookup(req.GetGroupId())
	if err != nil {
		return nil, err
	}
	if r.demand != nil && !req.GetBackground() {
		r.demand.Want(time.Now())
	}
	if at, wait := req.GetAtLeast(), time.Duration(req.GetWaitUs())*time.Microsecond; at > 0 && wait > 0 {
		wctx, cancel := context.WithTimeout(ctx, min(wait, maxEpochWait))
		r.sm.WaitFor(wctx, at)
		cancel()
	}
	st := r.group.Status()
	if !st.CaughtUp {
		return nil, status.Errorf(codes.Unavailable, "epoch group %d replica %d is replaying its log", st.Group, st.Replica)
	}
	if err := r.group.Err(); err != nil {
		return nil, status.Errorf(codes.Unavailable, "epoch group %d replica %d stopped: %v", st.Group, st.Replica, err)
	}
	if r.pub != nil && !r.pub.Fresh() {
		return nil, status.Errorf(codes.Unavailable, "publisher %d replica %d: no global epoch update for %v", st.Group, st.Replica, r.pub.lease)
	}
	// The configuration, the epoch, then the configuration again: the same
	// index both times shows the epoch was applied under that configuration
	// (raftgroup.Group.Configuration). A configuration change in the log
	// but not applied makes the replica abstain: a reader could otherwise
	// count it in a majority of a configuration the group has left
	// (DESIGN.md §12, epoch reads across configuration changes).
	ci, voters, outgoing := r.group.Configuration()
	e := r.sm.Epoch()
	pending := r.group.ConfPending()
	if pending || r.group.ConfIndex() != ci {
		return nil, status.Errorf(codes.Unavailable, "epoch group %d replica %d is applying a configuration change", st.Group, st.Replica)
	}
	return &epochpb.ReadEpochResponse{Epoch: e, ReplicaId: st.Replica, ConfIndex: ci, Voters: voters, VotersOutgoing: outgoing}, nil
}

// ReadEpochs implements epochpb.EpochServer: ReadEpoch for each of the
// request's reads, in order, each succeeding or failing on its own (its
// result carries the status ReadEpoch failed with). A read that waits
// (at_least, wait_us) delays the ones after it. It fails only with ctx's
// error, once ctx has ended.
func (s *Server) ReadEpochs(ctx context.Context, req *epochpb.ReadEpochsRequest) (*epochpb.ReadEpochsResponse, error) {
	out := &epochpb.ReadEpochsResponse{Results: make([]*epochpb.EpochResult, len(req.GetReads()))}
	for i, rd := range req.GetReads() {
		if err := ctx.Err(); err != nil {
			return nil, status.FromContextError(err).Err()
		}
		resp, err := s.ReadEpoch(ctx, rd)
		if err != nil {
			st := status.Convert(err)
			out.Results[i] = &epochpb.EpochResult{Code: uint32(st.Code()), Message: st.Message()}
			continue
		}
		out.Results[i] = &epochpb.EpochResult{Response: resp}
	}
	return out, nil
}

// Publish implements epochpb.EpochServer.
func (s *Server) Publish(ctx context.Context, req *epochpb.PublishRequest) (*epochpb.PublishResponse, error) {
	r, err := s.lookup(req.GetGroupId())
	if err != nil {
		return nil, err
	}
	if r.pub == nil {
		return nil, status.Errorf(codes.InvalidArgument, "epoch group %d is not a publisher", req.GetGroupId())
	}
	// Committed and applied here is not yet enough: a read needs a majority of
	// replicas to agree, and followers apply a moment later. Acknowledge only
	// once a majority read shows the epoch, so that every later read anywhere
	// does too (the global epoch invariant, DESIGN.md §3.2). The read starts
	// with the proposal: the replicas it asks answer as soon as they apply
	// the epoch, one round trip sooner than a read begun after the commit.
	qctx, cancel := context.WithCancel(ctx)
	defer cancel()
	certified := make(chan error, 1)
	began := time.Now()
	go func() { certified <- r.pub.quorum.AtLeast(qctx, req.GetEpoch()) }()
	_, err = r.group.Propose(ctx, EncodePublish(req.GetEpoch()))
	if err != nil {
		cancel()
	}
	committed := time.Now()
	cerr := <-certified
	if o := s.observe.Load(); o != nil && err == nil && cerr == nil {
		(*o)(PhasePublisherCommit, committed.Sub(began))
		(*o)(PhasePublisherCertify, time.Since(committed))
	}
	switch {
	case errors.Is(err, raftgroup.ErrNotLeader):
		return nil, status.Errorf(codes.FailedPrecondition, "publisher %d: not the leader", req.GetGroupId())
	case err != nil:
		return nil, status.Errorf(codes.Unavailable, "publisher %d: %v", req.GetGroupId(), err)
	case cerr != nil:
		return nil, status.Errorf(codes.Unavailable, "publisher %d: epoch %d not yet applied by a majority: %v", req.GetGroupId(), req.GetEpoch(), cerr)
	}
	return &epochpb.PublishResponse{Active: r.pub.demand.Active(time.Now())}, nil
}

// SetExcluded implements epochpb.EpochServer: it proposes the exclusion or
// inclusion of a publisher at the global epoch service's leader.
func (s *Server) SetExcluded(ctx context.Context, req *epochpb.SetExcludedRequest) (*epochpb.SetExcludedResponse, error) {
	r, err := s.lookup(req.GetGroupId())
	if err != nil {
		return nil, err
	}
	if req.GetPublisherGroup() == 0 {
		return nil, status.Error(codes.InvalidArgument, "publisher group 0")
	}
	cmd := EncodeInclude(req.GetPublisherGroup())
	if req.GetExcluded() {
		cmd = EncodeExclude(req.GetPublisherGroup())
	}
	_, err = r.group.Propose(ctx, cmd)
	switch {
	case err == nil:
		return &epochpb.SetExcludedResponse{}, nil
	case errors.Is(err, raftgroup.ErrNotLeader):
		return nil, status.Errorf(codes.FailedPrecondition, "global epoch group %d: not the leader", req.GetGroupId())
	}
	return nil, status.Errorf(codes.Unavailable, "global epoch group %d: %v", req.GetGroupId(), err)
}

// Membership implements epochpb.EpochServer.
func (s *Server) Membership(_ context.Context, req *epochpb.MembershipRequest) (*epochpb.MembershipResponse, error) {
	r, err := s.lookup(req.GetGroupId())
	if err != nil {
		return nil, err
	}
	if !r.group.Status().CaughtUp {
		return nil, status.Errorf(codes.Unavailable, "global epoch group %d is replaying its log", req.GetGroupId())
	}
	groups, since := r.sm.ExcludedGroups()
	return &epochpb.MembershipResponse{Epoch: r.sm.Epoch(), ExcludedGroups: groups, ExcludedSince: since}, nil
}
