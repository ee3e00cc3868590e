package nemesis

import (
	"bytes"
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

// withSpareNodes adds to top one node in each region that homes ranges,
// hosting nothing at first, so that replicas have somewhere to move
// (faultMoveReplica, faultMoveKill).
func withSpareNodes(top *topology.Topology) (*topology.Topology, error) {
	var next uint64
	for _, n := range top.Nodes {
		next = max(next, n.ID)
	}
	for _, region := range top.Regions {
		if !slices.ContainsFunc(top.Ranges(), func(g topology.Group) bool { return g.Region == region }) {
			continue
		}
		next++
		var err error
		// The in-process cluster binds every node to a port of its own.
		if top, err = top.WithNode(topology.Node{ID: next, Region: region, Addr: fmt.Sprintf("127.0.0.1:%d", 60000+next)}); err != nil {
			return nil, err
		}
	}
	return top, nil
}

// rangeOf returns the newest descriptor of the range holding key among the
// replicas of the running nodes.
func (cp *campaign) rangeOf(key []byte) *pb.RangeDescriptor {
	var best *pb.RangeDescriptor
	for _, id := range cp.c.NodeIDs() {
		n := cp.c.Node(id)
		if n == nil {
			continue
		}
		for _, rid := range n.RangeIDs() {
			r := n.Range(rid)
			if r == nil {
				continue
			}
			d := r.Desc()
			in := bytes.Compare(d.GetStartKey(), key) <= 0 && (len(d.GetEndKey()) == 0 || bytes.Compare(key, d.GetEndKey()) < 0)
			if in && !d.GetSubsumed() && (best == nil || d.GetGeneration() > best.GetGeneration()) {
				best = d
			}
		}
	}
	return best
}

// pickMove chooses, for the range holding key, one of its replicas and a
// node of its region that hosts none; ok false if there is none.
func (cp *campaign) pickMove(r *rand.Rand, key []byte) (d *pb.RangeDescriptor, from, to uint64, ok bool) {
	d = cp.rangeOf(key)
	if d == nil || len(d.GetReplicas()) == 0 {
		return nil, 0, 0, false
	}
	var spare []uint64
	for _, n := range cp.cfg.Topology.Nodes {
		if n.Region == d.GetRegion() && !slices.Contains(d.GetReplicas(), n.ID) && !slices.Contains(d.GetLearners(), n.ID) {
			spare = append(spare, n.ID)
		}
	}
	if len(spare) == 0 {
		return nil, 0, 0, false
	}
	return d, d.GetReplicas()[r.IntN(len(d.GetReplicas()))], spare[r.IntN(len(spare))], true
}

// moveReplica moves a replica of the range holding key through a client,
// and reports whether it moved; an anomaly is recorded if it failed in a
// way it never should. With killAfter > 0, the range's Raft leader is
// killed that long after the move began, and kill returns its ID.
func (cp *campaign) moveReplica(ctx context.Context, r *rand.Rand, db *client.DB, key []byte, killAfter time.Duration) (moved bool, killed uint64) {
	d, from, to, ok := cp.pickMove(r, key)
	if !ok {
		return false, 0
	}
	done := make(chan error, 1)
	mctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	go func() {
		_, err := db.AdminMoveReplica(mctx, key, from, to)
		done <- err
	}()
	if killAfter > 0 {
		select {
		case <-time.After(killAfter):
		case err := <-done:
			done <- err
		}
		if id := cp.c.Leader(d.GetRangeId()); id != 0 {
			if err := cp.c.KillNode(id); err != nil {
				cp.anomaly("stopping node %d during a replica move: %v", id, err)
			} else {
				killed = id
			}
		}
	}
	err := <-done
	switch {
	case err == nil:
		return true, killed
	case errors.Is(err, client.ErrMoveTarget):
		// Refused: the range changed since it was looked up (a split, an
		// earlier move), or the target is down.
	case killed != 0 || client.IsRetryable(err) || errors.Is(err, client.ErrCommitUnknown) || errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil:
	default:
		cp.anomaly("moving range %d's replica from node %d to %d: %v", d.GetRangeId(), from, to, err)
	}
	return false, killed
}

// collectBound is how long a restarted node may keep a replica a move left
// behind while it was down (a few replica GC intervals).
const collectBound = 30 * time.Second

// leaveBehind kills a replica's node of the range holding key and moves
// that replica to another running node of the region; it returns the
// killed node and the range (0: no move was possible, and the node runs).
// Restarted, the node holds a replica its range no longer names.
func (cp *campaign) leaveBehind(ctx context.Context, r *rand.Rand, db *client.DB, key []byte) (killed, rangeID uint64) {
	d, from, to, ok := cp.pickMove(r, key)
	if !ok || cp.c.Node(to) == nil || cp.c.Node(from) == nil {
		return 0, 0
	}
	if err := cp.c.KillNode(from); err != nil {
		cp.anomaly("killing node %d: %v", from, err)
		return 0, 0
	}
	// Moved or not (refused, or never through), the heal's check finds
	// whatever was left behind.
	cp.moveRetrying(ctx, db, key, from, to)
	return from, d.GetRangeId()
}

// moveRetrying moves the replica of the range holding key from node from
// to node to, again every 100 ms while the move fails in a way a retry may
// mend (the lease was on a node that is down or starved, or a reply was
// lost), for up to 15 s; it reports whether the move went through. A
// refusal (the range changed, the target went down) is final.
func (cp *campaign) moveRetrying(ctx context.Context, db *client.DB, key []byte, from, to uint64) bool {
	mctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	for {
		_, err := db.AdminMoveReplica(mctx, key, from, to)
		switch {
		case err == nil:
			return true
		case mctx.Err() != nil || errors.Is(err, client.ErrMoveTarget):
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// moveStarved starves a follower of the range holding key of the Raft log
// (starve) and moves its replica off it: the follower never learns of its
// removal, yet answers the replica GC's questions all along, its
// descriptor older than the others' from the moment the group enters the
// joint configuration that removes it. Until the group has left that
// configuration the follower is one of its outgoing voters, whose quorum
// the group still needs, and it must keep its replica
// (node/replicagc.go: leftRangeGroup); an anomaly is recorded if it is
// gone while the leader's configuration still names it as one. It
// returns the starved node and the range (0, 0: nothing was tried).
func (cp *campaign) moveStarved(ctx context.Context, r *rand.Rand, db *client.DB, key []byte, starve func(node uint64)) (starved, rangeID uint64) {
	d, from, to, ok := cp.pickMove(r, key)
	id := d.GetRangeId()
	if !ok || cp.c.Node(to) == nil || cp.c.Node(from) == nil || cp.c.Leader(id) == from || cp.c.Leader(id) == 0 {
		return 0, 0
	}
	starve(from)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if cp.moveRetrying(ctx, db, key, from, to) {
			cp.count("replica moved off a follower starved of the log")
		} else {
			cp.count("replica move off a follower starved of the log not made")
		}
	}()
	for {
		// Whether the replica is gone first, then whether the leader's
		// configuration names it: a configuration that still does, seen
		// after, did before too.
		n := cp.c.Node(from)
		gone := n != nil && n.Range(id) == nil
		if l := cp.c.Node(cp.c.Leader(id)); gone && l != nil {
			if g := l.Group(id); g != nil {
				if _, _, outgoing := g.Configuration(); slices.Contains(outgoing, from) {
					cp.anomaly("node %d dropped its replica of range %d while the range's joint configuration still names it as a voter (outgoing %v)", from, id, outgoing)
					<-done
					return from, id
				}
			}
		}
		select {
		case <-done:
			return from, id
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// awaitCollected records an anomaly if node still hosts a replica of
// range id that the range's newest descriptor does not name, collectBound
// after the fault that left it behind ended.
func (cp *campaign) awaitCollected(ctx context.Context, node, id uint64) {
	deadline := time.Now().Add(collectBound)
	for ctx.Err() == nil {
		n := cp.c.Node(node)
		if n == nil {
			return // stopped meanwhile
		}
		rep := n.Range(id)
		newest := cp.rangeByID(id)
		if rep == nil || newest == nil || slices.Contains(newest.GetReplicas(), node) || slices.Contains(newest.GetLearners(), node) {
			return
		}
		if time.Now().After(deadline) {
			cp.anomaly("node %d still hosts range %d %v after the fault ended; the range's replicas are %v (generation %d, the left-behind one's %d)",
				node, id, collectBound, newest.GetReplicas(), newest.GetGeneration(), rep.Desc().GetGeneration())
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// rangeByID returns the newest descriptor of range id among the running
// nodes' replicas (nil: none hosts it).
func (cp *campaign) rangeByID(id uint64) *pb.RangeDescriptor {
	var best *pb.RangeDescriptor
	for _, nid := range cp.c.NodeIDs() {
		if n := cp.c.Node(nid); n != nil {
			if r := n.Range(id); r != nil && (best == nil || r.Desc().GetGeneration() > best.GetGeneration()) {
				best = r.Desc()
			}
		}
	}
	return best
}
