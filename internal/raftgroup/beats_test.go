package raftgroup

import (
	"testing"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// TestHeartbeatsLandOnWholeMultiples drives a leader of three voters, its
// followers answering every append and heartbeat, through 300 ticks that
// start 3 past a multiple of heartbeatTicks and drop one tick (the loop
// was too late for it), as Group.run ticks it (alignBeats after each
// Tick, noteBeat on every message sent). After the first broadcast, whose
// phase comes from when the replica became leader, and the one after the
// dropped tick, every broadcast must fall on a whole multiple of
// heartbeatTicks, every heartbeatTicks ticks, and the leader must keep
// leading (CheckQuorum runs early only once per realignment). It fails
// without alignBeats ("broadcasts at ticks [1012 1022 …]").
func TestHeartbeatsLandOnWholeMultiples(t *testing.T) {
	st := raft.NewMemoryStorage()
	snap := &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: proto.Uint64(1), Term: proto.Uint64(1), ConfState: &raftpb.ConfState{Voters: []uint64{1, 2, 3}}}}
	if err := st.ApplySnapshot(snap); err != nil {
		t.Fatal(err)
	}
	rn, err := raft.NewRawNode(&raft.Config{ID: 1, ElectionTick: electionTicks, HeartbeatTick: heartbeatTicks, Storage: st,
		MaxSizePerMsg: 1 << 20, MaxInflightMsgs: 256, CheckQuorum: true, PreVote: true})
	if err != nil {
		t.Fatal(err)
	}
	g := &Group{rn: rn, beatAt: -1}
	var beats []int64
	// settle handles the Readys, answering for the followers.
	settle := func() {
		for rn.HasReady() {
			rd := rn.Ready()
			if rd.SoftState != nil {
				g.leading = rd.SoftState.RaftState == raft.StateLeader
			}
			if !raft.IsEmptyHardState(rd.HardState) {
				if err := st.SetHardState(rd.HardState); err != nil {
					t.Fatal(err)
				}
			}
			if err := st.Append(rd.Entries); err != nil {
				t.Fatal(err)
			}
			var replies []*raftpb.Message
			for _, m := range rd.Messages {
				g.noteBeat(m)
				reply := &raftpb.Message{From: proto.Uint64(m.GetTo()), To: proto.Uint64(1), Term: proto.Uint64(m.GetTerm())}
				switch m.GetType() {
				case raftpb.MsgPreVote:
					reply.Type = raftpb.MsgPreVoteResp.Enum()
				case raftpb.MsgVote:
					reply.Type = raftpb.MsgVoteResp.Enum()
				case raftpb.MsgApp:
					reply.Type, reply.Index = raftpb.MsgAppResp.Enum(), proto.Uint64(m.GetIndex()+uint64(len(m.GetEntries())))
				case raftpb.MsgHeartbeat:
					reply.Type = raftpb.MsgHeartbeatResp.Enum()
					if m.GetTo() == 2 {
						beats = append(beats, g.tickAt)
					}
				default:
					continue
				}
				replies = append(replies, reply)
			}
			rn.Advance(rd)
			for _, r := range replies {
				if err := rn.Step(r); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if err := rn.Campaign(); err != nil {
		t.Fatal(err)
	}
	settle()
	if !g.leading {
		t.Fatal("replica 1 did not become leader")
	}
	const start, dropped = 1003, 1150
	for at := int64(start); at < start+300; at++ {
		if at == dropped {
			continue
		}
		g.tickAt = at
		rn.Tick()
		g.alignBeats()
		settle()
		if !g.leading {
			t.Fatalf("the leader stepped down at tick %d (broadcasts at ticks %v)", at, beats)
		}
	}
	var off []int64
	afterDrop := false
	for i, b := range beats {
		first := i == 0 || (b > dropped && !afterDrop)
		afterDrop = afterDrop || b > dropped
		if !first && b%heartbeatTicks != 0 {
			off = append(off, b)
		}
	}
	if len(beats) < 25 || len(off) > 0 {
		t.Fatalf("broadcasts at ticks %v: %v off the multiples of %d", beats, off, heartbeatTicks)
	}
}
