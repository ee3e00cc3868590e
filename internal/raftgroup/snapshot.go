package raftgroup

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"

	"github.com/cockroachdb/pebble/v2"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/terroir-db/terroir/internal/storage"
	"github.com/terroir-db/terroir/internal/transport/transportpb"
)

// Snapshots (DESIGN.md §12). A group's state machine is either a
// Snapshotter, whose state is small enough to copy into memory and travel
// inside the Raft message, or Streamed, whose state lives in engine key
// spans of any size: a Raft snapshot of it carries only a marker, and when
// the leader sends it, the host streams the spans from a consistent engine
// snapshot in chunks, rate-limited, to the follower, which writes them into
// an SST file on disk as they arrive and ingests it atomically once Raft
// accepts the snapshot. Memory stays bounded by the chunk size on both
// sides, whatever the group's size.

// Snapshotter is a StateMachine whose whole state is copied into a
// snapshot in memory (epoch, transaction-state and directory groups).
type Snapshotter interface {
	// Snapshot encodes the state as of the last applied command.
	Snapshot() ([]byte, error)
	// Restore replaces the state with an encoded snapshot, staging its
	// durable form in b (an indexed batch).
	Restore(b *pebble.Batch, data []byte) error
}

// Streamed is a StateMachine whose whole state lives in engine key spans
// (ranges), snapshotted by streaming those spans.
type Streamed interface {
	// SnapshotSpans returns the sorted, disjoint engine spans [lo, hi) that
	// hold the state as the view get reads it (a consistent engine
	// snapshot), none under storage.PrefixRaft.
	SnapshotSpans(get func(key []byte) ([]byte, error)) ([][2][]byte, error)
	// CheckSpans vets the spans a received snapshot replaces: an error if
	// any could hold state that is not this group's.
	CheckSpans(spans [][2][]byte) error
	// Reload rebuilds the in-memory view from the engine once a received
	// snapshot has been ingested into its spans.
	Reload() error
}

// streamedMarker is the data of a Streamed group's Raft snapshot.
var streamedMarker = []byte("terroir/streamed-snapshot/v1")

// snapshotChunkBytes is the size of one streamed chunk (and of the
// receiver's buffer for it).
const snapshotChunkBytes = 256 << 10

// staged is a received snapshot waiting for Raft to accept it: its files,
// ingested together when it does.
type staged struct {
	index uint64
	paths []string
}

// incoming is a received snapshot handed to the group's goroutine.
type incoming struct {
	msg    *raftpb.Message
	staged staged
}

// route sends m, diverting a Streamed group's snapshot to a stream.
func (h *Host) route(g *Group) func(group uint64, m *raftpb.Message) {
	return func(group uint64, m *raftpb.Message) {
		if m.GetType() == raftpb.MsgSnap && isStreamed(m.GetSnapshot().GetData()) {
			h.streamSnapshot(g, m)
			return
		}
		h.sender.Send(group, m)
	}
}

// streamSnapshot sends g's state to m's destination in the background,
// then reports the outcome to g's Raft. Past the in-flight bound it fails
// at once (Raft tries again later).
func (h *Host) streamSnapshot(g *Group, m *raftpb.Message) {
	to := m.GetTo()
	h.mu.RLock()
	defer h.mu.RUnlock()
	if h.closed {
		return
	}
	select {
	case h.sending <- struct{}{}:
	default:
		g.reportSnapshot(func(rn *raft.RawNode) { rn.ReportSnapshot(to, raft.SnapshotFailure) })
		return
	}
	h.wg.Add(1) // under h.mu: Close waits for it
	go func() {
		defer h.wg.Done()
		defer func() { <-h.sending }()
		n, err := h.sendSnapshot(g, m)
		if err != nil {
			slog.Warn("raft snapshot not sent", "group", g.id, "to", to, "bytes", n, "err", err)
		} else {
			h.metrics.snapshotBytes.Add(float64(n))
			slog.Info("raft snapshot sent", "group", g.id, "to", to, "bytes", n)
		}
		status := raft.SnapshotFinish
		if err != nil {
			status = raft.SnapshotFailure
		}
		g.reportSnapshot(func(rn *raft.RawNode) { rn.ReportSnapshot(to, status) })
	}()
}

