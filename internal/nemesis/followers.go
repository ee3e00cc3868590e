package nemesis

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/terroir-db/terroir/client"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/topology"
)

// Follower reads and non-voting replicas (DESIGN.md §13). At the start of
// a campaign every range gets a non-voting replica in each other data
// region, and one client per region prefers followers for its snapshot
// reads (the registers workload runs on them too), so the checkers judge
// reads served from closed epochs, near and across the WAN. Four faults
// strike them: a follower starved of the log while it still answers
// reads, a non-voter moved to another node of its region, and the region
// of a non-voter cut off, after which the non-voter must serve again; and
// a follower starved of its log alone while its range idles, so that
// closes made at indexes it has not applied reach it outside the log.

// nonVoterTimeout bounds one non-voter change of a fault or of the setup.
const nonVoterTimeout = 30 * time.Second

// insideRange is a key inside the range starting at start (its start key
// itself, unless that is empty).
func insideRange(start []byte) []byte { return append(slices.Clone(start), 0) }

// nodeRegion is node id's region as the network knows it.
func (cp *campaign) nodeRegion(id uint64) string {
	n, _ := cp.c.Net.Node(id)
	return n.Region
}

// addNonVoters gives every range of the topology a non-voting replica on
// one node of each other data region.
func (cp *campaign) addNonVoters(ctx context.Context, db *client.DB) error {
	for _, g := range cp.cfg.Topology.Ranges() {
		for _, region := range cp.regions {
			if region == g.Region {
				continue
			}
			node := cp.firstNode(region)
			actx, cancel := context.WithTimeout(ctx, nonVoterTimeout)
			var err error
			for { // adding one that is there already is no error: a retry is safe
				_, err = db.AdminAddNonVoter(actx, insideRange([]byte(g.Start)), node)
				if err == nil || errors.Is(err, client.ErrMoveTarget) || actx.Err() != nil {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			cancel()
			if err != nil {
				return fmt.Errorf("nemesis: adding range %d's non-voter on node %d (%s): %w", g.ID, node, region, err)
			}
		}
	}
	return nil
}

// firstNode is the lowest-numbered node of region in the topology.
func (cp *campaign) firstNode(region string) uint64 {
	for _, n := range cp.cfg.Topology.Nodes {
		if n.Region == region {
			return n.ID
		}
	}
	return 0
}

// followerClients opens one client per data region that prefers followers.
func (cp *campaign) followerClients() ([]*client.DB, error) {
	var out []*client.DB
	for _, r := range cp.regions {
		db, err := cp.c.Client(r)
		if err != nil {
			return nil, err
		}
		db.SetFollowerReads(client.FollowerReadsPreferred)
		out = append(out, db)
	}
	return out, nil
}

// starveFollower starves a replica of a random range other than its
// leader — a follower or a non-voter — with starve: of every other node's
// messages (transport.Network.Starve), or of their Raft messages alone
// (StarveLog), while clients still reach it. It returns the node (0: none
// found).
func (cp *campaign) starveFollower(r *rand.Rand, ranges []topology.Group, starve func(node uint64)) uint64 {
	g := ranges[r.IntN(len(ranges))]
	d := cp.rangeOf(insideRange([]byte(g.Start)))
	if d == nil {
		return 0
	}
	leader := cp.c.Leader(d.GetRangeId())
	var cands []uint64
	for _, id := range append(slices.Clone(d.GetReplicas()), d.GetNonVoters()...) {
		if id != leader && cp.c.Node(id) != nil {
			cands = append(cands, id)
		}
	}
	if len(cands) == 0 {
		return 0
	}
	id := cands[r.IntN(len(cands))]
	starve(id)
	return id
}

// pickNonVoter returns a random range that has a non-voting replica, and
// one of them.
func (cp *campaign) pickNonVoter(r *rand.Rand, ranges []topology.Group) (*pb.RangeDescriptor, uint64, bool) {
	g := ranges[r.IntN(len(ranges))]
	d := cp.rangeOf(insideRange([]byte(g.Start)))
	if d == nil || len(d.GetNonVoters()) == 0 {
		return nil, 0, false
	}
	return d, d.GetNonVoters()[r.IntN(len(d.GetNonVoters()))], true
}

// moveNonVoter moves a random range's non-voting replica to another node
// of its region: the new one is added, then the old one removed. A
// refusal (the range changed, the target is down) or a retryable failure
// is no anomaly.
func (cp *campaign) moveNonVoter(ctx context.Context, r *rand.Rand, db *client.DB, ranges []topology.Group) bool {
	d, from, ok := cp.pickNonVoter(r, ranges)
	if !ok {
		return false
	}
	region := cp.nodeRegion(from)
	var spare []uint64
	for _, id := range cp.c.NodeIDs() {
		if cp.nodeRegion(id) == region && id != from && !slices.Contains(d.GetNonVoters(), id) && !cp.decommissioned[id] {
			spare = append(spare, id)
		}
	}
	if len(spare) == 0 {
		return false
	}
	to := spare[r.IntN(len(spare))]
	key := insideRange(d.GetStartKey())
	actx, cancel := context.WithTimeout(ctx, nonVoterTimeout)
	defer cancel()
	_, err := db.AdminAddNonVoter(actx, key, to)
	if err == nil {
		_, err = db.AdminRemoveNonVoter(actx, key, from)
	}
	switch {
	case err == nil:
		cp.count("non-voter moved")
		return true
	case errors.Is(err, client.ErrMoveTarget), client.IsRetryable(err), errors.Is(err, client.ErrCommitUnknown),
		errors.Is(err, context.DeadlineExceeded), ctx.Err() != nil:
		cp.count("non-voter move refused or cut short")
	default:
		cp.anomaly("moving range %d's non-voter from node %d to node %d: %v", d.GetRangeId(), from, to, err)
	}
	return false
}

// awaitNonVoterServes waits, after a cut of its region healed, until the
// range's non-voter on node serves a SerializableStale read of db's
// region by itself again; an anomaly if not within recoveryBound.
func (cp *campaign) awaitNonVoterServes(ctx context.Context, db *client.DB, d *pb.RangeDescriptor, node uint64) {
	deadline := time.Now().Add(recoveryBound)
	key := insideRange(d.GetStartKey())
	for ctx.Err() == nil {
		if cur := cp.rangeOf(key); cur == nil || !slices.Contains(cur.GetNonVoters(), node) || cp.c.Node(node) == nil {
			return // moved or merged meanwhile: nothing to judge
		}
		rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		st, err := db.View(rctx, client.SerializableStale, func(ctx context.Context, s *client.Snapshot) error {
			_, _, err := s.Get(ctx, key)
			return err
		})
		cancel()
		if err == nil && st.FollowerReads > 0 {
			cp.count("non-voter serving again after its region's cut")
			return
		}
		if time.Now().After(deadline) {
			cp.anomaly("range %d's non-voter on node %d served no read of its region %v after the cut healed (last: %v, %+v; %s)",
				d.GetRangeId(), node, recoveryBound, err, st, cp.closedState(d.GetRangeId(), node))
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// closedState describes range id's closed epoch at node and at its
// leader, for an anomaly's message.
func (cp *campaign) closedState(id, node uint64) string {
	at := func(n uint64) string {
		nd := cp.c.Node(n)
		if nd == nil {
			return "not running"
		}
		r := nd.Range(id)
		if r == nil {
			return "not hosted"
		}
		c, _ := r.ClosedEpoch(nil, nil)
		d := r.Desc()
		return fmt.Sprintf("closed %d, generation %d, replicas %v, non-voters %v", c, d.GetGeneration(), d.GetReplicas(), d.GetNonVoters())
	}
	leader := cp.c.Leader(id)
	return fmt.Sprintf("node %d: %s; leader %d: %s", node, at(node), leader, at(leader))
}

// changePlacement sets, replaces or removes a placement rule (DESIGN.md
// §13) over the register keys of a random data region, homed there — a
// global or a home rule — so the replicate queue splits at its bounds and
// adds non-voters while the load runs. A refusal is an anomaly: the rules
// it sets are well formed and never overlap.
func (cp *campaign) changePlacement(ctx context.Context, r *rand.Rand, db *client.DB) bool {
	i := r.IntN(len(cp.regions))
	prefix := cp.key(i, "nemesis-reg-")
	rule := client.PlacementRule{Prefix: prefix, Kind: client.PlacementGlobal, Home: cp.regions[i]}
	actx, cancel := context.WithTimeout(ctx, nonVoterTimeout)
	defer cancel()
	var err error
	switch r.IntN(3) {
	case 0:
		rule.Kind = client.PlacementHome
		fallthrough
	case 1:
		err = db.SetPlacement(actx, rule)
	default:
		if err = db.RemovePlacement(actx, prefix); errors.Is(err, client.ErrNoPlacementRule) {
			err = db.SetPlacement(actx, rule)
		}
	}
	switch {
	case err == nil:
		cp.count("placement rule changed")
		return true
	case client.IsRetryable(err), errors.Is(err, context.DeadlineExceeded), ctx.Err() != nil:
		cp.count("placement rule change cut short")
	default:
		cp.anomaly("changing the placement rule on %q: %v", prefix, err)
	}
	return false
}

// placementBound is how long after the faults are healed every placement
// rule may still differ from the ranges.
const placementBound = 60 * time.Second

// checkPlacement checks, once the faults are healed, that the ranges come
// to match every placement rule within placementBound.
func (cp *campaign) checkPlacement(ctx context.Context, db *client.DB) {
	deadline := time.Now().Add(placementBound)
	for {
		sts, err := db.Placements(ctx)
		var off []string
		for _, st := range sts {
			if len(st.Problems) > 0 {
				off = append(off, fmt.Sprintf("%q: %v", st.Rule.Prefix, st.Problems))
			}
		}
		if err == nil && len(off) == 0 {
			cp.count(fmt.Sprintf("placement rules matched at the end: %d", len(sts)))
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			cp.anomaly("the ranges do not match the placement rules %v after healing (%v): %v", placementBound, err, off)
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
}
