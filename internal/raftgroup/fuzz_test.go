package raftgroup

import (
	"errors"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/terroir-db/terroir/internal/storage"
)

// FuzzOpenLogStore stores arbitrary bytes as a group's on-disk Raft records
// (hard state, conf state, truncated state, applied index, snapshot, two log
// entries) and opens the log: it must not panic, and any failure must be
// storage.ErrCorrupt. A log that opens must answer its queries without panic.
func FuzzOpenLogStore(f *testing.F) {
	ent := func(i, term uint64) []byte {
		b, _ := proto.Marshal(&raftpb.Entry{Index: proto.Uint64(i), Term: proto.Uint64(term), Data: []byte("x")})
		return b
	}
	hs, _ := proto.Marshal(&raftpb.HardState{Term: proto.Uint64(1), Commit: proto.Uint64(2)})
	cs, _ := proto.Marshal(&raftpb.ConfState{Voters: []uint64{1, 2, 3}})
	f.Add(hs, cs, []byte(nil), []byte(nil), []byte(nil), ent(1, 1), ent(2, 1))
	f.Add([]byte{0xff}, []byte{1}, []byte{1, 2, 3}, []byte{9}, []byte{0x0a, 0x80}, ent(3, 1), ent(1, 9))
	e, err := storage.Open(f.TempDir(), 1)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { e.Close() })
	var group uint64
	f.Fuzz(func(t *testing.T, hs, cs, trunc, applied, snap, ent1, ent2 []byte) {
		group++ // a fresh group per input
		b := e.NewBatch()
		for rec, v := range map[byte][]byte{recHardState: hs, recConfState: cs, recTruncated: trunc, recApplied: applied, recSnapshot: snap} {
			if v != nil {
				if err := b.Set(recordKey(group, rec), v, nil); err != nil {
					t.Fatal(err)
				}
			}
		}
		for i, v := range [][]byte{ent1, ent2} {
			if err := b.Set(entryKey(group, uint64(i+1)), v, nil); err != nil {
				t.Fatal(err)
			}
		}
		if err := e.Commit(b, false); err != nil {
			t.Fatal(err)
		}
		s, err := openLogStore(e, group, []uint64{1, 2, 3})
		if err != nil {
			if !errors.Is(err, storage.ErrCorrupt) {
				t.Fatalf("open failed with %v, want ErrCorrupt", err)
			}
			return
		}
		first, _ := s.FirstIndex()
		last, _ := s.LastIndex()
		if _, err := s.Entries(first, last+1, 1<<20); err != nil && !errors.Is(err, storage.ErrCorrupt) {
			t.Fatalf("Entries(%d, %d) = %v", first, last+1, err)
		}
		if _, err := s.Term(last); err != nil {
			t.Fatalf("Term(last index %d) = %v", last, err)
		}
		if _, err := s.Snapshot(); err != nil && !errors.Is(err, storage.ErrCorrupt) {
			t.Fatalf("Snapshot = %v", err)
		}
		_, _, _ = s.InitialState()
	})
}