// sendSnapshot streams g's state as of now: the applied index, its term and
// the configuration come from the same engine snapshot as the data, so
// they agree whatever was applied since Raft asked. It returns the bytes of
// keys and values sent.
func (h *Host) sendSnapshot(g *Group, m *raftpb.Message) (uint64, error) {
	sm := g.sm.(Streamed)
	view := h.e.NewSnapshot()
	defer view.Close()
	md, ci, err := snapshotMetadata(view, g.id)
	if err != nil {
		return 0, err
	}
	spans, err := sm.SnapshotSpans(view.Get)
	if err != nil {
		return 0, err
	}
	msg := proto.Clone(m).(*raftpb.Message)
	msg.Snapshot = &raftpb.Snapshot{Metadata: md, Data: snapshotData(ci, streamedMarker)}
	first := &transportpb.SnapshotChunk{GroupId: g.id, Msg: msg}
	for _, sp := range spans {
		first.Spans = append(first.Spans, &transportpb.Span{Lo: sp[0], Hi: sp[1]})
	}
	var sent uint64
	err = h.sender.SendSnapshot(h.ctx, m.GetTo(), first, func(send func([]byte) error) error {
		buf := make([]byte, 0, snapshotChunkBytes)
		flush := func() error {
			if len(buf) == 0 {
				return nil
			}
			if err := h.limit(len(buf)); err != nil {
				return err
			}
			if err := send(buf); err != nil {
				return err
			}
			buf = buf[:0] // gRPC has serialized it
			return nil
		}
		for _, sp := range spans {
			err := view.Scan(sp[0], sp[1], func(k, v []byte) (bool, error) {
				buf = storage.AppendRecord(storage.AppendRecord(buf, k), v)
				sent += uint64(len(k) + len(v))
				if len(buf) >= snapshotChunkBytes {
					return true, flush()
				}
				return true, nil
			})
			if err != nil {
				return err
			}
		}
		return flush()
	})
	return sent, err
}

// limit waits until n more bytes may be sent under the host's rate.
func (h *Host) limit(n int) error {
	for n > 0 {
		step := min(n, h.limiter.Burst())
		if err := h.limiter.WaitN(h.ctx, step); err != nil {
			return err
		}
		n -= step
	}
	return nil
}

// snapshotMetadata reads group's Raft metadata from view: the applied
// index, the term of the entry there, and the configuration.
func snapshotMetadata(view *storage.Snapshot, group uint64) (md *raftpb.SnapshotMetadata, confIndex uint64, err error) {
	v, err := view.Get(recordKey(group, recApplied))
	if err != nil {
		return nil, 0, err
	}
	if len(v) != 8 {
		return nil, 0, fmt.Errorf("raftgroup: group %d has applied nothing to snapshot", group)
	}
	applied := binary.BigEndian.Uint64(v)
	var term uint64
	if t, err := view.Get(recordKey(group, recTruncated)); err != nil {
		return nil, 0, err
	} else if len(t) == 16 && binary.BigEndian.Uint64(t) == applied {
		term = binary.BigEndian.Uint64(t[8:])
	} else {
		ev, err := view.Get(entryKey(group, applied))
		if err != nil {
			return nil, 0, err
		}
		var ent raftpb.Entry
		if ev == nil || proto.Unmarshal(ev, &ent) != nil {
			return nil, 0, fmt.Errorf("%w: group %d has no readable entry at its applied index %d", storage.ErrCorrupt, group, applied)
		}
		term = ent.GetTerm()
	}
	cs := &raftpb.ConfState{}
	if cv, err := view.Get(recordKey(group, recConfState)); err != nil {
		return nil, 0, err
	} else if err := proto.Unmarshal(cv, cs); err != nil {
		return nil, 0, fmt.Errorf("%w: group %d conf state: %v", storage.ErrCorrupt, group, err)
	}
	if v, err := view.Get(recordKey(group, recConfIndex)); err != nil {
		return nil, 0, err
	} else if len(v) == 8 {
		confIndex = binary.BigEndian.Uint64(v)
	}
	return &raftpb.SnapshotMetadata{ConfState: cs, Index: proto.Uint64(applied), Term: proto.Uint64(term)}, confIndex, nil
}

