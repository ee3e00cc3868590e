package transport

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/terroir-db/terroir/internal/security"
	"github.com/terroir-db/terroir/internal/transport/transportpb"
)

// RaftHandler receives what the Raft transport delivers and reports. A multi-raft
// host implements it.
type RaftHandler interface {
	// HandleRaft delivers the messages of one batch from node `from`, in send order.
	HandleRaft(from uint64, msgs []*transportpb.RaftEnvelope)
	// ReportUnreachable tells group's Raft that messages to node `to` were lost.
	ReportUnreachable(group, to uint64)
	// ReportSnapshot tells group's Raft whether a snapshot to node `to` was sent.
	ReportSnapshot(group, to uint64, ok bool)
	// HandleSnapshot receives one streamed snapshot from node `from`: first
	// is its header chunk, next returns each later chunk's data and io.EOF
	// after the last. An error refuses the snapshot (a gRPC status error is
	// passed on as is, any other as FailedPrecondition).
	HandleSnapshot(ctx context.Context, from uint64, first *transportpb.SnapshotChunk, next func() ([]byte, error)) error
	// GroupView returns this node's view of group's configuration
	// (hosted false when it has no replica of it).
	GroupView(group uint64) *transportpb.GroupResponse
}

// maxQueuedPerPeer bounds the messages queued for one node; beyond it new messages
// are dropped, as a congested network would, and Raft retransmits.
const maxQueuedPerPeer = 8192

// Raft sends Raft messages to other nodes, one ordered gRPC stream per destination,
// coalescing everything queued for a destination (all groups) into one batch per
// send. It also serves the Transport gRPC service for incoming streams and pings.
type Raft struct {
	transportpb.UnimplementedTransportServer

	dialer  *Dialer
	handler RaftHandler

	mu      sync.Mutex
	senders map[uint64]*sender
	closed  bool
	wg      sync.WaitGroup
	ctx     context.Context // canceled by Close; parent of every stream
	cancel  context.CancelFunc
}

// NewRaft returns a Raft transport sending from dialer.Self() and delivering
// incoming messages to h.
func NewRaft(dialer *Dialer, h RaftHandler) *Raft {
	ctx, cancel := context.WithCancel(context.Background())
	return &Raft{dialer: dialer, handler: h, senders: map[uint64]*sender{}, ctx: ctx, cancel: cancel}
}

// Register installs the Transport service on s.
func (t *Raft) Register(s grpc.ServiceRegistrar) { transportpb.RegisterTransportServer(s, t) }

// Send queues msg of group for its destination node without blocking. Messages to
// one node leave in Send order, each after the network's one-way delay.
func (t *Raft) Send(group uint64, msg *raftpb.Message) {
	to := msg.GetTo()
	self := t.dialer.Self()
	if to == self.Node {
		return
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	s, ok := t.senders[to]
	if !ok {
		s = &sender{t: t, to: t.dialer.Network().NodeEndpoint(to), wake: make(chan struct{}, 1)}
		t.senders[to] = s
		t.wg.Add(1)
		go s.run()
	}
	t.mu.Unlock()
	s.enqueue(&transportpb.RaftEnvelope{GroupId: group, Msg: msg})
}

// Close stops every sender and waits for them to exit. Queued messages are lost.
func (t *Raft) Close() {
	t.mu.Lock()
	t.closed = true
	t.cancel()
	t.mu.Unlock()
	t.wg.Wait()
}

// Raft implements the server side of the batch stream. Over TLS, a batch
// must come from the node the stream's certificate names: a node cannot
// speak for another (PermissionDenied ends the stream).
func (t *Raft) Raft(stream grpc.ClientStreamingServer[transportpb.RaftBatch, transportpb.RaftAck]) error {
	peer, secure := security.PeerIdentity(stream.Context())
	for {
		b, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return stream.SendAndClose(&transportpb.RaftAck{})
		}
		if err != nil {
			return err
		}
		if secure && b.GetFromNode() != peer.Node {
			return status.Errorf(codes.PermissionDenied, "%s may not send Raft messages as node %d", peer, b.GetFromNode())
		}
		t.handler.HandleRaft(b.GetFromNode(), b.GetMsgs())
	}
}

// Group implements transportpb.TransportServer: this node's view of a
// group's configuration.
func (t *Raft) Group(_ context.Context, req *transportpb.GroupRequest) (*transportpb.GroupResponse, error) {
	return t.handler.GroupView(req.GetGroupId()), nil
}

// Ping implements the echo RPC.
func (t *Raft) Ping(_ context.Context, req *transportpb.PingRequest) (*transportpb.PingResponse, error) {
	return &transportpb.PingResponse{Payload: req.GetPayload()}, nil
}

