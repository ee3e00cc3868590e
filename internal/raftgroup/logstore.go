package raftgroup

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/cockroachdb/pebble/v2"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/terroir-db/terroir/internal/storage"
)

// Record kinds under storage.PrefixRaft/<group>.
const (
	recEntry     byte = 'l' // log entry, followed by its index
	recHardState byte = 'h'
	recConfState byte = 'c'
	recConfIndex byte = 'i' // the log index of the change that made the conf state (8 bytes)
	recSnapshot  byte = 's' // the latest snapshot (metadata and state machine data)
	recApplied   byte = 'a' // the applied index, written with the state it describes
	recTruncated byte = 't' // index and term of the last entry dropped from the log
)

func groupPrefix(group uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{storage.PrefixRaft}, group)
}

func recordKey(group uint64, rec byte) []byte { return append(groupPrefix(group), rec) }

func entryKey(group, index uint64) []byte {
	return binary.BigEndian.AppendUint64(recordKey(group, recEntry), index)
}

// logStore is a group's raft.Storage on the node's Pebble engine. It is used only
// from the group's goroutine (RawNode is single-threaded), so it needs no locks.
// It keeps the terms of the live log in memory so Term is a slice lookup.
type logStore struct {
	e     *storage.Engine
	group uint64

	hs        *raftpb.HardState
	cs        *raftpb.ConfState
	truncIdx  uint64   // the last index dropped from the log (by compaction or a snapshot)
	truncTerm uint64   // its term, kept so Raft can match the entry after it
	first     uint64   // first index in the log: truncIdx+1
	terms     []uint64 // terms[i] is the term of entry first+i
	applied   uint64
	streamed  bool // the state machine is Streamed: a snapshot is taken at the applied index when sent
	// ci is the log index of the configuration change that made cs (0 for
	// the bootstrap configuration), kept with it and carried in snapshots.
	ci uint64
	// confInLog is the index of the last configuration change this log
	// held since it was opened (never lowered: an entry replaced by a
	// conflicting append counts until the applied index passes it).
	confInLog uint64

	// cache holds the newest entries, cache[i] being entry cacheFirst+i, so
	// that committed entries and appends to followers are served from memory.
	cache      []*raftpb.Entry
	cacheFirst uint64
	cacheBytes int
}

// Bounds of the in-memory entry cache.
const (
	maxCacheEntries = 4096
	maxCacheBytes   = 8 << 20
)

// cacheAppend records entries just written (replacing any conflicting suffix).
func (s *logStore) cacheAppend(ents []*raftpb.Entry) {
	first := ents[0].GetIndex()
	if len(s.cache) == 0 || first < s.cacheFirst || first > s.cacheFirst+uint64(len(s.cache)) {
		s.cache, s.cacheFirst, s.cacheBytes = nil, first, 0
	} else {
		for _, e := range s.cache[first-s.cacheFirst:] {
			s.cacheBytes -= len(e.GetData())
		}
		s.cache = s.cache[:first-s.cacheFirst]
	}
	for _, e := range ents {
		s.cache = append(s.cache, e)
		s.cacheBytes += len(e.GetData())
	}
	for len(s.cache) > 0 && (len(s.cache) > maxCacheEntries || s.cacheBytes > maxCacheBytes) {
		s.cacheBytes -= len(s.cache[0].GetData())
		s.cache[0] = nil
		s.cache = s.cache[1:]
		s.cacheFirst++
	}
}

// cacheDropThrough forgets cached entries at or below index.
func (s *logStore) cacheDropThrough(index uint64) {
	for len(s.cache) > 0 && s.cacheFirst <= index {
		s.cacheBytes -= len(s.cache[0].GetData())
		s.cache[0] = nil
		s.cache = s.cache[1:]
		s.cacheFirst++
	}
	if len(s.cache) == 0 {
		s.cacheFirst = index + 1
	}
}

