package transport

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/terroir-db/terroir/internal/security"
)

// MaxMessageBytes bounds one gRPC message (a Raft batch or snapshot): 64 MiB.
const MaxMessageBytes = 64 << 20

// ErrClosed is returned by a Dialer after Close.
var ErrClosed = errors.New("transport: closed")

// Dialer hands out one gRPC connection per destination node, shared by every
// caller in the process. Unary calls through its connections pay the network's
// one-way delay before the request and again before the reply, and fail with
// codes.Unavailable when the network drops them.
type Dialer struct {
	net   *Network
	self  Endpoint
	creds credentials.TransportCredentials
	tls   bool

	mu     sync.Mutex
	conns  map[uint64]*grpc.ClientConn
	addrs  map[uint64]string // each connection's address
	gen    uint64            // the network book's generation the addresses are from
	closed bool

	life context.Context // canceled by Close: duplicates in flight and pings give up
	stop context.CancelFunc
	dups sync.WaitGroup // duplicated requests in flight

	muxConns map[uint64]*muxConn // under mu: Multiplexed's connections, by node
	muxWG    sync.WaitGroup      // their streams' goroutines (opening, receiving)

	det        detector
	detStarted bool // the detector's loop runs (from the first Conn)
}

// NewDialer returns a Dialer whose calls originate at self and present
// certs over mutual TLS (DESIGN.md §15); nil certs means plaintext, for a
// cluster started with --insecure.
func NewDialer(net *Network, self Endpoint, certs *security.Certs) *Dialer {
	life, stop := context.WithCancel(context.Background())
	creds := insecure.NewCredentials()
	if certs != nil {
		creds = credentials.NewTLS(certs.ClientTLS())
	}
	d := &Dialer{net: net, self: self, creds: creds, tls: certs != nil, conns: map[uint64]*grpc.ClientConn{}, muxConns: map[uint64]*muxConn{}, addrs: map[uint64]string{}, life: life, stop: stop}
	d.det = detector{cfg: net.detectorConfig().withDefaults(), d: d}
	return d
}

// SetDetector tunes the dialer's failure detection (see DetectorConfig);
// call it before the first Conn.
func (d *Dialer) SetDetector(cfg DetectorConfig) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.det.cfg = cfg.withDefaults()
}

// Detector returns the dialer's failure detection, defaults filled in.
func (d *Dialer) Detector() DetectorConfig {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.det.cfg
}

// Secure reports whether the dialer speaks mutual TLS.
func (d *Dialer) Secure() bool { return d.tls }

// Self returns the endpoint calls originate from.
func (d *Dialer) Self() Endpoint { return d.self }

// Network returns the network the dialer's calls cross.
func (d *Dialer) Network() *Network { return d.net }

// Conn returns the connection to node id, creating it on first use, at the
// address the network's node book gives (a node that moved is redialed).
// gRPC connects lazily and reconnects by itself; errors are returned only
// for an unknown node or a closed Dialer.
func (d *Dialer) Conn(id uint64) (*grpc.ClientConn, error) {
	c, err := d.conn(id)
	if errors.Is(err, errUnknownNode) && d.net.lookUp(id) { // joined after this process started
		c, err = d.conn(id)
	}
	return c, err
}

var errUnknownNode = errors.New("transport: unknown node")

func (d *Dialer) conn(id uint64) (*grpc.ClientConn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, ErrClosed
	}
	if gen := d.net.bookGen.Load(); gen != d.gen {
		d.gen = gen
		for other, c := range d.conns {
			if nd, ok := d.net.Node(other); ok && nd.Addr != d.addrs[other] {
				_ = c.Close() // calls on it fail Unavailable; callers retry
				delete(d.conns, other)
			}
		}
	}
	if c, ok := d.conns[id]; ok {
		return c, nil
	}
	node, ok := d.net.Node(id)
	if !ok {
		return nil, fmt.Errorf("%w %d", errUnknownNode, id)
	}
	to := Endpoint{Node: id, Region: node.Region}
	health := d.det.peer(id)
	if !d.detStarted {
		d.detStarted = true
		d.det.wg.Add(1)
		go d.det.run(d.life)
	}
	c, err := grpc.NewClient(node.Addr,
		grpc.WithTransportCredentials(d.creds),
		grpc.WithContextDialer(health.dial),
		grpc.WithInitialWindowSize(streamWindowBytes), grpc.WithInitialConnWindowSize(connWindowBytes),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessageBytes), grpc.MaxCallSendMsgSize(MaxMessageBytes)),
		grpc.WithChainUnaryInterceptor(health.interceptor, d.wanInterceptor(to)),
		// Reconnect within a second of a peer's restart; gRPC's default backoff
		// grows to two minutes, long enough to strand a restarted replica.
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{
			BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second,
		}, MinConnectTimeout: time.Second}),
	)
	if err != nil {
		return nil, fmt.Errorf("transport: dial node %d at %s: %w", id, node.Addr, err)
	}
	d.conns[id], d.addrs[id] = c, node.Addr
	return c, nil
}

