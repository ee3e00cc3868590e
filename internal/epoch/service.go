package epoch

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/terroir-db/terroir/internal/epoch/epochpb"
	"github.com/terroir-db/terroir/internal/raftgroup"
)

// Replica is one node's replica of an epoch group: the counter plus, while this
// replica leads, the loop that advances it every interval.
type Replica struct {
	group    *raftgroup.Group
	sm       *StateMachine
	interval time.Duration

	ctx    context.Context // canceled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// NewReplica ties sm to its Raft group. Call Start once the group runs.
func NewReplica(group *raftgroup.Group, sm *StateMachine, interval time.Duration) *Replica {
	ctx, cancel := context.WithCancel(context.Background())
	return &Replica{group: group, sm: sm, interval: interval, ctx: ctx, cancel: cancel}
}

// Start begins the advance loop (DESIGN.md §2: the leader advances every interval).
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

// Group returns the replica's Raft group.
func (r *Replica) Group() *raftgroup.Group { return r.group }

func (r *Replica) advanceLoop() {
	defer r.wg.Done()
	t := time.NewTicker(r.interval)
	defer t.Stop()
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-t.C:
		}
		st := r.group.Status()
		if st.Leader != st.Replica || !st.CaughtUp {
			continue
		}
		// One advance in flight at a time; a slow commit delays the next tick
		// rather than queueing a burst.
		ctx, cancel := context.WithTimeout(r.ctx, 20*r.interval+time.Second)
		_, err := r.group.Propose(ctx, EncodeAdvance(r.sm.Epoch()))
		cancel()
		if err != nil && !errors.Is(err, raftgroup.ErrNotLeader) && !errors.Is(err, context.Canceled) {
			slog.Debug("epoch advance failed", "group", r.group.ID(), "err", err)
		}
	}
}

// Server answers ReadEpoch for every epoch replica a node hosts.
type Server struct {
	epochpb.UnimplementedEpochServer

	mu       sync.RWMutex
	replicas map[uint64]*Replica
}

// NewServer returns a server with no replicas.
func NewServer() *Server { return &Server{replicas: map[uint64]*Replica{}} }

// Add makes r's group readable through the server.
func (s *Server) Add(r *Replica) {
	s.mu.Lock()
	s.replicas[r.group.ID()] = r
	s.mu.Unlock()
}

// Register installs the Epoch service on g.
func (s *Server) Register(g *grpc.Server) { epochpb.RegisterEpochServer(g, s) }

// ReadEpoch implements epochpb.EpochServer. It fails with NotFound for a group the
// node does not host and Unavailable while the replica replays its log.
func (s *Server) ReadEpoch(_ context.Context, req *epochpb.ReadEpochRequest) (*epochpb.ReadEpochResponse, error) {
	s.mu.RLock()
	r := s.replicas[req.GetGroupId()]
	s.mu.RUnlock()
	if r == nil {
		return nil, status.Errorf(codes.NotFound, "epoch group %d is not hosted here", req.GetGroupId())
	}
	st := r.group.Status()
	if !st.CaughtUp {
		return nil, status.Errorf(codes.Unavailable, "epoch group %d replica %d is replaying its log", st.Group, st.Replica)
	}
	if err := r.group.Err(); err != nil {
		return nil, status.Errorf(codes.Unavailable, "epoch group %d replica %d stopped: %v", st.Group, st.Replica, err)
	}
	return &epochpb.ReadEpochResponse{Epoch: r.sm.Epoch(), ReplicaId: st.Replica}, nil
}
