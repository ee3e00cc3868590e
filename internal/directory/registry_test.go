package directory

import (
	"errors"
	"maps"
	"testing"
	"time"

	"github.com/terroir-db/terroir/internal/directory/directorypb"
)

func register(id uint64, region, addr string) *directorypb.Command {
	return &directorypb.Command{Cmd: &directorypb.Command_RegisterNode{RegisterNode: &directorypb.RegisterNodeCmd{
		Node: &directorypb.NodeRecord{Id: id, Region: region, Addr: addr}}}}
}

func setState(id uint64, s directorypb.NodeState) *directorypb.Command {
	return &directorypb.Command{Cmd: &directorypb.Command_SetNodeState{SetNodeState: &directorypb.SetNodeStateCmd{Id: id, State: s}}}
}

// wantErr fails unless res is an error wrapping want (nil: no error).
func wantErr(t *testing.T, what string, res any, want error) {
	t.Helper()
	err, _ := res.(error)
	if want == nil && err != nil || want != nil && !errors.Is(err, want) {
		t.Errorf("%s = %v; want %v", what, res, want)
	}
}

func states(sm *StateMachine) map[uint64]string {
	out := map[uint64]string{}
	for _, n := range sm.Nodes() {
		out[n.GetId()] = n.GetAddr() + "/" + StateName(n.GetState())
	}
	return out
}

// TestRegistry walks the node registry's commands (DESIGN.md §12): the
// file's nodes are its first records, joins and address changes are
// recorded, bad records, duplicate addresses and gone ids are refused, and
// states move live ⇄ decommissioning → gone, never leaving fewer than
// MinLiveNodes live; a restart and a snapshot keep it all.
func TestRegistry(t *testing.T) {
	dir := t.TempDir()
	e, sm := open(t, dir, seed(t, "east"))
	if got := states(sm); len(got) != 1 || got[1] != "127.0.0.1:1/live" {
		t.Fatalf("seeded registry %v; want the file's node 1", got)
	}
	wantErr(t, "join node 3", apply(t, e, sm, register(3, "east", "127.0.0.1:3")), nil)
	wantErr(t, "join node 4", apply(t, e, sm, register(4, "east", "127.0.0.1:4")), nil)
	wantErr(t, "node 4 at a new address", apply(t, e, sm, register(4, "east", "127.0.0.1:44")), nil)
	for _, bad := range []struct {
		what string
		cmd  *directorypb.Command
		want error
	}{
		{"id 0", register(0, "east", "127.0.0.1:9"), ErrBadNode},
		{"another region", register(9, "west", "127.0.0.1:9"), ErrBadNode},
		{"no port", register(9, "east", "127.0.0.1"), ErrBadNode},
		{"port 0", register(9, "east", "127.0.0.1:0"), ErrBadNode},
		{"node 3's address", register(9, "east", "127.0.0.1:3"), ErrDuplicateAddr},
		{"unknown node", setState(9, directorypb.NodeState_NODE_DECOMMISSIONING), ErrUnknownNode},
		{"live straight to gone", setState(3, directorypb.NodeState_NODE_GONE), ErrNodeState},
		{"decommission leaving two live", setState(3, directorypb.NodeState_NODE_DECOMMISSIONING), ErrTooFewNodes},
	} {
		wantErr(t, bad.what, apply(t, e, sm, bad.cmd), bad.want)
	}
	want := map[uint64]string{1: "127.0.0.1:1/live", 3: "127.0.0.1:3/live", 4: "127.0.0.1:44/live"}
	if got := states(sm); !maps.Equal(got, want) {
		t.Fatalf("after refused commands: %v; want %v", got, want)
	}
	wantErr(t, "join node 5", apply(t, e, sm, register(5, "east", "127.0.0.1:5")), nil)
	wantErr(t, "decommission 4", apply(t, e, sm, setState(4, directorypb.NodeState_NODE_DECOMMISSIONING)), nil)
	wantErr(t, "decommission 5 too", apply(t, e, sm, setState(5, directorypb.NodeState_NODE_DECOMMISSIONING)), ErrTooFewNodes)
	wantErr(t, "recommission 4", apply(t, e, sm, setState(4, directorypb.NodeState_NODE_LIVE)), nil)
	wantErr(t, "decommission 4 again", apply(t, e, sm, setState(4, directorypb.NodeState_NODE_DECOMMISSIONING)), nil)
	wantErr(t, "4 gone", apply(t, e, sm, setState(4, directorypb.NodeState_NODE_GONE)), nil)
	wantErr(t, "gone 4 back", apply(t, e, sm, setState(4, directorypb.NodeState_NODE_LIVE)), ErrNodeState)
	wantErr(t, "gone 4 rejoins", apply(t, e, sm, register(4, "east", "127.0.0.1:4")), ErrNodeGone)
	wantErr(t, "gone 4's address reused", apply(t, e, sm, register(6, "east", "127.0.0.1:44")), nil)
	want = map[uint64]string{1: "127.0.0.1:1/live", 3: "127.0.0.1:3/live", 4: "127.0.0.1:44/gone", 5: "127.0.0.1:5/live", 6: "127.0.0.1:44/live"}
	if got := states(sm); !maps.Equal(got, want) {
		t.Fatalf("registry %v; want %v", got, want)
	}

	snap, err := sm.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e, sm = open(t, dir, seed(t, "east"))
	if got := states(sm); !maps.Equal(got, want) {
		t.Errorf("after a restart: %v; want %v", got, want)
	}
	e.Close()
	e2, sm2 := open(t, t.TempDir(), seed(t, "east"))
	defer e2.Close()
	b := e2.NewBatch()
	if err := sm2.Restore(b, snap); err != nil {
		t.Fatal(err)
	}
	if err := e2.Commit(b, true); err != nil {
		t.Fatal(err)
	}
	if got := states(sm2); !maps.Equal(got, want) {
		t.Errorf("restored from a snapshot: %v; want %v", got, want)
	}
}

