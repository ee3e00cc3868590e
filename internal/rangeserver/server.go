package rangeserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/terroir-db/terroir/internal/epoch"
	"github.com/terroir-db/terroir/internal/raftgroup"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/txnstate"
)

// Server answers Range RPCs for every range replica a node hosts.
type Server struct {
	pb.UnimplementedRangeServer

	mu       sync.RWMutex
	replicas map[uint64]*Replica
}

// NewServer returns a server with no replicas.
func NewServer() *Server { return &Server{replicas: map[uint64]*Replica{}} }

// Add makes r reachable through the server.
func (s *Server) Add(r *Replica) {
	s.mu.Lock()
	s.replicas[r.id] = r
	s.mu.Unlock()
}

// Register installs the Range service on g.
func (s *Server) Register(g grpc.ServiceRegistrar) { pb.RegisterRangeServer(g, s) }

func (s *Server) replica(id uint64) (*Replica, error) {
	s.mu.RLock()
	r := s.replicas[id]
	s.mu.RUnlock()
	if r == nil {
		return nil, status.Errorf(codes.NotFound, "range %d is not hosted here", id)
	}
	return r, nil
}

// ErrBadRequest marks a request the server refuses outright.
var ErrBadRequest = errors.New("rangeserver: bad request")

func validKey(key []byte) error {
	switch {
	case len(key) == 0:
		return fmt.Errorf("%w: empty key", ErrBadRequest)
	case len(key) > MaxKeySize:
		return fmt.Errorf("%w: key of %d bytes exceeds %d", ErrBadRequest, len(key), MaxKeySize)
	}
	return nil
}

func validTxn(m *pb.TxnMeta) error {
	if len(m.GetId()) != txnstate.TxnIDLen {
		return fmt.Errorf("%w: transaction ID of %d bytes", ErrBadRequest, len(m.GetId()))
	}
	return nil
}

func validWrites(ws []*pb.Write) error {
	for _, w := range ws {
		if err := validKey(w.GetKey()); err != nil {
			return err
		}
	}
	return nil
}

// maxSentWhole bounds the keys of a transaction sent whole (take_locks):
// 1000.
const maxSentWhole = 1000

// validReads checks a one-phase request's reads: keys, sent only with
// take_locks (a transaction that took its locks earlier read then).
func validReads(req *pb.OnePhaseRequest) error {
	if len(req.GetReads()) > 0 && !req.GetTakeLocks() {
		return fmt.Errorf("%w: reads in a one-phase commit without take_locks", ErrBadRequest)
	}
	if req.GetTakeLocks() && len(req.GetReads())+len(req.GetWrites()) == 0 {
		return fmt.Errorf("%w: a transaction sent whole with no read and no write", ErrBadRequest)
	}
	if n := len(req.GetReads()) + len(req.GetWrites()); req.GetTakeLocks() && n > maxSentWhole {
		return fmt.Errorf("%w: a transaction sent whole with %d keys, more than %d", ErrBadRequest, n, maxSentWhole)
	}
	for _, k := range req.GetReads() {
		if err := validKey(k); err != nil {
			return err
		}
	}
	return nil
}

// toStatus maps a replica error to a gRPC status the client understands.
func (r *Replica) toStatus(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrNotLeaseholder), errors.Is(err, raftgroup.ErrNotLeader):
		return notExecuted(err, r.LeaderHint())
	case errors.Is(err, ErrLeaseNotActive), errors.Is(err, raftgroup.ErrBusy), errors.Is(err, epoch.ErrUnavailable):
		return notExecuted(err, r.self) // retry here: the lease or leader is about to serve
	case errors.Is(err, ErrConflict), errors.Is(err, ErrLocksLost), errors.Is(err, ErrLeaseValidation):
		return status.Error(codes.Aborted, err.Error())
	case errors.Is(err, raftgroup.ErrOutcomeUnknown), errors.Is(err, raftgroup.ErrStopped):
		// The command may still apply: callers must not assume it failed.
		return status.Error(codes.Unknown, err.Error())
	case errors.Is(err, epoch.ErrReaderClosed):
		// The node is stopping: its epoch reader closed before the read
		// that needed it, which precedes any proposal (after the
		// case above, so an error that also says a proposal may apply keeps
		// saying so). Ask another replica.
		return notExecuted(err, 0)
	case errors.Is(err, ErrSnapshotEpoch):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, ErrNotClosed):
		return notExecuted(err, r.LeaderHint()) // the leader's closed epoch is the newest
	case errors.Is(err, ErrSnapshotTooOld): // the message names the horizon
		return status.Error(codes.OutOfRange, err.Error())
	case errors.Is(err, ErrRangeMismatch):
		return status.Error(codes.OutOfRange, err.Error())
	case errors.Is(err, ErrSplitKey):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, ErrTransferTarget), errors.Is(err, ErrMoveTarget), errors.Is(err, ErrRehomeTarget):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, ErrSplitBusy), errors.Is(err, ErrMergeBusy), errors.Is(err, ErrTransferBusy), errors.Is(err, ErrMoveBusy):
		return notExecuted(err, r.self) // retry here
	case errors.Is(err, ErrSplitRaced), errors.Is(err, ErrMergeRaced), errors.Is(err, ErrRehomeBusy):
		// A busy rehome is not retried at once: each attempt stops the
		// range's serving while it waits for its transactions.
		return status.Error(codes.Aborted, err.Error())
	case errors.Is(err, ErrMergeLast), errors.Is(err, ErrMergeRegions), errors.Is(err, ErrMergeReplicas):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, ErrBadRequest):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, ErrDuplicate): // the first copy may have committed
		return status.Error(codes.AlreadyExists, err.Error())
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	}
	return status.Error(codes.Internal, err.Error())
}

