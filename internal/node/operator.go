package node

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/terroir-db/terroir/internal/admin"
	"github.com/terroir-db/terroir/internal/node/nodepb"
)

// SetRegionExcluded implements nodepb.NodeServer: the operator's exclusion,
// proposed with this node's certificate (the admin user's was checked on
// the way in). Errors: InvalidArgument for a region without a publisher or
// a topology without a global epoch service, Unavailable when the service
// did not take it.
func (s *statusServer) SetRegionExcluded(ctx context.Context, req *nodepb.SetRegionExcludedRequest) (*nodepb.SetRegionExcludedResponse, error) {
	err := admin.ProposeRegionExcluded(ctx, s.n.dialer, s.n.cfg.Topology, req.GetRegion(), req.GetExcluded())
	switch {
	case err == nil:
		return &nodepb.SetRegionExcludedResponse{}, nil
	case errors.Is(err, admin.ErrUnknownRegion), errors.Is(err, admin.ErrNoPublisher), errors.Is(err, admin.ErrNoGlobalEpoch):
		return nil, status.Error(codes.InvalidArgument, err.Error())
	default:
		return nil, status.Error(codes.Unavailable, err.Error())
	}
}
