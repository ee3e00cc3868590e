package epoch

import (
	"testing"

	"github.com/terroir-db/terroir/internal/storage"
)

// FuzzEpochCommands: any log entry and any snapshot an epoch group might be
// handed decode without a panic, and a bad one changes nothing.
func FuzzEpochCommands(f *testing.F) {
	e, err := storage.Open(f.TempDir(), 1)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { e.Close() })
	f.Add(EncodeAdvance(1), []byte{0, 0, 0, 0, 0, 0, 0, 5})
	f.Add(EncodePublish(9), []byte{0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 23})
	f.Add(EncodeExclude(23), []byte{1})
	f.Add(EncodeNop(), []byte{})
	f.Fuzz(func(t *testing.T, cmd, snap []byte) {
		sm, err := NewStateMachine(e, 7)
		if err != nil {
			t.Fatal(err)
		}
		before := sm.Epoch()
		b := e.NewIndexedBatch()
		defer b.Close()
		if _, _, err := DecodeCommand(cmd); err != nil {
			if _, isErr := sm.Apply(b, 1, cmd).(error); !isErr || sm.Epoch() != before {
				t.Fatalf("a bad command %x was applied", cmd)
			}
		} else {
			sm.Apply(b, 1, cmd)
		}
		_ = sm.Restore(b, snap)
	})
}
