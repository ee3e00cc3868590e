package transport

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/terroir-db/terroir/internal/security"
	"github.com/terroir-db/terroir/internal/transport/transportpb"
)

// Server is a node's gRPC server. Every unary method of a service
// registered on it is served both as a gRPC call of its own and over the
// Multiplex stream (mux.go), whose calls run through the same
// interceptors (authorization, metrics) with the same method names.
type Server struct {
	*grpc.Server
	calls *callServer
}

// NewServer returns a gRPC server sized for Raft batches and snapshots. With
// certs (a node's), it speaks mutual TLS only, refuses a peer without a
// certificate of the cluster CA, and lets each identity call only the RPCs
// its role allows (security.RequiredRole); nil certs means plaintext with no
// checks, for a cluster started with --insecure. The interceptors run on
// every unary call, before authorization (so they see refused calls too),
// whether it came alone or over the Multiplex stream.
func NewServer(certs *security.Certs, interceptors ...grpc.UnaryServerInterceptor) *Server {
	opts := []grpc.ServerOption{grpc.MaxRecvMsgSize(MaxMessageBytes), grpc.MaxSendMsgSize(MaxMessageBytes),
		grpc.NumStreamWorkers(streamWorkers()),
		grpc.InitialWindowSize(streamWindowBytes), grpc.InitialConnWindowSize(connWindowBytes)}
	if certs != nil {
		unary, stream := security.ServerInterceptors()
		interceptors = append(interceptors, unary) // after the others: a refused call is still counted
		opts = append(opts, grpc.Creds(certs.ServerCredentials()), grpc.ChainStreamInterceptor(stream))
	}
	if len(interceptors) > 0 {
		opts = append(opts, grpc.ChainUnaryInterceptor(interceptors...))
	}
	s := &Server{Server: grpc.NewServer(opts...), calls: &callServer{methods: map[string]unaryMethod{}, chain: chainUnary(interceptors)}}
	transportpb.RegisterMultiplexServer(s.Server, s.calls)
	return s
}

// RegisterService registers impl's service on the gRPC server (it
// implements grpc.ServiceRegistrar) and its unary methods on the
// Multiplex stream.
func (s *Server) RegisterService(desc *grpc.ServiceDesc, impl any) {
	s.Server.RegisterService(desc, impl)
	s.calls.add(desc, impl)
}

// chainUnary folds interceptors into one, the first outermost (as
// grpc.ChainUnaryInterceptor does); nil for none.
func chainUnary(interceptors []grpc.UnaryServerInterceptor) grpc.UnaryServerInterceptor {
	if len(interceptors) == 0 {
		return nil
	}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		var next func(i int) grpc.UnaryHandler
		next = func(i int) grpc.UnaryHandler {
			if i == len(interceptors) {
				return handler
			}
			return func(ctx context.Context, req any) (any, error) {
				return interceptors[i](ctx, req, info, next(i+1))
			}
		}
		return next(0)(ctx, req)
	}
}

// unaryMethod is a unary method a Multiplex stream can carry.
type unaryMethod struct {
	impl    any
	handler grpc.MethodHandler
}

// callServer serves the Multiplex stream: each Call runs the method it
// names through the interceptor chain, on a worker of its stream, and its
// reply goes back on the stream whenever it is ready (calls that wait, for
// a lock or an epoch, hold up no other).
type callServer struct {
	transportpb.UnimplementedMultiplexServer

	mu      sync.RWMutex
	methods map[string]unaryMethod // by full method name
	chain   grpc.UnaryServerInterceptor
}

func (s *callServer) add(desc *grpc.ServiceDesc, impl any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range desc.Methods {
		s.methods["/"+desc.ServiceName+"/"+m.MethodName] = unaryMethod{impl: impl, handler: m.Handler}
	}
}

func (s *callServer) lookup(method string) (unaryMethod, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	m, ok := s.methods[method]
	return m, ok
}

