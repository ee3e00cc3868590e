package transport

import (
	"context"
	"net"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/transport/transportpb"
)

// TestMain fails the package if any test leaves a goroutine behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recorder is a RaftHandler that records what arrives.
type recorder struct {
	mu      sync.Mutex
	indexes []uint64
	at      []time.Time
	unreach int
}

func (r *recorder) HandleRaft(_ uint64, msgs []*transportpb.RaftEnvelope) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range msgs {
		r.indexes = append(r.indexes, m.GetMsg().GetIndex())
		r.at = append(r.at, time.Now())
	}
}
func (r *recorder) ReportUnreachable(group, to uint64)          { r.mu.Lock(); r.unreach++; r.mu.Unlock() }
func (r *recorder) ReportSnapshot(group, to uint64, ok bool)    {}
func (r *recorder) GroupView(uint64) *transportpb.GroupResponse { return &transportpb.GroupResponse{} }
func (r *recorder) HandleSnapshot(context.Context, uint64, *transportpb.SnapshotChunk, func() ([]byte, error)) error {
	return status.Error(codes.Unimplemented, "no snapshots here")
}

func (r *recorder) count() int { r.mu.Lock(); defer r.mu.Unlock(); return len(r.indexes) }

type testNode struct {
	raft *Raft
	rec  *recorder
	stop func()
}

// startNodes binds every node of a two-region topology (east: 1, 2; west: 3) on
// 127.0.0.1 and serves the Transport service on each.
func startNodes(t *testing.T, rttMS int) (*Network, map[uint64]*testNode) {
	t.Helper()
	return startNodesListening(t, rttMS, nil)
}

// startNodesListening is startNodes with each node serving on wrap(id,
// listener) (nil: the listener itself).
func startNodesListening(t *testing.T, rttMS int, wrap func(id uint64, l net.Listener) net.Listener) (*Network, map[uint64]*testNode) {
	t.Helper()
	ls := map[uint64]net.Listener{}
	addrs := map[uint64]string{}
	for id := uint64(1); id <= 3; id++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls[id], addrs[id] = l, l.Addr().String()
	}
	top, err := topology.Parse([]byte(`
regions: [east, west]
rtt: [{between: [east, west], ms: ` + itoa(rttMS) + `}]
nodes:
  - {id: 1, region: east, addr: "` + addrs[1] + `"}
  - {id: 2, region: east, addr: "` + addrs[2] + `"}
  - {id: 3, region: west, addr: "` + addrs[3] + `"}
`))
	if err != nil {
		t.Fatal(err)
	}
	net := NewNetwork(top)
	nodes := map[uint64]*testNode{}
	for id, l := range ls {
		rec := &recorder{}
		d := NewDialer(net, net.NodeEndpoint(id), nil)
		r := NewRaft(d, rec)
		s := NewServer(nil)
		r.Register(s)
		if wrap != nil {
			l = wrap(id, l)
		}
		done := make(chan struct{})
		go func() { _ = s.Serve(l); close(done) }()
		nodes[id] = &testNode{raft: r, rec: rec, stop: func() { r.Close(); s.Stop(); <-done; d.Close() }}
	}
	t.Cleanup(func() {
		for _, n := range nodes {
			n.stop()
		}
	})
	return net, nodes
}

func itoa(i int) string { return strconv.Itoa(i) }

func pingRTT(t *testing.T, d *Dialer, to uint64, n int) time.Duration {
	t.Helper()
	conn, err := d.Conn(to)
	if err != nil {
		t.Fatal(err)
	}
	c := transportpb.NewTransportClient(conn)
	var rtts []time.Duration
	for i := 0; i < n; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		start := time.Now()
		_, err := c.Ping(ctx, &transportpb.PingRequest{Payload: []byte("x")})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		rtts = append(rtts, time.Since(start))
	}
	sort.Slice(rtts, func(i, j int) bool { return rtts[i] < rtts[j] })
	return rtts[len(rtts)/2]
}