// HandleSnapshot implements transport.RaftHandler: it writes the streamed
// state into a staged SST (bounded memory), with a second one for the
// Raft metadata the snapshot implies, and hands the snapshot to the
// group's Raft; the group ingests both files if Raft accepts it.
func (h *Host) HandleSnapshot(ctx context.Context, from uint64, first *transportpb.SnapshotChunk, next func() ([]byte, error)) error {
	m := first.GetMsg()
	g := h.Group(first.GetGroupId())
	switch {
	case g == nil:
		return status.Errorf(codes.NotFound, "raftgroup: group %d is not hosted on node %d", first.GetGroupId(), h.self)
	case m.GetType() != raftpb.MsgSnap || m.GetTo() != h.self || m.GetFrom() != from || !h.known(from):
		h.metrics.strayMessages.Inc()
		return status.Errorf(codes.InvalidArgument, "raftgroup: snapshot of group %d from node %d misaddressed", g.id, from)
	}
	sm, ok := g.sm.(Streamed)
	if !ok {
		return status.Errorf(codes.InvalidArgument, "raftgroup: group %d does not take streamed snapshots", g.id)
	}
	md := m.GetSnapshot().GetMetadata()
	if md.GetIndex() == 0 || !isStreamed(m.GetSnapshot().GetData()) {
		return status.Errorf(codes.InvalidArgument, "raftgroup: snapshot of group %d without an index or marker", g.id)
	}
	var spans [][2][]byte
	for _, sp := range first.GetSpans() {
		s := [2][]byte{sp.GetLo(), sp.GetHi()}
		if len(s[0]) == 0 || bytes.Compare(s[0], s[1]) >= 0 || (len(spans) > 0 && bytes.Compare(spans[len(spans)-1][1], s[0]) > 0) || s[0][0] == storage.PrefixRaft {
			return status.Errorf(codes.InvalidArgument, "raftgroup: snapshot of group %d has unsorted, empty or Raft spans", g.id)
		}
		spans = append(spans, s)
	}
	if err := sm.CheckSpans(spans); err != nil {
		return status.Errorf(codes.InvalidArgument, "raftgroup: snapshot of group %d: %v", g.id, err)
	}
	select {
	case h.receiving <- struct{}{}:
		defer func() { <-h.receiving }()
	default:
		return status.Errorf(codes.ResourceExhausted, "raftgroup: node %d is receiving %d snapshots already", h.self, cap(h.receiving))
	}
	data, err := h.writeData(spans, next)
	if err != nil {
		return err
	}
	meta, err := h.writeMeta(g.id, m.GetSnapshot())
	if err != nil {
		h.e.RemoveStaged([]string{data})
		return err
	}
	in := &incoming{msg: m, staged: staged{index: md.GetIndex(), paths: []string{data, meta}}}
	select {
	case g.snapIn <- in: // unbuffered: the group's loop has it
		return nil
	case <-ctx.Done():
	case <-g.done:
	}
	h.e.RemoveStaged(in.staged.paths)
	return status.Errorf(codes.Unavailable, "raftgroup: group %d stopped or the sender left", g.id)
}