type queued struct {
	env       *transportpb.RaftEnvelope
	releaseAt time.Time
}

// sender owns the stream to one destination node.
type sender struct {
	t    *Raft
	to   Endpoint
	wake chan struct{}

	mu    sync.Mutex
	queue []queued
}

func (s *sender) enqueue(env *transportpb.RaftEnvelope) {
	net := s.t.dialer.Network()
	self := s.t.dialer.Self()
	if !net.DeliverableRaft(self, s.to) {
		s.failed([]*transportpb.RaftEnvelope{env})
		return
	}
	s.mu.Lock()
	if len(s.queue) >= maxQueuedPerPeer {
		s.mu.Unlock()
		s.failed([]*transportpb.RaftEnvelope{env})
		return
	}
	at := time.Now().Add(net.OneWayDelay(self, s.to))
	s.queue = append(s.queue, queued{env: env, releaseAt: at})
	if net.Duplicated() {
		s.queue = append(s.queue, queued{env: env, releaseAt: at})
	}
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// due removes and returns the queued messages whose delay has elapsed, and the
// time the next one falls due (zero if none is waiting). Messages still in
// flight when a cut begins are lost with it.
func (s *sender) due(now time.Time) (out, lost []*transportpb.RaftEnvelope, next time.Time) {
	s.mu.Lock()
	n := 0
	for n < len(s.queue) && !s.queue[n].releaseAt.After(now) {
		n++
	}
	out = make([]*transportpb.RaftEnvelope, n)
	for i := range out {
		out[i] = s.queue[i].env
	}
	s.queue = append(s.queue[:0], s.queue[n:]...)
	if len(s.queue) > 0 {
		next = s.queue[0].releaseAt
	}
	s.mu.Unlock()
	if len(out) > 0 && s.t.dialer.Network().CutRaft(s.t.dialer.Self(), s.to) {
		return nil, out, next
	}
	return out, nil, next
}

func (s *sender) run() {
	defer s.t.wg.Done()
	var (
		stream grpc.ClientStreamingClient[transportpb.RaftBatch, transportpb.RaftAck]
		cancel context.CancelFunc = func() {}
		timer                     = time.NewTimer(time.Hour)
	)
	defer func() {
		cancel()
		timer.Stop()
	}()
	self := s.t.dialer.Self()
	for {
		msgs, lost, next := s.due(time.Now())
		if len(lost) > 0 {
			s.failed(lost)
			continue
		}
		if len(msgs) > 0 {
			if stream == nil {
				st, c, err := s.open()
				if err != nil {
					s.failed(msgs)
					continue
				}
				stream, cancel = st, c
			}
			if err := stream.Send(&transportpb.RaftBatch{FromNode: self.Node, ToNode: s.to.Node, Msgs: msgs}); err != nil {
				slog.Debug("raft stream send failed", "to", s.to.Node, "err", err)
				cancel()
				stream = nil
				s.failed(msgs)
				continue
			}
			s.sent(msgs)
			continue
		}
		wait := time.Hour
		if !next.IsZero() {
			wait = time.Until(next)
		}
		timer.Reset(wait)
		select {
		case <-s.t.ctx.Done():
			return
		case <-s.wake:
		case <-timer.C:
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

func (s *sender) open() (grpc.ClientStreamingClient[transportpb.RaftBatch, transportpb.RaftAck], context.CancelFunc, error) {
	conn, err := s.t.dialer.Conn(s.to.Node)
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(s.t.ctx)
	stream, err := transportpb.NewTransportClient(conn).Raft(ctx)
	if err != nil {
		cancel()
		return nil, nil, err
	}
	return stream, cancel, nil
}

// failed reports lost messages to their groups so Raft probes again.
func (s *sender) failed(msgs []*transportpb.RaftEnvelope) {
	seen := map[uint64]bool{}
	for _, e := range msgs {
		if e.GetMsg().GetType() == raftpb.MsgSnap {
			s.t.handler.ReportSnapshot(e.GetGroupId(), s.to.Node, false)
		}
		if !seen[e.GetGroupId()] {
			seen[e.GetGroupId()] = true
			s.t.handler.ReportUnreachable(e.GetGroupId(), s.to.Node)
		}
	}
}

// sent reports snapshots handed to the stream.
func (s *sender) sent(msgs []*transportpb.RaftEnvelope) {
	for _, e := range msgs {
		if e.GetMsg().GetType() == raftpb.MsgSnap {
			s.t.handler.ReportSnapshot(e.GetGroupId(), s.to.Node, true)
		}
	}
}
