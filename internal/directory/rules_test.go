package directory

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/terroir-db/terroir/internal/directory/directorypb"
)

func setRule(prefix string, kind directorypb.PlacementKind, home string) *directorypb.Command {
	return &directorypb.Command{Cmd: &directorypb.Command_SetPlacementRule{SetPlacementRule: &directorypb.SetPlacementRuleCmd{
		Rule: &directorypb.PlacementRule{Prefix: []byte(prefix), Kind: kind, Home: home}}}}
}

func removeRule(prefix string) *directorypb.Command {
	return &directorypb.Command{Cmd: &directorypb.Command_SetPlacementRule{SetPlacementRule: &directorypb.SetPlacementRuleCmd{
		Rule: &directorypb.PlacementRule{Prefix: []byte(prefix)}, Remove: true}}}
}

// rules renders the state machine's rules as "prefix:kind:home" by prefix.
func rules(sm *StateMachine) string {
	var parts []string
	for _, r := range sm.PlacementRules() {
		parts = append(parts, fmt.Sprintf("%s:%s:%s", r.GetPrefix(), KindName(r.GetKind()), r.GetHome()))
	}
	return strings.Join(parts, " ")
}

// TestPlacementRules: rules are set, replaced by prefix and removed;
// malformed, overlapping and unknown ones are refused with typed errors
// and change nothing; the rules survive a restart and a snapshot.
func TestPlacementRules(t *testing.T) {
	dir := t.TempDir()
	e, sm := open(t, dir, seed(t, "east"))
	const (
		home   = directorypb.PlacementKind_PLACEMENT_HOME
		byRow  = directorypb.PlacementKind_PLACEMENT_BY_ROW
		global = directorypb.PlacementKind_PLACEMENT_GLOBAL
	)
	for _, c := range []*directorypb.Command{setRule("users/", byRow, ""), setRule("config/", global, "east"), setRule("orders/", home, "west")} {
		if res := apply(t, e, sm, c); res != uint32(0) {
			t.Fatalf("setting a rule: %v", res)
		}
	}
	want := "config/:global:east orders/:home:west users/:by-row:"
	if got := rules(sm); got != want {
		t.Fatalf("rules %q, want %q", got, want)
	}
	for _, bad := range []struct {
		cmd  *directorypb.Command
		want error
	}{
		{setRule("", home, "east"), ErrBadPlacement},
		{setRule("x/", byRow, "east"), ErrBadPlacement},
		{setRule("x/", global, ""), ErrBadPlacement},
		{setRule("users/eu/", home, "east"), ErrPlacementOverlap}, // inside another rule
		{setRule("order", home, "east"), ErrPlacementOverlap},     // a prefix of another rule
		{setRule(strings.Repeat("k", MaxPlacementPrefix+1), home, "east"), ErrBadPlacement},
		{removeRule("nothing/"), ErrNoPlacementRule},
	} {
		res := apply(t, e, sm, bad.cmd)
		if err, ok := res.(error); !ok || !errors.Is(err, bad.want) {
			t.Errorf("%v: %v, want %v", bad.cmd, res, bad.want)
		}
	}
	if got := rules(sm); got != want {
		t.Fatalf("after refusals, rules %q, want %q unchanged", got, want)
	}
	if err := CheckPlacementRule(&directorypb.PlacementRule{Prefix: []byte("x/"), Home: "mars"}, []string{"east", "west"}); !errors.Is(err, ErrUnknownRegion) {
		t.Errorf("an unknown region: %v, want ErrUnknownRegion", err)
	}
	// The same prefix replaces its rule; removal drops it.
	apply(t, e, sm, setRule("orders/", global, "east"))
	apply(t, e, sm, removeRule("config/"))
	want = "orders/:global:east users/:by-row:"
	if got := rules(sm); got != want {
		t.Fatalf("after replace and remove, rules %q, want %q", got, want)
	}
	snap, err := sm.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	e.Close()
	e, sm = open(t, dir, seed(t, "east"))
	defer e.Close()
	if got := rules(sm); got != want {
		t.Fatalf("after a restart, rules %q, want %q", got, want)
	}
	e2, other := open(t, t.TempDir(), seed(t, "west"))
	defer e2.Close()
	b := e2.NewIndexedBatch()
	if err := other.Restore(b, snap); err != nil {
		t.Fatal(err)
	}
	if err := e2.Commit(b, true); err != nil {
		t.Fatal(err)
	}
	if got := rules(other); got != want {
		t.Fatalf("restored from a snapshot, rules %q, want %q", got, want)
	}
}
