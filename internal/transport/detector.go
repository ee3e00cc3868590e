package transport

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/terroir-db/terroir/internal/transport/transportpb"
)

// Failure detection (DESIGN.md §12): a node that stops answering without
// closing its sockets — a frozen (SIGSTOP'd) process, a machine that hangs,
// a network that black-holes — would make every call to it wait for its
// caller's deadline. The dialer instead watches each connection: once calls
// have been outstanding on it for ProbeAfter without any of them completing,
// it pings the node, and if the ping times out — gets no answer within
// ProbeTimeout plus the round trip; a ping refused at once is not a node
// that stopped answering — it declares the node unresponsive. That closes the
// connection's sockets, so the calls in flight fail at once with
// codes.Unavailable (they may have executed), and new calls to the node fail
// at once with a NotSent error until a later ping is answered. Lock waits and
// other long calls to a live node are untouched: the node answers the ping.
// A node never declares itself unresponsive: its calls to itself are slow
// only when its own process is (a disk stall, a loaded machine), and
// failing them would turn that into errors of unknown outcome for its
// clients, without any node to fail over from. Calls that complete cost two
// atomic adds and a clock read.

// DetectorConfig tunes failure detection. Zero fields take the defaults.
type DetectorConfig struct {
	// ProbeAfter is how long calls may be outstanding on a connection
	// without one completing before the node is pinged (default 400 ms). It
	// is also how often an unresponsive node is pinged again.
	ProbeAfter time.Duration
	// ProbeTimeout bounds the ping, on top of the network's round trip
	// (default 400 ms).
	ProbeTimeout time.Duration
}

// Defaults of DetectorConfig: a frozen node is detected 0.8–0.9 s after its
// last answer, about when its range leases lapse (100 local epochs of 10 ms).
const (
	DefaultProbeAfter   = 400 * time.Millisecond
	DefaultProbeTimeout = 400 * time.Millisecond
)

func (c DetectorConfig) withDefaults() DetectorConfig {
	if c.ProbeAfter <= 0 {
		c.ProbeAfter = DefaultProbeAfter
	}
	if c.ProbeTimeout <= 0 {
		c.ProbeTimeout = DefaultProbeTimeout
	}
	return c
}

// notSentError is a call that never left this process (its node is
// unresponsive, or no connection to it took the call): it did not execute.
type notSentError struct{ st *status.Status }

func (e *notSentError) Error() string              { return e.st.Err().Error() }
func (e *notSentError) GRPCStatus() *status.Status { return e.st }

// NotSent reports whether err is a call that never left this process
// (codes.Unavailable): the dialer refused it because its node did not
// answer the last ping, or it found no connection to the node and gRPC
// failed it before any connection took it (the dial was refused: a node
// stopped or restarting). Unlike other Unavailable errors, it proves the
// call did not execute, so even a non-idempotent call may be sent
// elsewhere or again.
func NotSent(err error) bool {
	var ns *notSentError
	return errors.As(err, &ns)
}

// peerHealth is the detector's view of one destination node.
type peerHealth struct {
	node     uint64
	inflight atomic.Int64
	progress atomic.Int64 // unix ns of the last call that completed with an answer, or of the last answered ping
	down     atomic.Int64 // unix ns since the node is unresponsive, 0 while it answers
	probing  atomic.Bool
	open     atomic.Int32 // len(socks), kept beside it so a call reads it without mu

	mu    sync.Mutex
	socks map[net.Conn]struct{} // the connection's open sockets
}

func newPeerHealth(node uint64) *peerHealth {
	p := &peerHealth{node: node, socks: map[net.Conn]struct{}{}}
	p.progress.Store(time.Now().UnixNano())
	return p
}

// trackedConn removes itself from its peer's sockets when closed.
type trackedConn struct {
	net.Conn
	p    *peerHealth
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.p.open.Add(-1)
		c.p.mu.Lock()
		delete(c.p.socks, c)
		c.p.mu.Unlock()
	})
	return c.Conn.Close()
}

// dial opens a socket to addr for gRPC, tracked so that a node declared
// unresponsive can have its sockets closed.
func (p *peerHealth) dial(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	tc := &trackedConn{Conn: c, p: p}
	p.open.Add(1)
	p.mu.Lock()
	p.socks[tc] = struct{}{}
	p.mu.Unlock()
	return tc, nil
}

// closeSockets closes every open socket to the node: gRPC fails the calls
// on them and reconnects.
func (p *peerHealth) closeSockets() {
	p.mu.Lock()
	socks := make([]net.Conn, 0, len(p.socks))
	for c := range p.socks {
		socks = append(socks, c)
	}
	p.mu.Unlock()
	for _, c := range socks {
		_ = c.Close()
	}
}

type probeKey struct{}

// sendTrace records what became of a call made while no socket to its node
// was open: whether a connection took it (reached, filled by grpc.Peer),
// and whether the network model sent a copy of it (duplicated: the copy
// may reach the node even if the call did not).
type sendTrace struct {
	reached    peer.Peer
	duplicated atomic.Bool
}

type sendTraceKey struct{}

// notSent reports whether the traced call never left the process: no
// connection took it, and no copy of it was sent.
func (t *sendTrace) notSent() bool { return t.reached.Addr == nil && !t.duplicated.Load() }

