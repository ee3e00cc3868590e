package txnstate

import (
	"context"
	"errors"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/terroir-db/terroir/internal/raftgroup"
	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/transport"
	"github.com/terroir-db/terroir/internal/txnstate/txnstatepb"
)

// Replica is a node's replica of a txn-state group.
type Replica struct {
	Group *raftgroup.Group
	SM    *StateMachine
}

// Server answers TxnState RPCs for every txn-state replica a node hosts.
type Server struct {
	txnstatepb.UnimplementedTxnStateServer

	mu       sync.RWMutex
	replicas map[uint64]Replica
}

// NewServer returns a server with no replicas.
func NewServer() *Server { return &Server{replicas: map[uint64]Replica{}} }

// Add makes r's group reachable through the server.
func (s *Server) Add(r Replica) {
	s.mu.Lock()
	s.replicas[r.Group.ID()] = r
	s.mu.Unlock()
}

// Remove takes group id's replica out of the server (it left this node):
// later calls for it fail with NotFound.
func (s *Server) Remove(id uint64) {
	s.mu.Lock()
	delete(s.replicas, id)
	s.mu.Unlock()
}

// hosted returns the replicas the server hosts now.
func (s *Server) hosted() []Replica {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]Replica, 0, len(s.replicas))
	for _, r := range s.replicas {
		out = append(out, r)
	}
	return out
}

// Records returns how many records the hosted replicas hold.
func (s *Server) Records() (int, error) {
	n := 0
	for _, r := range s.hosted() {
		if err := r.SM.Records(func(*txnstatepb.Record) bool { n++; return true }); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// Register installs the TxnState service on g.
func (s *Server) Register(g grpc.ServiceRegistrar) { txnstatepb.RegisterTxnStateServer(g, s) }

func (s *Server) replica(id uint64) (Replica, error) {
	s.mu.RLock()
	r, ok := s.replicas[id]
	s.mu.RUnlock()
	if !ok {
		return Replica{}, status.Errorf(codes.NotFound, "txn-state group %d is not hosted here", id)
	}
	return r, nil
}

// notLeader is the status a non-leader replica answers with.
func notLeader(id uint64) error {
	return status.Errorf(codes.FailedPrecondition, "txn-state group %d: not the leader", id)
}

// Decide implements txnstatepb.TxnStateServer.
func (s *Server) Decide(ctx context.Context, req *txnstatepb.DecideRequest) (*txnstatepb.DecideResponse, error) {
	r, err := s.replica(req.GetGroupId())
	if err != nil {
		return nil, err
	}
	if err := validDecision(req.GetRecord()); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	cmd, err := EncodeDecide(req.GetRecord())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	res, err := propose(ctx, r, req.GetGroupId(), cmd)
	if err != nil {
		return nil, err
	}
	switch v := res.(type) {
	case *txnstatepb.Record:
		return &txnstatepb.DecideResponse{Record: v}, nil
	case error:
		return nil, status.Error(codes.Internal, v.Error())
	}
	return nil, status.Errorf(codes.Internal, "txn-state: unexpected result %T", res)
}

// propose proposes cmd in r's group and maps its failures to statuses.
func propose(ctx context.Context, r Replica, group uint64, cmd []byte) (any, error) {
	res, err := r.Group.Propose(ctx, cmd)
	switch {
	case errors.Is(err, raftgroup.ErrNotLeader):
		return nil, notLeader(group)
	case errors.Is(err, raftgroup.ErrOutcomeUnknown), errors.Is(err, raftgroup.ErrBusy), errors.Is(err, raftgroup.ErrStopped):
		return nil, status.Error(codes.Unavailable, err.Error())
	case err != nil:
		return nil, status.FromContextError(err).Err()
	}
	if err, ok := res.(error); ok {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return res, nil
}

// Forget implements txnstatepb.TxnStateServer.
func (s *Server) Forget(ctx context.Context, req *txnstatepb.ForgetRequest) (*txnstatepb.ForgetResponse, error) {
	r, err := s.replica(req.GetGroupId())
	if err != nil {
		return nil, err
	}
	for _, id := range req.GetTxnIds() {
		if len(id) != TxnIDLen {
			return nil, status.Errorf(codes.InvalidArgument, "transaction ID of %d bytes", len(id))
		}
	}
	cmd, err := EncodeForget(req.GetTxnIds())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if _, err := propose(ctx, r, req.GetGroupId(), cmd); err != nil {
		return nil, err
	}
	return &txnstatepb.ForgetResponse{}, nil
}

// Get implements txnstatepb.TxnStateServer: a ReadIndex barrier, then a local read.
func (s *Server) Get(ctx context.Context, req *txnstatepb.GetRequest) (*txnstatepb.GetResponse, error) {
	r, err := s.replica(req.GetGroupId())
	if err != nil {
		return nil, err
	}
	if len(req.GetTxnId()) != TxnIDLen {
		return nil, status.Errorf(codes.InvalidArgument, "transaction ID of %d bytes", len(req.GetTxnId()))
	}
	if err := r.Group.ReadIndex(ctx); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	rec, err := r.SM.Get(req.GetTxnId())
	if err != nil {
		return nil, status.Error(codes.DataLoss, err.Error())
	}
	return &txnstatepb.GetResponse{Record: rec}, nil
}

// Client calls one txn-state group through its leader.
type Client struct {
	group uint64
	lc    *transport.LeaderClient
}

// NewClient returns a client of group whose replicas are on the given nodes.
func NewClient(dialer *transport.Dialer, g topology.Group) *Client {
	return &Client{group: g.ID, lc: transport.NewGroupClient(dialer, g)}
}

// Decide records rec's outcome unless another was recorded first, and returns
// the winning record. It retries other replicas and transient failures until ctx
// ends; the caller must treat an error as "outcome unknown".
func (c *Client) Decide(ctx context.Context, rec *txnstatepb.Record) (*txnstatepb.Record, error) {
	var out *txnstatepb.Record
	err := c.lc.Call(ctx, func(ctx context.Context, conn grpc.ClientConnInterface) error {
		resp, err := txnstatepb.NewTxnStateClient(conn).Decide(ctx, &txnstatepb.DecideRequest{GroupId: c.group, Record: rec})
		out = resp.GetRecord()
		return err
	})
	return out, err
}

// Get returns the recorded outcome of txnID (UNKNOWN if none yet).
func (c *Client) Get(ctx context.Context, txnID []byte) (*txnstatepb.Record, error) {
	var out *txnstatepb.Record
	err := c.lc.Call(ctx, func(ctx context.Context, conn grpc.ClientConnInterface) error {
		resp, err := txnstatepb.NewTxnStateClient(conn).Get(ctx, &txnstatepb.GetRequest{GroupId: c.group, TxnId: txnID})
		out = resp.GetRecord()
		return err
	})
	return out, err
}

// Forget removes the records of txnIDs (each of TxnIDLen bytes), whose
// outcome every participant has applied. It retries other replicas and
// transient failures until ctx ends.
func (c *Client) Forget(ctx context.Context, txnIDs [][]byte) error {
	return c.lc.Call(ctx, func(ctx context.Context, conn grpc.ClientConnInterface) error {
		_, err := txnstatepb.NewTxnStateClient(conn).Forget(ctx, &txnstatepb.ForgetRequest{GroupId: c.group, TxnIds: txnIDs})
		return err
	})
}
