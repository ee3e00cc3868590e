package node_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/directory/directorypb"
	"github.com/terroir-db/terroir/internal/epoch/epochpb"
	"github.com/terroir-db/terroir/internal/localcluster"
	"github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/transport/transportpb"
	"github.com/terroir-db/terroir/internal/txnstate"
	"github.com/terroir-db/terroir/internal/txnstate/txnstatepb"
)

// wireTopology is one region with a replica of every kind of group, so each
// RPC service a node serves has a group to answer for.
const wireTopology = `
local_epoch_interval: 10ms
publisher_lease: 1s
raft_tick: 10ms
regions: [us-east1]
nodes:
  - {id: 1, region: us-east1, addr: "127.0.0.1:1"}
  - {id: 2, region: us-east1, addr: "127.0.0.1:2"}
  - {id: 3, region: us-east1, addr: "127.0.0.1:3"}
groups:
  - {id: 1, kind: local-epoch, region: us-east1}
  - {id: 2, kind: txn-state, region: us-east1}
  - {id: 3, kind: global-epoch, region: us-east1}
  - {id: 4, kind: publisher, region: us-east1}
  - {id: 5, kind: directory, region: us-east1}
  - {id: 10, kind: range, region: us-east1, start: "", end: "m"}
  - {id: 11, kind: range, region: us-east1, start: "m"}
`

// wireMethod is one unary RPC a node serves: its full name, its request and
// response types, and the kinds of group it serves (none: no group).
type wireMethod struct {
	name      string
	req, resp func() proto.Message
	kinds     []topology.Kind
}

// The kinds of group each service serves.
var (
	rangeKinds     = []topology.Kind{topology.KindRange}
	txnStateKinds  = []topology.Kind{topology.KindTxnState}
	epochKinds     = []topology.Kind{topology.KindLocalEpoch, topology.KindGlobalEpoch, topology.KindPublisher}
	publisherKinds = []topology.Kind{topology.KindPublisher}
	globalKinds    = []topology.Kind{topology.KindGlobalEpoch}
	directoryKinds = []topology.Kind{topology.KindDirectory}
)

