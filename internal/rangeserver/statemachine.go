package rangeserver

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/routing"
	"github.com/terroir-db/terroir/internal/storage"
)

// Sub-spaces of a range's range-local state under storage.PrefixState/<range>.
// Its MVCC data lives under the user key, in storage.PrefixData and
// storage.PrefixRegional (DESIGN.md §11).
const (
	subPrepared   byte = 'p' // prepared transactions, by transaction ID
	subLease      byte = 'l' // the current lease
	subDescriptor byte = 'D' // the range's descriptor, once a command changes it
)

// Keyspace selects which versions of a range's data a read sees.
type Keyspace uint8

const (
	// Versions is the data under its version ids: global epochs, or local
	// ones in a regional-only deployment (paper §5.1).
	Versions Keyspace = iota
	// RegionalVersions is the regional copy of the data under local-epoch
	// version ids, kept in regions with a publisher (paper §5.4).
	RegionalVersions
)

var (
	dataPrefix     = []byte{storage.PrefixData}
	regionalPrefix = []byte{storage.PrefixRegional}
)

func (k Keyspace) prefix() []byte {
	if k == RegionalVersions {
		return regionalPrefix
	}
	return dataPrefix
}

// ErrBadCommand marks a log entry that does not decode as a range command.
var ErrBadCommand = errors.New("rangeserver: malformed command")

// StateMachine is a range's replicated state (raftgroup.StateMachine). The lease
// and the prepared transactions are also kept in memory for the leader.
type StateMachine struct {
	e      *storage.Engine
	prefix []byte                             // storage.PrefixState | range ID: the range-local state
	desc   atomic.Pointer[pb.RangeDescriptor] // immutable once stored: replaced, never modified
	gc     atomic.Pointer[pb.GCThreshold]     // no snapshot reads below it (DESIGN.md §14); replaced, never modified
	closed atomic.Uint64                      // the closed epoch reads trust (DESIGN.md §13; closed.go)
	// closedRose is closed, and dropped, when closed rises: the reads
	// waiting for an epoch to close (waitClosed) wake on it.
	closedWake sync.Mutex
	closedRose chan struct{}

	mu           sync.Mutex
	lease        *pb.Lease
	prepared     map[string]*pb.PreparedRecord
	closedStored uint64                  // the closed epoch in the engine or the batch being applied
	side         sideClosed              // the newest close sent outside the log (sideclosed.go)
	applied      uint64                  // the group's applied index as of the last PostApply
	splits       []Split                 // applied, not yet durable: told by PostApply
	onSplit      []func(Split)           // split listeners
	merges       []Merge                 // applied, not yet durable: told by PostApply
	onMerge      []func(Merge)           // merge listeners
	changes      []ReplicasChanged       // applied, not yet durable: told by PostApply
	onChange     []func(ReplicasChanged) // replica change listeners
	// handover is the highest epoch a lease handed over by a cooperative
	// transfer starts at, raised by every commit applied after the
	// transfer (a prepared transaction's outcome may still reach the
	// previous holder); nil unless this process applied the transfer
	// (DESIGN.md §12; lease.go).
	handover *handover
}

// handover is what the successor of a transferred lease inherits.
type handover struct {
	seq     uint64 // the transferred lease's seq
	highest uint64
}

// Split is a split as applied: the range's new descriptor and the new
// right-hand range's.
type Split struct {
	Left, Right *pb.RangeDescriptor
}

// Merge is a merge as applied on the left-hand range: its new descriptor, the
// subsumed right-hand range's last one, and the prepared records it took
// from the right-hand range.
type Merge struct {
	Merged, Right *pb.RangeDescriptor
	Prepared      []*pb.PreparedRecord
}

// ReplicasChanged is a configuration change as applied: the range's new
// descriptor and the Raft configuration it made (DESIGN.md §12).
type ReplicasChanged struct {
	Desc *pb.RangeDescriptor
	Conf *raftpb.ConfState
}

