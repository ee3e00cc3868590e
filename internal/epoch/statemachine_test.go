package epoch

import (
	"errors"
	"slices"
	"testing"

	"github.com/terroir-db/terroir/internal/storage"
)

func TestExcludedPublishersSurviveRestartAndSnapshot(t *testing.T) {
	dir := t.TempDir()
	e, err := storage.Open(dir, 1)
	if err != nil {
		t.Fatal(err)
	}
	sm, err := NewStateMachine(e, 7)
	if err != nil {
		t.Fatal(err)
	}
	b := e.NewBatch()
	for _, cmd := range [][]byte{EncodeExclude(30), EncodeExclude(20), EncodeAdvance(InitialEpoch), EncodeInclude(30), EncodeExclude(40)} {
		if res := sm.Apply(b, 0, cmd); res == nil {
			t.Fatal("no result")
		} else if err, ok := res.(error); ok {
			t.Fatal(err)
		}
	}
	if err := e.Commit(b, true); err != nil {
		t.Fatal(err)
	}
	want := []uint64{20, 40}
	if got := sm.ExcludedGroups(); !slices.Equal(got, want) || sm.Epoch() != InitialEpoch+1 {
		t.Fatalf("excluded %v at epoch %d, want %v at %d", got, sm.Epoch(), want, InitialEpoch+1)
	}
	snap, err := sm.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	// Reloaded from disk.
	again, err := NewStateMachine(e, 7)
	if err != nil {
		t.Fatal(err)
	}
	if got := again.ExcludedGroups(); !slices.Equal(got, want) || !again.Excluded(40) || again.Excluded(30) {
		t.Fatalf("after reload: excluded %v", got)
	}
	// Restored from the snapshot into another group.
	other, err := NewStateMachine(e, 8)
	if err != nil {
		t.Fatal(err)
	}
	b = e.NewIndexedBatch()
	if err := other.Restore(b, snap); err != nil {
		t.Fatal(err)
	}
	if got := other.ExcludedGroups(); !slices.Equal(got, want) || other.Epoch() != InitialEpoch+1 {
		t.Fatalf("after restore: excluded %v at %d", got, other.Epoch())
	}
	for _, bad := range [][]byte{snap[:5], append(append([]byte{}, snap...), 1)} {
		if err := other.Restore(e.NewIndexedBatch(), bad); !errors.Is(err, storage.ErrCorrupt) {
			t.Errorf("restore of %d bytes = %v, want ErrCorrupt", len(bad), err)
		}
	}
	e.Close()
}