// openLogStore loads a group's Raft state, initialising it with voters on first use.
// A log with holes, or one that ends before its recorded commit index (synced
// entries lost), is corrupt.
func openLogStore(e *storage.Engine, group uint64, voters []uint64) (*logStore, error) {
	return openLogStoreConf(e, group, voters, nil)
}

// openLogStoreConf is openLogStore for a group whose first configuration
// also has learners.
func openLogStoreConf(e *storage.Engine, group uint64, voters, learners []uint64) (*logStore, error) {
	s := &logStore{e: e, group: group, hs: &raftpb.HardState{}, cs: &raftpb.ConfState{}}
	if err := s.load(recHardState, s.hs); err != nil {
		return nil, err
	}
	found, err := s.loadFound(recConfState, s.cs)
	if err != nil {
		return nil, err
	}
	if !found {
		s.cs = &raftpb.ConfState{Voters: slices.Clone(voters)}
		if len(voters) > 0 {
			s.cs.Learners = slices.Clone(learners)
		}
		b := e.NewBatch()
		if err := s.put(b, recConfState, s.cs); err != nil {
			return nil, err
		}
		if err := b.Set(recordKey(group, recConfIndex), binary.BigEndian.AppendUint64(nil, 0), nil); err != nil {
			return nil, err
		}
		if err := e.Commit(b, true); err != nil {
			return nil, err
		}
	}
	if err := s.loadConfIndex(); err != nil {
		return nil, err
	}
	if v, err := e.Get(recordKey(group, recTruncated)); err != nil {
		return nil, err
	} else if v != nil {
		if len(v) != 16 {
			return nil, fmt.Errorf("%w: group %d truncated state has %d bytes", storage.ErrCorrupt, group, len(v))
		}
		s.truncIdx, s.truncTerm = binary.BigEndian.Uint64(v), binary.BigEndian.Uint64(v[8:])
	}
	s.first = s.truncIdx + 1
	if v, err := e.Get(recordKey(group, recApplied)); err != nil {
		return nil, err
	} else if v != nil {
		if len(v) != 8 {
			return nil, fmt.Errorf("%w: group %d applied index has %d bytes", storage.ErrCorrupt, group, len(v))
		}
		s.applied = binary.BigEndian.Uint64(v)
	}
	next := s.first
	err = e.Scan(entryKey(group, s.first), recordKey(group, recEntry+1), func(k, v []byte) (bool, error) {
		var ent raftpb.Entry
		if err := proto.Unmarshal(v, &ent); err != nil {
			return false, fmt.Errorf("%w: group %d entry %x: %v", storage.ErrCorrupt, group, k, err)
		}
		if ent.GetIndex() != next {
			return false, fmt.Errorf("%w: group %d log has a hole: want index %d, found %d", storage.ErrCorrupt, group, next, ent.GetIndex())
		}
		s.terms = append(s.terms, ent.GetTerm())
		if ent.GetType() != raftpb.EntryNormal {
			s.confInLog = ent.GetIndex()
		}
		next++
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	if s.hs.GetCommit() < s.truncIdx {
		// A streamed snapshot was ingested (its state, applied and
		// truncated index) but the crash came before the hard state Raft
		// writes after it: what was applied was committed.
		s.hs.Commit = proto.Uint64(s.truncIdx)
		s.hs.Term = proto.Uint64(max(s.hs.GetTerm(), s.truncTerm))
	}
	if c := s.hs.GetCommit(); c > s.lastIndex() {
		return nil, fmt.Errorf("%w: group %d log ends at %d but index %d was committed", storage.ErrCorrupt, group, s.lastIndex(), c)
	}
	if s.applied > s.hs.GetCommit() && s.applied > s.truncIdx {
		return nil, fmt.Errorf("%w: group %d applied %d beyond commit %d", storage.ErrCorrupt, group, s.applied, s.hs.GetCommit())
	}
	return s, nil
}

// loadConfIndex reads the configuration's index. A store written before it
// was recorded has none, and no group of it changed configuration by a
// snapshot-carried index either: it starts at 0, and its stored snapshot's
// data gains the index prefix every snapshot carries now.
func (s *logStore) loadConfIndex() error {
	v, err := s.e.Get(recordKey(s.group, recConfIndex))
	switch {
	case err != nil:
		return err
	case len(v) == 8:
		s.ci = binary.BigEndian.Uint64(v)
		return nil
	case v != nil:
		return fmt.Errorf("%w: group %d configuration index has %d bytes", storage.ErrCorrupt, s.group, len(v))
	}
	b := s.e.NewBatch()
	snap := &raftpb.Snapshot{}
	found, err := s.loadFound(recSnapshot, snap)
	if err != nil {
		return err
	}
	if found {
		snap.Data = snapshotData(0, snap.GetData())
		if err := s.put(b, recSnapshot, snap); err != nil {
			return err
		}
	}
	if err := b.Set(recordKey(s.group, recConfIndex), binary.BigEndian.AppendUint64(nil, 0), nil); err != nil {
		return err
	}
	return s.e.Commit(b, true)
}

// snapshotData is a Raft snapshot's data: the index of the configuration
// change that made the snapshot's configuration (8 bytes, big-endian), then
// the state machine's snapshot, or streamedMarker.
func snapshotData(confIndex uint64, body []byte) []byte {
	return append(binary.BigEndian.AppendUint64(make([]byte, 0, 8+len(body)), confIndex), body...)
}

// splitSnapshotData undoes snapshotData. Errors wrap storage.ErrCorrupt.
func splitSnapshotData(data []byte) (confIndex uint64, body []byte, err error) {
	if len(data) < 8 {
		return 0, nil, fmt.Errorf("%w: snapshot data of %d bytes has no configuration index", storage.ErrCorrupt, len(data))
	}
	return binary.BigEndian.Uint64(data), data[8:], nil
}

// isStreamed reports whether snapshot data is a Streamed group's marker.
func isStreamed(data []byte) bool {
	return len(data) == 8+len(streamedMarker) && bytes.Equal(data[8:], streamedMarker)
}

// StoredConf returns the Raft configuration group's replica on e last
// stored (empty if none): a node restarted in the middle of a joint change
// is still an outgoing voter although the range's descriptor no longer
// names it. Errors wrap storage.ErrCorrupt.
func StoredConf(e *storage.Engine, group uint64) (*raftpb.ConfState, error) {
	cs := &raftpb.ConfState{}
	_, err := (&logStore{e: e, group: group}).loadFound(recConfState, cs)
	return cs, err
}

func (s *logStore) load(rec byte, m proto.Message) error {
	_, err := s.loadFound(rec, m)
	return err
}

func (s *logStore) loadFound(rec byte, m proto.Message) (bool, error) {
	v, err := s.e.Get(recordKey(s.group, rec))
	if err != nil || v == nil {
		return false, err
	}
	if err := proto.Unmarshal(v, m); err != nil {
		return false, fmt.Errorf("%w: group %d record %q: %v", storage.ErrCorrupt, s.group, rec, err)
	}
	return true, nil
}

func (s *logStore) put(b *pebble.Batch, rec byte, m proto.Message) error {
	v, err := proto.Marshal(m)
	if err != nil {
		return err
	}
	return b.Set(recordKey(s.group, rec), v, nil)
}

func (s *logStore) lastIndex() uint64 { return s.first + uint64(len(s.terms)) - 1 }

// InitialState implements raft.Storage.
func (s *logStore) InitialState() (*raftpb.HardState, *raftpb.ConfState, error) {
	return proto.Clone(s.hs).(*raftpb.HardState), proto.Clone(s.cs).(*raftpb.ConfState), nil
}

// Entries implements raft.Storage.
func (s *logStore) Entries(lo, hi, maxSize uint64) ([]*raftpb.Entry, error) {
	if lo < s.first {
		return nil, raft.ErrCompacted
	}
	if hi > s.lastIndex()+1 {
		return nil, raft.ErrUnavailable
	}
	if len(s.cache) > 0 && lo >= s.cacheFirst && hi <= s.cacheFirst+uint64(len(s.cache)) {
		out := make([]*raftpb.Entry, 0, hi-lo)
		var size uint64
		for _, e := range s.cache[lo-s.cacheFirst : hi-s.cacheFirst] {
			size += uint64(proto.Size(e))
			if len(out) > 0 && size > maxSize {
				break
			}
			out = append(out, e)
		}
		return out, nil
	}
	var out []*raftpb.Entry
	var size uint64
	err := s.e.Scan(entryKey(s.group, lo), entryKey(s.group, hi), func(_, v []byte) (bool, error) {
		ent := &raftpb.Entry{}
		if err := proto.Unmarshal(v, ent); err != nil {
			return false, fmt.Errorf("%w: group %d entry: %v", storage.ErrCorrupt, s.group, err)
		}
		size += uint64(len(v))
		if len(out) > 0 && size > maxSize {
			return false, nil
		}
		out = append(out, ent)
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, raft.ErrUnavailable
	}
	return out, nil
}

// Term implements raft.Storage.
func (s *logStore) Term(i uint64) (uint64, error) {
	switch {
	case i == s.truncIdx:
		return s.truncTerm, nil
	case i < s.first:
		return 0, raft.ErrCompacted
	case i > s.lastIndex():
		return 0, raft.ErrUnavailable
	}
	return s.terms[i-s.first], nil
}

// LastIndex implements raft.Storage.
func (s *logStore) LastIndex() (uint64, error) { return s.lastIndex(), nil }

// FirstIndex implements raft.Storage.
func (s *logStore) FirstIndex() (uint64, error) { return s.first, nil }

// Snapshot implements raft.Storage. A Streamed group's snapshot is its
// state at the applied index (the host streams it from the engine when it
// sends it, at the index applied then).
func (s *logStore) Snapshot() (*raftpb.Snapshot, error) {
	if s.streamed && s.applied > 0 && s.applied >= s.truncIdx {
		term, err := s.Term(s.applied)
		if err != nil {
			return nil, err
		}
		return &raftpb.Snapshot{Data: snapshotData(s.ci, streamedMarker), Metadata: &raftpb.SnapshotMetadata{
			ConfState: proto.Clone(s.cs).(*raftpb.ConfState), Index: proto.Uint64(s.applied), Term: proto.Uint64(term)}}, nil
	}
	snap := &raftpb.Snapshot{}
	if err := s.load(recSnapshot, snap); err != nil {
		return nil, err
	}
	if snap.Metadata == nil {
		snap.Metadata = &raftpb.SnapshotMetadata{ConfState: proto.Clone(s.cs).(*raftpb.ConfState), Index: new(uint64), Term: new(uint64)}
	}
	return snap, nil
}

// append stages entries (replacing any conflicting suffix) into b.
func (s *logStore) append(b *pebble.Batch, ents []*raftpb.Entry) error {
	if len(ents) == 0 {
		return nil
	}
	firstNew := ents[0].GetIndex()
	if firstNew < s.first || firstNew > s.lastIndex()+1 {
		return fmt.Errorf("raftgroup: group %d append at %d outside log [%d, %d]", s.group, firstNew, s.first, s.lastIndex())
	}
	oldLast := s.lastIndex()
	for _, ent := range ents {
		v, err := proto.Marshal(ent)
		if err != nil {
			return err
		}
		if err := b.Set(entryKey(s.group, ent.GetIndex()), v, nil); err != nil {
			return err
		}
	}
	newLast := ents[len(ents)-1].GetIndex()
	if newLast < oldLast {
		if err := b.DeleteRange(entryKey(s.group, newLast+1), entryKey(s.group, oldLast+1), nil); err != nil {
			return err
		}
	}
	s.terms = s.terms[:firstNew-s.first]
	for _, ent := range ents {
		s.terms = append(s.terms, ent.GetTerm())
		if ent.GetType() != raftpb.EntryNormal {
			s.confInLog = max(s.confInLog, ent.GetIndex())
		}
	}
	s.cacheAppend(ents)
	return nil
}

// setHardState stages hs into b.
func (s *logStore) setHardState(b *pebble.Batch, hs *raftpb.HardState) error {
	s.hs = proto.Clone(hs).(*raftpb.HardState)
	return s.put(b, recHardState, s.hs)
}

// setConfState stages cs, made by the configuration change at index, into b.
func (s *logStore) setConfState(b *pebble.Batch, cs *raftpb.ConfState, index uint64) error {
	s.cs, s.ci = proto.Clone(cs).(*raftpb.ConfState), index
	if err := b.Set(recordKey(s.group, recConfIndex), binary.BigEndian.AppendUint64(nil, index), nil); err != nil {
		return err
	}
	return s.put(b, recConfState, s.cs)
}

// setApplied stages the applied index into b.
func (s *logStore) setApplied(b *pebble.Batch, index uint64) error {
	s.applied = index
	return b.Set(recordKey(s.group, recApplied), binary.BigEndian.AppendUint64(nil, index), nil)
}

// installSnapshot stages a snapshot received from the leader: the log is discarded
// and restarts after the snapshot's index.
func (s *logStore) installSnapshot(b *pebble.Batch, snap *raftpb.Snapshot) error {
	if err := b.DeleteRange(entryKey(s.group, 0), recordKey(s.group, recEntry+1), nil); err != nil {
		return err
	}
	if err := s.put(b, recSnapshot, snap); err != nil {
		return err
	}
	md := snap.GetMetadata()
	ci, _, err := splitSnapshotData(snap.GetData())
	if err != nil {
		return err
	}
	if err := s.setConfState(b, md.GetConfState(), ci); err != nil {
		return err
	}
	s.terms = s.terms[:0]
	s.cache, s.cacheFirst, s.cacheBytes = nil, md.GetIndex()+1, 0
	if err := s.setTruncated(b, md.GetIndex(), md.GetTerm()); err != nil {
		return err
	}
	return s.setApplied(b, md.GetIndex())
}

// setTruncated stages the truncated state: the log restarts after index.
func (s *logStore) setTruncated(b *pebble.Batch, index, term uint64) error {
	s.truncIdx, s.truncTerm, s.first = index, term, index+1
	v := binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, index), term)
	return b.Set(recordKey(s.group, recTruncated), v, nil)
}

// compact records data as the snapshot at index (which must be applied) and drops
// the log up to and including truncateTo (≤ index), so followers a little behind
// still catch up from the log rather than from a snapshot.
func (s *logStore) compact(b *pebble.Batch, index, truncateTo uint64, data []byte) error {
	term, err := s.Term(index)
	if err != nil {
		return err
	}
	truncTerm, err := s.Term(truncateTo)
	if err != nil || truncateTo > index {
		return fmt.Errorf("raftgroup: group %d cannot truncate to %d (snapshot at %d): %v", s.group, truncateTo, index, err)
	}
	snap := &raftpb.Snapshot{
		Data: snapshotData(s.ci, data),
		Metadata: &raftpb.SnapshotMetadata{
			ConfState: proto.Clone(s.cs).(*raftpb.ConfState),
			Index:     proto.Uint64(index),
			Term:      proto.Uint64(term),
		},
	}
	if err := s.put(b, recSnapshot, snap); err != nil {
		return err
	}
	if err := b.DeleteRange(entryKey(s.group, s.first), entryKey(s.group, truncateTo+1), nil); err != nil {
		return err
	}
	s.terms = s.terms[truncateTo+1-s.first:]
	s.cacheDropThrough(truncateTo)
	return s.setTruncated(b, truncateTo, truncTerm)
}
