package coordinator

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/transport"
)

// FollowerReads says which replica serves a snapshot's reads (DESIGN.md
// §13). A replica that is not the leader — a follower, or a non-voting
// replica in another region — serves a read at epoch s from its closed
// epoch c when s ≤ c+1, with no lock or epoch wait; otherwise it waits
// briefly for c to rise, then refuses, and the read goes to the leader.
// Only modes whose epoch a closed epoch covers may use followers: Strong,
// StrongLocal, Serializable and SerializableStale. Linearizable (its check
// needs the newest versions, which only the leader is sure to hold) and
// Regional (local-epoch versions are not closed) always read at the
// leader.
type FollowerReads uint8

const (
	// FollowerReadsNearest, the default, sends Serializable and
	// SerializableStale reads to the nearest replica: one in the client's
	// region first, then by round trip. A follower as near as the leader
	// serves only SerializableStale reads (whose epoch it has almost always
	// closed). Strong reads go to the leader: their epoch is the newest, and
	// a follower learns it closed about a closed-epoch interval and a
	// one-way trip from the home region after the leader could serve it.
	FollowerReadsNearest FollowerReads = iota
	// FollowerReadsPreferred sends every read it can, Strong ones too, to
	// the nearest follower, also when the leader is as near, and lets the
	// follower wait up to two closed-epoch intervals more for its epoch to
	// close: it spreads snapshot reads off the leaders at some latency.
	FollowerReadsPreferred
	// FollowerReadsOff sends every read to the leader.
	FollowerReadsOff
)

var followerReadsNames = [...]string{"nearest", "preferred", "off"}

// String returns the policy's name as the CLI spells it.
func (f FollowerReads) String() string {
	if int(f) < len(followerReadsNames) {
		return followerReadsNames[f]
	}
	return fmt.Sprintf("follower-reads(%d)", f)
}

// ParseFollowerReads parses a policy name (String's spelling). Errors: one
// naming the accepted names.
func ParseFollowerReads(s string) (FollowerReads, error) {
	for i, n := range followerReadsNames {
		if n == s {
			return FollowerReads(i), nil
		}
	}
	return 0, fmt.Errorf("unknown follower-reads policy %q (one of %v)", s, followerReadsNames)
}

// SetFollowerReads makes snapshot reads from now on choose their replica
// by policy p.
func (c *Coordinator) SetFollowerReads(p FollowerReads) { c.followerReads.Store(uint32(p)) }

// followerMode reports whether a snapshot in mode may read from a closed
// epoch.
func followerMode(mode SnapshotMode) bool {
	switch mode {
	case Strong, StrongLocal, Serializable, SerializableStale:
		return true
	}
	return false
}

// followerTarget chooses the replica of range g that should serve a read of
// a snapshot in mode from its closed epoch, and how long it may wait for
// its epoch to close (about what reading at the leader instead would
// cost). ok is false when the read should go to the leader.
func (c *Coordinator) followerTarget(g *pb.RangeDescriptor, mode SnapshotMode) (node uint64, wait time.Duration, ok bool) {
	policy := FollowerReads(c.followerReads.Load())
	switch {
	case policy == FollowerReadsOff || !followerMode(mode) || len(g.GetReplicas()) == 0:
		return 0, 0, false
	case policy == FollowerReadsNearest && mode != Serializable && mode != SerializableStale:
		return 0, 0, false
	}
	net := c.dialer.Network()
	here := transport.Endpoint{Region: c.region}
	rtt := func(region string) time.Duration {
		return 2 * net.OneWayDelay(here, transport.Endpoint{Region: region})
	}
	best := time.Duration(math.MaxInt64)
	var tier []uint64 // the nearest replicas
	for _, id := range append(slices.Clone(g.GetReplicas()), g.GetNonVoters()...) {
		region := g.GetRegion()
		if nd, ok := net.Resolve(id); ok {
			region = nd.Region
		}
		switch d := rtt(region); {
		case d < best:
			best, tier = d, append(tier[:0], id)
		case d == best:
			tier = append(tier, id)
		}
	}
	leader, known := c.routes.Leader(g.GetRangeId())
	if known {
		for i, id := range tier {
			if id != leader {
				continue
			}
			if policy == FollowerReadsNearest && mode != SerializableStale || len(tier) == 1 {
				return 0, 0, false // the leader is as near: it serves with no closed epoch to wait for
			}
			tier = append(tier[:i:i], tier[i+1:]...)
			break
		}
	}
	node = tier[int(c.spread.Add(1)%uint64(len(tier)))]
	// The replica first waits, as the leader would, for its publisher to
	// show the epoch, then up to wait for a close to cover it: a leader
	// closes every ClosedEpochInterval, on its next tick.
	wait = rtt(g.GetRegion())
	if policy == FollowerReadsPreferred {
		wait += 2 * c.top.ClosedEpochInterval
	}
	return node, wait, true
}

// followerSlack bounds a follower read beyond the waits it asks for.
const followerSlack = time.Second

// followerRead asks replica node to serve req from its closed epoch,
// waiting up to wait for it to close. Any refusal or failure but ctx's end
// is left to the caller, which reads at the leader instead: a follower
// behind, restarting or gone says nothing the leader does not say better.
func (c *Coordinator) followerRead(ctx context.Context, node uint64, wait time.Duration, req *pb.SnapshotReadRequest) (*pb.SnapshotReadResponse, error) {
	conn, err := c.dialer.Conn(node)
	if err != nil {
		return nil, err
	}
	fr := proto.CloneOf(req)
	fr.Closed, fr.ClosedWaitUs = true, uint64(wait.Microseconds())
	// The replica waits at most about 2×wait (its publisher, then a close):
	// one that hangs sends the read to the leader too.
	fctx, cancel := context.WithTimeout(ctx, 2*wait+followerSlack)
	defer cancel()
	return pb.NewRangeClient(conn).SnapshotRead(fctx, fr)
}

// fromFollower serves one read of s from a follower's closed epoch when the
// policy chooses one (followerTarget). A nil response and error mean the
// read goes to the leader: no follower was chosen, or it could not serve.
// Followers serve no Linearizable read, so no check runs here.
func (s *Snapshot) fromFollower(ctx context.Context, g *pb.RangeDescriptor, req *pb.SnapshotReadRequest) (*pb.SnapshotReadResponse, error) {
	node, wait, ok := s.c.followerTarget(g, s.mode)
	if !ok {
		return nil, nil
	}
	resp, err := s.c.followerRead(ctx, node, wait, req)
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case err == nil:
		s.c.staleRoute(g, resp.GetGeneration())
		s.stats.FollowerReads++
		return resp, nil
	case ctx.Err() != nil:
		return nil, s.c.unavailable(ctx, g, err)
	case status.Code(err) == codes.NotFound:
		// The node no longer hosts the range: the cached descriptor names
		// replicas that moved. The leader's answer does not tell, so the
		// descriptor is read afresh next time.
		s.c.routes.Forget(g.GetRangeId())
	}
	// Anything else — refused as behind, timed out, unreachable — the
	// leader answers instead.
	s.stats.FollowerFallbacks++
	return nil, nil
}

// staleRoute forgets the cached descriptor g of a range whose replica
// answered at a newer generation: its replicas or non-voters may have
// moved, and follower reads choose among them (a leader's answer succeeds
// on a stale descriptor, so nothing else would refresh it).
func (c *Coordinator) staleRoute(g *pb.RangeDescriptor, generation uint64) {
	if generation > g.GetGeneration() {
		c.routes.Forget(g.GetRangeId())
	}
}
