package epoch

import (
	"context"
	"encoding/binary"
	"errors"
	"slices"
	"testing"
	"time"

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
	for _, cmd := range [][]byte{EncodeExclude(30), EncodeExclude(20), EncodeAdvance(InitialEpoch), EncodeInclude(30), EncodeExclude(40), EncodeExclude(20)} {
		if res := sm.Apply(b, 0, cmd); res == nil {
			t.Fatal("no result")
		} else if err, ok := res.(error); ok {
			t.Fatal(err)
		}
	}
	if err := e.Commit(b, true); err != nil {
		t.Fatal(err)
	}
	// 20 was excluded at the initial epoch (excluding it again keeps that),
	// 40 after the advance.
	want, wantSince := []uint64{20, 40}, []uint64{InitialEpoch, InitialEpoch + 1}
	check := func(when string, sm *StateMachine) {
		t.Helper()
		if got, since := sm.ExcludedGroups(); !slices.Equal(got, want) || !slices.Equal(since, wantSince) || sm.Epoch() != InitialEpoch+1 {
			t.Fatalf("%s: excluded %v since %v at epoch %d, want %v since %v at %d", when, got, since, sm.Epoch(), want, wantSince, InitialEpoch+1)
		}
	}
	check("applied", sm)
	snap, err := sm.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	// Reloaded from disk.
	again, err := NewStateMachine(e, 7)
	if err != nil {
		t.Fatal(err)
	}
	check("after reload", again)
	if !again.Excluded(40) || again.Excluded(30) {
		t.Fatal("after reload: Excluded disagrees with ExcludedGroups")
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
	check("after restore", other)
	// A snapshot from before the epochs were kept: groups alone, since 0.
	legacy := append(append([]byte{}, snap[:8]...), 0, 0, 0, 0, 0, 0, 0, 20)
	if err := other.Restore(e.NewIndexedBatch(), legacy); err != nil {
		t.Fatal(err)
	}
	if got, since := other.ExcludedGroups(); !slices.Equal(got, []uint64{20}) || !slices.Equal(since, []uint64{0}) {
		t.Fatalf("legacy snapshot restored as %v since %v", got, since)
	}
	for _, bad := range [][]byte{snap[:5], append(append([]byte{}, snap...), 1)} {
		if err := other.Restore(e.NewIndexedBatch(), bad); !errors.Is(err, storage.ErrCorrupt) {
			t.Errorf("restore of %d bytes = %v, want ErrCorrupt", len(bad), err)
		}
	}
	e.Close()
}

// TestWaitForWakesAtTheEpoch: WaitFor returns at once for an epoch already
// applied, wakes when an apply (or a snapshot's restore) reaches the
// epoch — not at an earlier change — and returns the applied epoch when
// its context ends first.
func TestWaitForWakesAtTheEpoch(t *testing.T) {
	e, err := storage.Open(t.TempDir(), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	sm, err := NewStateMachine(e, 7)
	if err != nil {
		t.Fatal(err)
	}
	if got := sm.WaitFor(context.Background(), InitialEpoch); got != InitialEpoch {
		t.Fatalf("WaitFor(applied) = %d, want %d", got, InitialEpoch)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	got := sm.WaitFor(ctx, InitialEpoch+1)
	cancel()
	if got != InitialEpoch {
		t.Fatalf("WaitFor with nothing applied = %d, want %d once its context ended", got, InitialEpoch)
	}
	done := make(chan uint64, 1)
	go func() { done <- sm.WaitFor(context.Background(), InitialEpoch+2) }()
	b := e.NewBatch()
	defer b.Close()
	sm.Apply(b, 0, EncodeAdvance(InitialEpoch))
	select {
	case got := <-done:
		t.Fatalf("WaitFor(%d) returned %d at an earlier epoch", InitialEpoch+2, got)
	case <-time.After(20 * time.Millisecond):
	}
	sm.Apply(b, 0, EncodeAdvance(InitialEpoch+1))
	select {
	case got := <-done:
		if got != InitialEpoch+2 {
			t.Fatalf("WaitFor woke at %d, want %d", got, InitialEpoch+2)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("WaitFor did not wake when the epoch was applied")
	}
	go func() { done <- sm.WaitFor(context.Background(), 100) }()
	snap := binary.BigEndian.AppendUint64(nil, 100)
	if err := sm.Restore(b, snap); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-done:
		if got != 100 {
			t.Fatalf("WaitFor woke at %d after a restore to 100", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("WaitFor did not wake at a restore")
	}
}