// Applied is the result of applying one command.
type Applied struct {
	// LeaseGranted is set for a lease command that took effect.
	LeaseGranted bool
	// Rejected is set for a prepare or one-phase commit evaluated under a lease
	// that is no longer current, or with writes outside the range's span
	// (a split applied first), and for a split proposed under an older
	// generation: it had no effect.
	Rejected bool
	// Split is set for a split that took effect.
	Split *Split
	// Subsumed is the range's last descriptor after a subsume that took
	// effect.
	Subsumed *pb.RangeDescriptor
	// Merge is set for a merge that took effect.
	Merge *Merge
	// GC is set for a GC chunk that took effect.
	GC *GCResult
	// Rehomed is the range's new descriptor after a rehome that took
	// effect (DESIGN.md §13).
	Rehomed *pb.RangeDescriptor
}

// OnSplit registers f to be told of every split of this range once it is
// durable in the engine (on every replica, after the entry applied): the
// node starts the right-hand range there, the leader hands over what it held.
func (sm *StateMachine) OnSplit(f func(Split)) {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	sm.onSplit = append(sm.onSplit, f)
}

// OnMerge registers f to be told of every merge of this range (as the
// left-hand range) once it is durable in the engine, on every replica: the
// node removes its replica of the subsumed range.
func (sm *StateMachine) OnMerge(f func(Merge)) {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	sm.onMerge = append(sm.onMerge, f)
}

// OnReplicasChanged registers f to be told of every configuration change
// of the range once it is durable in the engine, on every replica that
// applies it: the leaseholder's node publishes the descriptor, and a node
// the change removed drops its replica.
func (sm *StateMachine) OnReplicasChanged(f func(ReplicasChanged)) {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	sm.onChange = append(sm.onChange, f)
}

// ApplyConfChange implements raftgroup.ConfChanger: the descriptor takes
// the replicas, learners and non-voters of the change's payload (a ReplicasChange),
// keeping its span, with the next generation. It returns the new
// descriptor, or an error (the configuration changed all the same; the
// descriptor did not) for a payload that does not decode.
func (sm *StateMachine) ApplyConfChange(b *pebble.Batch, _ uint64, cs *raftpb.ConfState, payload []byte) any {
	ch := &pb.ReplicasChange{}
	if err := proto.Unmarshal(payload, ch); err != nil {
		return fmt.Errorf("%w: replicas change: %v", ErrBadCommand, err)
	}
	sm.mu.Lock()
	defer sm.mu.Unlock()
	d := proto.CloneOf(sm.desc.Load())
	d.Replicas, d.Learners, d.NonVoters, d.Generation = ch.GetReplicas(), ch.GetLearners(), ch.GetNonVoters(), d.GetGeneration()+1
	if len(d.GetRehomeVoters()) > 0 && routing.SameNodes(d.GetReplicas(), d.GetRehomeVoters()) {
		d.RehomeVoters = nil // the rehome's voters vote: it is complete
	}
	v, _ := proto.Marshal(d)
	_ = b.Set(sm.sub(subDescriptor, nil), v, nil)
	sm.desc.Store(d)
	sm.changes = append(sm.changes, ReplicasChanged{Desc: d, Conf: proto.CloneOf(cs)})
	return d
}

// PostApply implements raftgroup.PostApplier: it tells the split, merge
// and replica change listeners of what applied since the last call, now
// that it is in the engine, and trusts the closed epochs it covers.
func (sm *StateMachine) PostApply(applied uint64) {
	sm.mu.Lock()
	sm.applied = max(sm.applied, applied)
	sm.publishClosed()
	splits, onSplit := sm.splits, sm.onSplit
	merges, onMerge := sm.merges, sm.onMerge
	changes, onChange := sm.changes, sm.onChange
	sm.splits, sm.merges, sm.changes = nil, nil, nil
	sm.mu.Unlock()
	tell(splits, onSplit)
	tell(merges, onMerge)
	tell(changes, onChange)
}