// TestRegistryOfAnOlderStore: a store seeded before the registry existed
// reads the file's nodes, and its first registry command writes them all,
// so a restart keeps them.
func TestRegistryOfAnOlderStore(t *testing.T) {
	dir := t.TempDir()
	old := seed(t, "east")
	old.Nodes = nil
	e, _ := open(t, dir, old) // seeded with no registry
	e.Close()
	e, sm := open(t, dir, seed(t, "east"))
	if got := states(sm); !maps.Equal(got, map[uint64]string{1: "127.0.0.1:1/live"}) {
		t.Fatalf("older store's registry %v; want the file's node 1", got)
	}
	wantErr(t, "join node 3", apply(t, e, sm, register(3, "east", "127.0.0.1:3")), nil)
	e.Close()
	old.Nodes = nil
	e, sm = open(t, dir, old) // even without the file's nodes
	defer e.Close()
	if got := states(sm); !maps.Equal(got, map[uint64]string{1: "127.0.0.1:1/live", 3: "127.0.0.1:3/live"}) {
		t.Errorf("after a restart: %v", got)
	}
}

// TestLiveness: a leader counts a node live while it heard from it within
// the timeout, and not before it heard from it in its term; gone nodes are
// never live.
func TestLiveness(t *testing.T) {
	var l liveness
	t0 := time.Unix(1000, 0)
	nodes := []*directorypb.NodeRecord{{Id: 1}, {Id: 2}, {Id: 3, State: directorypb.NodeState_NODE_GONE}}
	live := func(term uint64, at time.Time) []bool {
		var out []bool
		for _, v := range l.view(term, at, time.Second, nodes) {
			out = append(out, v.GetLive())
		}
		return out
	}
	l.beat(1, 1, t0)
	if got := live(1, t0.Add(900*time.Millisecond)); !got[0] || got[1] || got[2] {
		t.Errorf("node 1 heard, node 2 not yet: %v; want [true false false]", got)
	}
	l.beat(1, 2, t0.Add(time.Second))
	l.beat(1, 1, t0.Add(1500*time.Millisecond))
	if got := live(1, t0.Add(2100*time.Millisecond)); !got[0] || got[1] {
		t.Errorf("node 2 silent for 1.1 s: %v; want [true false false]", got)
	}
	if got := live(2, t0.Add(2200*time.Millisecond)); got[0] || got[1] {
		t.Errorf("a new term has heard from nobody: %v; want none live", got)
	}
	l.beat(2, 2, t0.Add(2300*time.Millisecond))
	if got := live(2, t0.Add(2400*time.Millisecond)); got[0] || !got[1] {
		t.Errorf("the new term heard from node 2: %v; want [false true false]", got)
	}
}
