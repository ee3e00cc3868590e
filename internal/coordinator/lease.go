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
	return c.transferLease(ctx, key, to, false)
}

// TransferLeaseIfIdle is TransferLease for the replicate queue's balancing:
// the holder refuses while any transaction holds locks at the range (none
// is aborted), and the call retries until ctx ends.
func (c *Coordinator) TransferLeaseIfIdle(ctx context.Context, key []byte, to uint64) (*pb.RangeDescriptor, *pb.Lease, error) {
	return c.transferLease(ctx, key, to, true)
}

func (c *Coordinator) transferLease(ctx context.Context, key []byte, to uint64, ifIdle bool) (*pb.RangeDescriptor, *pb.Lease, error) {
	var lease *pb.Lease
	d, err := c.operate(ctx, key, ErrLeaseTarget, func(d *pb.RangeDescriptor) error {
		if !slices.Contains(d.GetReplicas(), to) {
			return fmt.Errorf("%w: node %d is not a replica of range %d (replicas %v)", ErrLeaseTarget, to, d.GetRangeId(), d.GetReplicas())
		}
		return nil
	}, func(ctx context.Context, rc pb.RangeClient, d *pb.RangeDescriptor) error {
		resp, err := rc.TransferLease(ctx, &pb.TransferLeaseRequest{RangeId: d.GetRangeId(), Target: to, IfIdle: ifIdle})
		lease = resp.GetLease()
		return err
	})
	return d, lease, err
}

// operate runs an operator's call (not idempotent) at the leaseholder of
// the range holding key, after check vets the range; the leaseholder's
// InvalidArgument refusal becomes refused, wrapped. It returns the range
// as routed.
func (c *Coordinator) operate(ctx context.Context, key []byte, refused error, check func(*pb.RangeDescriptor) error,
	call func(context.Context, pb.RangeClient, *pb.RangeDescriptor) error) (*pb.RangeDescriptor, error) {
	if len(key) > MaxKeySize {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrKeyTooLarge, len(key), MaxKeySize)
	}
	var desc *pb.RangeDescriptor
	err := c.routeKey(ctx, key, check, func(d *pb.RangeDescriptor) error {
		desc = d
		err := c.rangeCall(ctx, d, false, func(ctx context.Context, rc pb.RangeClient) error { return call(ctx, rc, d) })
		if status.Code(err) == codes.InvalidArgument {
			return fmt.Errorf("%w: %s", refused, status.Convert(err).Message())
		}
		return err
	})
	return desc, err
}
