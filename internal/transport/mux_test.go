package transport

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/transport/transportpb"
)

// waiter is a test service: Echo answers its payload (or fails with the
// status it names), Wait holds the call until its context ends and
// reports how it ended and whether it had a deadline.
type waiter struct {
	started chan struct{}
	ended   chan error
	dl      chan bool
}

func newWaiter() *waiter {
	return &waiter{started: make(chan struct{}, 16), ended: make(chan error, 16), dl: make(chan bool, 16)}
}

var waiterDesc = grpc.ServiceDesc{
	ServiceName: "terroir.transport.Waiter",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{
		{MethodName: "Echo", Handler: func(srv any, ctx context.Context, dec func(any) error, in grpc.UnaryServerInterceptor) (any, error) {
			req := new(transportpb.PingRequest)
			if err := dec(req); err != nil {
				return nil, err
			}
			if p := string(req.GetPayload()); strings.HasPrefix(p, "fail:") {
				return nil, status.Error(codes.FailedPrecondition, strings.TrimPrefix(p, "fail:"))
			}
			return &transportpb.PingResponse{Payload: req.GetPayload()}, nil
		}},
		{MethodName: "Wait", Handler: func(srv any, ctx context.Context, dec func(any) error, in grpc.UnaryServerInterceptor) (any, error) {
			w := srv.(*waiter)
			if err := dec(new(transportpb.PingRequest)); err != nil {
				return nil, err
			}
			_, ok := ctx.Deadline()
			w.dl <- ok
			w.started <- struct{}{}
			<-ctx.Done()
			w.ended <- ctx.Err()
			return nil, ctx.Err()
		}},
	},
}

// muxServe serves node 1 of a one-region network with the Transport and
// Waiter services (on a plain gRPC server without Multiplex if plain),
// and returns a dialer of node 2 and a function that stops the server.
func muxServe(t *testing.T, plain bool) (*Dialer, *Network, *waiter, func()) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	top, err := topology.Parse([]byte(`
regions: [east]
nodes:
  - {id: 1, region: east, addr: "` + l.Addr().String() + `"}
  - {id: 2, region: east, addr: "127.0.0.1:1"}
`))
	if err != nil {
		t.Fatal(err)
	}
	nw := NewNetwork(top)
	sd := NewDialer(nw, nw.NodeEndpoint(1), nil)
	r := NewRaft(sd, &recorder{})
	w := newWaiter()
	var s interface {
		grpc.ServiceRegistrar
		Serve(net.Listener) error
		Stop()
	}
	if plain {
		s = grpc.NewServer()
	} else {
		s = NewServer(nil)
	}
	r.Register(s)
	s.RegisterService(&waiterDesc, w)
	done := make(chan struct{})
	go func() { _ = s.Serve(l); close(done) }()
	var once sync.Once
	stop := func() { once.Do(func() { s.Stop(); <-done }) }
	d := NewDialer(nw, nw.NodeEndpoint(2), nil)
	t.Cleanup(func() {
		d.Close()
		stop()
		r.Close()
		sd.Close()
	})
	return d, nw, w, stop
}

func muxCall(ctx context.Context, d *Dialer, method, payload string) (string, error) {
	conn, err := d.Multiplexed(1)
	if err != nil {
		return "", err
	}
	resp := new(transportpb.PingResponse)
	err = conn.Invoke(ctx, "/terroir.transport.Waiter/"+method, &transportpb.PingRequest{Payload: []byte(payload)}, resp)
	return string(resp.GetPayload()), err
}