// wireMethods lists every unary RPC of every service a node serves.
var wireMethods = []wireMethod{
	{rangepb.Range_Get_FullMethodName, func() proto.Message { return &rangepb.GetRequest{} }, func() proto.Message { return &rangepb.GetResponse{} }, rangeKinds},
	{rangepb.Range_Scan_FullMethodName, func() proto.Message { return &rangepb.ScanRequest{} }, func() proto.Message { return &rangepb.ScanResponse{} }, rangeKinds},
	{rangepb.Range_Lock_FullMethodName, func() proto.Message { return &rangepb.LockRequest{} }, func() proto.Message { return &rangepb.LockResponse{} }, rangeKinds},
	{rangepb.Range_Prepare_FullMethodName, func() proto.Message { return &rangepb.PrepareRequest{} }, func() proto.Message { return &rangepb.PrepareResponse{} }, rangeKinds},
	{rangepb.Range_Commit_FullMethodName, func() proto.Message { return &rangepb.CommitRequest{} }, func() proto.Message { return &rangepb.CommitResponse{} }, rangeKinds},
	{rangepb.Range_Abort_FullMethodName, func() proto.Message { return &rangepb.AbortRequest{} }, func() proto.Message { return &rangepb.AbortResponse{} }, rangeKinds},
	{rangepb.Range_CommitOnePhase_FullMethodName, func() proto.Message { return &rangepb.OnePhaseRequest{} }, func() proto.Message { return &rangepb.OnePhaseResponse{} }, rangeKinds},
	{rangepb.Range_SnapshotRead_FullMethodName, func() proto.Message { return &rangepb.SnapshotReadRequest{} }, func() proto.Message { return &rangepb.SnapshotReadResponse{} }, rangeKinds},
	{rangepb.Range_Heartbeat_FullMethodName, func() proto.Message { return &rangepb.HeartbeatRequest{} }, func() proto.Message { return &rangepb.HeartbeatResponse{} }, rangeKinds},
	{rangepb.Range_AdminSplit_FullMethodName, func() proto.Message { return &rangepb.AdminSplitRequest{} }, func() proto.Message { return &rangepb.AdminSplitResponse{} }, rangeKinds},
	{rangepb.Range_AdminMerge_FullMethodName, func() proto.Message { return &rangepb.AdminMergeRequest{} }, func() proto.Message { return &rangepb.AdminMergeResponse{} }, rangeKinds},
	{rangepb.Range_Ranges_FullMethodName, func() proto.Message { return &rangepb.RangesRequest{} }, func() proto.Message { return &rangepb.RangesResponse{} }, nil},
	{txnstatepb.TxnState_Decide_FullMethodName, func() proto.Message { return &txnstatepb.DecideRequest{} }, func() proto.Message { return &txnstatepb.DecideResponse{} }, txnStateKinds},
	{txnstatepb.TxnState_Get_FullMethodName, func() proto.Message { return &txnstatepb.GetRequest{} }, func() proto.Message { return &txnstatepb.GetResponse{} }, txnStateKinds},
	{epochpb.Epoch_ReadEpoch_FullMethodName, func() proto.Message { return &epochpb.ReadEpochRequest{} }, func() proto.Message { return &epochpb.ReadEpochResponse{} }, epochKinds},
	{epochpb.Epoch_Publish_FullMethodName, func() proto.Message { return &epochpb.PublishRequest{} }, func() proto.Message { return &epochpb.PublishResponse{} }, publisherKinds},
	{epochpb.Epoch_SetExcluded_FullMethodName, func() proto.Message { return &epochpb.SetExcludedRequest{} }, func() proto.Message { return &epochpb.SetExcludedResponse{} }, globalKinds},
	{epochpb.Epoch_Membership_FullMethodName, func() proto.Message { return &epochpb.MembershipRequest{} }, func() proto.Message { return &epochpb.MembershipResponse{} }, globalKinds},
	{directorypb.Directory_Lookup_FullMethodName, func() proto.Message { return &directorypb.LookupRequest{} }, func() proto.Message { return &directorypb.LookupResponse{} }, directoryKinds},
	{directorypb.Directory_Update_FullMethodName, func() proto.Message { return &directorypb.UpdateRequest{} }, func() proto.Message { return &directorypb.UpdateResponse{} }, directoryKinds},
	{directorypb.Directory_Allocate_FullMethodName, func() proto.Message { return &directorypb.AllocateRequest{} }, func() proto.Message { return &directorypb.AllocateResponse{} }, directoryKinds},
	{directorypb.Directory_Placement_FullMethodName, func() proto.Message { return &directorypb.PlacementRequest{} }, func() proto.Message { return &directorypb.PlacementResponse{} }, directoryKinds},
	{directorypb.Directory_List_FullMethodName, func() proto.Message { return &directorypb.ListRequest{} }, func() proto.Message { return &directorypb.ListResponse{} }, directoryKinds},
	{transportpb.Transport_Ping_FullMethodName, func() proto.Message { return &transportpb.PingRequest{} }, func() proto.Message { return &transportpb.PingResponse{} }, nil},
}

