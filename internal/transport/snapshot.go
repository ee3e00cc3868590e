package transport

import (
	"context"
	"errors"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/terroir-db/terroir/internal/security"
	"github.com/terroir-db/terroir/internal/transport/transportpb"
)

// snapshotIdle bounds how long a snapshot stream may make no progress (a
// chunk not taken, the receiver's answer not come) before it is abandoned:
// a frozen receiver does not hold a send slot and a storage snapshot for
// good.
const snapshotIdle = 20 * time.Second

// SendSnapshot streams one Raft snapshot to node `to` (DESIGN.md §12): first
// carries the header (group, MsgSnap, spans), then body calls send with
// each chunk of data in order. It returns once the receiver has taken the
// whole snapshot (nil) or refused it, or when ctx ends. The network's cuts
// apply, checked at the start and at every chunk; its delays do not (a
// snapshot is bulk data, paced by its sender).
func (t *Raft) SendSnapshot(ctx context.Context, to uint64, first *transportpb.SnapshotChunk, body func(send func(data []byte) error) error) error {
	self, dest := t.dialer.Self(), t.dialer.Network().NodeEndpoint(to)
	if !t.dialer.Network().DeliverableRaft(self, dest) {
		return status.Errorf(codes.Unavailable, "transport: snapshot to node %d cut off by the network", to)
	}
	conn, err := t.dialer.Conn(to)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	idle := time.AfterFunc(snapshotIdle, cancel)
	defer idle.Stop()
	stream, err := transportpb.NewTransportClient(conn).Snapshot(ctx)
	if err != nil {
		return err
	}
	first.FromNode = self.Node
	if err := stream.Send(first); err != nil {
		return streamErr(stream, err)
	}
	err = body(func(data []byte) error {
		if !t.dialer.Network().DeliverableRaft(self, dest) {
			return status.Errorf(codes.Unavailable, "transport: snapshot to node %d cut off by the network", to)
		}
		if err := stream.Send(&transportpb.SnapshotChunk{FromNode: self.Node, Data: data}); err != nil {
			return streamErr(stream, err)
		}
		idle.Reset(snapshotIdle)
		return nil
	})
	if err != nil {
		return err
	}
	_, err = stream.CloseAndRecv()
	return err
}

// streamErr returns the server's status for a failed Send (gRPC reports
// io.EOF there and the real error at CloseAndRecv).
func streamErr(stream grpc.ClientStreamingClient[transportpb.SnapshotChunk, transportpb.SnapshotAck], err error) error {
	if errors.Is(err, io.EOF) {
		if _, rerr := stream.CloseAndRecv(); rerr != nil {
			return rerr
		}
	}
	return err
}

// Snapshot implements the server side of a snapshot stream, handing it to
// the handler. Over TLS, every chunk must come from the node the stream's
// certificate names.
func (t *Raft) Snapshot(stream grpc.ClientStreamingServer[transportpb.SnapshotChunk, transportpb.SnapshotAck]) error {
	peer, secure := security.PeerIdentity(stream.Context())
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	from := first.GetFromNode()
	if secure && from != peer.Node {
		return status.Errorf(codes.PermissionDenied, "%s may not send snapshots as node %d", peer, from)
	}
	next := func() ([]byte, error) {
		c, err := stream.Recv()
		if err != nil {
			return nil, err // io.EOF at the end
		}
		if c.GetFromNode() != from {
			return nil, status.Errorf(codes.InvalidArgument, "snapshot chunk from node %d in node %d's stream", c.GetFromNode(), from)
		}
		return c.GetData(), nil
	}
	if err := t.handler.HandleSnapshot(stream.Context(), from, first, next); err != nil {
		if _, ok := status.FromError(err); ok {
			return err
		}
		return status.Error(codes.FailedPrecondition, err.Error())
	}
	return stream.SendAndClose(&transportpb.SnapshotAck{})
}