// wanInterceptor applies the network model to one unary call towards `to`.
func (d *Dialer) wanInterceptor(to Endpoint) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if !SleepCtx(ctx, d.net.OneWayDelay(d.self, to)) {
			return status.FromContextError(ctx.Err()).Err()
		}
		if !d.net.Deliverable(d.self, to) {
			return status.Errorf(codes.Unavailable, "transport: request to node %d dropped by the network", to.Node)
		}
		if d.net.Duplicated() {
			markDuplicated(ctx) // the copy may arrive: the call is never NotSent
			d.duplicate(to, method, req, reply, cc, invoker, opts)
		}
		if err := invoker(ctx, method, req, reply, cc, opts...); err != nil {
			return err
		}
		if !SleepCtx(ctx, d.net.OneWayDelay(to, d.self)) {
			return status.FromContextError(ctx.Err()).Err()
		}
		if !d.net.Deliverable(to, d.self) {
			return status.Errorf(codes.Unavailable, "transport: reply from node %d dropped by the network", to.Node)
		}
		return nil
	}
}

// dupMaxLag bounds how much later than the original a duplicated request
// arrives; dupTimeout bounds the duplicate's call.
const (
	dupMaxLag  = 50 * time.Millisecond
	dupTimeout = 2 * time.Second
)

// duplicate sends a copy of a request 0–dupMaxLag after the original, so it
// may overtake it or arrive after the caller has its reply (or gave up); its
// reply is lost. Close waits for it.
func (d *Dialer) duplicate(to Endpoint, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts []grpc.CallOption) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return
	}
	req = proto.Clone(req.(proto.Message))
	dupOpts := make([]grpc.CallOption, 0, len(opts))
	for _, o := range opts {
		if _, ok := o.(grpc.PeerCallOption); !ok { // the original's record of its connection is its own
			dupOpts = append(dupOpts, o)
		}
	}
	opts = dupOpts
	dupReply := proto.Clone(reply.(proto.Message))
	proto.Reset(dupReply)
	lag := time.Duration(rand.Int64N(int64(dupMaxLag)))
	d.dups.Add(1)
	go func() {
		defer d.dups.Done()
		ctx, cancel := context.WithTimeout(d.life, dupTimeout)
		defer cancel()
		if !SleepCtx(ctx, lag) || !d.net.Deliverable(d.self, to) {
			return
		}
		_ = invoker(ctx, method, req, dupReply, cc, opts...)
	}()
}

// Close closes every connection, after stopping duplicated requests in
// flight; later Conn calls fail with ErrClosed.
func (d *Dialer) Close() {
	d.mu.Lock()
	conns := d.conns
	d.conns = map[uint64]*grpc.ClientConn{}
	d.closed = true
	d.mu.Unlock()
	d.stop()
	d.dups.Wait()
	d.muxWG.Wait()
	d.det.wg.Wait()
	for _, c := range conns {
		_ = c.Close()
	}
}

// streamWorkers is how many goroutines a server keeps to run incoming
// calls (16 per core, at least 64): a call runs on one whose stack has
// already grown to a handler's depth, rather than on a fresh goroutine
// that grows and copies its stack on every call. A call holds its worker
// while it waits (on a lock, an epoch read, a Raft commit), and a stream
// (each peer's Raft stream, a changefeed) for its whole life, so a node
// under 16 clients has a few dozen in use: at 8, most calls found every
// worker busy and gRPC started a goroutine for them (issue 17: stack
// growth in those was about 2% of a range leader's CPU). Idle workers cost
// only their stacks.
func streamWorkers() uint32 { return uint32(max(64, 16*runtime.GOMAXPROCS(0))) }

// streamWindowBytes and connWindowBytes are the HTTP/2 flow-control
// windows every connection between nodes opens with, per stream and per
// connection (bytes), on both ends. Setting them turns off gRPC's
// bandwidth-delay estimator, which otherwise answers nearly every message
// that arrives on a quiet connection with a PING of its own and its ACK:
// two more TLS records, writes and wakeups per Raft batch or epoch read
// (issue 17: an idle cluster spent about 3 points of a core on them). The
// sizes are those the estimator grows to at most (16 MiB a connection);
// 4 MiB a stream keeps a snapshot stream at its 32 MiB/s over a 100 ms
// round trip.
const (
	streamWindowBytes = 4 << 20
	connWindowBytes   = 16 << 20
)
