package coordinator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"

	"github.com/terroir-db/terroir/internal/epoch/epochpb"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/routing"
	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/transport"
)

// membershipTimeout bounds the question a failed call asks the global epoch
// service; it runs only once a call has already failed, never on the commit
// path.
const membershipTimeout = 500 * time.Millisecond

// unavailable is the error of a call to range g that no leader served before
// its deadline: ErrUnavailable naming the range's region, or, when that
// region's publisher is excluded from the global epoch service,
// ErrRegionExcluded saying since which global epoch and how to readmit it —
// an operator reading "unavailable" would otherwise look for a crash.
func (c *Coordinator) unavailable(g *pb.RangeDescriptor, lastErr error) error {
	return c.unavailableIn(g.GetRegion(), fmt.Sprintf("range %d", g.GetRangeId()), lastErr)
}

// routeUnavailable is the error of a lookup of key that did not succeed in
// time: as unavailable's when the directory of a known region did not
// answer, else ErrUnavailable.
func (c *Coordinator) routeUnavailable(key []byte, err error) error {
	if re, ok := errors.AsType[*routing.RegionUnreachableError](err); ok {
		return c.unavailableIn(re.Region, fmt.Sprintf("routing %q", key), err)
	}
	return fmt.Errorf("%w: routing %q: %v", ErrUnavailable, key, err)
}

// unavailableIn names region as the one that did not serve `what`, and says
// when it is excluded.
func (c *Coordinator) unavailableIn(region, what string, lastErr error) error {
	if since, excluded := c.excludedSince(region); excluded {
		return fmt.Errorf("%w: region %s is excluded from the global epoch since epoch %d, so %s there cannot be served (readmit it with `terroir admin region include %s`): %v",
			ErrRegionExcluded, region, since, what, region, lastErr)
	}
	return fmt.Errorf("%w: %s in region %s: no answer in time (is %s cut off or down?): %v", ErrUnavailable, what, region, region, lastErr)
}

// excludedSince asks the global epoch service whether region's publisher is
// excluded and since which epoch; false when the topology has no global
// epoch service, region no publisher, or the service did not answer within
// membershipTimeout.
func (c *Coordinator) excludedSince(region string) (uint64, bool) {
	global := c.top.GroupsOfKind(topology.KindGlobalEpoch, "")
	pub := c.top.GroupsOfKind(topology.KindPublisher, region)
	if len(global) == 0 || len(pub) == 0 {
		return 0, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), membershipTimeout)
	defer cancel()
	var resp *epochpb.MembershipResponse
	err := transport.NewLeaderClient(c.dialer, global[0].Replicas).Call(ctx, func(ctx context.Context, conn *grpc.ClientConn) error {
		var err error
		resp, err = epochpb.NewEpochClient(conn).Membership(ctx, &epochpb.MembershipRequest{GroupId: global[0].ID})
		return err
	})
	if err != nil {
		return 0, false
	}
	for i, g := range resp.GetExcludedGroups() {
		if g == pub[0].ID {
			if i < len(resp.GetExcludedSince()) {
				return resp.GetExcludedSince()[i], true
			}
			return 0, true
		}
	}
	return 0, false
}