// status maps a replica error to a gRPC status; a mismatch carries the
// range's current descriptor and every descriptor this node hosts over the
// keys asked for (after a split, the right-hand range is here too), so the
// sender's cache fills in one round.
func (s *Server) status(r *Replica, err error) error {
	var m *MismatchError
	if !errors.As(err, &m) {
		return r.toStatus(err)
	}
	st := status.New(codes.OutOfRange, err.Error())
	if ds, derr := st.WithDetails(&pb.RangeMismatch{Descriptors: s.hosted(m)}); derr == nil {
		st = ds
	}
	return st.Err()
}

// hosted returns m's descriptor and every other one this node hosts over the
// keys m names.
func (s *Server) hosted(m *MismatchError) []*pb.RangeDescriptor {
	descs := []*pb.RangeDescriptor{m.Desc}
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, o := range s.replicas {
		d := o.Desc()
		if d.GetRangeId() != m.Desc.GetRangeId() && (m.End == nil || bytes.Compare(d.GetStartKey(), m.End) < 0) &&
			(len(d.GetEndKey()) == 0 || bytes.Compare(m.Start, d.GetEndKey()) < 0) {
			descs = append(descs, d)
		}
	}
	return descs
}

// notExecuted is FailedPrecondition: the request did not execute and may be
// retried, at the leader named by hint (0: unknown, or this replica later).
func notExecuted(err error, hint uint64) error {
	st := status.New(codes.FailedPrecondition, err.Error())
	if d, derr := st.WithDetails(&pb.NotLeader{LeaderHint: hint}); derr == nil {
		st = d
	}
	return st.Err()
}

// Get implements pb.RangeServer.
func (s *Server) Get(ctx context.Context, req *pb.GetRequest) (*pb.GetResponse, error) {
	r, err := s.replica(req.GetRangeId())
	if err != nil {
		return nil, err
	}
	if err := errors.Join(validTxn(req.GetTxn()), validKey(req.GetKey())); err != nil {
		return nil, s.status(r, err)
	}
	resp, err := r.Get(ctx, req.GetTxn(), req.GetKey())
	return resp, s.status(r, err)
}

// Scan implements pb.RangeServer.
func (s *Server) Scan(ctx context.Context, req *pb.ScanRequest) (*pb.ScanResponse, error) {
	r, err := s.replica(req.GetRangeId())
	if err != nil {
		return nil, err
	}
	if err := validTxn(req.GetTxn()); err != nil {
		return nil, s.status(r, err)
	}
	var end []byte
	if len(req.GetEnd()) > 0 {
		end = req.GetEnd()
	}
	resp, err := r.Scan(ctx, req.GetTxn(), req.GetStart(), end, int(req.GetLimit()))
	return resp, s.status(r, err)
}

// Lock implements pb.RangeServer.
func (s *Server) Lock(ctx context.Context, req *pb.LockRequest) (*pb.LockResponse, error) {
	r, err := s.replica(req.GetRangeId())
	if err != nil {
		return nil, err
	}
	if err := errors.Join(validTxn(req.GetTxn()), validKey(req.GetKey())); err != nil {
		return nil, s.status(r, err)
	}
	inc, err := r.Lock(ctx, req.GetTxn(), req.GetKey())
	return &pb.LockResponse{Incarnation: inc}, s.status(r, err)
}

// Prepare implements pb.RangeServer.
func (s *Server) Prepare(ctx context.Context, req *pb.PrepareRequest) (*pb.PrepareResponse, error) {
	r, err := s.replica(req.GetRangeId())
	if err != nil {
		return nil, err
	}
	if err := errors.Join(validTxn(req.GetTxn()), validWrites(req.GetWrites())); err != nil {
		return nil, s.status(r, err)
	}
	resp, err := r.Prepare(ctx, req.GetTxn(), req.GetWrites(), req.GetLockCount(), req.GetIncarnation(), req.GetGeneration())
	return resp, s.status(r, err)
}