func TestLatencyInjection(t *testing.T) {
	net, _ := startNodes(t, 60)
	client := NewDialer(net, Endpoint{Region: "east"}, nil)
	defer client.Close()
	pingRTT(t, client, 1, 3) // warm the connections
	pingRTT(t, client, 3, 1)
	cross := pingRTT(t, client, 3, 9)
	if cross < 55*time.Millisecond || cross > 65*time.Millisecond {
		t.Errorf("cross-region RTT = %v, want 60 ± 5 ms", cross)
	}
	local := pingRTT(t, client, 1, 9)
	if local > 5*time.Millisecond {
		t.Errorf("intra-region RTT = %v, want no injected delay (< 5 ms)", local)
	}
	t.Logf("cross-region median RTT %v, intra-region %v", cross, local)
}

func TestRaftStreamDelayKeepsOrder(t *testing.T) {
	_, nodes := startNodes(t, 200)
	// Warm both streams, so the first timed message does not pay for the dial.
	nodes[1].raft.Send(9, &raftpb.Message{To: proto.Uint64(3), Index: proto.Uint64(0)})
	nodes[1].raft.Send(9, &raftpb.Message{To: proto.Uint64(2), Index: proto.Uint64(0)})
	for nodes[3].rec.count() < 1 || nodes[2].rec.count() < 1 {
		time.Sleep(time.Millisecond)
	}
	for _, id := range []uint64{2, 3} {
		nodes[id].rec.mu.Lock()
		nodes[id].rec.indexes, nodes[id].rec.at = nil, nil
		nodes[id].rec.mu.Unlock()
	}
	const n = 200
	start := time.Now()
	for i := 1; i <= n; i++ {
		nodes[1].raft.Send(9, &raftpb.Message{To: proto.Uint64(3), Index: proto.Uint64(uint64(i))})
		nodes[1].raft.Send(9, &raftpb.Message{To: proto.Uint64(2), Index: proto.Uint64(uint64(i))})
	}
	deadline := time.Now().Add(5 * time.Second)
	for (nodes[3].rec.count() < n || nodes[2].rec.count() < n) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	for _, id := range []uint64{2, 3} {
		rec := nodes[id].rec
		rec.mu.Lock()
		if len(rec.indexes) != n {
			t.Fatalf("node %d got %d messages, want %d", id, len(rec.indexes), n)
		}
		for i, idx := range rec.indexes {
			if idx != uint64(i+1) {
				t.Fatalf("node %d: message %d has index %d: order not kept", id, i, idx)
			}
		}
		firstArrival := rec.at[0].Sub(start)
		rec.mu.Unlock()
		// Generous upper bounds: other tests may load the machine.
		if id == 3 && (firstArrival < 100*time.Millisecond || firstArrival > 140*time.Millisecond) {
			t.Errorf("cross-region one-way delay %v, want 100 ms (RTT/2)", firstArrival)
		}
		if id == 2 && firstArrival > 50*time.Millisecond {
			t.Errorf("intra-region delivery took %v, want no injected delay", firstArrival)
		}
	}
}

