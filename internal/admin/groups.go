package admin

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/terroir-db/terroir/internal/node/nodepb"
	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/transport"
)

// ErrBadGroupMove is a group move refused before anything changed: the
// group is a range or unknown, from is not a voter, to is one already, or
// to is not a node of the group's region.
var ErrBadGroupMove = errors.New("admin: bad group replica move")

// MoveGroupReplica moves the non-range group id's replica on node from to
// node to (DESIGN.md §12), at the group's leader, which it finds among the
// nodes of the group's region (transport.LocateGroup) and follows as
// leadership moves (a leader hands it on before moving its own replica).
// It returns the group's voters after the move. Errors: ErrBadGroupMove,
// or the last error once ctx ends.
func MoveGroupReplica(ctx context.Context, d *transport.Dialer, top *topology.Topology, id, from, to uint64) ([]uint64, error) {
	g, ok := top.Group(id)
	if !ok || g.Kind == topology.KindRange {
		return nil, fmt.Errorf("%w: group %d is not an epoch, transaction-state or directory group of the topology (move a range's replica with range move)", ErrBadGroupMove, id)
	}
	var lastErr error
	for attempt := 0; ctx.Err() == nil; attempt++ {
		if attempt > 0 && !transport.SleepCtx(ctx, retryPause(attempt)) {
			break
		}
		v, err := transport.LocateGroup(ctx, d, id, d.RegionNodes(g.Region, g.Replicas))
		if err != nil || v.Leader == 0 {
			lastErr = fmt.Errorf("group %d has no leader to move its replica: %v", id, err)
			continue
		}
		conn, err := d.Conn(v.Leader)
		if err != nil {
			lastErr = err
			continue
		}
		resp, err := nodepb.NewNodeClient(conn).MoveGroupReplica(ctx, &nodepb.MoveGroupReplicaRequest{GroupId: id, FromNode: from, ToNode: to})
		switch status.Code(err) {
		case codes.OK:
			return resp.GetVoters(), nil
		case codes.InvalidArgument:
			return nil, fmt.Errorf("%w: %s", ErrBadGroupMove, CleanRPCText(status.Convert(err).Message()))
		}
		lastErr = err
	}
	return nil, fmt.Errorf("moving group %d's replica from node %d to node %d: %w (last error: %v)", id, from, to, ctx.Err(), lastErr)
}

// retryPause is 100 ms doubling to 1.6 s.
func retryPause(attempt int) time.Duration { return 100 * time.Millisecond << min(attempt-1, 4) }
