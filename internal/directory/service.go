package directory

import (
	"context"
	"errors"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/terroir-db/terroir/internal/directory/directorypb"
	"github.com/terroir-db/terroir/internal/raftgroup"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
)

// lookupLimit is how many descriptors a lookup returns at most: the range
// holding the key and the ones after it, which a scan reaches next.
const lookupLimit = 16

// Replica is a node's replica of a directory group.
type Replica struct {
	Group *raftgroup.Group
	SM    *StateMachine
}

// Server answers Directory RPCs for every directory replica a node hosts.
// Reads are linearizable (a ReadIndex round, then the local state) and any
// replica serves them; updates and allocations go through the leader.
type Server struct {
	directorypb.UnimplementedDirectoryServer

	mu              sync.RWMutex
	replicas        map[uint64]Replica
	watch           renewalWatch
	live            map[uint64]*liveness // by group: the node registry's liveness, at its leader
	livenessTimeout time.Duration
}

// NewServer returns a server with no replicas whose leaders count a node
// live while they heard from it within livenessTimeout (0:
// DefaultLivenessTimeout).
func NewServer(livenessTimeout time.Duration) *Server {
	if livenessTimeout <= 0 {
		livenessTimeout = DefaultLivenessTimeout
	}
	return &Server{replicas: map[uint64]Replica{}, live: map[uint64]*liveness{}, livenessTimeout: livenessTimeout}
}

// Add makes r's group reachable through the server.
func (s *Server) Add(r Replica) {
	s.mu.Lock()
	s.replicas[r.Group.ID()] = r
	s.mu.Unlock()
}

// Remove takes group id's replica out of the server (it left this node),
// with the liveness its leader kept: later calls for it fail with NotFound.
func (s *Server) Remove(id uint64) {
	s.mu.Lock()
	delete(s.replicas, id)
	delete(s.live, id)
	s.mu.Unlock()
}

// Register installs the Directory service on g.
func (s *Server) Register(g grpc.ServiceRegistrar) { directorypb.RegisterDirectoryServer(g, s) }

func (s *Server) replica(id uint64) (Replica, error) {
	s.mu.RLock()
	r, ok := s.replicas[id]
	s.mu.RUnlock()
	if !ok {
		return Replica{}, status.Errorf(codes.NotFound, "directory group %d is not hosted here", id)
	}
	return r, nil
}

// read returns group id's replica once it has applied everything committed
// when the call began.
func (s *Server) read(ctx context.Context, id uint64) (Replica, error) {
	r, err := s.replica(id)
	if err != nil {
		return r, err
	}
	if err := r.Group.ReadIndex(ctx); err != nil {
		if errors.Is(err, raftgroup.ErrStopped) {
			return r, status.Error(codes.Unavailable, err.Error())
		}
		return r, status.FromContextError(err).Err()
	}
	return r, nil
}

// propose replicates cmd through group id's log and returns the state
// machine's result.
func (s *Server) propose(ctx context.Context, id uint64, cmd *directorypb.Command) (any, error) {
	r, err := s.replica(id)
	if err != nil {
		return nil, err
	}
	data, err := proto.Marshal(cmd)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	res, err := r.Group.Propose(ctx, data)
	switch {
	case errors.Is(err, raftgroup.ErrNotLeader):
		return nil, status.Errorf(codes.FailedPrecondition, "directory group %d: not the leader", id)
	case errors.Is(err, raftgroup.ErrOutcomeUnknown), errors.Is(err, raftgroup.ErrBusy), errors.Is(err, raftgroup.ErrStopped):
		return nil, status.Error(codes.Unavailable, err.Error())
	case err != nil:
		return nil, status.FromContextError(err).Err()
	}
	if err, ok := res.(error); ok {
		if errors.Is(err, ErrBadDescriptor) || errors.Is(err, ErrBadCommand) || errors.Is(err, ErrBadGCTTL) || errors.Is(err, ErrBadProtection) || IsRegistryError(err) || isPlacementError(err) {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		if errors.Is(err, ErrIDsExhausted) {
			return nil, status.Error(codes.ResourceExhausted, err.Error())
		}
		return nil, status.Error(codes.Internal, err.Error())
	}
	return res, nil
}

// Lookup implements directorypb.DirectoryServer.
func (s *Server) Lookup(ctx context.Context, req *directorypb.LookupRequest) (*directorypb.LookupResponse, error) {
	r, err := s.read(ctx, req.GetGroupId())
	if err != nil {
		return nil, err
	}
	limit := min(max(int(req.GetLimit()), 1), lookupLimit)
	return &directorypb.LookupResponse{Descriptors: r.SM.Lookup(req.GetKey(), limit)}, nil
}

// Update implements directorypb.DirectoryServer: only the descriptors that
// change the directory are proposed, so a reconciliation that finds it up
// to date costs no Raft entry.
func (s *Server) Update(ctx context.Context, req *directorypb.UpdateRequest) (*directorypb.UpdateResponse, error) {
	r, err := s.replica(req.GetGroupId())
	if err != nil {
		return nil, err
	}
	var changes []*pb.RangeDescriptor
	for _, d := range req.GetDescriptors() {
		ok, err := r.SM.Changes(d)
		if err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		if ok {
			changes = append(changes, d)
		}
	}
	if len(changes) == 0 {
		return &directorypb.UpdateResponse{}, nil
	}
	res, err := s.propose(ctx, req.GetGroupId(), &directorypb.Command{Cmd: &directorypb.Command_Update{Update: &directorypb.UpdateCmd{Descriptors: changes}}})
	if err != nil {
		return nil, err
	}
	n, _ := res.(uint32)
	return &directorypb.UpdateResponse{Installed: n}, nil
}

// Allocate implements directorypb.DirectoryServer.
func (s *Server) Allocate(ctx context.Context, req *directorypb.AllocateRequest) (*directorypb.AllocateResponse, error) {
	res, err := s.propose(ctx, req.GetGroupId(), &directorypb.Command{Cmd: &directorypb.Command_Allocate{Allocate: &directorypb.AllocateCmd{}}})
	if err != nil {
		return nil, err
	}
	id, ok := res.(uint64)
	if !ok {
		return nil, status.Errorf(codes.Internal, "directory: allocate returned %T", res)
	}
	return &directorypb.AllocateResponse{RangeId: id}, nil
}

// Placement implements directorypb.DirectoryServer.
func (s *Server) Placement(ctx context.Context, req *directorypb.PlacementRequest) (*directorypb.PlacementResponse, error) {
	r, err := s.read(ctx, req.GetGroupId())
	if err != nil {
		return nil, err
	}
	return &directorypb.PlacementResponse{Placements: r.SM.Placements()}, nil
}

// List implements directorypb.DirectoryServer.
func (s *Server) List(ctx context.Context, req *directorypb.ListRequest) (*directorypb.ListResponse, error) {
	r, err := s.read(ctx, req.GetGroupId())
	if err != nil {
		return nil, err
	}
	return &directorypb.ListResponse{Descriptors: r.SM.List()}, nil
}