// Commit implements pb.RangeServer.
func (s *Server) Commit(ctx context.Context, req *pb.CommitRequest) (*pb.CommitResponse, error) {
	r, err := s.replica(req.GetRangeId())
	if err != nil {
		return nil, err
	}
	return &pb.CommitResponse{}, s.status(r, r.Commit(ctx, req.GetTxnId(), req.GetVersion(), req.GetRegionalVersion()))
}

// Abort implements pb.RangeServer.
func (s *Server) Abort(ctx context.Context, req *pb.AbortRequest) (*pb.AbortResponse, error) {
	r, err := s.replica(req.GetRangeId())
	if err != nil {
		return nil, err
	}
	if err := r.Abort(ctx, req.GetTxnId()); err != nil {
		return nil, s.status(r, err)
	}
	// Aborted here; if the range changed shape since the sender knew it,
	// say so, so it aborts where the locks went too.
	resp := &pb.AbortResponse{}
	var m *MismatchError
	if errors.As(r.checkGeneration(req.GetGeneration()), &m) {
		resp.Reshaped, resp.Descriptors = true, s.hosted(m)
	}
	return resp, nil
}

// Heartbeat implements pb.RangeServer.
func (s *Server) Heartbeat(_ context.Context, req *pb.HeartbeatRequest) (*pb.HeartbeatResponse, error) {
	r, err := s.replica(req.GetRangeId())
	if err != nil {
		return nil, err
	}
	lost, err := r.Heartbeat(req.GetTxnId(), req.GetIncarnation(), req.GetGeneration())
	return &pb.HeartbeatResponse{Lost: lost}, s.status(r, err)
}

// Ranges implements pb.RangeServer.
func (s *Server) Ranges(context.Context, *pb.RangesRequest) (*pb.RangesResponse, error) {
	s.mu.RLock()
	replicas := make([]*Replica, 0, len(s.replicas))
	for _, r := range s.replicas {
		replicas = append(replicas, r)
	}
	s.mu.RUnlock()
	resp := &pb.RangesResponse{}
	for _, r := range replicas {
		resp.Ranges = append(resp.Ranges, r.Status())
	}
	return resp, nil
}

// ClosedEpoch implements pb.RangeServer: any replica answers, with the
// closed epoch it applied.
func (s *Server) ClosedEpoch(_ context.Context, req *pb.ClosedEpochRequest) (*pb.ClosedEpochResponse, error) {
	r, err := s.replica(req.GetRangeId())
	if err != nil {
		return nil, err
	}
	var end []byte
	if len(req.GetEnd()) > 0 {
		end = req.GetEnd()
	}
	c, err := r.ClosedEpoch(req.GetStart(), end)
	if err != nil {
		return nil, s.status(r, err)
	}
	return &pb.ClosedEpochResponse{ClosedEpoch: c}, nil
}

// SideClosed implements pb.RangeServer (node to node): each close goes to
// this node's replica of its range, which trusts it once it applied far
// enough (sideclosed.go); closes of ranges not hosted here are ignored.
func (s *Server) SideClosed(_ context.Context, req *pb.SideClosedRequest) (*pb.SideClosedResponse, error) {
	for _, u := range req.GetCloses() {
		s.mu.RLock()
		r := s.replicas[u.GetRangeId()]
		s.mu.RUnlock()
		if r != nil {
			r.ReceiveSideClosed(u)
		}
	}
	return &pb.SideClosedResponse{}, nil
}

// AdminSplit implements pb.RangeServer.
func (s *Server) AdminSplit(ctx context.Context, req *pb.AdminSplitRequest) (*pb.AdminSplitResponse, error) {
	r, err := s.replica(req.GetRangeId())
	if err != nil {
		return nil, err
	}
	if err := validKey(req.GetSplitKey()); err != nil {
		return nil, s.status(r, fmt.Errorf("%w: %v", ErrSplitKey, err))
	}
	left, right, err := r.AdminSplit(ctx, req.GetSplitKey())
	if err != nil {
		return nil, s.status(r, err)
	}
	return &pb.AdminSplitResponse{Left: left, Right: right}, nil
}

// TransferLease implements pb.RangeServer (DESIGN.md §12).
func (s *Server) TransferLease(ctx context.Context, req *pb.TransferLeaseRequest) (*pb.TransferLeaseResponse, error) {
	r, err := s.replica(req.GetRangeId())
	if err != nil {
		return nil, err
	}
	lease, err := r.TransferLease(ctx, req.GetTarget(), req.GetIfIdle())
	if err != nil {
		return nil, s.status(r, err)
	}
	return &pb.TransferLeaseResponse{Lease: lease}, nil
}

