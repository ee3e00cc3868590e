package node

import (
	"context"
	"errors"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/terroir-db/terroir/internal/admin"
	"github.com/terroir-db/terroir/internal/node/nodepb"
)

// SetRegionExcluded implements nodepb.NodeServer: the operator's exclusion,
// proposed with this node's certificate (the admin user's was checked on
// the way in). Errors: InvalidArgument for a region without a publisher or
// a topology without a global epoch service; FailedPrecondition when the
// service refused this node (its certificate, or a final error): no other
// node would do better, so the caller stops; Unavailable when the service
// did not answer in time.
func (s *statusServer) SetRegionExcluded(ctx context.Context, req *nodepb.SetRegionExcludedRequest) (*nodepb.SetRegionExcludedResponse, error) {
	err := admin.ProposeRegionExcluded(ctx, s.n.dialer, s.n.cfg.Topology, req.GetRegion(), req.GetExcluded())
	switch {
	case err == nil:
		return &nodepb.SetRegionExcludedResponse{}, nil
	case errors.Is(err, admin.ErrUnknownRegion), errors.Is(err, admin.ErrNoPublisher), errors.Is(err, admin.ErrNoGlobalEpoch):
		return nil, status.Error(codes.InvalidArgument, err.Error())
	case slices.Contains([]codes.Code{codes.PermissionDenied, codes.Unauthenticated, codes.InvalidArgument, codes.Internal, codes.DataLoss}, status.Code(err)):
		return nil, status.Errorf(codes.FailedPrecondition, "node %d could not propose it: %v", s.n.cfg.NodeID, status.Convert(err).Message())
	default:
		return nil, status.Error(codes.Unavailable, err.Error())
	}
}
