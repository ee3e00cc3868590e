package coordinator

import (
	"context"
	"fmt"

	"github.com/terroir-db/terroir/internal/epoch"

	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/routing"
)

// ClosedEpoch returns the least closed epoch of the ranges holding keys in
// [lo, hi) (hi nil: to the end of the key space): every version of the span
// with an epoch at or below it is applied and final, so a snapshot at the
// returned epoch + 1 reads the span with no waits (DESIGN.md §13–§14). It
// is a changefeed's resolved epoch. Its caller waits for epochs to close,
// so it asks for the full pace of the epoch closes follow (epoch.Demand):
// the region's publisher, or in a regional-only deployment its local
// epoch. Errors: ErrInvalidRange, ErrUnavailable.
func (c *Coordinator) ClosedEpoch(ctx context.Context, lo, hi []byte) (uint64, error) {
	if err := checkScan(lo, hi); err != nil {
		return 0, err
	}
	if err := c.closingEpoch().Ask(); err != nil {
		return 0, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	closed, first := uint64(0), true
	err := c.routeSpan(ctx, lo, hi, nil, func(part routing.Part) (bool, error) {
		return false, c.rangeCall(ctx, part.Desc, true, func(ctx context.Context, rc pb.RangeClient) error {
			resp, err := rc.ClosedEpoch(ctx, &pb.ClosedEpochRequest{RangeId: part.Desc.GetRangeId(), Start: part.Start, End: part.End})
			if err == nil && (first || resp.GetClosedEpoch() < closed) {
				closed, first = resp.GetClosedEpoch(), false
			}
			return err
		})
	})
	if err != nil {
		return 0, err
	}
	return closed, nil
}

// ClosedSnapshot returns a snapshot reading at epoch at from the closed
// epochs of the ranges it reads (DESIGN.md §13): with at at most the least
// closed epoch + 1 of the span read (ClosedEpoch), every read is served at
// once, with no epoch or lock wait; a range whose closed epoch is below
// at-1 refuses and the read is retried (ErrUnavailable once ctx ends).
// Global-epoch versions only: it reads like a Serializable snapshot at at.
func (c *Coordinator) ClosedSnapshot(at uint64) *Snapshot {
	return &Snapshot{c: c, mode: Serializable, at: at, closed: true, lR: map[string]uint64{},
		stats: SnapshotStats{Mode: Serializable, Epoch: at}}
}

// closingEpoch is the reader of the epoch this region's ranges close: its
// publisher's, or in a regional-only deployment its local epoch's.
func (c *Coordinator) closingEpoch() *epoch.Reader {
	if p, ok := c.publishers[c.region]; ok && c.global != nil {
		return p
	}
	return c.epochs[c.region]
}