func tell[E any](events []E, listeners []func(E)) {
	for _, e := range events {
		for _, f := range listeners {
			f(e)
		}
	}
}

// writesInSpan reports whether every write's key lies in d's span; none does
// once d is subsumed.
func writesInSpan(d *pb.RangeDescriptor, writes []*pb.Write) bool {
	if d.GetSubsumed() {
		return false
	}
	for _, w := range writes {
		k := w.GetKey()
		if bytes.Compare(k, d.GetStartKey()) < 0 || (len(d.GetEndKey()) > 0 && bytes.Compare(k, d.GetEndKey()) >= 0) {
			return false
		}
	}
	return true
}

// NewStateMachine loads the descriptor, lease and prepared transactions of
// range seed.RangeId from e. The descriptor is the stored one, or seed (the
// bootstrap descriptor, DESIGN.md §11) if none was stored. Damaged records
// wrap storage.ErrCorrupt.
func NewStateMachine(e *storage.Engine, seed *pb.RangeDescriptor) (*StateMachine, error) {
	prefix := binary.BigEndian.AppendUint64([]byte{storage.PrefixState}, seed.GetRangeId())
	sm := &StateMachine{e: e, prefix: prefix}
	sm.desc.Store(seed)
	if err := sm.load(); err != nil {
		return nil, fmt.Errorf("range %d: %w", seed.GetRangeId(), err)
	}
	return sm, nil
}

// Descriptor returns the range's current descriptor. It is shared: callers
// must not modify it.
func (sm *StateMachine) Descriptor() *pb.RangeDescriptor { return sm.desc.Load() }

func (sm *StateMachine) sub(b byte, rest []byte) []byte {
	return append(append(append([]byte{}, sm.prefix...), b), rest...)
}

func (sm *StateMachine) load() error {
	sm.lease, sm.prepared = &pb.Lease{}, map[string]*pb.PreparedRecord{}
	if v, err := sm.e.Get(sm.sub(subLease, nil)); err != nil {
		return err
	} else if v != nil {
		if err := proto.Unmarshal(v, sm.lease); err != nil {
			return fmt.Errorf("%w: lease: %v", storage.ErrCorrupt, err)
		}
	}
	if v, err := sm.e.Get(sm.sub(subDescriptor, nil)); err != nil {
		return err
	} else if v != nil {
		d := &pb.RangeDescriptor{}
		if err := proto.Unmarshal(v, d); err != nil {
			return fmt.Errorf("%w: descriptor: %v", storage.ErrCorrupt, err)
		}
		sm.desc.Store(d)
	}
	if err := sm.loadGC(sm.e.Get); err != nil {
		return err
	}
	if err := sm.loadClosed(sm.e.Get, true); err != nil {
		return err
	}
	lo := sm.sub(subPrepared, nil)
	return sm.e.Scan(lo, storage.PrefixEnd(lo), func(_, v []byte) (bool, error) {
		rec := &pb.PreparedRecord{}
		if err := proto.Unmarshal(v, rec); err != nil {
			return false, fmt.Errorf("%w: prepared record: %v", storage.ErrCorrupt, err)
		}
		sm.prepared[string(rec.GetTxn().GetId())] = rec
		return true, nil
	})
}

// Get returns key's newest version in ks below `below` (ok false if there is
// none or it is a tombstone) and the key's newest version id overall (zero if
// it was never written): storage.Engine.GetMVCC over the range's data.
// Errors wrap storage.ErrCorrupt.
func (sm *StateMachine) Get(ks Keyspace, key []byte, below storage.VersionID) (v storage.Version, ok bool, newest storage.VersionID, err error) {
	return sm.e.GetMVCC(ks.prefix(), key, below)
}

