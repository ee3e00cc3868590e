package raftgroup

import (
	"errors"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/terroir-db/terroir/internal/storage"
)

func entries(lo, hi, term uint64) []*raftpb.Entry {
	var out []*raftpb.Entry
	for i := lo; i <= hi; i++ {
		out = append(out, &raftpb.Entry{Index: proto.Uint64(i), Term: proto.Uint64(term), Data: []byte{byte(i)}})
	}
	return out
}

// writeLog stores entries 1..10 (term 1) with commit index 8 and closes the engine.
func writeLog(t *testing.T, dir string) {
	t.Helper()
	e, err := storage.Open(dir, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	s, err := openLogStore(e, 7, []uint64{1, 2, 3})
	if err != nil {
		t.Fatal(err)
	}
	b := e.NewBatch()
	if err := s.append(b, entries(1, 10, 1)); err != nil {
		t.Fatal(err)
	}
	if err := s.setHardState(b, &raftpb.HardState{Term: proto.Uint64(1), Commit: proto.Uint64(8)}); err != nil {
		t.Fatal(err)
	}
	if err := e.Commit(b, true); err != nil {
		t.Fatal(err)
	}
}

func TestLogStoreRecoversAndTruncates(t *testing.T) {
	dir := t.TempDir()
	writeLog(t, dir)
	e, err := storage.Open(dir, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	s, err := openLogStore(e, 7, nil)
	if err != nil {
		t.Fatal(err)
	}
	if last, _ := s.LastIndex(); last != 10 {
		t.Fatalf("LastIndex = %d, want 10", last)
	}
	if _, cs, _ := s.InitialState(); len(cs.GetVoters()) != 3 {
		t.Fatalf("voters not recovered: %v", cs)
	}
	// A new leader overwrites 6..10 with 6..7 of term 2.
	b := e.NewBatch()
	if err := s.append(b, entries(6, 7, 2)); err != nil {
		t.Fatal(err)
	}
	if err := e.Commit(b, true); err != nil {
		t.Fatal(err)
	}
	if last, _ := s.LastIndex(); last != 7 {
		t.Fatalf("LastIndex after conflicting append = %d, want 7", last)
	}
	if term, _ := s.Term(7); term != 2 {
		t.Fatalf("Term(7) = %d, want 2", term)
	}
	ents, err := s.Entries(5, 8, 1<<20)
	if err != nil || len(ents) != 3 || ents[2].GetTerm() != 2 {
		t.Fatalf("Entries(5, 8) = %v, %v", ents, err)
	}
	// Compact through 5: entries below are gone, 5's term is kept.
	b = e.NewBatch()
	if err := s.compact(b, 5, 5, []byte("state")); err != nil {
		t.Fatal(err)
	}
	if err := e.Commit(b, true); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Entries(3, 6, 1<<20); !errors.Is(err, raft.ErrCompacted) {
		t.Fatalf("Entries below the snapshot = %v, want ErrCompacted", err)
	}
	if term, err := s.Term(5); err != nil || term != 1 {
		t.Fatalf("Term(5) at the snapshot = %d, %v; want 1", term, err)
	}
	snap, err := s.Snapshot()
	if err != nil || string(snap.GetData()) != string(snapshotData(0, []byte("state"))) || snap.GetMetadata().GetIndex() != 5 {
		t.Fatalf("Snapshot = %v, %v", snap, err)
	}
}

// openDamaged writes the standard log, damages it with fn, and reopens it.
func openDamaged(t *testing.T, fn func(b *pebble.Batch)) error {
	t.Helper()
	dir := t.TempDir()
	writeLog(t, dir)
	e, err := storage.Open(dir, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	b := e.NewBatch()
	fn(b)
	if err := e.Commit(b, true); err != nil {
		t.Fatal(err)
	}
	_, err = openLogStore(e, 7, nil)
	return err
}

func TestLogStoreDetectsDamage(t *testing.T) {
	for name, damage := range map[string]func(b *pebble.Batch){
		"hole at index 4":           func(b *pebble.Batch) { _ = b.Delete(entryKey(7, 4), nil) },
		"committed entries missing": func(b *pebble.Batch) { _ = b.DeleteRange(entryKey(7, 8), entryKey(7, 11), nil) }, // commit index is 8
		"garbled hard state":        func(b *pebble.Batch) { _ = b.Set(recordKey(7, recHardState), []byte{0xff, 0xff, 0xff}, nil) },
		"short truncated state":     func(b *pebble.Batch) { _ = b.Set(recordKey(7, recTruncated), []byte{1}, nil) },
	} {
		if err := openDamaged(t, damage); !errors.Is(err, storage.ErrCorrupt) {
			t.Errorf("%s: open = %v, want ErrCorrupt", name, err)
		}
	}
}

func TestLogStoreCompactionKeepsATail(t *testing.T) {
	dir := t.TempDir()
	writeLog(t, dir)
	e, err := storage.Open(dir, 1)
	if err != nil {
		t.Fatal(err)
	}
	s, err := openLogStore(e, 7, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Snapshot at 8 (applied), log truncated only through 5.
	b := e.NewBatch()
	if err := s.compact(b, 8, 5, []byte("at8")); err != nil {
		t.Fatal(err)
	}
	if err := e.Commit(b, true); err != nil {
		t.Fatal(err)
	}
	e.Close()
	if e, err = storage.Open(dir, 1); err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if s, err = openLogStore(e, 7, nil); err != nil {
		t.Fatal(err)
	}
	if first, _ := s.FirstIndex(); first != 6 {
		t.Fatalf("FirstIndex after reopen = %d, want 6", first)
	}
	if term, err := s.Term(5); err != nil || term != 1 {
		t.Fatalf("Term(5), the truncation point = %d, %v", term, err)
	}
	if ents, err := s.Entries(6, 11, 1<<20); err != nil || len(ents) != 5 {
		t.Fatalf("kept tail Entries(6, 11) = %d entries, %v", len(ents), err)
	}
	if snap, _ := s.Snapshot(); snap.GetMetadata().GetIndex() != 8 || string(snap.GetData()) != string(snapshotData(0, []byte("at8"))) {
		t.Fatalf("snapshot = %v", snap)
	}
}

func TestLogStoreEntryCacheFollowsConflicts(t *testing.T) {
	e, err := storage.Open(t.TempDir(), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	s, err := openLogStore(e, 7, []uint64{1})
	if err != nil {
		t.Fatal(err)
	}
	appendCommit := func(ents []*raftpb.Entry) {
		b := e.NewBatch()
		if err := s.append(b, ents); err != nil {
			t.Fatal(err)
		}
		if err := e.Commit(b, true); err != nil {
			t.Fatal(err)
		}
	}
	appendCommit(entries(1, 10, 1))
	appendCommit(entries(8, 9, 2)) // replaces 8..10 with 8..9 of term 2
	ents, err := s.Entries(6, 10, 1<<20)
	if err != nil || len(ents) != 4 || ents[1].GetTerm() != 1 || ents[2].GetTerm() != 2 || ents[3].GetIndex() != 9 {
		t.Fatalf("cached Entries(6, 10) = %v, %v", ents, err)
	}
	if ents, _ := s.Entries(1, 10, 1); len(ents) != 1 {
		t.Fatalf("maxSize not honoured from the cache: %d entries", len(ents))
	}
	if _, err := s.Entries(8, 11, 1<<20); !errors.Is(err, raft.ErrUnavailable) {
		t.Fatalf("Entries past the end = %v, want ErrUnavailable", err)
	}
}

// The configuration's index is stored with it and survives a restart; the
// log's last configuration change is found again when the store opens; a
// store written before configuration indexes has its stored snapshot's
// data given the index prefix (0) once.
func TestLogStoreKeepsTheConfigurationIndex(t *testing.T) {
	dir := t.TempDir()
	writeLog(t, dir)
	e, err := storage.Open(dir, 1)
	if err != nil {
		t.Fatal(err)
	}
	s, err := openLogStore(e, 7, nil)
	if err != nil {
		t.Fatal(err)
	}
	if s.ci != 0 || s.confInLog != 0 {
		t.Fatalf("fresh log: configuration index %d, last change in the log %d; want 0, 0", s.ci, s.confInLog)
	}
	b := e.NewBatch()
	cc := &raftpb.Entry{Index: proto.Uint64(11), Term: proto.Uint64(1), Type: raftpb.EntryConfChangeV2.Enum()}
	if err := s.append(b, []*raftpb.Entry{cc}); err != nil {
		t.Fatal(err)
	}
	if err := s.setConfState(b, &raftpb.ConfState{Voters: []uint64{1, 2, 4}}, 6); err != nil {
		t.Fatal(err)
	}
	if err := e.Commit(b, true); err != nil {
		t.Fatal(err)
	}
	e.Close()
	if e, err = storage.Open(dir, 1); err != nil {
		t.Fatal(err)
	}
	if s, err = openLogStore(e, 7, nil); err != nil {
		t.Fatal(err)
	}
	if s.ci != 6 || s.confInLog != 11 || len(s.cs.GetVoters()) != 3 || s.cs.GetVoters()[2] != 4 {
		t.Fatalf("reopened: configuration %v at %d, last change in the log %d; want [1 2 4] at 6, 11", s.cs.GetVoters(), s.ci, s.confInLog)
	}
	// An older store: a snapshot without the prefix, no index record.
	b = e.NewBatch()
	if err := s.put(b, recSnapshot, &raftpb.Snapshot{Data: []byte("old"), Metadata: &raftpb.SnapshotMetadata{Index: proto.Uint64(3), Term: proto.Uint64(1)}}); err != nil {
		t.Fatal(err)
	}
	if err := b.Delete(recordKey(7, recConfIndex), nil); err != nil {
		t.Fatal(err)
	}
	if err := e.Commit(b, true); err != nil {
		t.Fatal(err)
	}
	e.Close()
	for range 2 { // converted once, then as written
		if e, err = storage.Open(dir, 1); err != nil {
			t.Fatal(err)
		}
		if s, err = openLogStore(e, 7, nil); err != nil {
			t.Fatal(err)
		}
		snap := &raftpb.Snapshot{}
		if err := s.load(recSnapshot, snap); err != nil {
			t.Fatal(err)
		}
		ci, body, err := splitSnapshotData(snap.GetData())
		if err != nil || ci != 0 || string(body) != "old" || s.ci != 0 {
			t.Fatalf("older store: snapshot data %q (index %d, %v), configuration index %d; want \"old\" at 0", body, ci, err, s.ci)
		}
		e.Close()
	}
}
