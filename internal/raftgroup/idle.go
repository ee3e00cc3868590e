package raftgroup

import (
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
)

// The idle pace of a group's Raft clock (issue 17: an idle cluster should
// cost a small fraction of a core). A group that has had nothing but
// heartbeats and reads for a second — an idle range, directory or transaction-state
// group — ticks its Raft clock once every idleClockFactor periods instead
// of every period. Its leader then heartbeats every 300 ms rather than
// 100 ms, and its followers campaign after 0.9–1.65 s without a leader
// rather than 0.3–0.55 s. Heartbeats and their replies were most of what
// an idle cluster's nodes sent one another: the demo's eight idle groups
// sent 320 of its 926 Raft messages a second.
//
// This is CockroachDB's quiescence made gentler: a quiesced range stops
// ticking and relies on node liveness to learn that its leader died; here
// the clock only slows, so Raft's own heartbeats and election timeout still
// detect a dead leader, within 1.65 s. No safety property depends on the
// pace: Raft's safety holds whatever its timing, and a slower clock only
// delays an election.
//
// Anything but a heartbeat or a read wakes a replica at once: a proposal, a
// report, a message of another type (an append, a vote), entries to store
// or apply, a change of leader. A leader that wakes sends its append at
// once, which wakes its followers; so a write to an idle group waits for
// no tick, and the group is at its full pace again within one message. A
// read (ReadIndex) needs no tick either: the leader confirms its
// leadership with a round of heartbeats it sends at once.
//
// A follower idles after idleAfterFollower quiet periods, a leader after
// idleAfterLeader: a follower's last activity (the append that told it the
// leader's last commit) comes after the leader's, so followers idle first.
// A range whose lease is renewed every few seconds thus spends most of its
// time at the idle pace. A follower still at the full pace
// (it restarted, or a vote woke it) may time out between two idle
// heartbeats; its pre-vote then wakes the leader, which refuses it, and the
// other follower, which heard from the leader within its timeout, refuses
// it too (PreVote with CheckQuorum), so no election follows.
const (
	idleClockFactor   = 3
	idleAfterFollower = 10 // periods of the Raft clock: 0.5 s at the default Tick
	idleAfterLeader   = 20 // 1 s
)

// idlePace is a replica's count of quiet periods and whether its clock
// runs at the idle pace. The group's goroutine alone uses it.
type idlePace struct {
	quiet int  // periods in a row with nothing but heartbeats and reads
	idle  bool // the Raft clock ticks once every idleClockFactor periods
	phase int  // while idle: periods since the Raft clock last ticked
}

// wake notes activity: the clock returns to its full pace. It reports
// whether the replica was idle.
func (p *idlePace) wake() bool {
	was := p.idle
	*p = idlePace{}
	return was
}

// period advances one period of the Raft clock and reports whether Raft
// should tick in it; mayIdle is asked, once the replica has been quiet long
// enough for its role, whether it may idle now.
func (p *idlePace) period(mayIdle func(quiet int) bool) (tick, idled bool) {
	if p.idle {
		p.phase++
		if p.phase < idleClockFactor {
			return false, false
		}
		p.phase = 0
		return true, false
	}
	p.quiet++
	if p.quiet >= idleAfterFollower && mayIdle(p.quiet) {
		p.idle, p.phase = true, 0
		return true, true
	}
	return true, false
}

// wakes reports whether a message of type t, received, is activity: every
// type but a heartbeat, a read and their replies.
func wakes(t raftpb.MessageType) bool {
	switch t {
	case raftpb.MsgHeartbeat, raftpb.MsgHeartbeatResp, raftpb.MsgReadIndex, raftpb.MsgReadIndexResp:
		return false
	}
	return true
}

// mayIdle reports whether the replica may idle after quiet periods with
// nothing but heartbeats and reads: a follower that knows its leader, after
// idleAfterFollower; a leader with no proposal or read waiting, whose
// every entry is committed, applied and matched by every replica, after
// idleAfterLeader. Candidates never idle.
func (g *Group) mayIdle(quiet int) bool {
	st := g.rn.BasicStatus()
	switch st.RaftState {
	case raft.StateFollower:
		return st.Lead != raft.None
	case raft.StateLeader:
		if quiet < idleAfterLeader || len(g.waiters) > 0 || len(g.pendingReads) > 0 || st.LeadTransferee != raft.None {
			return false
		}
		last := g.ls.lastIndex()
		if st.HardState.GetCommit() != last || st.Applied != last {
			return false
		}
		caughtUp := true
		g.rn.WithProgress(func(id uint64, _ raft.ProgressType, pr tracker.Progress) {
			if pr.Match != last || pr.State != tracker.StateReplicate {
				caughtUp = false
			}
		})
		return caughtUp
	}
	return false
}