// Newest returns the id of key's newest version in ks, tombstones
// included (the zero id when it has none), reading no value
// (storage.Engine.NewestVersion). Errors wrap storage.ErrCorrupt.
func (sm *StateMachine) Newest(ks Keyspace, key []byte) (storage.VersionID, error) {
	v, _, err := sm.e.NewestVersion(ks.prefix(), key)
	return v, err
}

// Scan calls fn with every key of [start, end) in ks that has a version, in
// key order, as storage.Engine.ScanMVCC does. The caller keeps the bounds
// inside the range's span.
func (sm *StateMachine) Scan(ks Keyspace, start, end []byte, below storage.VersionID, fn func(visible storage.Version, newest storage.VersionID) bool) error {
	return sm.e.ScanMVCC(ks.prefix(), start, end, below, fn)
}

// Versions calls fn with every version of ks in [start, end) with id in
// [from, below) — each key's newest only, with newestOnly — newest first
// per key (storage.Engine.ScanVersions).
func (sm *StateMachine) Versions(ks Keyspace, start, end []byte, from, below storage.VersionID, newestOnly bool, fn func(storage.Version) bool) error {
	return sm.e.ScanVersions(ks.prefix(), start, end, from, below, newestOnly, fn)
}

// spans returns the engine spans a snapshot of the range holds: its
// range-local state, then its data and regional copies within its span.
func (sm *StateMachine) spans() [][2][]byte { return sm.spansOf(sm.desc.Load()) }

// spansOf returns the engine spans of the range-local state and of the data
// and regional copies in d's span.
func (sm *StateMachine) spansOf(d *pb.RangeDescriptor) [][2][]byte {
	return append([][2][]byte{{sm.prefix, storage.PrefixEnd(sm.prefix)}}, DataSpans(d)...)
}

// DataSpans returns the engine spans [lo, hi) of the data and regional
// copies of the keys in d's span (shared by the node's ranges, each owning
// its span; DESIGN.md §11).
func DataSpans(d *pb.RangeDescriptor) [][2][]byte {
	var end []byte
	if len(d.GetEndKey()) > 0 {
		end = d.GetEndKey()
	}
	dlo, dhi := storage.MVCCKeyBounds(dataPrefix, d.GetStartKey(), end)
	rlo, rhi := storage.MVCCKeyBounds(regionalPrefix, d.GetStartKey(), end)
	return [][2][]byte{{dlo, dhi}, {rlo, rhi}}
}

// Lease returns the current lease (a copy).
func (sm *StateMachine) Lease() *pb.Lease {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	return proto.Clone(sm.lease).(*pb.Lease)
}

// Prepared returns the prepared transactions (shared records: do not modify).
func (sm *StateMachine) Prepared() []*pb.PreparedRecord {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	out := make([]*pb.PreparedRecord, 0, len(sm.prepared))
	for _, r := range sm.prepared {
		out = append(out, r)
	}
	return out
}

// raiseHandover raises a transferred lease's inherited highest epoch to a
// commit's epoch e (sm.mu held).
func (sm *StateMachine) raiseHandover(e uint64) {
	if sm.handover != nil {
		sm.handover.highest = max(sm.handover.highest, e)
	}
}

// Handover returns the highest epoch the holder of lease seq starts at, if
// the lease was handed over by a cooperative transfer that this replica
// applied since it started: the previous holder's highest epoch, raised by
// every commit applied since (DESIGN.md §12). Otherwise ok is false and
// the holder waits for the global epoch to advance (DESIGN.md §3.5).
func (sm *StateMachine) Handover(seq uint64) (highest uint64, ok bool) {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	if sm.handover == nil || sm.handover.seq != seq || sm.lease.GetSeq() != seq {
		return 0, false
	}
	return sm.handover.highest, true
}

// IsPrepared reports whether txnID is prepared here.
func (sm *StateMachine) IsPrepared(txnID []byte) bool {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	_, ok := sm.prepared[string(txnID)]
	return ok
}

