package transport

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/terroir-db/terroir/internal/topology"
)

// ErrNoLeader is returned by a LeaderClient that reached no serving replica in time.
var ErrNoLeader = errors.New("transport: no replica of the group served the call")

// LeaderClient calls whichever replica of a Raft group currently serves (its
// leader, for calls that must go through Raft), remembering the last one that
// did. Replicas that are not the leader answer FailedPrecondition; the client
// then tries the next.
type LeaderClient struct {
	dialer   *Dialer
	replicas atomic.Pointer[[]uint64] // the voters to try
	leader   atomic.Uint64            // last replica that served; 0 if unknown
	group    uint64                   // set by Follow: the group whose moves it follows
	region   string                   // and the region whose nodes it asks
	// AttemptTimeout bounds one call to one replica (default 1 s).
	AttemptTimeout time.Duration
}

// NewLeaderClient returns a client of the group whose replicas are on the given nodes.
func NewLeaderClient(dialer *Dialer, replicas []uint64) *LeaderClient {
	c := &LeaderClient{dialer: dialer, AttemptTimeout: time.Second}
	rs := slices.Clone(replicas)
	c.replicas.Store(&rs)
	return c
}

// NewGroupClient returns a client of the non-range group g (an epoch,
// transaction-state or directory group) that follows its replica moves.
func NewGroupClient(dialer *Dialer, g topology.Group) *LeaderClient {
	return NewLeaderClient(dialer, g.Replicas).Follow(g.ID, g.Region)
}

// Follow makes c follow group's replica moves (DESIGN.md §12): after a
// round in which no replica served, c asks the nodes of region (and the
// replicas it knows) for the group's newest configuration (LocateGroup)
// and tries its voters and leader from then on. It returns c.
func (c *LeaderClient) Follow(group uint64, region string) *LeaderClient {
	c.group, c.region = group, region
	return c
}

// relocate refreshes the voters and the leader from the nodes' views.
func (c *LeaderClient) relocate(ctx context.Context) {
	v, err := LocateGroup(ctx, c.dialer, c.group, c.dialer.RegionNodes(c.region, *c.replicas.Load()))
	if err != nil || len(v.Voters) == 0 {
		return
	}
	c.replicas.Store(&v.Voters)
	if v.Leader != 0 {
		c.leader.Store(v.Leader)
	}
}

// Call runs f against the remembered leader first, then each replica in turn,
// pausing between rounds, until f succeeds, fails with a final code
// (InvalidArgument, DataLoss, Internal, and PermissionDenied or
// Unauthenticated: no replica will let this caller in), or ctx ends
// (ErrNoLeader). f's calls travel over each node's Multiplex stream
// (Dialer.Multiplexed).
func (c *LeaderClient) Call(ctx context.Context, f func(ctx context.Context, conn grpc.ClientConnInterface) error) error {
	var lastErr error
	for round := 0; ; round++ {
		order := *c.replicas.Load()
		if l := c.leader.Load(); l != 0 {
			order = append([]uint64{l}, order...)
		}
		for _, id := range order {
			conn, err := c.dialer.Multiplexed(id)
			if err != nil {
				return err
			}
			actx, cancel := context.WithTimeout(ctx, c.AttemptTimeout)
			err = f(actx, conn)
			cancel()
			if err == nil {
				c.leader.Store(id)
				return nil
			}
			lastErr = err
			switch status.Code(err) {
			case codes.InvalidArgument, codes.DataLoss, codes.Internal, codes.PermissionDenied, codes.Unauthenticated:
				return err
			}
			if ctx.Err() != nil {
				return fmt.Errorf("%w: %v", ErrNoLeader, lastErr)
			}
		}
		if c.group != 0 {
			c.relocate(ctx)
		}
		if !SleepCtx(ctx, time.Duration(min(round+1, 10))*10*time.Millisecond) {
			return fmt.Errorf("%w: %v", ErrNoLeader, lastErr)
		}
	}
}

// SleepCtx waits d; false if ctx ended first. A zero or negative d returns at
// once, without a timer (the intra-region fast path of every call).
func SleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
