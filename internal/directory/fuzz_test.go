package directory

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/terroir-db/terroir/internal/directory/directorypb"
	"github.com/terroir-db/terroir/internal/storage"
)

// FuzzDirectoryCommands applies any bytes as a directory command: no input
// panics, a refused command is ErrBadCommand, ErrBadDescriptor or
// ErrIDsExhausted, ErrBadGCTTL or ErrBadProtection and changes nothing, and the directory's descriptors stay
// sorted and disjoint.
func FuzzDirectoryCommands(f *testing.F) {
	for _, c := range []proto.Message{update(desc(10, "", "c", 2), desc(1_000_000_000, "c", "g", 2)), allocate,
		update(desc(11, "g", "m", 3)), update(desc(0, "a", "b", 1)), setTTL(time.Hour), protect("a", 3, time.Minute),
		protect("", 3, time.Minute), release("a"), register(3, "east", "127.0.0.1:3"), register(0, "east", "x"),
		setState(1, directorypb.NodeState_NODE_DECOMMISSIONING), setState(1, directorypb.NodeState(7))} {
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
		state := func() string {
			return fmt.Sprintf("%s | %s | %v | %v | %s", spans(sm), protections(sm), sm.GCTTL(), states(sm), rules(sm))
		}
		before := state()
		b := e.NewIndexedBatch()
		defer b.Close()
		res := sm.Apply(b, 1, cmd)
		if err, ok := res.(error); ok {
			if !errors.Is(err, ErrBadCommand) && !errors.Is(err, ErrBadDescriptor) && !errors.Is(err, ErrIDsExhausted) &&
				!errors.Is(err, ErrBadGCTTL) && !errors.Is(err, ErrBadProtection) && !IsRegistryError(err) && !isPlacementError(err) {
				t.Fatalf("untyped refusal: %v", err)
			}
			if state() != before {
				t.Fatalf("a refused command changed the directory: %s, was %s", state(), before)
			}
			return
		}
		rs := sm.PlacementRules()
		for i, r := range rs {
			for _, o := range rs[i+1:] {
				if overlaps(r.GetPrefix(), o.GetPrefix()) {
					t.Fatalf("overlapping placement rules after %x: %s", cmd, rules(sm))
				}
			}
		}
		ds := sm.List()
		for i := 1; i < len(ds); i++ {
			if prev := ds[i-1]; len(prev.GetEndKey()) == 0 || string(prev.GetEndKey()) > string(ds[i].GetStartKey()) {
				t.Fatalf("overlapping descriptors after %x: %s", cmd, spans(sm))
			}
		}
	})
}
