package transport

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/transport/transportpb"
)

// freezer is a TCP proxy in front of a server that can stop forwarding
// without closing anything, as a SIGSTOP'd process does: the kernel keeps the
// sockets open, nothing answers.
type freezer struct {
	l      net.Listener
	target string

	mu     sync.Mutex
	frozen bool
	thawed chan struct{} // closed when unfrozen
	conns  []net.Conn
	wg     sync.WaitGroup
	closed bool
}

func newFreezer(t *testing.T, target string) *freezer {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &freezer{l: l, target: target, thawed: make(chan struct{})}
	close(f.thawed)
	f.wg.Add(1)
	go f.accept()
	t.Cleanup(f.close)
	return f
}

func (f *freezer) accept() {
	defer f.wg.Done()
	for {
		c, err := f.l.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", f.target)
		if err != nil {
			c.Close()
			continue
		}
		f.mu.Lock()
		if f.closed {
			f.mu.Unlock()
			c.Close()
			s.Close()
			return
		}
		f.conns = append(f.conns, c, s)
		f.wg.Add(2)
		f.mu.Unlock()
		go f.pipe(c, s)
		go f.pipe(s, c)
	}
}

// pipe copies src to dst, holding every chunk while frozen.
func (f *freezer) pipe(dst, src net.Conn) {
	defer f.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			f.mu.Lock()
			thawed := f.thawed
			f.mu.Unlock()
			<-thawed
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				_ = dst.Close()
			} else if tc, ok := dst.(*net.TCPConn); ok {
				_ = tc.CloseWrite()
			}
			return
		}
	}
}

func (f *freezer) freeze(on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if on == f.frozen {
		return
	}
	f.frozen = on
	if on {
		f.thawed = make(chan struct{})
	} else {
		close(f.thawed)
	}
}

func (f *freezer) close() {
	f.freeze(false)
	f.mu.Lock()
	f.closed = true
	conns := f.conns
	f.mu.Unlock()
	f.l.Close()
	for _, c := range conns {
		c.Close()
	}
	f.wg.Wait()
}

// frozenPair serves the Transport service as node 1, reached through a
// freezer, and returns a client dialer with fast failure detection.
func frozenPair(t *testing.T, rttMS int) (*Dialer, *freezer, *Network) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := newFreezer(t, l.Addr().String())
	top, err := topology.Parse([]byte(`
regions: [east, west]
rtt: [{between: [east, west], ms: ` + itoa(rttMS) + `}]
nodes:
  - {id: 1, region: east, addr: "` + f.l.Addr().String() + `"}
`))
	if err != nil {
		t.Fatal(err)
	}
	nw := NewNetwork(top)
	sd := NewDialer(nw, nw.NodeEndpoint(1), nil)
	r := NewRaft(sd, &recorder{})
	s := NewServer(nil)
	r.Register(s)
	done := make(chan struct{})
	go func() { _ = s.Serve(l); close(done) }()
	d := NewDialer(nw, Endpoint{Region: "west"}, nil)
	d.SetDetector(DetectorConfig{ProbeAfter: 100 * time.Millisecond, ProbeTimeout: 100 * time.Millisecond})
	t.Cleanup(func() {
		d.Close()
		f.close()
		r.Close()
		s.Stop()
		<-done
		sd.Close()
	})
	return d, f, nw
}

func ping(d *Dialer, ctx context.Context) error {
	conn, err := d.Conn(1)
	if err != nil {
		return err
	}
	_, err = transportpb.NewTransportClient(conn).Ping(ctx, &transportpb.PingRequest{})
	return err
}

