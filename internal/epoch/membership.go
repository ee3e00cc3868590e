package epoch

import (
	"context"
	"slices"

	"google.golang.org/grpc"

	"github.com/terroir-db/terroir/internal/epoch/epochpb"
	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/transport"
)

// Membership reads the global epoch service's publisher set from the
// replica that serves (DESIGN.md §7). Errors: transport.ErrNoLeader when
// none answered before ctx ended, or the RPC's final error.
func Membership(ctx context.Context, d *transport.Dialer, service topology.Group) (*epochpb.MembershipResponse, error) {
	var resp *epochpb.MembershipResponse
	err := transport.NewGroupClient(d, service).Call(ctx, func(ctx context.Context, conn grpc.ClientConnInterface) error {
		var err error
		resp, err = epochpb.NewEpochClient(conn).Membership(ctx, &epochpb.MembershipRequest{GroupId: service.ID})
		return err
	})
	return resp, err
}

// ExcludedSince reports whether publisher group pub is excluded in resp,
// and the global epoch since which (0: excluded before the epochs were
// recorded).
func ExcludedSince(resp *epochpb.MembershipResponse, pub uint64) (uint64, bool) {
	i := slices.Index(resp.GetExcludedGroups(), pub)
	if i < 0 {
		return 0, false
	}
	if i < len(resp.GetExcludedSince()) {
		return resp.GetExcludedSince()[i], true
	}
	return 0, true
}
