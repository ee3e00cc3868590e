package storage

import (
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// TestWriteStallsCountEachStallAndItsLength: Pebble's begin and end events
// make one stall whose length is the time between them; a stall under way
// counts up to now; an end without a begin counts nothing.
func TestWriteStallsCountEachStallAndItsLength(t *testing.T) {
	s := &stalls{}
	var l pebble.EventListener
	s.listen(&l)
	if n, d := s.read(); n != 0 || d != 0 {
		t.Fatalf("before any stall: %d stalls, %v; want none", n, d)
	}
	l.WriteStallEnd() // no begin: ignored
	if n, _ := s.read(); n != 0 {
		t.Fatalf("an end without a begin counted %d stalls", n)
	}
	l.WriteStallBegin(pebble.WriteStallBeginInfo{Reason: "memtable count limit reached"})
	time.Sleep(20 * time.Millisecond)
	if n, d := s.read(); n != 1 || d < 20*time.Millisecond {
		t.Fatalf("during a stall: %d stalls, %v; want 1, at least 20ms", n, d)
	}
	time.Sleep(10 * time.Millisecond)
	l.WriteStallEnd()
	n, first := s.read()
	if n != 1 || first < 30*time.Millisecond {
		t.Fatalf("after a stall: %d stalls, %v; want 1, at least 30ms", n, first)
	}
	time.Sleep(10 * time.Millisecond)
	if _, d := s.read(); d != first {
		t.Fatalf("an ended stall grew from %v to %v", first, d)
	}
	l.WriteStallBegin(pebble.WriteStallBeginInfo{Reason: "L0 file count limit exceeded"})
	l.WriteStallEnd()
	if n, d := s.read(); n != 2 || d < first {
		t.Fatalf("after a second stall: %d stalls, %v; want 2, at least %v", n, d, first)
	}
}

// TestAnOpenStoreReportsNoStalls: a fresh store's engine is wired to count
// stalls and has none.
func TestAnOpenStoreReportsNoStalls(t *testing.T) {
	e, err := Open(t.TempDir(), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if n, d := e.WriteStalls(); n != 0 || d != 0 {
		t.Fatalf("a fresh store: %d stalls, %v", n, d)
	}
}
