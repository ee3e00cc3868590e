package rangeserver

import (
	"context"
	"log/slog"
	"sync"
	"time"

	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/transport"
)

// SideTransport sends the side-transported closes of the ranges a node
// leads (sideclosed.go, DESIGN.md §13) to the nodes holding their other
// replicas: one Range/SideClosed RPC per peer node for every range's
// newest close, gathered over a short window, with at most
// sideInFlight RPCs in flight per peer (a peer across the WAN takes a
// round trip longer than the interval between closes). A close that
// cannot be sent is dropped: the next one, an interval later, says more;
// a replica ignores one older than the newest it has.
type SideTransport struct {
	send   func(ctx context.Context, node uint64, req *pb.SideClosedRequest) error
	self   uint64
	gather time.Duration

	mu      sync.Mutex
	pending map[uint64]map[uint64]*pb.SideClosed // peer node → range ID → newest close
	busy    map[uint64]int                       // RPCs in flight, by peer
	hold    time.Duration                        // Hold: every RPC waits this long first

	kick   chan struct{}
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// sideTimeout bounds one SideClosed RPC, hold included; sideInFlight is
// how many may be in flight to one peer.
const (
	sideTimeout  = 3 * time.Second
	sideInFlight = 4
)

// NewSideTransport starts node self's side transport: it sends with send,
// gathering the closes enqueued within gather (> 0) of the first into one
// RPC per peer. Close stops it.
func NewSideTransport(self uint64, gather time.Duration, send func(ctx context.Context, node uint64, req *pb.SideClosedRequest) error) *SideTransport {
	ctx, cancel := context.WithCancel(context.Background())
	t := &SideTransport{send: send, self: self, gather: gather, pending: map[uint64]map[uint64]*pb.SideClosed{},
		busy: map[uint64]int{}, kick: make(chan struct{}, 1), ctx: ctx, cancel: cancel}
	t.wg.Add(1)
	go t.loop()
	return t
}

// Send queues close u for each of nodes, replacing any queued close of the
// same range (Config.SideClose).
func (t *SideTransport) Send(nodes []uint64, u *pb.SideClosed) {
	t.mu.Lock()
	for _, n := range nodes {
		q := t.pending[n]
		if q == nil {
			q = map[uint64]*pb.SideClosed{}
			t.pending[n] = q
		}
		q[u.GetRangeId()] = u
	}
	t.mu.Unlock()
	t.wake()
}

// Hold makes every RPC sent from now on wait d before it goes (0: none): a
// nemesis delivers closes late with it, after the leases or shapes they
// were made under may have changed.
func (t *SideTransport) Hold(d time.Duration) {
	t.mu.Lock()
	t.hold = d
	t.mu.Unlock()
}

// Close stops the transport and waits for the RPCs in flight.
func (t *SideTransport) Close() {
	t.cancel()
	t.wg.Wait()
}

func (t *SideTransport) wake() {
	select {
	case t.kick <- struct{}{}:
	default:
	}
}

func (t *SideTransport) loop() {
	defer t.wg.Done()
	for {
		select {
		case <-t.ctx.Done():
			return
		case <-t.kick:
		}
		if !transport.SleepCtx(t.ctx, t.gather) {
			return
		}
		t.flush()
	}
}

// flush starts one RPC to each peer with closes queued and fewer than
// sideInFlight in flight.
func (t *SideTransport) flush() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for n, q := range t.pending {
		if t.busy[n] >= sideInFlight || len(q) == 0 {
			continue
		}
		req := &pb.SideClosedRequest{FromNode: t.self, Closes: make([]*pb.SideClosed, 0, len(q))}
		for _, u := range q {
			req.Closes = append(req.Closes, u)
		}
		delete(t.pending, n)
		t.busy[n]++
		t.wg.Add(1)
		go t.sendTo(n, req, t.hold)
	}
}

func (t *SideTransport) sendTo(n uint64, req *pb.SideClosedRequest, hold time.Duration) {
	defer t.wg.Done()
	ctx, cancel := context.WithTimeout(t.ctx, sideTimeout)
	defer cancel()
	if transport.SleepCtx(ctx, hold) {
		if err := t.send(ctx, n, req); err != nil {
			slog.Debug("side-transported closes not sent", "node", n, "closes", len(req.GetCloses()), "err", err)
		}
	}
	t.mu.Lock()
	if t.busy[n]--; t.busy[n] == 0 {
		delete(t.busy, n)
	}
	again := len(t.pending[n]) > 0
	t.mu.Unlock()
	if again {
		t.wake()
	}
}
