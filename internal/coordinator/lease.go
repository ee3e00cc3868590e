package coordinator

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
)

// ErrLeaseTarget: a lease transfer to a node that is not a replica of the
// range, or that already holds its lease. Nothing changed.
var ErrLeaseTarget = errors.New("terroir: the lease cannot go to that node")

// TransferLease hands the lease of the range holding key to node `to`, a
// replica of it, without waiting for the lease to run out (DESIGN.md §12):
// an operator's action. It returns the range and the successor's lease.
// Transactions holding only unreplicated locks on the range abort; those
// prepared or committing there finish first. Errors: ErrLeaseTarget
// (nothing changed), ErrKeyTooLarge, ErrUnavailable, ErrCommitUnknown
// (whether the lease moved is unknown). While such transactions keep the
// holder busy it refuses and the call retries until ctx ends.
func (c *Coordinator) TransferLease(ctx context.Context, key []byte, to uint64) (*pb.RangeDescriptor, *pb.Lease, error) {
	if len(key) > MaxKeySize {
		return nil, nil, fmt.Errorf("%w: %d bytes, limit %d", ErrKeyTooLarge, len(key), MaxKeySize)
	}
	var desc *pb.RangeDescriptor
	var lease *pb.Lease
	err := c.routeKey(ctx, key, nil, func(d *pb.RangeDescriptor) error {
		desc = d
		if !slices.Contains(d.GetReplicas(), to) {
			return fmt.Errorf("%w: node %d is not a replica of range %d (replicas %v)", ErrLeaseTarget, to, d.GetRangeId(), d.GetReplicas())
		}
		err := c.rangeCall(ctx, d, false, func(ctx context.Context, rc pb.RangeClient) error {
			resp, err := rc.TransferLease(ctx, &pb.TransferLeaseRequest{RangeId: d.GetRangeId(), Target: to})
			lease = resp.GetLease()
			return err
		})
		if status.Code(err) == codes.InvalidArgument {
			return fmt.Errorf("%w: %s", ErrLeaseTarget, status.Convert(err).Message())
		}
		return err
	})
	return desc, lease, err
}
