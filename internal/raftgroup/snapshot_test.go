package raftgroup

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/terroir-db/terroir/internal/storage"
)

func chunks(kvs ...string) func() ([]byte, error) {
	var data []byte
	for i := 0; i+1 < len(kvs); i += 2 {
		data = storage.AppendRecord(storage.AppendRecord(data, []byte(kvs[i])), []byte(kvs[i+1]))
	}
	sent := false
	return func() ([]byte, error) {
		if sent {
			return nil, io.EOF
		}
		sent = true
		return data, nil
	}
}

// A received snapshot's data is refused, and nothing stays staged, when a
// key lies outside the spans it names or comes out of order; good data
// makes one staged file.
func TestReceivedSnapshotDataIsVetted(t *testing.T) {
	dir := t.TempDir()
	e, err := storage.Open(dir, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	h := NewHost(1, e, Config{}, nil)
	defer h.Close()
	spans := [][2][]byte{{[]byte{storage.PrefixData, 'a'}, []byte{storage.PrefixData, 'm'}}}
	staged := func() int {
		ents, _ := os.ReadDir(filepath.Join(dir, "auxiliary", "staging"))
		return len(ents)
	}
	for _, bad := range []func() ([]byte, error){
		chunks("\x03b", "1", "\x03z", "2"), // outside
		chunks("\x03c", "1", "\x03b", "2"), // out of order
		chunks("\x03c", "1", "\x03c", "2"), // repeated
	} {
		if _, err := h.writeData(spans, bad); status.Code(err) != codes.InvalidArgument {
			t.Errorf("writeData = %v, want InvalidArgument", err)
		}
	}
	if n := staged(); n != 0 {
		t.Fatalf("%d files staged after refused snapshots", n)
	}
	path, err := h.writeData(spans, chunks("\x03b", "1", "\x03c", "2"))
	if err != nil || staged() != 1 {
		t.Fatalf("good data: %q, %v, %d staged", path, err, staged())
	}
	e.RemoveStaged([]string{path})
}

// A crash after a streamed snapshot was ingested (applied and truncated at
// its index) but before Raft wrote its hard state leaves the commit index
// behind: the store opens with the commit index raised to the snapshot's.
func TestOpenAfterIngestBeforeHardState(t *testing.T) {
	dir := t.TempDir()
	writeLog(t, dir) // entries 1..10, commit 8
	e, err := storage.Open(dir, 1)
	if err != nil {
		t.Fatal(err)
	}
	h := NewHost(1, e, Config{}, nil)
	cs := &raftpb.ConfState{Voters: []uint64{1, 2, 3}}
	meta, err := h.writeMeta(7, &raftpb.Snapshot{Data: snapshotData(15, streamedMarker),
		Metadata: &raftpb.SnapshotMetadata{ConfState: cs, Index: proto.Uint64(20), Term: proto.Uint64(2)}})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Ingest([]string{meta}); err != nil {
		t.Fatal(err)
	}
	h.Close()
	e.Close()
	if e, err = storage.Open(dir, 1); err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	s, err := openLogStore(e, 7, nil)
	if err != nil {
		t.Fatalf("open after the ingest: %v", err)
	}
	if s.ci != 15 {
		t.Fatalf("after the ingest: configuration index %d, want the snapshot's 15", s.ci)
	}
	if s.hs.GetCommit() != 20 || s.hs.GetTerm() < 2 || s.applied != 20 || s.first != 21 || s.lastIndex() != 20 {
		t.Fatalf("after the ingest: hard state %v, applied %d, log [%d, %d]; want commit 20, applied 20, empty log after 20",
			s.hs, s.applied, s.first, s.lastIndex())
	}
	if _, err := s.Entries(10, 11, 1<<20); !errors.Is(err, raft.ErrCompacted) {
		t.Fatalf("entry 10 after the ingest: %v, want compacted", err)
	}
}