// EncodeCommand marshals a range command.
func EncodeCommand(c *pb.Command) []byte {
	b, _ := proto.Marshal(c)
	return b
}

// CommitHold implements raftgroup.LazyCommit: a range's followers may
// learn of a commit up to followerCommitHold after its leader, so that
// the next append carries it rather than an append of its own, with a
// reply (issue 17). Its leader serves every transaction; a follower
// applies to serve reads at closed epochs and to be ready to lead.
func (sm *StateMachine) CommitHold() time.Duration { return followerCommitHold }

// followerCommitHold is StateMachine.CommitHold: 2 ms, a fifth of a local
// epoch at the default interval, and longer than the gap between a range's
// appends under YCSB-A's 16 clients (about 1.4 ms): there the next append
// replaced about 86% of the commit-only ones (Raft messages per operation
// 4.1 to 2.3).
const followerCommitHold = 2 * time.Millisecond

// Apply implements raftgroup.StateMachine. The result is an Applied or an error.
func (sm *StateMachine) Apply(b *pebble.Batch, _ uint64, cmd []byte) any {
	c := &pb.Command{}
	if err := proto.Unmarshal(cmd, c); err != nil {
		return fmt.Errorf("%w: %v", ErrBadCommand, err)
	}
	sm.mu.Lock()
	defer sm.mu.Unlock()
	switch x := c.Cmd.(type) {
	case *pb.Command_Lease:
		// Leader disjointness (DESIGN.md §3.3): only the successor of the current
		// lease is accepted.
		if x.Lease.GetPrevSeq() != sm.lease.GetSeq() || x.Lease.GetLease().GetSeq() != sm.lease.GetSeq()+1 {
			return Applied{}
		}
		if d := sm.desc.Load(); len(d.GetRehomeVoters()) > 0 || len(d.GetReplicas()) > 0 && !slices.Contains(d.GetReplicas(), x.Lease.GetLease().GetHolder()) {
			// Mid-rehome no replica may lead; and only a voter of the
			// range's home ever holds its lease (DESIGN.md §13): a lease
			// proposed before a rehome applied must not follow it.
			return Applied{}
		}
		v, _ := proto.Marshal(x.Lease.GetLease())
		_ = b.Set(sm.sub(subLease, nil), v, nil)
		sm.lease = proto.Clone(x.Lease.GetLease()).(*pb.Lease)
		sm.handover = nil
		if h := sm.lease.GetHandedHighest(); h > 0 {
			sm.handover = &handover{seq: sm.lease.GetSeq(), highest: h}
		}
		return Applied{LeaseGranted: true}
	case *pb.Command_Prepare:
		if x.Prepare.GetLeaseStart() != sm.lease.GetStart() || !writesInSpan(sm.desc.Load(), x.Prepare.GetWrites()) {
			return Applied{Rejected: true}
		}
		rec := &pb.PreparedRecord{Txn: x.Prepare.GetTxn(), Writes: x.Prepare.GetWrites()}
		v, _ := proto.Marshal(rec)
		_ = b.Set(sm.sub(subPrepared, rec.GetTxn().GetId()), v, nil)
		sm.prepared[string(rec.GetTxn().GetId())] = rec
	case *pb.Command_Commit:
		rec, ok := sm.prepared[string(x.Commit.GetTxnId())]
		if !ok || sm.desc.Load().GetSubsumed() {
			// Already resolved, or subsumed: the merged range holds the
			// record now and resolves it.
			return Applied{}
		}
		sm.writeVersions(b, rec.GetWrites(), x.Commit.GetVersion(), x.Commit.GetRegionalVersion())
		sm.raiseHandover(x.Commit.GetVersion().GetEpoch())
		_ = b.Delete(sm.sub(subPrepared, x.Commit.GetTxnId()), nil)
		delete(sm.prepared, string(x.Commit.GetTxnId()))
	case *pb.Command_Abort:
		if sm.desc.Load().GetSubsumed() {
			return Applied{}
		}
		_ = b.Delete(sm.sub(subPrepared, x.Abort.GetTxnId()), nil)
		delete(sm.prepared, string(x.Abort.GetTxnId()))
	case *pb.Command_OnePhase:
		if x.OnePhase.GetLeaseStart() != sm.lease.GetStart() || !writesInSpan(sm.desc.Load(), x.OnePhase.GetWrites()) {
			return Applied{Rejected: true}
		}
		sm.writeVersions(b, x.OnePhase.GetWrites(), x.OnePhase.GetVersion(), x.OnePhase.GetRegionalVersion())
		sm.raiseHandover(x.OnePhase.GetVersion().GetEpoch())
	case *pb.Command_Split:
		return sm.applySplit(b, x.Split)
	case *pb.Command_Subsume:
		return sm.applySubsume(b, x.Subsume)
	case *pb.Command_Merge:
		return sm.applyMerge(b, x.Merge)
	case *pb.Command_Gc:
		return sm.applyGC(b, x.Gc)
	case *pb.Command_Closed:
		return sm.applyClosed(b, x.Closed)
	case *pb.Command_Rehome:
		return sm.applyRehome(b, x.Rehome)
	default:
		return fmt.Errorf("%w: empty command", ErrBadCommand)
	}
	return Applied{}
}

