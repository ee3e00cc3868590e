package directory_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/directory"
	"github.com/terroir-db/terroir/internal/localcluster"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/topology"
)

// countingResolver counts the misses the directory could not answer.
type countingResolver struct{ calls atomic.Int64 }

func (r *countingResolver) Resolve(context.Context, []byte) ([]*pb.RangeDescriptor, error) {
	r.calls.Add(1)
	return nil, fmt.Errorf("the fallback was asked")
}

// shape renders descriptors as "[start,end)" in key order.
func shape(ds []*pb.RangeDescriptor) string {
	var parts []string
	for _, d := range ds {
		parts = append(parts, fmt.Sprintf("[%s,%s)", d.GetStartKey(), d.GetEndKey()))
	}
	return strings.Join(parts, " ")
}

// waitFor polls the region's directory until it lists want.
func waitFor(t *testing.T, dir *directory.Client, want string) []*pb.RangeDescriptor {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		ds, err := dir.List(ctx)
		cancel()
		if err == nil && shape(ds) == want {
			return ds
		}
		if time.Now().After(deadline) {
			t.Fatalf("directory lists %s (%v), want %s", shape(ds), err, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestDirectoryFollowsSplitsMergesAndRestarts: splits and merges reach the
// directory, which allocates the new ranges' IDs from its region's block and
// answers routing by itself; a restarted cluster keeps the directory as the
// log made it, not as the topology file seeds it.
func TestDirectoryFollowsSplitsMergesAndRestarts(t *testing.T) {
	c := localcluster.StartT(t, "../../examples/one-region.yaml", localcluster.Options{})
	g := c.Topology.GroupsOfKind(topology.KindDirectory, "us-east1")[0]
	dir := directory.NewClient(c.Dialer("us-east1"), g)
	waitFor(t, dir, "[,m) [m,)")
	db, err := c.Client("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, k := range []string{"c", "p"} {
		if err := db.AdminSplit(ctx, []byte(k)); err != nil {
			t.Fatal(err)
		}
	}
	ds := waitFor(t, dir, "[,c) [c,m) [m,p) [p,)")
	for _, d := range ds {
		if id := d.GetRangeId(); !bytes.Equal(d.GetStartKey(), nil) && string(d.GetStartKey()) != "m" &&
			(id < topology.MaxGroupID || id >= 2*topology.MaxGroupID) {
			t.Errorf("range %d at %q: not from us-east1's block of IDs [%d, %d)", id, d.GetStartKey(), uint64(topology.MaxGroupID), uint64(2*topology.MaxGroupID))
		}
	}

	// A resolver that only the directory serves.
	fallback := &countingResolver{}
	r := directory.NewResolver(c.Topology, "us-east1", directory.NewDirectories(c.Topology, c.Dialer("us-east1")), fallback)
	for key, want := range map[string]string{"a": "[,c)", "d": "[c,m)", "n": "[m,p)", "z": "[p,)"} {
		got, err := r.Resolve(ctx, []byte(key))
		if err != nil || len(got) == 0 || shape(got[:1]) != want {
			t.Fatalf("Resolve(%q) = %s, %v; want %s first", key, shape(got), err, want)
		}
	}
	if n := fallback.calls.Load(); n != 0 {
		t.Fatalf("the fallback was asked %d times with the directory up", n)
	}

	if _, err := db.AdminMerge(ctx, []byte("a")); err != nil {
		t.Fatal(err)
	}
	merged := waitFor(t, dir, "[,m) [m,p) [p,)")
	if merged[0].GetGeneration() <= ds[0].GetGeneration() {
		t.Fatalf("merged range at generation %d, its halves were at %d", merged[0].GetGeneration(), ds[0].GetGeneration())
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	for _, id := range c.NodeIDs() {
		if err := c.StopNode(id); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []uint64{1, 2, 3} {
		if err := c.RestartNode(id); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, dir, "[,m) [m,p) [p,)")
	// A fresh client routes by the directory to the ranges the splits made.
	db, err = c.Client("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, k := range []string{"a", "n", "q"} {
		if err := db.Update(ctx, func(ctx context.Context, tx *client.Txn) error { return tx.Put(ctx, []byte(k), []byte("v")) }); err != nil {
			t.Fatalf("write %q after the restart: %v", k, err)
		}
	}
}

// TestReconciliationRepairsALostWrite: when the directory loses a range's
// descriptor (here, a subsumed descriptor written by hand; in life, a write
// its leader never got to make), the range's leader writes it back.
func TestReconciliationRepairsALostWrite(t *testing.T) {
	c := localcluster.StartT(t, "../../examples/one-region.yaml", localcluster.Options{})
	g := c.Topology.GroupsOfKind(topology.KindDirectory, "us-east1")[0]
	d, err := c.NodeDialer(1) // writing a descriptor is a node's action
	if err != nil {
		t.Fatal(err)
	}
	dir := directory.NewClient(d, g)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ds := waitFor(t, dir, "[,m) [m,)")
	lost := &pb.RangeDescriptor{RangeId: ds[1].GetRangeId(), StartKey: ds[1].GetStartKey(), Region: "us-east1", Generation: ds[1].GetGeneration(), Subsumed: true}
	if n, err := dir.Update(ctx, lost); err != nil || n != 1 {
		t.Fatalf("dropping range %d by hand: %d, %v", lost.GetRangeId(), n, err)
	}
	waitFor(t, dir, "[,m)")
	waitFor(t, dir, "[,m) [m,)") // within a reconciliation interval
}
