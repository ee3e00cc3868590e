package raftgroup

import (
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
)

// TestHeartbeatsAfterAnAppendAreElided: a leader elides a heartbeat to a
// follower it sent an append within the heartbeat period (100 ms), and
// no other: not one to a follower without a recent append, not one after
// the period, never one that carries a read's context.
func TestHeartbeatsAfterAnAppendAreElided(t *testing.T) {
	g := &Group{cfg: Config{}.withDefaults()}
	t0 := time.Now()
	msg := func(typ raftpb.MessageType, to uint64, ctx []byte) *raftpb.Message {
		return &raftpb.Message{Type: typ.Enum(), To: &to, Context: ctx}
	}
	steps := []struct {
		what  string
		m     *raftpb.Message
		at    time.Duration
		elide bool
	}{
		{"a heartbeat before any append", msg(raftpb.MsgHeartbeat, 2, nil), 0, false},
		{"an append to 2", msg(raftpb.MsgApp, 2, nil), 0, false},
		{"a heartbeat to 2 50 ms after its append", msg(raftpb.MsgHeartbeat, 2, nil), 50 * time.Millisecond, true},
		{"a heartbeat to 3, which had no append", msg(raftpb.MsgHeartbeat, 3, nil), 50 * time.Millisecond, false},
		{"a read's heartbeat to 2", msg(raftpb.MsgHeartbeat, 2, []byte("read")), 60 * time.Millisecond, false},
		{"a heartbeat to 2 150 ms after its append", msg(raftpb.MsgHeartbeat, 2, nil), 150 * time.Millisecond, false},
		{"another append to 2", msg(raftpb.MsgApp, 2, nil), 160 * time.Millisecond, false},
		{"a heartbeat to 2 90 ms after it", msg(raftpb.MsgHeartbeat, 2, nil), 250 * time.Millisecond, true},
	}
	for _, s := range steps {
		if got := g.elide(s.m, t0.Add(s.at)); got != s.elide {
			t.Errorf("%s: elided %v, want %v", s.what, got, s.elide)
		}
	}
}
