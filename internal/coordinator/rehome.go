package coordinator

import (
	"context"
	"errors"
	"fmt"

	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
)

// ErrRehomeTarget: the range cannot be rehomed to that region (an unknown
// region, one with no publisher or directory, its home already, or one
// with too few live nodes for its voters). Nothing changed.
var ErrRehomeTarget = errors.New("terroir: the range cannot be rehomed there")

// Rehome moves the home of the range holding key to region (DESIGN.md
// §13), at its leaseholder: the region's nodes join as non-voting replicas
// and catch up while the range serves on; the leaseholder stops, lets the
// transactions prepared there be decided, and ends its lease by a Raft
// entry recording the rehome barrier G_b; the region's replicas become the
// voters; the new home's first leaseholder waits for the global epoch to
// pass G_b before serving. Transactions that held locks there and had not
// prepared abort (their clients retry). It returns the range's new
// descriptor and G_b. Errors: ErrRehomeTarget (nothing changed),
// ErrKeyTooLarge, ErrUnavailable, ErrCommitUnknown (whether it moved is
// unknown: the range's descriptor tells).
func (c *Coordinator) Rehome(ctx context.Context, key []byte, region string) (*pb.RangeDescriptor, uint64, error) {
	if c.publishers[region] == nil || c.dirs.Of(region) == nil {
		return nil, 0, fmt.Errorf("%w: region %q has no publisher or no directory (regions: %v)", ErrRehomeTarget, region, c.dirs.Regions())
	}
	var (
		out     *pb.RangeDescriptor
		barrier uint64
	)
	_, err := c.operate(ctx, key, ErrRehomeTarget, func(d *pb.RangeDescriptor) error {
		if d.GetRegion() == region {
			return fmt.Errorf("%w: range %d [%q, %q) is homed in %s already", ErrRehomeTarget, d.GetRangeId(), d.GetStartKey(), d.GetEndKey(), region)
		}
		return nil
	}, func(ctx context.Context, rc pb.RangeClient, d *pb.RangeDescriptor) error {
		resp, err := rc.Rehome(ctx, &pb.RehomeRequest{RangeId: d.GetRangeId(), Region: region})
		out, barrier = resp.GetRangeDescriptor(), resp.GetBarrier()
		return err
	})
	if err != nil {
		return nil, 0, err
	}
	c.routes.Update(out)
	return out, barrier, nil
}
