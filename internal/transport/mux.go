package transport

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/terroir-db/terroir/internal/transport/transportpb"
)

// Unary calls over one stream (issue 17). A unary gRPC call opens an
// HTTP/2 stream of its own: HEADERS with the method, deadline and
// content type, the server's HEADERS and trailers back, a server
// goroutine dispatched and the headers encoded and decoded on both sides.
// On this machine that is about 200 µs of CPU for a round trip on
// loopback, where a message each way on a stream already open costs
// about 90 µs (a same-process benchmark of the two, plaintext). A node
// calls its peers' epoch replicas about once per transaction, so the
// calls that go between nodes often travel as messages on one
// Multiplex stream per peer instead: Multiplexed's connection.
//
// Such a call means what a unary call means. It runs through the same
// client interceptors (the failure detector's accounting, the network
// model's delays, drops and duplicates) and, at the server, the same
// server interceptors (authorization, metrics) under its own method
// name; its deadline travels with it, and a caller that gives up
// cancels it at the server. A stream that breaks fails the calls in
// flight on it with codes.Unavailable (they may have executed), and the
// next call opens a new one. A node that does not serve Multiplex (one
// that predates it) answers Unimplemented, and its calls go as unary
// calls from then on.

// errNoMultiplex is a call sent on a stream the node does not serve: it
// did not execute, and goes again as a unary call.
var errNoMultiplex = errors.New("transport: node does not serve the Multiplex stream")

// Multiplexed returns a connection to node id whose unary calls travel
// over one long-lived Multiplex stream (see above); its streaming calls
// are those of Conn(id). It is made once per node and shared. Errors: as
// Conn.
func (d *Dialer) Multiplexed(id uint64) (grpc.ClientConnInterface, error) {
	if _, err := d.Conn(id); err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, ErrClosed
	}
	if m, ok := d.muxConns[id]; ok {
		return m, nil
	}
	to := d.net.NodeEndpoint(id)
	m := &muxConn{d: d, to: to, health: d.det.peer(id), wan: d.wanInterceptor(to)}
	d.muxConns[id] = m
	return m, nil
}

// muxConn is the Multiplexed connection to one node.
type muxConn struct {
	d      *Dialer
	to     Endpoint
	health *peerHealth
	wan    grpc.UnaryClientInterceptor
	unary  atomic.Bool // the node answered Unimplemented: plain unary calls

	mu      sync.Mutex
	st      *muxStream // the open stream (nil: none)
	opening *opening   // the stream being opened (nil: none)
}

// Invoke implements grpc.ClientConnInterface: one unary call over the
// stream, through the detector's and the network model's interceptors.
func (m *muxConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	if !m.unary.Load() {
		err := m.health.interceptor(ctx, method, args, reply, nil, m.viaNetwork, opts...)
		if !errors.Is(err, errNoMultiplex) {
			return err
		}
	}
	conn, err := m.d.Conn(m.to.Node)
	if err != nil {
		return err
	}
	return conn.Invoke(ctx, method, args, reply, opts...)
}

// NewStream implements grpc.ClientConnInterface: streaming calls go on
// the node's connection as they would without the Multiplex stream.
func (m *muxConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	conn, err := m.d.Conn(m.to.Node)
	if err != nil {
		return nil, err
	}
	return conn.NewStream(ctx, desc, method, opts...)
}

func (m *muxConn) viaNetwork(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, opts ...grpc.CallOption) error {
	return m.wan(ctx, method, req, reply, cc, m.call, opts...)
}

// call sends one call on the stream and waits for its reply: the
// innermost invoker, under the interceptors.
func (m *muxConn) call(ctx context.Context, method string, req, reply any, _ *grpc.ClientConn, opts ...grpc.CallOption) error {
	in, err := proto.Marshal(req.(proto.Message))
	if err != nil {
		return status.Errorf(codes.Internal, "transport: marshal %s request: %v", method, err)
	}
	c := &transportpb.Call{Method: method, Request: in}
	var st *muxStream
	var replies <-chan *transportpb.CallReply
	for attempt := 0; ; attempt++ {
		if st, err = m.stream(ctx); err != nil {
			return err
		}
		if replies, err = st.register(c); err == nil {
			break
		}
		// The stream broke before this call went out on it: forget it
		// and take a new one (a few times at most, as each needs a
		// connection that opens a stream).
		m.forget(st)
		if status.Code(err) != codes.Unavailable || attempt == 2 {
			return err
		}
	}
	for _, o := range opts {
		if p, ok := o.(grpc.PeerCallOption); ok && p.PeerAddr != nil {
			p.PeerAddr.Addr = st.addr // a connection took the call (peerHealth's NotSent)
		}
	}
	if dl, ok := ctx.Deadline(); ok {
		c.TimeoutUs = max(1, time.Until(dl).Microseconds())
	}
	// A send that fails aborts the stream (gRPC's SendMsg): its receiver
	// then learns why (Unimplemented: a node without the service) and
	// closes replies, so the call ends as the calls in flight on it do.
	_ = st.send(c)
	select {
	case r, ok := <-replies:
		if !ok {
			return st.failure()
		}
		if len(r.GetStatus()) > 0 {
			var sp spb.Status
			if err := proto.Unmarshal(r.GetStatus(), &sp); err != nil {
				return status.Errorf(codes.Internal, "transport: %s: cannot unmarshal the reply's status: %v", method, err)
			}
			return status.ErrorProto(&sp)
		}
		if err := proto.Unmarshal(r.GetResponse(), reply.(proto.Message)); err != nil {
			return status.Errorf(codes.Internal, "transport: %s: cannot unmarshal the response: %v", method, err)
		}
		return nil
	case <-ctx.Done():
		if st.unregister(c.GetId()) {
			_ = st.send(&transportpb.Call{Id: c.GetId(), Cancel: true}) // best effort: the server stops waiting
		}
		return status.FromContextError(ctx.Err()).Err()
	}
}

