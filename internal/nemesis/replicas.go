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
