package coordinator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/terroir-db/terroir/internal/epoch"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/routing"
	"github.com/terroir-db/terroir/internal/topology"
)

// membershipTimeout bounds the question a failed call asks the global epoch
// service; it runs only once a call has already failed, never on the commit
// path.
const membershipTimeout = 500 * time.Millisecond

// membershipTTL is how long excludedSince reuses an answer.
const membershipTTL = time.Second

// unavailable is the error of a call to range g that no leader served before
// its deadline: ErrUnavailable naming the range's region, or, when that
// region's publisher is excluded from the global epoch service,
// ErrRegionExcluded saying since which global epoch and how to readmit it —
// an operator reading "unavailable" would otherwise look for a crash.
func (c *Coordinator) unavailable(ctx context.Context, g *pb.RangeDescriptor, lastErr error) error {
	if errors.Is(ctx.Err(), context.Canceled) {
		return fmt.Errorf("%w: range %d: %v", ErrUnavailable, g.GetRangeId(), lastErr) // the caller gave up: no question asked
	}
	return c.unavailableIn(g.GetRegion(), fmt.Sprintf("range %d", g.GetRangeId()), lastErr)
}

// routeUnavailable is the error of a lookup of key that did not succeed in
// time: as unavailable's when the directory of a known region did not
// answer, else ErrUnavailable.
func (c *Coordinator) routeUnavailable(ctx context.Context, key []byte, err error) error {
	if re, ok := errors.AsType[*routing.RegionUnreachableError](err); ok && !errors.Is(ctx.Err(), context.Canceled) {
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
// membershipTimeout. An answer serves again for membershipTTL, so a burst
// of failing calls during a cut asks once.
func (c *Coordinator) excludedSince(region string) (uint64, bool) {
	global := c.top.GroupsOfKind(topology.KindGlobalEpoch, "")
	pub := c.top.GroupsOfKind(topology.KindPublisher, region)
	if len(global) == 0 || len(pub) == 0 {
		return 0, false
	}
	c.membership.mu.Lock()
	defer c.membership.mu.Unlock()
	if c.membership.at.IsZero() || time.Since(c.membership.at) > membershipTTL {
		ctx, cancel := context.WithTimeout(context.Background(), membershipTimeout)
		resp, err := epoch.Membership(ctx, c.dialer, global[0])
		cancel()
		if err != nil {
			resp = nil // unknown: not asked again within the TTL either
		}
		c.membership.resp, c.membership.at = resp, time.Now()
	}
	if c.membership.resp == nil {
		return 0, false
	}
	return epoch.ExcludedSince(c.membership.resp, pub[0].ID)
}
