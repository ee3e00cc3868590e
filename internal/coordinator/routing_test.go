package coordinator_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/terroir-db/terroir/internal/coordinator"
	"github.com/terroir-db/terroir/internal/localcluster"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// staleRoutes is what a client would cache had range 10 of
// examples/one-region.yaml ([, m)) once reached "t": it sends keys of
// range 11 to range 10.
func staleRoutes() []*pb.RangeDescriptor {
	return []*pb.RangeDescriptor{
		{RangeId: 10, EndKey: []byte("t"), Region: "us-east1", Replicas: []uint64{1, 2, 3}, Generation: 1},
		{RangeId: 11, StartKey: []byte("t"), Region: "us-east1", Replicas: []uint64{1, 2, 3}, Generation: 1},
	}
}

// startCoordinator starts examples/one-region.yaml and a coordinator in
// us-east1, closed with the test, and a context of 30 s.
func startCoordinator(t *testing.T) (*localcluster.Cluster, *coordinator.Coordinator, context.Context) {
	c := localcluster.StartT(t, "../../examples/one-region.yaml", localcluster.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	coord, err := coordinator.New(c.Topology, "us-east1", c.Dialer("us-east1"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(coord.Close)
	return c, coord, ctx
}

// TestStaleRoutingIsRefreshed: a coordinator whose descriptor cache is stale
// sends reads, writes and scans to the wrong range; the range answers with a
// typed mismatch carrying its descriptor, the coordinator refreshes its cache
// and routes again, and the caller never sees the mismatch (DESIGN.md §11).
func TestStaleRoutingIsRefreshed(t *testing.T) {
	_, coord, ctx := startCoordinator(t)
	coordinator.SetRoutes(coord, staleRoutes()...)
	tx := coord.Begin(0)
	for _, k := range []string{"apple", "pear", "zebra"} { // pear: range 11, cached as 10's
		if err := tx.Put(ctx, []byte(k), []byte("v-"+k)); err != nil {
			t.Fatalf("Put %s through a stale cache: %v", k, err)
		}
	}
	if _, err := tx.Commit(ctx); err != nil {
		t.Fatalf("Commit: %v", err)
	}

	coordinator.SetRoutes(coord, staleRoutes()...)
	tx = coord.Begin(0)
	if v, ok, err := tx.Get(ctx, []byte("pear")); err != nil || !ok || string(v) != "v-pear" {
		t.Fatalf("Get pear through a stale cache = %q %v %v", v, ok, err)
	}
	coordinator.SetRoutes(coord, staleRoutes()...)
	kvs, err := tx.Scan(ctx, []byte("a"), nil, 0)
	if err != nil || len(kvs) != 3 || string(kvs[1].Key) != "pear" {
		t.Fatalf("Scan through a stale cache = %v, %v; want apple, pear, zebra", kvs, err)
	}
	if _, err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	coordinator.SetRoutes(coord, staleRoutes()...)
	s, err := coord.BeginSnapshot(ctx, coordinator.Strong, 0)
	if err != nil {
		t.Fatal(err)
	}
	if kvs, err := s.Scan(ctx, []byte("b"), []byte("zz"), 0); err != nil || len(kvs) != 2 {
		t.Fatalf("snapshot Scan through a stale cache = %v, %v; want pear, zebra", kvs, err)
	}
	if _, err := s.Finish(); err != nil {
		t.Fatal(err)
	}
}

// TestMismatchReplyCarriesTheDescriptor: a range never cuts a scan to its
// span silently, nor serves a key outside it: it answers OutOfRange with its
// current descriptor, and executes nothing.
func TestMismatchReplyCarriesTheDescriptor(t *testing.T) {
	c, coord, ctx := startCoordinator(t)
	tx := coord.Begin(0)
	for _, k := range []string{"a-warm-up", "warm-up"} { // a serving leader for both ranges
		if _, _, err := tx.Get(ctx, []byte(k)); err != nil {
			t.Fatal(err)
		}
	}
	_ = tx.Abort(ctx)
	conn, err := c.Dialer("us-east1").Conn(c.Leader(10))
	if err != nil {
		t.Fatal(err)
	}
	rc := pb.NewRangeClient(conn)
	meta := &pb.TxnMeta{Id: make([]byte, 16), Priority: 1, TxnStateGroup: 2}
	for name, call := range map[string]func() error{
		"scan past the end": func() error {
			_, err := rc.Scan(ctx, &pb.ScanRequest{RangeId: 10, Txn: meta, Start: []byte("a"), End: []byte("z")})
			return err
		},
		"scan to the end of the key space": func() error {
			_, err := rc.Scan(ctx, &pb.ScanRequest{RangeId: 10, Txn: meta, Start: []byte("a")})
			return err
		},
		"lock outside": func() error {
			_, err := rc.Lock(ctx, &pb.LockRequest{RangeId: 10, Txn: meta, Key: []byte("pear")})
			return err
		},
		"snapshot read outside": func() error {
			_, err := rc.SnapshotRead(ctx, &pb.SnapshotReadRequest{RangeId: 10, Start: []byte("pear"), At: 1})
			return err
		},
	} {
		st := status.Convert(call())
		var got *pb.RangeMismatch
		for _, d := range st.Details() {
			if m, ok := d.(*pb.RangeMismatch); ok {
				got = m
			}
		}
		if st.Code() != codes.OutOfRange || got == nil || len(got.GetDescriptors()) == 0 ||
			got.GetDescriptors()[0].GetRangeId() != 10 || string(got.GetDescriptors()[0].GetEndKey()) != "m" {
			t.Errorf("%s: %v (details %v); want OutOfRange carrying range 10's descriptor [, m)", name, st.Err(), got)
			continue
		}
		// The node hosts range 11 too, which holds the keys asked for: the
		// reply names it, so the sender's cache fills in one round.
		if ds := got.GetDescriptors(); len(ds) != 2 || ds[1].GetRangeId() != 11 {
			t.Errorf("%s: the reply names %v; want range 10's and range 11's descriptors", name, ds)
		}
	}
	if n := c.Node(c.Leader(10)); n != nil && n.Range(10).HoldsLocks(meta.GetId()) {
		t.Error("a refused request left a lock behind")
	}
}