// markDuplicated records, on the call of ctx if it is traced, that the
// network model sends a copy of it.
func markDuplicated(ctx context.Context) {
	if t, ok := ctx.Value(sendTraceKey{}).(*sendTrace); ok {
		t.duplicated.Store(true)
	}
}

// interceptor fails calls to an unresponsive node at once, counts the
// others in flight, and marks a call that failed without reaching any
// connection as NotSent.
func (p *peerHealth) interceptor(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if ctx.Value(probeKey{}) != nil {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	if since := p.down.Load(); since != 0 {
		return &notSentError{status.Newf(codes.Unavailable,
			"transport: node %d is not answering (no answer to a ping for %v: frozen, overloaded or cut off?)",
			p.node, time.Since(time.Unix(0, since)).Round(time.Millisecond))}
	}
	if p.inflight.Add(1) == 1 {
		p.progress.Store(time.Now().UnixNano()) // an idle connection's first call: the wait starts now
	}
	var tr *sendTrace
	if p.open.Load() == 0 {
		// No socket to the node: gRPC dials for this call. grpc.Peer is
		// filled only once a connection took the call, so if it stays empty
		// the call failed before any byte of it left (a dial refused or
		// timed out: a node stopped, restarting or gone).
		tr = &sendTrace{}
		ctx = context.WithValue(ctx, sendTraceKey{}, tr)
		opts = append(opts[:len(opts):len(opts)], grpc.Peer(&tr.reached))
	}
	err := invoker(ctx, method, req, reply, cc, opts...)
	p.inflight.Add(-1)
	if answered(err) {
		p.progress.Store(time.Now().UnixNano())
	} else if tr != nil && tr.notSent() && status.Code(err) == codes.Unavailable {
		return &notSentError{status.Newf(codes.Unavailable, "transport: call to node %d not sent, no connection: %s", p.node, status.Convert(err).Message())}
	} else if since := p.down.Load(); since != 0 && status.Code(err) == codes.Unavailable {
		return status.Errorf(codes.Unavailable, "transport: node %d stopped answering (no answer to a ping; the call may have executed): %v", p.node, status.Convert(err).Message())
	}
	return err
}

// answered reports whether err (from a call) shows the node answered it.
func answered(err error) bool {
	switch status.Code(err) {
	case codes.OK:
		return true
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		return false
	default:
		return true
	}
}

// detector runs the pings of one dialer.
type detector struct {
	cfg   DetectorConfig
	d     *Dialer
	peers sync.Map // node ID → *peerHealth
	wg    sync.WaitGroup
}

// peer returns the health of node id, creating it on first use.
func (det *detector) peer(id uint64) *peerHealth {
	if p, ok := det.peers.Load(id); ok {
		return p.(*peerHealth)
	}
	p, _ := det.peers.LoadOrStore(id, newPeerHealth(id))
	return p.(*peerHealth)
}

// run checks every connection each tick until ctx ends.
func (det *detector) run(ctx context.Context) {
	defer det.wg.Done()
	t := time.NewTicker(det.cfg.ProbeAfter / 4)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now().UnixNano()
		det.peers.Range(func(_, v any) bool {
			p := v.(*peerHealth)
			if self := det.d.self.Node; self != 0 && p.node == self {
				return true // never this node itself (see above)
			}
			stuck := p.inflight.Load() > 0 && now-p.progress.Load() > int64(det.cfg.ProbeAfter)
			retry := p.down.Load() != 0 && now-p.progress.Load() > int64(det.cfg.ProbeAfter)
			if (stuck || retry) && p.probing.CompareAndSwap(false, true) {
				det.wg.Add(1)
				go det.probe(ctx, p)
			}
			return true
		})
	}
}

// probe pings p's node once, and declares it unresponsive (or answering
// again) by the outcome.
func (det *detector) probe(ctx context.Context, p *peerHealth) {
	defer det.wg.Done()
	defer p.probing.Store(false)
	to := det.d.net.NodeEndpoint(p.node)
	bound := det.cfg.ProbeTimeout + det.d.net.OneWayDelay(det.d.self, to) + det.d.net.OneWayDelay(to, det.d.self)
	pctx, cancel := context.WithTimeout(context.WithValue(ctx, probeKey{}, true), bound)
	defer cancel()
	err := det.ping(pctx, p.node)
	if ctx.Err() != nil {
		return // the dialer closed
	}
	now := time.Now().UnixNano()
	if err != nil && pctx.Err() == nil {
		// Refused or dropped at once (a node down, the network model):
		// not a node that stopped answering. Calls to it fail by themselves.
		p.progress.Store(now)
		return
	}
	if err == nil {
		p.progress.Store(now)
		if since := p.down.Swap(0); since != 0 {
			slog.Info("node answers again", "node", p.node, "from", det.d.self.Node, "after", time.Duration(now-since).Round(time.Millisecond))
		}
		return
	}
	p.progress.Store(now) // the next ping waits ProbeAfter
	if p.down.CompareAndSwap(0, now) {
		slog.Warn("node not answering: failing its calls", "node", p.node, "from", det.d.self.Node, "bound", bound, "err", err)
	}
	p.closeSockets()
}

func (det *detector) ping(ctx context.Context, node uint64) error {
	conn, err := det.d.Conn(node)
	if err != nil {
		return err
	}
	_, err = transportpb.NewTransportClient(conn).Ping(ctx, &transportpb.PingRequest{})
	if err != nil {
		return fmt.Errorf("ping: %w", err)
	}
	return nil
}
