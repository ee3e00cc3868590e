// Package admin holds the operator's actions on a running cluster, as
// `terroir admin` runs them: excluding a region from the global epoch
// service's publisher set and including it again (paper §5.5, DESIGN.md §7).
package admin

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"google.golang.org/grpc"

	"github.com/terroir-db/terroir/internal/epoch/epochpb"
	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/transport"
)

// Errors returned by this package.
var (
	// ErrUnknownRegion: the topology does not declare the region.
	ErrUnknownRegion = errors.New("admin: unknown region")
	// ErrNoPublisher: the region runs no publisher, so it is not in the set.
	ErrNoPublisher = errors.New("admin: the region has no publisher")
	// ErrNoGlobalEpoch: the topology has no global epoch service.
	ErrNoGlobalEpoch = errors.New("admin: the topology has no global epoch service")
)

// RegionStatus is one region's place in the global epoch service's set.
type RegionStatus struct {
	Region    string
	Publisher uint64 // its publisher group
	Excluded  bool
	Since     uint64 // the global epoch at which it was excluded (0: not recorded)
}

func globalGroup(top *topology.Topology) (topology.Group, error) {
	g := top.GroupsOfKind(topology.KindGlobalEpoch, "")
	if len(g) == 0 {
		return topology.Group{}, ErrNoGlobalEpoch
	}
	return g[0], nil
}

// SetRegionExcluded excludes region's publisher from the global epoch
// service's set (excluded true) or includes it again, through the service's
// leader. The change is durable when it returns. Excluding lets the other
// regions' global epoch advance while region is cut off (after its lease has
// surely lapsed); including makes the service wait for the region again, from
// the next round on, once its publisher has applied the current epoch.
//
// Errors: ErrUnknownRegion, ErrNoPublisher, ErrNoGlobalEpoch, or the
// transport's ErrNoLeader when no leader answered before ctx ended.
func SetRegionExcluded(ctx context.Context, d *transport.Dialer, top *topology.Topology, region string, excluded bool) error {
	if !top.HasRegion(region) {
		return fmt.Errorf("%w: %q", ErrUnknownRegion, region)
	}
	pub := top.GroupsOfKind(topology.KindPublisher, region)
	if len(pub) == 0 {
		return fmt.Errorf("%w: %q", ErrNoPublisher, region)
	}
	g, err := globalGroup(top)
	if err != nil {
		return err
	}
	return transport.NewLeaderClient(d, g.Replicas).Call(ctx, func(ctx context.Context, conn *grpc.ClientConn) error {
		_, err := epochpb.NewEpochClient(conn).SetExcluded(ctx, &epochpb.SetExcludedRequest{
			GroupId: g.ID, PublisherGroup: pub[0].ID, Excluded: excluded})
		return err
	})
}

// Regions returns every region with a publisher and whether it is excluded,
// as a replica of the global epoch service has applied it, with the global epoch there.
// Errors: ErrNoGlobalEpoch, or ErrNoLeader.
func Regions(ctx context.Context, d *transport.Dialer, top *topology.Topology) ([]RegionStatus, uint64, error) {
	g, err := globalGroup(top)
	if err != nil {
		return nil, 0, err
	}
	var resp *epochpb.MembershipResponse
	err = transport.NewLeaderClient(d, g.Replicas).Call(ctx, func(ctx context.Context, conn *grpc.ClientConn) error {
		var err error
		resp, err = epochpb.NewEpochClient(conn).Membership(ctx, &epochpb.MembershipRequest{GroupId: g.ID})
		return err
	})
	if err != nil {
		return nil, 0, err
	}
	var out []RegionStatus
	for _, r := range top.Regions {
		if p := top.GroupsOfKind(topology.KindPublisher, r); len(p) > 0 {
			st := RegionStatus{Region: r, Publisher: p[0].ID}
			if i := slices.Index(resp.GetExcludedGroups(), p[0].ID); i >= 0 {
				st.Excluded = true
				if i < len(resp.GetExcludedSince()) {
					st.Since = resp.GetExcludedSince()[i]
				}
			}
			out = append(out, st)
		}
	}
	return out, resp.GetEpoch(), nil
}
