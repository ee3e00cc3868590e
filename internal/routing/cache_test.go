package routing

import (
	"context"
	"errors"
	"fmt"
	"testing"

	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
)

func desc(id uint64, start, end string, gen uint64) *pb.RangeDescriptor {
	d := &pb.RangeDescriptor{RangeId: id, StartKey: []byte(start), Generation: gen}
	if end != "" {
		d.EndKey = []byte(end)
	}
	return d
}

// resolverOf answers with fixed descriptors and counts its calls.
type resolverOf struct {
	descs []*pb.RangeDescriptor
	calls int
}

func (r *resolverOf) Resolve(context.Context, []byte) ([]*pb.RangeDescriptor, error) {
	r.calls++
	return r.descs, nil
}

func spans(parts []Part) string {
	s := ""
	for _, p := range parts {
		s += fmt.Sprintf("%d[%s,%s) ", p.Desc.GetRangeId(), p.Start, p.End)
	}
	return s
}

// TestSplitThenMerge follows a cache through a split it learns of by a
// mismatch reply (the left half, then a miss resolved for the right) and a
// merge, and checks a stale descriptor never displaces a newer one.
func TestSplitThenMerge(t *testing.T) {
	ctx := context.Background()
	res := &resolverOf{}
	c := NewCache(res, desc(10, "", "m", 1), desc(11, "m", "", 1))
	if d, _ := c.Lookup(ctx, []byte("k")); d.GetRangeId() != 10 {
		t.Fatalf("k in %d", d.GetRangeId())
	}
	// Range 10 split at "f" into 10 [,f) and 12 [f,m), generation 2; the
	// client learns of the left half from its mismatch reply.
	c.SetLeader(10, 1)
	c.Update(desc(10, "", "f", 2))
	if _, ok := c.Leader(10); !ok {
		t.Error("a range's leader hint was dropped by its own new descriptor")
	}
	res.descs = []*pb.RangeDescriptor{desc(12, "f", "m", 2)}
	d, err := c.Lookup(ctx, []byte("k"))
	if err != nil || d.GetRangeId() != 12 || res.calls != 1 {
		t.Fatalf("k after the split: %v %v (resolver calls %d); want range 12 from the resolver", d, err, res.calls)
	}
	if got := spans(must(c.Overlapping(ctx, []byte("a"), []byte("z")))); got != "10[a,f) 12[f,m) 11[m,z) " {
		t.Errorf("Overlapping(a, z) = %s", got)
	}
	if got := spans(must(c.Overlapping(ctx, []byte("g"), nil))); got != "12[g,m) 11[m,) " {
		t.Errorf("Overlapping(g, end) = %s", got)
	}
	// A stale reply (generation 1 of range 10) changes nothing.
	c.Update(desc(10, "", "m", 1))
	if d, _ := c.Lookup(ctx, []byte("k")); d.GetRangeId() != 12 {
		t.Fatalf("a stale descriptor displaced a newer one: k in %d", d.GetRangeId())
	}
	// 10 absorbs 12 at a generation above both; 12's leader hint goes.
	c.SetLeader(12, 2)
	c.Update(desc(10, "", "m", 3))
	if d, _ := c.Lookup(ctx, []byte("k")); d.GetRangeId() != 10 {
		t.Fatalf("k after the merge in %d", d.GetRangeId())
	}
	if _, ok := c.Leader(12); ok {
		t.Error("the merged-away range kept its leader hint")
	}
	if got := spans(must(c.Overlapping(ctx, nil, nil))); got != "10[,m) 11[m,) " {
		t.Errorf("Overlapping(all) = %s", got)
	}
}

func TestMissTheResolverCannotFill(t *testing.T) {
	c := NewCache(&resolverOf{descs: []*pb.RangeDescriptor{desc(11, "m", "", 1)}})
	if _, err := c.Lookup(context.Background(), []byte("a")); !errors.Is(err, ErrNoRange) {
		t.Fatalf("Lookup of an unheld key = %v, want ErrNoRange", err)
	}
}

func must(p []Part, err error) []Part {
	if err != nil {
		panic(err)
	}
	return p
}