// writeVersions stores writes at version v and, if regional is set, again at
// the local-epoch version regional (stored twice, paper §5.4).
func (sm *StateMachine) writeVersions(b *pebble.Batch, writes []*pb.Write, v, regional *pb.VersionID) {
	ver := storage.VersionID{Epoch: v.GetEpoch(), Counter: v.GetCounter()}
	reg := storage.VersionID{Epoch: regional.GetEpoch(), Counter: regional.GetCounter()}
	for _, w := range writes {
		val := storage.EncodeMVCCValue(w.GetValue(), w.GetTombstone())
		_ = b.Set(storage.EncodeMVCCKey(dataPrefix, w.GetKey(), ver), val, nil)
		if reg != (storage.VersionID{}) {
			_ = b.Set(storage.EncodeMVCCKey(regionalPrefix, w.GetKey(), reg), val, nil)
		}
	}
}

// SnapshotSpans implements raftgroup.Streamed: the range-local state, and
// the data and regional copies within the span of the descriptor the view
// holds (a merge may have grown it since the replica started).
func (sm *StateMachine) SnapshotSpans(get func(key []byte) ([]byte, error)) ([][2][]byte, error) {
	d := sm.desc.Load()
	if v, err := get(sm.sub(subDescriptor, nil)); err != nil {
		return nil, err
	} else if v != nil {
		d = &pb.RangeDescriptor{}
		if err := proto.Unmarshal(v, d); err != nil {
			return nil, fmt.Errorf("%w: descriptor: %v", storage.ErrCorrupt, err)
		}
	}
	return sm.spansOf(d), nil
}

// CheckSpans implements raftgroup.Streamed: a snapshot of the range holds
// exactly its range-local state first, then spans of the data and regional
// key spaces (whose keys ranges share, each owning its span).
func (sm *StateMachine) CheckSpans(spans [][2][]byte) error {
	if len(spans) == 0 || !bytes.Equal(spans[0][0], sm.prefix) || !bytes.Equal(spans[0][1], storage.PrefixEnd(sm.prefix)) {
		return fmt.Errorf("the first span is not range %x's own state", sm.prefix)
	}
	for _, sp := range spans[1:] {
		if len(sp[0]) == 0 {
			return fmt.Errorf("span [%x, %x) starts at the empty key", sp[0], sp[1])
		}
		p := sp[0][0]
		if (p != storage.PrefixData && p != storage.PrefixRegional) || bytes.Compare(sp[1], []byte{p + 1}) > 0 {
			return fmt.Errorf("span [%x, %x) is not in the data or regional key space", sp[0], sp[1])
		}
	}
	return nil
}

