package raftgroup

import (
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// appendTo is an append from node 1 to node to with n entries, carrying
// commit index commit.
func appendTo(to uint64, n int, commit uint64) *raftpb.Message {
	m := &raftpb.Message{Type: raftpb.MsgApp.Enum(), From: new(uint64(1)), To: &to, Commit: &commit}
	for range n {
		m.Entries = append(m.Entries, &raftpb.Entry{})
	}
	return m
}

// sentLog records what a group handed its transport.
type sentLog []*raftpb.Message

func (s *sentLog) send(_ uint64, m *raftpb.Message) { *s = append(*s, m) }

// A LazyCommit group's leader holds a commit-only append (commitappend.go):
// an append with entries to its follower drops it, a newer commit-only
// append replaces it, and the hold's end sends what is still held, the
// newest for each follower; a group that stops leading drops what it
// holds. A group that is not LazyCommit sends every append at once.
func TestCommitOnlyAppendsWaitForTheNextAppend(t *testing.T) {
	var sent sentLog
	g := &Group{id: 10, self: 1, cfg: Config{}.withDefaults(), metrics: NewMetrics(nil), commitHold: 20 * time.Millisecond, send: sent.send}
	coalesced := func() int {
		var m dto.Metric
		if err := g.metrics.commitsCoalesced.Write(&m); err != nil {
			t.Fatal(err)
		}
		return int(m.GetCounter().GetValue())
	}
	step := func(what string, wantSent, wantCoalesced int, msgs ...*raftpb.Message) {
		t.Helper()
		g.sendAll(msgs)
		if len(sent) != wantSent || coalesced() != wantCoalesced {
			t.Fatalf("%s: %d sent, %d coalesced; want %d and %d", what, len(sent), coalesced(), wantSent, wantCoalesced)
		}
	}
	step("a commit-only append to 2", 0, 0, appendTo(2, 0, 5))
	step("an append with entries to 2", 1, 1, appendTo(2, 1, 5))
	step("commit-only appends to 2 and 3", 1, 1, appendTo(2, 0, 6), appendTo(3, 0, 6))
	step("a newer commit-only append to 2", 1, 2, appendTo(2, 0, 7))
	step("a heartbeat to 3", 2, 2, &raftpb.Message{Type: raftpb.MsgHeartbeat.Enum(), To: new(uint64(3))})
	if g.holdC == nil {
		t.Fatal("appends held, but no hold runs")
	}
	select {
	case <-g.holdC:
		g.releaseHeld()
	case <-time.After(5 * time.Second):
		t.Fatal("the hold did not end within 5 s")
	}
	if len(sent) != 4 {
		t.Fatalf("after the hold: %d sent, want 4", len(sent))
	}
	commits := map[uint64]uint64{}
	for _, m := range sent[2:] {
		commits[m.GetTo()] = m.GetCommit()
	}
	if commits[2] != 7 || commits[3] != 6 {
		t.Fatalf("the hold's end sent commits %v, want 7 to node 2 and 6 to node 3", commits)
	}
	if g.holdC != nil || len(g.held) != 0 {
		t.Fatal("still holding after the hold's end")
	}

	step("a commit-only append to 2", 4, 2, appendTo(2, 0, 8))
	g.dropHeld()
	if g.holdC != nil || len(g.held) != 0 {
		t.Fatal("still holding after dropHeld")
	}
	step("an append with entries to 2 after the drop", 5, 2, appendTo(2, 1, 9))

	eager := &Group{id: 1, self: 1, cfg: Config{}.withDefaults(), metrics: NewMetrics(nil), send: sent.send}
	sent = nil
	eager.sendAll([]*raftpb.Message{appendTo(2, 0, 5), appendTo(3, 0, 5)})
	if len(sent) != 2 || eager.holdC != nil {
		t.Fatalf("a group that is not LazyCommit: %d of 2 commit-only appends sent", len(sent))
	}
}

// A leader that hands over its leadership first sends the commit-only
// appends it holds, so that its successor knows every commit when it
// takes over.
func TestATransferSendsTheHeldAppendsFirst(t *testing.T) {
	var sent sentLog
	g := &Group{id: 10, self: 1, cfg: Config{}.withDefaults(), metrics: NewMetrics(nil), commitHold: time.Minute, send: sent.send,
		reports: make(chan func(*raft.RawNode), 1)}
	g.sendAll([]*raftpb.Message{appendTo(2, 0, 5), appendTo(3, 0, 5)})
	if len(sent) != 0 {
		t.Fatalf("%d commit-only appends sent at once, want both held", len(sent))
	}
	rn, err := raft.NewRawNode(&raft.Config{ID: 1, ElectionTick: 10, HeartbeatTick: 1, Storage: raft.NewMemoryStorage(), MaxInflightMsgs: 1})
	if err != nil {
		t.Fatal(err)
	}
	g.TransferLeadership(2)
	(<-g.reports)(rn)
	if len(sent) != 2 || g.holdC != nil {
		t.Fatalf("after TransferLeadership: %d of 2 held appends sent", len(sent))
	}
}