// A call to a node that stops answering without closing its sockets fails
// soon after the detector's ping goes unanswered, well before the caller's
// deadline; later calls fail at once as NotSent; once the node answers
// again, calls go through.
func TestDetectorFailsCallsToFrozenNode(t *testing.T) {
	d, f, _ := frozenPair(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := ping(d, ctx); err != nil {
		t.Fatal(err)
	}
	f.freeze(true)
	start := time.Now()
	err := ping(d, ctx)
	took := time.Since(start)
	if status.Code(err) != codes.Unavailable || NotSent(err) || ctx.Err() != nil {
		t.Fatalf("call in flight to a frozen node: %v (after %v), want Unavailable before the deadline", err, took)
	}
	t.Logf("call in flight failed after %v: %v", took, err)
	start = time.Now()
	err = ping(d, ctx)
	if !NotSent(err) || status.Code(err) != codes.Unavailable || time.Since(start) > time.Second {
		t.Fatalf("call to an unresponsive node: %v after %v, want NotSent at once", err, time.Since(start))
	}
	f.freeze(false)
	for {
		if err = ping(d, ctx); err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("node thawed, calls still fail: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A node that answers slowly (here a 1.5 s round trip, far above ProbeAfter
// and ProbeTimeout) is not declared unresponsive: the ping's bound includes
// the round trip, and the call completes.
func TestDetectorSparesSlowNode(t *testing.T) {
	d, _, _ := frozenPair(t, 1500)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := 0; i < 2; i++ {
		if err := ping(d, ctx); err != nil {
			t.Fatalf("call %d to a slow node: %v", i, err)
		}
	}
	if p := d.det.peer(1); p.down.Load() != 0 {
		t.Fatal("a slow node was declared unresponsive")
	}
}

// A node's calls to itself are never failed by its detector: through a
// frozen path (here, the freezer in front of its own server) they wait for
// their own deadline, where calls from elsewhere fail soon after a ping
// goes unanswered (TestDetectorFailsCallsToFrozenNode).
func TestDetectorNeverDeclaresItsOwnNodeUnresponsive(t *testing.T) {
	_, f, nw := frozenPair(t, 0)
	self := NewDialer(nw, nw.NodeEndpoint(1), nil)
	self.SetDetector(DetectorConfig{ProbeAfter: 100 * time.Millisecond, ProbeTimeout: 100 * time.Millisecond})
	defer self.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := ping(self, ctx); err != nil {
		t.Fatal(err)
	}
	f.freeze(true)
	cctx, ccancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer ccancel()
	start := time.Now()
	err := ping(self, cctx)
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a node's call to itself through a frozen path: %v after %v, want its own deadline (1.5 s)", err, time.Since(start).Round(time.Millisecond))
	}
	if p := self.det.peer(1); p.down.Load() != 0 {
		t.Fatal("the node declared itself unresponsive")
	}
	f.freeze(false)
	if err := ping(self, ctx); err != nil {
		t.Fatalf("thawed: %v", err)
	}
}

// A dialer takes its failure detection from its network's SetDetector, with
// the defaults for the fields left zero.
func TestDialerTakesItsNetworksDetector(t *testing.T) {
	top, err := topology.Parse([]byte("regions: [east]\nnodes:\n  - {id: 1, region: east, addr: \"127.0.0.1:1\"}\n"))
	if err != nil {
		t.Fatal(err)
	}
	nw := NewNetwork(top)
	before := NewDialer(nw, Endpoint{Region: "east"}, nil)
	defer before.Close()
	nw.SetDetector(DetectorConfig{ProbeTimeout: 2 * time.Second})
	after := NewDialer(nw, Endpoint{Region: "east"}, nil)
	defer after.Close()
	if got := before.det.cfg; got.ProbeTimeout != DefaultProbeTimeout || got.ProbeAfter != DefaultProbeAfter {
		t.Fatalf("a dialer made before SetDetector: %+v, want the defaults", got)
	}
	if got := after.det.cfg; got.ProbeTimeout != 2*time.Second || got.ProbeAfter != DefaultProbeAfter {
		t.Fatalf("a dialer made after SetDetector{ProbeTimeout: 2s}: %+v, want 2s and the default ProbeAfter", got)
	}
}

// A call that finds no connection to its node, and whose dial is refused,
// never left the process: it fails as NotSent, so a coordinator may send
// even a commit elsewhere. A call a connection took before the node went
// away, or one the network model duplicated, may have executed: it fails
// Unavailable but not NotSent.
func TestCallsNoConnectionTookAreNotSent(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	// Nothing listens at node 1's address: every dial is refused.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	top, err := topology.Parse([]byte("regions: [east]\nnodes:\n  - {id: 1, region: east, addr: \"" + addr + "\"}\n"))
	if err != nil {
		t.Fatal(err)
	}
	refused := NewDialer(NewNetwork(top), Endpoint{Region: "east"}, nil)
	defer refused.Close()
	for i := 0; i < 3; i++ {
		if err := ping(refused, ctx); status.Code(err) != codes.Unavailable || !NotSent(err) {
			t.Fatalf("call %d to a node that refuses connections: %v, want Unavailable and NotSent", i, err)
		}
	}

	// A call the network model duplicates may reach the node by its copy:
	// it is never NotSent, even though the call itself was refused.
	dupNet := NewNetwork(top)
	dupNet.SetDuplicateRate(1)
	dup := NewDialer(dupNet, Endpoint{Region: "east"}, nil)
	defer dup.Close()
	if err := ping(dup, ctx); status.Code(err) != codes.Unavailable || NotSent(err) {
		t.Fatalf("a duplicated call to a node that refuses connections: %v, want Unavailable and not NotSent (its copy may arrive)", err)
	}

	// A call on an open connection when the node goes away.
	d, f, _ := frozenPair(t, 0)
	if err := ping(d, ctx); err != nil {
		t.Fatal(err)
	}
	f.freeze(true)
	inflight := make(chan error, 1)
	go func() { inflight <- ping(d, ctx) }()
	time.Sleep(30 * time.Millisecond) // the request is on the socket, held by the freezer
	f.mu.Lock()
	conns := f.conns
	f.mu.Unlock()
	f.l.Close() // later dials are refused
	for _, c := range conns {
		c.Close()
	}
	f.freeze(false)
	if err := <-inflight; status.Code(err) != codes.Unavailable || NotSent(err) {
		t.Fatalf("a call sent before its node went away: %v, want Unavailable and not NotSent (it may have executed)", err)
	}
	// Once gRPC has dropped the dead socket, calls dial, are refused, and
	// are NotSent.
	for {
		err := ping(d, ctx)
		if NotSent(err) {
			break
		}
		if status.Code(err) != codes.Unavailable || ctx.Err() != nil {
			t.Fatalf("call after the node went away: %v, want Unavailable, and soon NotSent", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
