package transport

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ErrNoLeader is returned by a LeaderClient that reached no serving replica in time.
var ErrNoLeader = errors.New("transport: no replica of the group served the call")

// LeaderClient calls whichever replica of a Raft group currently serves (its
// leader, for calls that must go through Raft), remembering the last one that
// did. Replicas that are not the leader answer FailedPrecondition; the client
// then tries the next.
type LeaderClient struct {
	dialer   *Dialer
	replicas []uint64
	leader   atomic.Uint64 // last replica that served; 0 if unknown
	// AttemptTimeout bounds one call to one replica (default 1 s).
	AttemptTimeout time.Duration
}

// NewLeaderClient returns a client of the group whose replicas are on the given nodes.
func NewLeaderClient(dialer *Dialer, replicas []uint64) *LeaderClient {
	return &LeaderClient{dialer: dialer, replicas: append([]uint64(nil), replicas...), AttemptTimeout: time.Second}
}

// Call runs f against the remembered leader first, then each replica in turn,
// pausing between rounds, until f succeeds, fails with a final code
// (InvalidArgument, DataLoss, Internal, and PermissionDenied or
// Unauthenticated: no replica will let this caller in), or ctx ends
// (ErrNoLeader).
func (c *LeaderClient) Call(ctx context.Context, f func(ctx context.Context, conn *grpc.ClientConn) error) error {
	var lastErr error
	for round := 0; ; round++ {
		order := c.replicas
		if l := c.leader.Load(); l != 0 {
			order = append([]uint64{l}, c.replicas...)
		}
		for _, id := range order {
			conn, err := c.dialer.Conn(id)
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
