// Package admin holds the operator's actions on a running cluster, as
// `terroir admin` runs them: excluding a region from the global epoch
// service's publisher set and including it again (paper §5.5, DESIGN.md §7).
package admin

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/terroir-db/terroir/internal/epoch"
	"github.com/terroir-db/terroir/internal/epoch/epochpb"
	"github.com/terroir-db/terroir/internal/node/nodepb"
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
// service's set (excluded true) or includes it again: the operator's action
// (DESIGN.md §7). It asks a node to do it (Node.SetRegionExcluded, which
// needs the admin user's certificate; the node proposes the change with its
// own, as the service accepts nodes only), trying the nodes of the
// service's region first. The change is durable when it returns. Excluding
// lets the other regions' global epoch advance while region is cut off
// (after its lease has surely lapsed); including makes the service wait for
// the region again, from the next round on, once its publisher has applied
// the current epoch.
//
// Errors: ErrUnknownRegion, ErrNoPublisher, ErrNoGlobalEpoch, a permission
// error for a user other than admin, or the transport's ErrNoLeader when no
// node did it before ctx ended.
func SetRegionExcluded(ctx context.Context, d *transport.Dialer, top *topology.Topology, region string, excluded bool) error {
	_, g, err := exclusionTargets(top, region)
	if err != nil {
		return err
	}
	order := make([]uint64, 0, len(top.Nodes))
	for _, n := range top.Nodes {
		if n.Region == g.Region {
			order = append(order, n.ID)
		}
	}
	for _, n := range top.Nodes {
		if n.Region != g.Region {
			order = append(order, n.ID)
		}
	}
	var lastErr error
	for round := 0; ; round++ {
		for _, id := range order {
			conn, err := d.Conn(id)
			if err != nil {
				return err
			}
			actx, cancel := context.WithTimeout(ctx, excludeAttempt)
			_, err = nodepb.NewNodeClient(conn).SetRegionExcluded(actx, &nodepb.SetRegionExcludedRequest{Region: region, Excluded: excluded})
			cancel()
			switch status.Code(err) {
			case codes.OK:
				return nil
			case codes.PermissionDenied, codes.Unauthenticated, codes.InvalidArgument, codes.FailedPrecondition:
				return err // final: another node would answer the same
			}
			lastErr = err
		}
		if !transport.SleepCtx(ctx, time.Duration(min(round+1, 10))*50*time.Millisecond) {
			return fmt.Errorf("%w: %v", transport.ErrNoLeader, lastErr)
		}
	}
}

// excludeAttempt bounds one node's attempt at SetRegionExcluded.
const excludeAttempt = 5 * time.Second

// ProposeRegionExcluded is a node's side of SetRegionExcluded: it proposes
// the change through the global epoch service's leader. The dialer must
// present a node certificate. Errors as SetRegionExcluded's.
func ProposeRegionExcluded(ctx context.Context, d *transport.Dialer, top *topology.Topology, region string, excluded bool) error {
	pub, g, err := exclusionTargets(top, region)
	if err != nil {
		return err
	}
	return transport.NewGroupClient(d, g).Call(ctx, func(ctx context.Context, conn grpc.ClientConnInterface) error {
		_, err := epochpb.NewEpochClient(conn).SetExcluded(ctx, &epochpb.SetExcludedRequest{
			GroupId: g.ID, PublisherGroup: pub.ID, Excluded: excluded})
		return err
	})
}

// exclusionTargets returns region's publisher group and the global epoch
// service's. Errors: ErrUnknownRegion, ErrNoPublisher, ErrNoGlobalEpoch.
func exclusionTargets(top *topology.Topology, region string) (pub, service topology.Group, err error) {
	if !top.HasRegion(region) {
		return pub, service, fmt.Errorf("%w: %q", ErrUnknownRegion, region)
	}
	pubs := top.GroupsOfKind(topology.KindPublisher, region)
	if len(pubs) == 0 {
		return pub, service, fmt.Errorf("%w: %q", ErrNoPublisher, region)
	}
	service, err = globalGroup(top)
	return pubs[0], service, err
}

// Regions returns every region with a publisher and whether it is excluded,
// as a replica of the global epoch service has applied it, with the global epoch there.
// Errors: ErrNoGlobalEpoch, or ErrNoLeader.
func Regions(ctx context.Context, d *transport.Dialer, top *topology.Topology) ([]RegionStatus, uint64, error) {
	g, err := globalGroup(top)
	if err != nil {
		return nil, 0, err
	}
	resp, err := epoch.Membership(ctx, d, g)
	if err != nil {
		return nil, 0, err
	}
	var out []RegionStatus
	for _, r := range top.Regions {
		if p := top.GroupsOfKind(topology.KindPublisher, r); len(p) > 0 {
			st := RegionStatus{Region: r, Publisher: p[0].ID}
			st.Since, st.Excluded = epoch.ExcludedSince(resp, p[0].ID)
			out = append(out, st)
		}
	}
	return out, resp.GetEpoch(), nil
}