// writeData writes the streamed records into a staged SST that first
// deletes every span, so that ingesting it replaces them exactly.
func (h *Host) writeData(spans [][2][]byte, next func() ([]byte, error)) (string, error) {
	w, err := h.e.NewSSTWriter()
	if err != nil {
		return "", err
	}
	for _, sp := range spans {
		if err := w.DeleteRange(sp[0], sp[1]); err != nil {
			w.Abort()
			return "", err
		}
	}
	var last []byte
	for {
		chunk, err := next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			w.Abort()
			return "", err
		}
		for len(chunk) > 0 {
			k, rest, err := storage.NextRecord(chunk)
			if err == nil {
				var v []byte
				v, rest, err = storage.NextRecord(rest)
				if err == nil && (!inSpans(k, spans) || (last != nil && bytes.Compare(k, last) <= 0)) {
					err = fmt.Errorf("key %x out of order or outside the snapshot's spans", k)
				}
				if err == nil {
					err = w.Set(k, v)
				}
			}
			if err != nil {
				w.Abort()
				return "", status.Errorf(codes.InvalidArgument, "raftgroup: snapshot data: %v", err)
			}
			last = append(last[:0], k...)
			chunk = rest
		}
	}
	return w.Finish()
}

func inSpans(k []byte, spans [][2][]byte) bool {
	i, found := slices.BinarySearchFunc(spans, k, func(sp [2][]byte, k []byte) int { return bytes.Compare(sp[0], k) })
	if found {
		return true
	}
	return i > 0 && bytes.Compare(k, spans[i-1][1]) < 0
}

// writeMeta writes a staged SST with the Raft state that installing a
// snapshot at md implies (the log emptied and truncated at its index, which
// is also the applied index, and its configuration), so that ingesting it
// with the data is one atomic step. The hard state is left alone: Raft
// writes it after, and opening a store whose hard state lags its applied
// index (a crash in between) raises the commit index to it.
func (h *Host) writeMeta(group uint64, in *raftpb.Snapshot) (string, error) {
	md := in.GetMetadata()
	ci, _, err := splitSnapshotData(in.GetData())
	if err != nil {
		return "", err
	}
	w, err := h.e.NewSSTWriter()
	if err != nil {
		return "", err
	}
	cs, err := proto.Marshal(md.GetConfState())
	if err == nil {
		var snap []byte
		snap, err = proto.Marshal(&raftpb.Snapshot{Metadata: md, Data: snapshotData(ci, streamedMarker)})
		index, term := md.GetIndex(), md.GetTerm()
		for _, kv := range [][2][]byte{ // in key order, as the SST needs
			{recordKey(group, recApplied), binary.BigEndian.AppendUint64(nil, index)},
			{recordKey(group, recConfState), cs},
			{recordKey(group, recConfIndex), binary.BigEndian.AppendUint64(nil, ci)},
			{recordKey(group, recSnapshot), snap},
			{recordKey(group, recTruncated), binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, index), term)},
		} {
			if err == nil {
				err = w.Set(kv[0], kv[1])
			}
		}
		if err == nil {
			err = w.DeleteRange(entryKey(group, 0), recordKey(group, recEntry+1))
		}
	}
	if err != nil {
		w.Abort()
		return "", err
	}
	return w.Finish()
}

// takeSnapshot runs on the group's goroutine: it keeps a received snapshot
// as the one to ingest (dropping an earlier one not taken) and steps its
// message into Raft.
func (g *Group) takeSnapshot(in *incoming) {
	g.dropStaged()
	g.staged = &in.staged
	g.stepLocal(in.msg)
}

// dropStaged removes a received snapshot Raft did not accept.
func (g *Group) dropStaged() {
	if g.staged != nil {
		g.e.RemoveStaged(g.staged.paths)
		g.staged = nil
	}
}

// installStreamed ingests the staged snapshot Raft accepted at index.
func (g *Group) installStreamed(index uint64) error {
	st := g.staged
	g.staged = nil
	if st == nil || st.index != index {
		return fmt.Errorf("raftgroup: group %d accepted a streamed snapshot at %d that was not received", g.id, index)
	}
	if err := g.e.Ingest(st.paths); err != nil {
		g.e.RemoveStaged(st.paths)
		return err
	}
	return g.sm.(Streamed).Reload()
}