// Reload implements raftgroup.Streamed: the in-memory view (lease,
// descriptor, GC and closed epochs, prepared transactions) is read again
// from the engine, into which a snapshot was just ingested (durably, so
// its closed epoch is trusted at once).
func (sm *StateMachine) Reload() error {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	sm.handover = nil // the snapshot may hold commits it never saw: wait for the global epoch instead
	return sm.load()
}

// inSpans reports whether engine key k lies in one of spans ([lo, hi); a nil
// hi is unbounded).
func inSpans(k []byte, spans [][2][]byte) bool {
	for _, sp := range spans {
		if bytes.Compare(k, sp[0]) >= 0 && (sp[1] == nil || bytes.Compare(k, sp[1]) < 0) {
			return true
		}
	}
	return false
}

// Size estimates the bytes on disk of the range's data and regional copies.
func (sm *StateMachine) Size() (uint64, error) {
	var total uint64
	for _, sp := range sm.spans()[1:] {
		n, err := sm.e.DiskUsage(sp[0], sp[1])
		if err != nil {
			return 0, err
		}
		total += n
	}
	return total, nil
}

// midMarks is about how many candidate split keys MidKey keeps (its
// memory: that many keys; more if the data compresses better than 2:1 or
// is still in memtables, which the size estimate misses), and midMinStep
// the least data, in bytes, between two of them.
const (
	midMarks   = 4096
	midMinStep = 256
)

// MidKey returns the user key at which the range's data (all versions)
// reaches about half its bytes, for a split by size: the first key starting
// a new user key once half the bytes are behind, to within the data size /
// midMarks. Both sides of it hold data. nil if the range holds fewer than
// two user keys. It reads the range's keys once, and the values' lengths
// but not their bytes (storage.ScanLazy: a range's history is mostly in
// blob files), so it runs off the tick loop; it stops early with ctx's
// error.
func (sm *StateMachine) MidKey(ctx context.Context) ([]byte, error) {
	d := sm.desc.Load()
	var end []byte
	if len(d.GetEndKey()) > 0 {
		end = d.GetEndKey()
	}
	lo, hi := storage.MVCCKeyBounds(dataPrefix, d.GetStartKey(), end)
	step := uint64(midMinStep)
	if size, err := sm.e.DiskUsage(lo, hi); err == nil {
		step = max(step, 2*size/midMarks) // on-disk bytes are compressed: about half the scanned ones
	}
	type mark struct {
		at  uint64 // data bytes before the key
		key []byte // a user key
	}
	var (
		marks []mark
		first []byte // the range's first user key
		seen  uint64
		next  uint64 // the least seen of the next mark
		due   bool   // a mark is due at the next new user key
	)
	err := sm.e.ScanLazy(lo, hi, func(k []byte, v *storage.LazyValue) (bool, error) {
		at := seen
		seen += uint64(len(k) + v.Len())
		if at/step != seen/step && ctx.Err() != nil {
			return false, ctx.Err()
		}
		if first != nil && !due && at < next {
			return true, nil
		}
		uk, _, err := storage.DecodeMVCCKey(dataPrefix, k)
		if err != nil {
			return false, fmt.Errorf("%w: %v", storage.ErrCorrupt, err)
		}
		switch {
		case first == nil:
			first, due = bytes.Clone(uk), true // mark the second user key, however close
		case bytes.Equal(uk, first) || (len(marks) > 0 && bytes.Equal(uk, marks[len(marks)-1].key)):
			due = true // the key has more versions: mark the next one
		default:
			marks = append(marks, mark{at, bytes.Clone(uk)})
			due, next = false, at+step
		}
		return true, nil
	})
	if err != nil || len(marks) == 0 {
		return nil, err
	}
	for _, m := range marks {
		if m.at*2 >= seen {
			return m.key, nil
		}
	}
	return marks[len(marks)-1].key, nil
}