// Calls over the Multiplex stream answer as they would alone: responses,
// and failures with their code and message; every call to a node shares
// one stream.
func TestMultiplexedCallsAnswer(t *testing.T) {
	d, _, _, _ := muxServe(t, false)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, want := range []string{"a", "bb", "ccc"} {
		got, err := muxCall(ctx, d, "Echo", want)
		if err != nil || got != want {
			t.Fatalf("call %d: %q, %v; want %q", i, got, err, want)
		}
	}
	_, err := muxCall(ctx, d, "Echo", "fail:no such thing")
	if status.Code(err) != codes.FailedPrecondition || status.Convert(err).Message() != "no such thing" {
		t.Fatalf("failing call: %v, want FailedPrecondition \"no such thing\"", err)
	}
	err = d.muxConns[1].Invoke(ctx, "/terroir.transport.Waiter/Nope", &transportpb.PingRequest{}, new(transportpb.PingResponse))
	if status.Code(err) != codes.Unimplemented {
		t.Fatalf("unknown method: %v, want Unimplemented", err)
	}
	m := d.muxConns[1]
	m.mu.Lock()
	st := m.st
	m.mu.Unlock()
	if st == nil {
		t.Fatal("no stream open")
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.next != 5 {
		t.Fatalf("the stream carried %d calls, want all 5", st.next)
	}
}

// A call that waits holds up no other call on the stream; the caller's
// deadline reaches the server, and a caller that gives up cancels its
// call there.
func TestMultiplexedCallsWaitAndCancelApart(t *testing.T) {
	d, _, w, _ := muxServe(t, false)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	wctx, wcancel := context.WithCancel(context.Background()) // no deadline
	defer wcancel()
	waited := make(chan error, 1)
	go func() { _, err := muxCall(wctx, d, "Wait", ""); waited <- err }()
	<-w.started
	if <-w.dl {
		t.Fatal("a call without a deadline had one at the server")
	}
	if got, err := muxCall(ctx, d, "Echo", "x"); err != nil || got != "x" {
		t.Fatalf("a call beside a waiting one: %q, %v", got, err)
	}
	wcancel()
	if err := <-waited; status.Code(err) != codes.Canceled {
		t.Fatalf("the canceled caller got %v, want Canceled", err)
	}
	select {
	case err := <-w.ended:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("the server's call ended with %v, want canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the server's call was not canceled when its caller gave up")
	}
	dctx, dcancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer dcancel()
	_, err := muxCall(dctx, d, "Wait", "")
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a call past its deadline: %v, want DeadlineExceeded", err)
	}
	if !<-w.dl {
		t.Fatal("the caller's deadline did not reach the server")
	}
	if err := <-w.ended; !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
		t.Fatalf("the server's call ended with %v", err)
	}
}

// The network model applies as to a unary call: a node cut off fails the
// call with Unavailable, and the injected one-way delays are paid.
func TestMultiplexedCallsCrossTheNetworkModel(t *testing.T) {
	d, nw, _, _ := muxServe(t, false)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := muxCall(ctx, d, "Echo", "x"); err != nil {
		t.Fatal(err)
	}
	nw.CutNode(1)
	if _, err := muxCall(ctx, d, "Echo", "x"); status.Code(err) != codes.Unavailable {
		t.Fatalf("a call to a node cut off: %v, want Unavailable", err)
	}
	nw.Heal()
	if _, err := muxCall(ctx, d, "Echo", "x"); err != nil {
		t.Fatalf("after healing: %v", err)
	}
}

// A stream that breaks fails the calls in flight with Unavailable, and
// a node that does not serve Multiplex gets plain unary calls.
func TestMultiplexedStreamBreaksAndFallsBack(t *testing.T) {
	d, _, w, stop := muxServe(t, false)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	waited := make(chan error, 1)
	go func() { _, err := muxCall(ctx, d, "Wait", ""); waited <- err }()
	<-w.started
	stop()
	if err := <-waited; status.Code(err) != codes.Unavailable || NotSent(err) {
		t.Fatalf("a call in flight when its stream broke: %v, want Unavailable that may have executed (not NotSent)", err)
	}

	d2, _, _, _ := muxServe(t, true)
	for i := range 2 {
		if got, err := muxCall(ctx, d2, "Echo", "y"); err != nil || got != "y" {
			t.Fatalf("call %d to a node without Multiplex: %q, %v", i, got, err)
		}
	}
	if !d2.muxConns[1].unary.Load() {
		t.Fatal("calls to a node without Multiplex did not fall back to unary calls")
	}
}

// A node that stops answering without closing its sockets: the call in
// flight on the stream fails once the detector's ping goes unanswered,
// later calls fail at once as NotSent, and calls go through once it
// answers again.
func TestMultiplexedCallsToAFrozenNode(t *testing.T) {
	d, f, _ := frozenPair(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ping := func() error {
		conn, err := d.Multiplexed(1)
		if err != nil {
			return err
		}
		_, err = transportpb.NewTransportClient(conn).Ping(ctx, &transportpb.PingRequest{})
		return err
	}
	if err := ping(); err != nil {
		t.Fatal(err)
	}
	f.freeze(true)
	if err := ping(); status.Code(err) != codes.Unavailable || NotSent(err) || ctx.Err() != nil {
		t.Fatalf("call in flight to a frozen node: %v, want Unavailable before the deadline", err)
	}
	if err := ping(); !NotSent(err) {
		t.Fatalf("call to an unresponsive node: %v, want NotSent", err)
	}
	f.freeze(false)
	for {
		err := ping()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("calls never went through again: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