// FuzzWireRequests sends any bytes a peer could put on the wire, decoded as
// the request of any unary RPC, to a node of a running cluster over gRPC: no
// handler may panic (a panic in a gRPC handler takes the whole node down),
// and a request the server cannot serve is refused with a status, never an
// internal error. The request's group is most often pointed at a group the
// cluster hosts, so the fuzzer reaches past the lookup into each handler.
func FuzzWireRequests(f *testing.F) {
	path := filepath.Join(f.TempDir(), "wire.yaml")
	if err := os.WriteFile(path, []byte(wireTopology), 0o644); err != nil {
		f.Fatal(err)
	}
	c := startServing(f, path, localcluster.Options{OrphanAfter: 200 * time.Millisecond})
	d := c.Dialer("us-east1")
	txn := make([]byte, txnstate.TxnIDLen)
	for i, m := range wireMethods {
		req := m.req()
		// A well-formed request of each kind seeds the corpus with the fields
		// each handler reads.
		switch r := req.(type) {
		case *rangepb.GetRequest:
			r.Txn, r.Key = &rangepb.TxnMeta{Id: txn, Priority: 1}, []byte("a")
		case *rangepb.ScanRequest:
			r.Txn, r.Start, r.End = &rangepb.TxnMeta{Id: txn}, []byte("a"), []byte("c")
		case *rangepb.LockRequest:
			r.Txn, r.Key = &rangepb.TxnMeta{Id: txn}, []byte("b")
		case *rangepb.PrepareRequest:
			r.Txn, r.Writes, r.LockCount = &rangepb.TxnMeta{Id: txn}, []*rangepb.Write{{Key: []byte("b"), Value: []byte("v")}}, 1
		case *rangepb.CommitRequest:
			r.TxnId, r.Version = txn, &rangepb.VersionID{Epoch: 5, Counter: 1}
		case *rangepb.AbortRequest:
			r.TxnId = txn
		case *rangepb.OnePhaseRequest:
			r.Txn, r.Writes = &rangepb.TxnMeta{Id: txn}, []*rangepb.Write{{Key: []byte("c"), Tombstone: true}}
		case *rangepb.SnapshotReadRequest:
			r.Start, r.End, r.Scan, r.At = []byte("a"), []byte("z"), true, 3
		case *rangepb.HeartbeatRequest:
			r.TxnId, r.Incarnation = txn, 1
		case *rangepb.AdminSplitRequest:
			r.SplitKey = []byte("b")
		case *rangepb.AdminMergeRequest:
			r.EndKey = []byte("m")
		case *txnstatepb.DecideRequest:
			r.Record = &txnstatepb.Record{TxnId: txn, Outcome: txnstatepb.Outcome_OUTCOME_ABORTED}
		case *txnstatepb.GetRequest:
			r.TxnId = txn
		case *epochpb.SetExcludedRequest:
			r.PublisherGroup, r.Excluded = 4, true
		case *directorypb.LookupRequest:
			r.Key, r.Limit = []byte("n"), 3
		case *directorypb.UpdateRequest:
			r.Descriptors = []*rangepb.RangeDescriptor{{RangeId: 10, StartKey: []byte("m"), Region: "us-east1", Replicas: []uint64{1, 2, 3}, Generation: 1}}
		case *transportpb.PingRequest:
			r.Payload = []byte("ping")
		}
		b, err := proto.Marshal(req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(uint8(i), uint8(i), b)
	}
	f.Fuzz(func(t *testing.T, method, target uint8, payload []byte) {
		m := wireMethods[int(method)%len(wireMethods)]
		req := m.req()
		if proto.Unmarshal(payload, req) != nil {
			return // gRPC refuses what does not decode before any handler runs
		}
		to := uint64(target%3) + 1
		if groups := groupsOf(c.Topology, m.kinds); len(groups) > 0 && target>>6 != 3 {
			// Three times in four, a group of the kind the service serves,
			// and then most often at its leader.
			g := groups[int(target)%len(groups)]
			setGroup(req, g)
			if l := c.Leader(g); l != 0 && target&0x20 == 0 {
				to = l
			}
		}
		conn, err := d.Conn(to)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		err = conn.Invoke(ctx, m.name, req, m.resp())
		if code := status.Code(err); code == codes.Internal || code == codes.Unknown && ctx.Err() == nil && !outcomeMayBeUnknown(m.name) {
			t.Fatalf("%s %v: %v", m.name, req, err)
		}
	})
}

// startServing starts the single-region cluster of the topology file at
// path and commits one write in it, so that the groups a write needs (the
// local epoch, a range, the publisher if there is one) have leaders before
// the test begins.
func startServing(tb testing.TB, path string, opts localcluster.Options) *localcluster.Cluster {
	tb.Helper()
	c := localcluster.StartT(tb, path, opts)
	db, err := c.Client(c.Topology.Regions[0])
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := db.Update(ctx, func(ctx context.Context, tx *client.Txn) error { return tx.Put(ctx, []byte("b"), []byte("v")) }); err != nil {
		tb.Fatal(err)
	}
	return c
}

// groupsOf lists top's groups of kinds.
func groupsOf(top *topology.Topology, kinds []topology.Kind) []uint64 {
	var out []uint64
	for _, k := range kinds {
		for _, g := range top.GroupsOfKind(k, "") {
			out = append(out, g.ID)
		}
	}
	return out
}

// setGroup points a request's group_id or range_id field at id.
func setGroup(req proto.Message, id uint64) {
	r := req.ProtoReflect()
	for _, name := range []protoreflect.Name{"range_id", "group_id"} {
		if fd := r.Descriptor().Fields().ByName(name); fd != nil {
			r.Set(fd, protoreflect.ValueOfUint64(id))
		}
	}
}

// outcomeMayBeUnknown reports whether method replicates a command whose
// outcome a server may report as unknown (codes.Unknown) under load.
func outcomeMayBeUnknown(method string) bool {
	switch method {
	case rangepb.Range_Prepare_FullMethodName, rangepb.Range_Commit_FullMethodName, rangepb.Range_Abort_FullMethodName,
		rangepb.Range_CommitOnePhase_FullMethodName, rangepb.Range_AdminSplit_FullMethodName, rangepb.Range_AdminMerge_FullMethodName,
		txnstatepb.TxnState_Decide_FullMethodName,
		epochpb.Epoch_Publish_FullMethodName, epochpb.Epoch_SetExcluded_FullMethodName:
		return true
	}
	return false
}

// TestStrayRaftMessagesAreDropped sends, over a real Raft stream, append
// messages at a far higher term to a follower of a range, misaddressed in
// each way: to another replica, from a node other than the stream's sender,
// from a node outside the cluster, for a group not hosted there. None reaches
// the group: its term stays. The same message well addressed does raise it,
// so the check is what kept the others out.
func TestStrayRaftMessagesAreDropped(t *testing.T) {
	// Plaintext: over TLS the stream's certificate must name the sender
	// (TestRaftSenderMustMatchItsCertificate); these are the host's checks.
	c := startServing(t, "../../examples/one-region.yaml", localcluster.Options{Insecure: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const group = 10
	leader := c.Leader(group)
	follower := leader%3 + 1
	other := follower%3 + 1
	if other == leader {
		other = other%3 + 1
	}
	g := c.Node(follower).Group(group)
	term := g.Status().Term
	conn, err := c.Dialer("us-east1").Conn(follower)
	if err != nil {
		t.Fatal(err)
	}
	send := func(from uint64, env *transportpb.RaftEnvelope) {
		t.Helper()
		stream, err := transportpb.NewTransportClient(conn).Raft(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(&transportpb.RaftBatch{FromNode: from, ToNode: follower, Msgs: []*transportpb.RaftEnvelope{env}}); err != nil {
			t.Fatal(err)
		}
		if _, err := stream.CloseAndRecv(); err != nil {
			t.Fatal(err)
		}
	}
	app := func(group, from, to uint64) *transportpb.RaftEnvelope {
		m := &raftpb.Message{Type: raftpb.MsgApp.Enum(), From: proto.Uint64(from), To: proto.Uint64(to), Term: proto.Uint64(term + 100)}
		return &transportpb.RaftEnvelope{GroupId: group, Msg: m}
	}
	for name, stray := range map[string]struct {
		sender uint64
		env    *transportpb.RaftEnvelope
	}{
		"to another replica":           {leader, app(group, leader, other)},
		"not from the stream's sender": {other, app(group, leader, follower)},
		"from outside the cluster":     {99, app(group, 99, follower)},
		"for a group not hosted":       {leader, app(12345, leader, follower)},
	} {
		send(stray.sender, stray.env)
		time.Sleep(50 * time.Millisecond)
		if got := g.Status().Term; got != term {
			t.Fatalf("a message %s moved the follower's term from %d to %d", name, term, got)
		}
	}
	send(leader, app(group, leader, follower))
	deadline := time.Now().Add(5 * time.Second)
	for g.Status().Term <= term {
		if time.Now().After(deadline) {
			t.Fatalf("a well-addressed message at term %d did not reach the follower (term %d)", term+100, g.Status().Term)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRaftSenderMustMatchItsCertificate: over TLS a node's Raft stream may
// carry only its own messages; a batch claiming another sender ends the
// stream with PermissionDenied, and the same batch from its own node passes.
func TestRaftSenderMustMatchItsCertificate(t *testing.T) {
	c := startServing(t, "../../examples/one-region.yaml", localcluster.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	send := func(as, from uint64) error {
		d, err := c.NodeDialer(as)
		if err != nil {
			t.Fatal(err)
		}
		conn, err := d.Conn(2)
		if err != nil {
			t.Fatal(err)
		}
		stream, err := transportpb.NewTransportClient(conn).Raft(ctx)
		if err != nil {
			return err
		}
		if err := stream.Send(&transportpb.RaftBatch{FromNode: from, ToNode: 2}); err != nil {
			return err
		}
		_, err = stream.CloseAndRecv()
		return err
	}
	if err := send(1, 3); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "node 1 (us-east1) may not send Raft messages as node 3") {
		t.Fatalf("node 1 sending as node 3 = %v, want PermissionDenied", err)
	}
	if err := send(3, 3); err != nil {
		t.Fatalf("node 3 sending as itself = %v", err)
	}
}