// Calls implements transportpb.MultiplexServer. It returns when the
// caller closes the stream (nil) or the stream fails, once every call it
// started has returned: their contexts end with the stream's.
func (s *callServer) Calls(stream transportpb.Multiplex_CallsServer) error {
	cs := &callStream{s: s, stream: stream, running: map[uint64]context.CancelFunc{}, work: make(chan func())}
	err := cs.receive()
	cs.mu.Lock()
	for _, cancel := range cs.running {
		cancel()
	}
	cs.mu.Unlock()
	close(cs.work) // receive has returned: nothing sends on work any more
	cs.wg.Wait()
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// callStream is one Multiplex stream being served.
type callStream struct {
	s      *callServer
	stream transportpb.Multiplex_CallsServer
	sendMu sync.Mutex // stream.Send is not safe for concurrent use
	wg     sync.WaitGroup
	work   chan func()  // to an idle worker (unbuffered)
	idle   atomic.Int32 // workers waiting on work

	mu      sync.Mutex
	running map[uint64]context.CancelFunc // calls started and not yet answered
}

func (cs *callStream) receive() error {
	ctx := cs.stream.Context()
	for {
		c, err := cs.stream.Recv()
		if err != nil {
			return err
		}
		if c.GetCancel() {
			cs.mu.Lock()
			if cancel, ok := cs.running[c.GetId()]; ok {
				cancel()
			}
			cs.mu.Unlock()
			continue
		}
		cctx, cancel := callContext(ctx, c.GetTimeoutUs())
		cs.mu.Lock()
		cs.running[c.GetId()] = cancel
		cs.mu.Unlock()
		cs.wg.Add(1)
		job := func() {
			defer cs.wg.Done()
			cs.serve(cctx, c)
			cs.mu.Lock()
			delete(cs.running, c.GetId())
			cs.mu.Unlock()
			cancel()
		}
		select {
		case cs.work <- job:
		default:
			go cs.worker(job)
		}
	}
}

// maxIdleWorkers bounds the workers a stream keeps waiting for calls;
// past it a worker that finishes its call returns, so that a burst of
// calls that waited (on locks) leaves no crowd of goroutines behind.
const maxIdleWorkers = 16

// callContext is a call's context under the stream's ctx: with the
// caller's deadline, timeoutUs µs from now, unless that is 0.
func callContext(ctx context.Context, timeoutUs int64) (context.Context, context.CancelFunc) {
	if timeoutUs > 0 {
		return context.WithTimeout(ctx, time.Duration(timeoutUs)*time.Microsecond)
	}
	return context.WithCancel(ctx)
}

// worker runs job, then every job handed to it until the stream ends or
// enough other workers are idle: a call runs on a goroutine whose stack
// has already grown to a handler's depth (as the server's stream
// workers, streamWorkers).
func (cs *callStream) worker(job func()) {
	for {
		job()
		if cs.idle.Add(1) > maxIdleWorkers {
			cs.idle.Add(-1)
			return
		}
		next, ok := <-cs.work
		cs.idle.Add(-1)
		if !ok {
			return
		}
		job = next
	}
}

// serve runs call c and sends its reply; a reply that cannot be sent
// (the stream broke) is dropped, as its caller learns from the stream.
func (cs *callStream) serve(ctx context.Context, c *transportpb.Call) {
	reply := &transportpb.CallReply{Id: c.GetId()}
	resp, err := cs.call(ctx, c)
	if err == nil {
		reply.Response, err = proto.Marshal(resp)
	}
	if err != nil {
		st, ok := status.FromError(err)
		if !ok { // as gRPC answers a unary call: a context's error by its code
			st = status.FromContextError(err)
		}
		reply.Status, _ = proto.Marshal(st.Proto())
		reply.Response = nil
	}
	cs.sendMu.Lock()
	_ = cs.stream.Send(reply)
	cs.sendMu.Unlock()
}

// call runs c's method through the interceptor chain.
func (cs *callStream) call(ctx context.Context, c *transportpb.Call) (proto.Message, error) {
	m, ok := cs.s.lookup(c.GetMethod())
	if !ok {
		return nil, status.Errorf(codes.Unimplemented, "transport: method %s is not served over the Multiplex stream", c.GetMethod())
	}
	dec := func(v any) error {
		if err := proto.Unmarshal(c.GetRequest(), v.(proto.Message)); err != nil {
			return status.Errorf(codes.Internal, "transport: %s: cannot unmarshal the request: %v", c.GetMethod(), err)
		}
		return nil
	}
	resp, err := m.handler(m.impl, ctx, dec, cs.s.chain) // the handler gives the chain its FullMethod
	if err != nil {
		return nil, err
	}
	msg, ok := resp.(proto.Message)
	if !ok {
		return nil, status.Errorf(codes.Internal, "transport: %s answered a %T, not a message", c.GetMethod(), resp)
	}
	return msg, nil
}
