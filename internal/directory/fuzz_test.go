package directory

import (
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/terroir-db/terroir/internal/storage"
)

// FuzzDirectoryCommands applies any bytes as a directory command: no input
// panics, a refused command is ErrBadCommand, ErrBadDescriptor or
// ErrIDsExhausted and changes nothing, and the directory's descriptors stay
// sorted and disjoint.
func FuzzDirectoryCommands(f *testing.F) {
	for _, c := range []proto.Message{update(desc(10, "", "c", 2), desc(1_000_000_000, "c", "g", 2)), allocate,
		update(desc(11, "g", "m", 3)), update(desc(0, "a", "b", 1))} {
		b, _ := proto.Marshal(c)
		f.Add(b)
	}
	f.Add([]byte{0xff})
	e, err := storage.Open(f.TempDir(), 1)
	if err != nil {
		f.Fatal(err)
	}
	defer e.Close()
	top := seed(f, "east")
	f.Fuzz(func(t *testing.T, cmd []byte) {
		sm, err := NewStateMachine(e, 5, top)
		if err != nil {
			t.Fatal(err)
		}
		before := spans(sm)
		b := e.NewIndexedBatch()
		defer b.Close()
		res := sm.Apply(b, 1, cmd)
		if err, ok := res.(error); ok {
			if !errors.Is(err, ErrBadCommand) && !errors.Is(err, ErrBadDescriptor) && !errors.Is(err, ErrIDsExhausted) {
				t.Fatalf("untyped refusal: %v", err)
			}
			if spans(sm) != before {
				t.Fatalf("a refused command changed the directory: %s, was %s", spans(sm), before)
			}
			return
		}
		ds := sm.List()
		for i := 1; i < len(ds); i++ {
			if prev := ds[i-1]; len(prev.GetEndKey()) == 0 || string(prev.GetEndKey()) > string(ds[i].GetStartKey()) {
				t.Fatalf("overlapping descriptors after %x: %s", cmd, spans(sm))
			}
		}
	})
}
