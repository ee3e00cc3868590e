package coordinator

import (
	"context"
	"errors"
	"fmt"
	"slices"

	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
)

// ErrMoveTarget: a replica move from a node that is not a replica of the
// range, or to one that cannot take it (a replica already, unknown, down,
// or in another region). Nothing changed.
var ErrMoveTarget = errors.New("terroir: the replica cannot move there")

// ChangeNonVoter adds (or, with remove, removes) a non-voting replica of
// the range holding key on node, at the range's leaseholder (DESIGN.md
// §13): node hosts an empty replica, joins as a learner that stays one and
// catches up by a streamed snapshot; from then on it serves snapshot reads
// from its closed epoch. It returns the range's new descriptor. Errors:
// ErrMoveTarget (nothing changed: an unknown node, one that hosts a voter
// of the range or is in its home region, or, to remove, one that is not a
// non-voter; adding a
// non-voter that is one already changes nothing and is no error), ErrKeyTooLarge,
// ErrUnavailable, ErrCommitUnknown.
func (c *Coordinator) ChangeNonVoter(ctx context.Context, key []byte, node uint64, remove bool) (*pb.RangeDescriptor, error) {
	nd, ok := c.dialer.Network().Resolve(node)
	if !ok {
		return nil, fmt.Errorf("%w: node %d is not in the cluster", ErrMoveTarget, node)
	}
	var out *pb.RangeDescriptor
	_, err := c.operate(ctx, key, ErrMoveTarget, func(d *pb.RangeDescriptor) error {
		switch {
		case remove && !slices.Contains(d.GetNonVoters(), node):
			return fmt.Errorf("%w: node %d hosts no non-voting replica of range %d (non-voters %v)", ErrMoveTarget, node, d.GetRangeId(), d.GetNonVoters())
		case !remove && slices.Contains(d.GetReplicas(), node):
			return fmt.Errorf("%w: node %d hosts a voting replica of range %d (replicas %v)", ErrMoveTarget, node, d.GetRangeId(), d.GetReplicas())
		case !remove && nd.Region == d.GetRegion():
			return fmt.Errorf("%w: node %d is in range %d's home region %s, where its voters serve: a non-voter goes to another region", ErrMoveTarget, node, d.GetRangeId(), d.GetRegion())
		}
		return nil
	}, func(ctx context.Context, rc pb.RangeClient, d *pb.RangeDescriptor) error {
		resp, err := rc.ChangeNonVoter(ctx, &pb.ChangeNonVoterRequest{RangeId: d.GetRangeId(), Node: node, Remove: remove})
		out = resp.GetRangeDescriptor()
		return err
	})
	if err != nil {
		return nil, err
	}
	c.routes.Update(out)
	return out, nil
}

// MoveReplica moves the replica of the range holding key from node from to
// node to (DESIGN.md §12), at the range's leaseholder: to joins as a
// learner, catches up by a streamed snapshot, and is promoted as from is
// removed, in one joint configuration change; the range keeps three voters
// throughout. It returns the range's new descriptor. Errors: ErrMoveTarget
// (nothing changed), ErrKeyTooLarge, ErrUnavailable, ErrCommitUnknown
// (whether it moved is unknown: the range's descriptor tells).
func (c *Coordinator) MoveReplica(ctx context.Context, key []byte, from, to uint64) (*pb.RangeDescriptor, error) {
	if _, ok := c.dialer.Network().Resolve(to); !ok {
		return nil, fmt.Errorf("%w: node %d is not in the cluster", ErrMoveTarget, to)
	}
	var moved *pb.RangeDescriptor
	_, err := c.operate(ctx, key, ErrMoveTarget, func(d *pb.RangeDescriptor) error {
		if !slices.Contains(d.GetReplicas(), from) {
			return fmt.Errorf("%w: node %d is not a replica of range %d (replicas %v)", ErrMoveTarget, from, d.GetRangeId(), d.GetReplicas())
		}
		return nil
	}, func(ctx context.Context, rc pb.RangeClient, d *pb.RangeDescriptor) error {
		resp, err := rc.MoveReplica(ctx, &pb.MoveReplicaRequest{RangeId: d.GetRangeId(), From: from, To: to})
		moved = resp.GetRangeDescriptor()
		return err
	})
	if err != nil {
		return nil, err
	}
	c.routes.Update(moved)
	return moved, nil
}
