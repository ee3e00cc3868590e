package raftgroup

import (
	"time"

	"go.etcd.io/raft/v3/raftpb"
)

// Commit-only appends a follower can wait for (issue 17). When a leader's
// commit index advances, etcd raft sends each follower at once an append
// with no entries that carries it, and the follower replies: under
// YCSB-A, half the appends a range leader sent, each with a reply, and
// for each a Ready at the follower (its hard state written, the entry
// applied) just as the client's next transaction reached the leader and
// asked the followers' nodes for the epoch. The next append carries the
// commit index too. So a group whose followers need not apply at once
// (LazyCommit) holds a commit-only append for up to its CommitHold: an
// append with entries sent to the follower meanwhile supersedes it (it
// is dropped: the newer append carries a commit index at least as high),
// and so does a newer commit-only append, which is held in its place;
// otherwise it leaves when the hold ends.
//
// Raft is safe whatever messages are lost or delayed, so this changes no
// outcome, only how soon a follower applies what is committed: at most
// CommitHold later. The leader's own apply, which answers the proposer,
// is not delayed.

// LazyCommit is a StateMachine whose followers may learn of a commit up
// to CommitHold after the leader did (commitappend.go). A range is one:
// its leader serves every transaction, and a follower applies to serve
// reads at closed epochs and to be ready to lead. An epoch group is not:
// an epoch counts as advanced once a majority of replicas has applied it
// (DESIGN.md §3.1).
type LazyCommit interface {
	// CommitHold is how long the leader may hold a commit-only append to
	// a follower (positive; 0 holds none).
	CommitHold() time.Duration
}

// holdCommit reports whether m, about to be sent, is a commit-only append
// the group holds rather than sends now; an append with entries drops the
// one held for its follower, which it supersedes.
func (g *Group) holdCommit(m *raftpb.Message) bool {
	if g.commitHold <= 0 || m.GetType() != raftpb.MsgApp { // etcd raft sends no append to itself
		return false
	}
	to := m.GetTo()
	_, had := g.held[to]
	if len(m.GetEntries()) > 0 {
		if had {
			delete(g.held, to)
			g.metrics.commitsCoalesced.Inc()
			if len(g.held) == 0 {
				g.stopHold() // nothing left to release: no wakeup for it
			}
		}
		return false
	}
	if had {
		g.metrics.commitsCoalesced.Inc() // m carries a later commit index
	}
	if g.held == nil {
		g.held = map[uint64]*raftpb.Message{}
	}
	g.held[to] = m
	if g.holdC == nil {
		if g.holdTimer == nil {
			g.holdTimer = time.NewTimer(g.commitHold)
		} else {
			g.holdTimer.Reset(g.commitHold)
		}
		g.holdC = g.holdTimer.C
	}
	return true
}

// releaseHeld sends the commit-only appends still held: their hold ended,
// or their leader hands over (TransferLeadership).
func (g *Group) releaseHeld() {
	g.stopHold()
	now := time.Now()
	for to, m := range g.held {
		delete(g.held, to)
		g.sendOne(m, now)
	}
}

// dropHeld forgets the commit-only appends held (the replica stopped
// leading, or stopped): Raft counts them sent, and lost is what they are.
func (g *Group) dropHeld() {
	clear(g.held)
	g.stopHold()
}

// stopHold stops the hold's timer, if it runs. Since Go 1.23 a stopped
// timer's channel delivers nothing stale.
func (g *Group) stopHold() {
	if g.holdC != nil {
		g.holdTimer.Stop()
		g.holdC = nil
	}
}
