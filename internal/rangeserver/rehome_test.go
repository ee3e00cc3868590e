package rangeserver

import (
	"strings"
	"testing"

	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/storage"
)

// TestRehomeEndsTheLeaseAndCopiesTheBarrier: a RehomeCmd under the current
// lease ends it and homes the range in the new region with its voters to
// come; no lease applies while they come, nor one for a node that is not a
// voter; the regional copies hold each key's newest global version at or
// below the barrier (a deleted key none), at the local epoch below the
// regional floor, and no regional read below the floor is served.
func TestRehomeEndsTheLeaseAndCopiesTheBarrier(t *testing.T) {
	e, err := storage.Open(t.TempDir(), 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	sm, err := NewStateMachine(e, &pb.RangeDescriptor{RangeId: 10, Region: "east", Replicas: []uint64{1, 2, 3}, Generation: 1})
	if err != nil {
		t.Fatal(err)
	}
	put := func(key string, epoch uint64, tomb bool) *pb.Command {
		return &pb.Command{Cmd: &pb.Command_OnePhase{OnePhase: &pb.OnePhaseCmd{TxnId: make([]byte, 16), LeaseStart: 5,
			Writes: []*pb.Write{{Key: []byte(key), Value: []byte(key), Tombstone: tomb}}, Version: &pb.VersionID{Epoch: epoch, Counter: 1},
			RegionalVersion: &pb.VersionID{Epoch: 100 + epoch, Counter: 1}}}}
	}
	rehome := &pb.Command{Cmd: &pb.Command_Rehome{Rehome: &pb.RehomeCmd{Region: "west", Barrier: 8, PrevSeq: 1, Voters: []uint64{4, 5, 6}, RegionalFloor: 40}}}
	res := apply(t, sm,
		leaseCmd(9, 5, 105, 1, 0), // not a voter
		leaseCmd(1, 5, 105, 1, 0),
		put("a", 3, false), put("b", 4, false), put("b", 6, true), put("c", 7, false),
		rehome,
		leaseCmd(4, 10, 110, 3, 2), // mid-rehome: no lease
	)
	if res[0].(Applied).LeaseGranted || !res[1].(Applied).LeaseGranted {
		t.Fatalf("leases: %+v %+v; want only the voter's granted", res[0], res[1])
	}
	if a := res[6].(Applied); a.Rejected || a.Rehomed == nil {
		t.Fatalf("rehome: %+v", a)
	}
	if res[7].(Applied).LeaseGranted {
		t.Fatal("a lease applied while the voters move")
	}
	d := sm.Descriptor()
	if d.GetRegion() != "west" || len(d.GetRehomeVoters()) != 3 || d.GetRehomeBarrier() != 8 || d.GetRehomeRegionalFloor() != 40 || sm.Lease().GetHolder() != 0 {
		t.Fatalf("after the rehome: %v, lease %v", d, sm.Lease())
	}
	var got []string
	if err := sm.Scan(RegionalVersions, nil, nil, storage.EpochStart(40), func(v storage.Version, _ storage.VersionID) bool {
		if v.Live() {
			got = append(got, string(v.Key)+"@"+v.ID.String())
		}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if want := "a@<39,1> c@<39,1>"; strings.Join(got, " ") != want {
		t.Fatalf("regional copies %q, want %q (b was deleted at or below the barrier)", strings.Join(got, " "), want)
	}
	if err := sm.checkSnapshotAge(RegionalVersions, 39); err == nil {
		t.Fatal("a regional read below the floor was not refused")
	}
	rehomeAgain := apply(t, sm, rehome)
	if !rehomeAgain[0].(Applied).Rejected {
		t.Fatal("a second rehome under the ended lease applied")
	}
}