func TestCutAndHeal(t *testing.T) {
	net, nodes := startNodes(t, 0)
	client := NewDialer(net, Endpoint{Region: "east"}, nil)
	defer client.Close()
	pingRTT(t, client, 3, 1)

	net.CutRegion("west")
	conn, _ := client.Conn(3)
	_, err := transportpb.NewTransportClient(conn).Ping(context.Background(), &transportpb.PingRequest{})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("ping across a cut region = %v, want Unavailable", err)
	}
	pingRTT(t, client, 1, 1) // inside the region still works
	nodes[1].raft.Send(1, &raftpb.Message{To: proto.Uint64(3), Index: proto.Uint64(1)})
	time.Sleep(50 * time.Millisecond)
	if got := nodes[3].rec.count(); got != 0 {
		t.Fatalf("cut region received %d raft messages", got)
	}
	nodes[1].rec.mu.Lock()
	unreach := nodes[1].rec.unreach
	nodes[1].rec.mu.Unlock()
	if unreach == 0 {
		t.Errorf("a dropped raft message was not reported unreachable")
	}

	net.Heal()
	net.CutNode(2)
	if _, err := transportpb.NewTransportClient(mustConn(t, client, 2)).Ping(context.Background(), &transportpb.PingRequest{}); status.Code(err) != codes.Unavailable {
		t.Fatalf("ping to a cut node = %v, want Unavailable", err)
	}
	net.Heal()
	pingRTT(t, client, 2, 1)
	pingRTT(t, client, 3, 1)

	// A starved node gets no raft message, yet a client reaches it.
	net.Starve(2)
	before := nodes[2].rec.count()
	nodes[1].raft.Send(1, &raftpb.Message{To: proto.Uint64(2), Index: proto.Uint64(1)})
	time.Sleep(50 * time.Millisecond)
	if got := nodes[2].rec.count(); got != before {
		t.Fatalf("a starved node received %d raft messages", got-before)
	}
	pingRTT(t, client, 2, 1)
	net.Heal()
	nodes[1].raft.Send(1, &raftpb.Message{To: proto.Uint64(2), Index: proto.Uint64(2)})
	deadline := time.Now().Add(5 * time.Second)
	for nodes[2].rec.count() == before {
		if time.Now().After(deadline) {
			t.Fatal("a healed node received no raft message")
		}
		time.Sleep(5 * time.Millisecond)
	}

	// A node whose log is starved gets no raft message, yet another node's
	// RPC reaches it (a side-transported close, DESIGN.md §13).
	net.StarveLog(2)
	before = nodes[2].rec.count()
	nodes[1].raft.Send(1, &raftpb.Message{To: proto.Uint64(2), Index: proto.Uint64(3)})
	time.Sleep(50 * time.Millisecond)
	if got := nodes[2].rec.count(); got != before {
		t.Fatalf("a node whose log is starved received %d raft messages", got-before)
	}
	peer := NewDialer(net, net.NodeEndpoint(1), nil)
	defer peer.Close()
	pingRTT(t, peer, 2, 1)
	net.Heal()

	net.SetDropRate(1)
	if _, err := transportpb.NewTransportClient(mustConn(t, client, 1)).Ping(context.Background(), &transportpb.PingRequest{}); status.Code(err) != codes.Unavailable {
		t.Fatalf("ping at drop rate 1 = %v, want Unavailable", err)
	}
	net.Heal()
	net.SetExtraDelay(15 * time.Millisecond)
	if rtt := pingRTT(t, client, 1, 3); rtt < 30*time.Millisecond {
		t.Errorf("ping with 15 ms extra one-way delay took %v, want ≥ 30 ms", rtt)
	}
}

func mustConn(t *testing.T, d *Dialer, id uint64) *grpc.ClientConn {
	t.Helper()
	c, err := d.Conn(id)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestDuplication: at duplicate rate 1 a Raft message arrives twice and a
// request reaches its server twice, the caller seeing one reply; Heal stops it.
func TestDuplication(t *testing.T) {
	net, nodes := startNodes(t, 0)
	net.SetDuplicateRate(1)
	nodes[1].raft.Send(2, &raftpb.Message{To: proto.Uint64(2), Index: proto.Uint64(7)})
	deadline := time.Now().Add(5 * time.Second)
	for nodes[2].rec.count() < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if got := nodes[2].rec.count(); got != 2 {
		t.Fatalf("raft message delivered %d times at duplicate rate 1, want 2", got)
	}

	client := NewDialer(net, Endpoint{Region: "east"}, nil)
	var mu sync.Mutex
	var replies []*transportpb.PingResponse // one per call the server saw
	invoke := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, opts ...grpc.CallOption) error {
		mu.Lock()
		defer mu.Unlock()
		replies = append(replies, reply.(*transportpb.PingResponse))
		return nil
	}
	call := func() *transportpb.PingResponse {
		reply := &transportpb.PingResponse{}
		if err := client.wanInterceptor(net.NodeEndpoint(1))(context.Background(), "/ping", &transportpb.PingRequest{}, reply, nil, invoke); err != nil {
			t.Fatal(err)
		}
		return reply
	}
	mine := call()
	net.Heal()
	call()
	seen := func() (n, mineN int) {
		mu.Lock()
		defer mu.Unlock()
		for _, r := range replies {
			if r == mine {
				mineN++
			}
		}
		return len(replies), mineN
	}
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if n, _ := seen(); n >= 3 {
			break
		}
	}
	client.Close()
	if n, mineN := seen(); n != 3 || mineN != 1 {
		t.Fatalf("%d calls reached the server, %d with the caller's reply; want the request twice and, after Heal, once, the caller's reply filled once", n, mineN)
	}
}
