package raftgroup

import (
	"time"

	"go.etcd.io/raft/v3/raftpb"
)

// Heartbeats a follower does not need (issue 17: an idle cluster should
// cost a small fraction of a core). etcd raft's leader heartbeats every
// follower on its clock whatever else it sends it. A group whose leader
// appends regularly — a local epoch advancing every 100 ms when idle, a
// publisher's group certifying the global epoch — sent its followers an
// append and a heartbeat in every period, and two replies.
//
// A follower hears from its leader through an append as through a
// heartbeat: either resets its election timeout, and either carries the
// leader's commit index (an append the commit it knew when it sent it;
// etcd raft sends another append as soon as its commit index advances).
// And the leader hears the follower through either reply, which is what
// CheckQuorum counts. So the leader elides a heartbeat to a follower it
// sent an append within the last heartbeat period. A heartbeat that
// carries a read's context (ReadIndex) is never elided: the read waits for
// its reply.
//
// A follower whose appends stopped (a probe lost, its flow paused) gets a
// heartbeat again one period after the last append; the reply makes the
// leader probe it again, one period later at most than before.

// elide reports whether m, about to be sent, is a heartbeat its follower
// does not need, and records the appends sent; now is the send's time.
func (g *Group) elide(m *raftpb.Message, now time.Time) bool {
	switch m.GetType() {
	case raftpb.MsgApp:
		if g.appended == nil {
			g.appended = map[uint64]time.Time{}
		}
		g.appended[m.GetTo()] = now
	case raftpb.MsgHeartbeat:
		at, ok := g.appended[m.GetTo()]
		return ok && len(m.GetContext()) == 0 && now.Sub(at) < heartbeatTicks*clockTicks*g.cfg.Tick
	}
	return false
}
