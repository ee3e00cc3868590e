package raftgroup

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/terroir-db/terroir/internal/storage"
	"github.com/terroir-db/terroir/internal/transport/transportpb"
)

// indexSM is a state machine that stores nothing and answers each command
// with its log index.
type indexSM struct{}

func (indexSM) Apply(_ *pebble.Batch, index uint64, _ []byte) any { return index }
func (indexSM) Snapshot() ([]byte, error)                         { return nil, nil }
func (indexSM) Restore(*pebble.Batch, []byte) error               { return nil }

// directSender hands a node's Raft messages straight to the other hosts of
// the test, in process.
type directSender struct {
	self  uint64
	hosts map[uint64]*Host
}

func (s *directSender) Send(group uint64, m *raftpb.Message) {
	if h := s.hosts[m.GetTo()]; h != nil {
		h.HandleRaft(s.self, []*transportpb.RaftEnvelope{{GroupId: group, Msg: proto.Clone(m).(*raftpb.Message)}})
	}
}

func (s *directSender) SendSnapshot(context.Context, uint64, *transportpb.SnapshotChunk, func(func([]byte) error) error) error {
	return errors.New("no snapshots in this test")
}

// A leader applies the entries a Ready commits, and answers their
// proposers, while the fsync of the entries that Ready appends is still
// running (commitAppend's overlap): with the leader's fsyncs held, a
// command the followers have made durable is answered, though the
// command proposed after it waits for the held fsync.
func TestALeaderAppliesWhileItsAppendSyncs(t *testing.T) {
	const group = 7
	voters := []uint64{1, 2, 3}
	hosts, engines := map[uint64]*Host{}, map[uint64]*storage.Engine{}
	for _, id := range voters {
		e, err := storage.OpenCrashable(t.TempDir(), id)
		if err != nil {
			t.Fatal(err)
		}
		h := NewHost(id, e, Config{}, nil)
		if _, err := h.AddGroup(group, voters, indexSM{}); err != nil {
			t.Fatal(err)
		}
		hosts[id], engines[id] = h, e
	}
	for _, id := range voters {
		hosts[id].Start(&directSender{self: id, hosts: hosts})
	}
	t.Cleanup(func() {
		for _, id := range voters {
			hosts[id].Close()
			_ = engines[id].Close()
		}
	})
	leader := hosts[1].Group(group)
	leader.Campaign()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("after 5 s: %s", what)
			}
		}
	}
	waitFor("replica 1 does not lead", leader.IsLeader)
	if _, err := leader.Propose(ctx, []byte("first")); err != nil {
		t.Fatal(err)
	}
	propose := func(cmd string) chan error {
		done := make(chan error, 1)
		go func() {
			_, err := leader.Propose(ctx, []byte(cmd))
			done <- err
		}()
		return done
	}

	hold := engines[1].HoldSyncs()
	defer hold.Release()
	// a's Ready: the leader sends a to the followers, then its fsync waits.
	a := propose("a")
	waitFor("the leader's fsync of a did not come to the hold", func() bool { return hold.Waiting() > 0 })
	// Both followers acknowledge a, and b waits to be proposed: the
	// leader's next Ready commits a and appends b.
	waitFor("the followers did not acknowledge a", func() bool { return len(leader.inbox) >= 2 })
	b := propose("b")
	waitFor("b was not queued", func() bool { return len(leader.props) > 0 })
	hold.Pass()
	waitFor("the leader's fsync of b did not come to the hold", func() bool { return hold.Waiting() > 0 })
	select {
	case err := <-a:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("a, committed, was not answered while the fsync of the entries after it was held")
	}
	select {
	case err := <-b:
		t.Fatalf("b was answered (err %v) before the leader's fsync of it", err)
	default:
	}
	hold.Release()
	if err := <-b; err != nil {
		t.Fatal(err)
	}
}