// ChangeNonVoter implements pb.RangeServer (DESIGN.md §13).
func (s *Server) ChangeNonVoter(ctx context.Context, req *pb.ChangeNonVoterRequest) (*pb.ChangeNonVoterResponse, error) {
	r, err := s.replica(req.GetRangeId())
	if err != nil {
		return nil, err
	}
	change := r.AddNonVoter
	if req.GetRemove() {
		change = r.RemoveNonVoter
	}
	d, err := change(ctx, req.GetNode())
	if err != nil {
		return nil, s.status(r, err)
	}
	return &pb.ChangeNonVoterResponse{RangeDescriptor: d}, nil
}

// Rehome implements pb.RangeServer (DESIGN.md §13).
func (s *Server) Rehome(ctx context.Context, req *pb.RehomeRequest) (*pb.RehomeResponse, error) {
	r, err := s.replica(req.GetRangeId())
	if err != nil {
		return nil, err
	}
	d, barrier, err := r.Rehome(ctx, req.GetRegion(), req.GetVoters())
	if err != nil {
		return nil, s.status(r, err)
	}
	return &pb.RehomeResponse{RangeDescriptor: d, Barrier: barrier}, nil
}

// MoveReplica implements pb.RangeServer (DESIGN.md §12).
func (s *Server) MoveReplica(ctx context.Context, req *pb.MoveReplicaRequest) (*pb.MoveReplicaResponse, error) {
	r, err := s.replica(req.GetRangeId())
	if err != nil {
		return nil, err
	}
	d, err := r.MoveReplica(ctx, req.GetFrom(), req.GetTo())
	if err != nil {
		return nil, s.status(r, err)
	}
	return &pb.MoveReplicaResponse{RangeDescriptor: d}, nil
}

// AdminMerge implements pb.RangeServer.
func (s *Server) AdminMerge(ctx context.Context, req *pb.AdminMergeRequest) (*pb.AdminMergeResponse, error) {
	r, err := s.replica(req.GetRangeId())
	if err != nil {
		return nil, err
	}
	var end []byte
	if len(req.GetEndKey()) > 0 {
		end = req.GetEndKey()
	}
	merged, err := r.AdminMerge(ctx, end)
	if err != nil {
		return nil, s.status(r, err)
	}
	return &pb.AdminMergeResponse{Merged: merged}, nil
}

// Remove makes range id unreachable through the server (a merge removed
// it).
func (s *Server) Remove(id uint64) {
	s.mu.Lock()
	delete(s.replicas, id)
	s.mu.Unlock()
}

// Sibling returns the replica of the range whose span starts at key, or nil
// (Config.Sibling).
func (s *Server) Sibling(key []byte) *Replica {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var found *Replica
	for _, r := range s.replicas {
		if bytes.Equal(r.Desc().GetStartKey(), key) && (found == nil || r.Desc().GetGeneration() > found.Desc().GetGeneration()) {
			found = r
		}
	}
	return found
}

// CommitOnePhase implements pb.RangeServer.
func (s *Server) CommitOnePhase(ctx context.Context, req *pb.OnePhaseRequest) (*pb.OnePhaseResponse, error) {
	r, err := s.replica(req.GetRangeId())
	if err != nil {
		return nil, err
	}
	if err := errors.Join(validTxn(req.GetTxn()), validWrites(req.GetWrites())); err != nil {
		return nil, s.status(r, err)
	}
	if err := validReads(req); err != nil {
		return nil, s.status(r, err)
	}
	v, reads, err := r.CommitOnePhase(ctx, req)
	if err != nil {
		return nil, s.status(r, err)
	}
	return &pb.OnePhaseResponse{Version: v, Reads: reads}, nil
}

// SnapshotRead implements pb.RangeServer.
func (s *Server) SnapshotRead(ctx context.Context, req *pb.SnapshotReadRequest) (*pb.SnapshotReadResponse, error) {
	r, err := s.replica(req.GetRangeId())
	if err != nil {
		return nil, err
	}
	if !req.GetScan() {
		if err := validKey(req.GetStart()); err != nil {
			return nil, s.status(r, err)
		}
	} else if len(req.GetEnd()) > 0 && bytes.Compare(req.GetEnd(), req.GetStart()) < 0 {
		return nil, s.status(r, fmt.Errorf("%w: scan end before start", ErrBadRequest))
	}
	resp, err := r.SnapshotRead(ctx, req)
	return resp, s.status(r, err)
}