// stream returns the open stream, opening one if none is: the open runs
// on a goroutine of its own (gRPC waits for a connection while one is
// being made), so a caller waits for it at most until ctx ends.
func (m *muxConn) stream(ctx context.Context) (*muxStream, error) {
	m.mu.Lock()
	if st := m.st; st != nil {
		m.mu.Unlock()
		return st, nil
	}
	a := m.opening
	if a == nil {
		m.d.mu.Lock()
		closed := m.d.closed
		if !closed {
			m.d.muxWG.Add(1)
		}
		m.d.mu.Unlock()
		if closed {
			m.mu.Unlock()
			return nil, status.Error(codes.Unavailable, ErrClosed.Error())
		}
		a = &opening{done: make(chan struct{})}
		m.opening = a
		go m.run(a)
	}
	m.mu.Unlock()
	select {
	case <-a.done:
		return a.st, a.err
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// forget drops st, if it is the open stream, so that the next call opens
// a new one.
func (m *muxConn) forget(st *muxStream) {
	m.mu.Lock()
	if m.st == st {
		m.st = nil
	}
	m.mu.Unlock()
}

// opening is a stream being opened: once done is closed, st is the
// stream, or err why none opened.
type opening struct {
	done chan struct{}
	st   *muxStream
	err  error
}

// run opens a stream for a, and receives its replies until it breaks
// (the connection failed or closed, or the dialer closed).
func (m *muxConn) run(a *opening) {
	defer m.d.muxWG.Done()
	a.st, a.err = m.open()
	m.mu.Lock()
	m.st, m.opening = a.st, nil
	m.mu.Unlock()
	close(a.done)
	st := a.st
	if st == nil {
		return
	}
	err := st.receive()
	if status.Code(err) == codes.Unimplemented {
		m.unary.Store(true)
		err = errNoMultiplex
	}
	m.forget(st)
	st.fail(err)
}

func (m *muxConn) open() (*muxStream, error) {
	conn, err := m.d.Conn(m.to.Node)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "transport: node %d: %v", m.to.Node, err)
	}
	ctx, cancel := context.WithCancel(m.d.life)
	cs, err := transportpb.NewMultiplexClient(conn).Calls(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	return &muxStream{cs: cs, cancel: cancel, addr: muxAddr(conn.Target()), pending: map[uint64]chan *transportpb.CallReply{}}, nil
}

// muxStream is one open Multiplex stream and its calls in flight.
type muxStream struct {
	cs     transportpb.Multiplex_CallsClient
	cancel context.CancelFunc
	addr   muxAddr
	sendMu sync.Mutex // cs.Send is not safe for concurrent use

	mu      sync.Mutex
	next    uint64
	pending map[uint64]chan *transportpb.CallReply // by call id; closed when the stream breaks
	err     error                                  // why the stream broke (nil while it works)
}

// register gives c an id and returns the channel its reply comes on.
func (s *muxStream) register(c *transportpb.Call) (<-chan *transportpb.CallReply, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return nil, s.failureLocked()
	}
	s.next++
	c.Id = s.next
	ch := make(chan *transportpb.CallReply, 1)
	s.pending[c.Id] = ch
	return ch, nil
}

// unregister forgets call id; false if it was not pending (answered, or
// the stream broke).
func (s *muxStream) unregister(id uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.pending[id]
	delete(s.pending, id)
	return ok
}

func (s *muxStream) send(c *transportpb.Call) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	return s.cs.Send(c)
}

// receive hands each reply to its call until the stream fails.
func (s *muxStream) receive() error {
	for {
		r, err := s.cs.Recv()
		if err != nil {
			return err
		}
		s.mu.Lock()
		ch, ok := s.pending[r.GetId()]
		delete(s.pending, r.GetId())
		s.mu.Unlock()
		if ok {
			ch <- r // buffered: never blocks
		}
	}
}

// fail ends the stream for err: the calls in flight learn it from their
// closed channels (failure).
func (s *muxStream) fail(err error) {
	s.cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.err = err
	for id, ch := range s.pending {
		close(ch)
		delete(s.pending, id)
	}
}

// failure is the error of a call in flight when the stream broke.
func (s *muxStream) failure() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failureLocked()
}

func (s *muxStream) failureLocked() error {
	if errors.Is(s.err, errNoMultiplex) {
		return errNoMultiplex
	}
	if c := status.Code(s.err); c == codes.PermissionDenied || c == codes.Unauthenticated {
		return s.err // the node refused the stream: its calls executed nowhere
	}
	return status.Errorf(codes.Unavailable, "transport: the call stream broke (the call may have executed): %v", s.err)
}

// muxAddr is the address a Multiplexed call reached, for grpc.Peer.
type muxAddr string

func (a muxAddr) Network() string { return "tcp" }
func (a muxAddr) String() string  { return string(a) }
