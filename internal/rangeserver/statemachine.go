// Package rangeserver is the KV service of one range (paper §2.3, DESIGN.md §2,
// §3.3–§3.5, §4): the replicated state machine every replica applies (the
// range's lease, its MVCC data, its prepared transactions), and the leader that
// serves locking reads and writes, takes part in two-phase commit, and resolves
// transactions whose coordinator went silent.
package rangeserver

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/cockroachdb/pebble/v2"
	"google.golang.org/protobuf/proto"

	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/storage"
)

// Sub-spaces of a range's state under storage.PrefixState/<range>.
const (
	subData     byte = 'd' // MVCC data under global version ids
	subRegional byte = 'r' // the same data under local-epoch version ids (paper §5.4)
	subPrepared byte = 'p' // prepared transactions, by transaction ID
	subLease    byte = 'l' // the current lease
)

// ErrBadCommand marks a log entry that does not decode as a range command.
var ErrBadCommand = errors.New("rangeserver: malformed command")

// StateMachine is a range's replicated state (raftgroup.StateMachine). The lease
// and the prepared transactions are also kept in memory for the leader.
type StateMachine struct {
	e        *storage.Engine
	prefix   []byte // storage.PrefixState | range ID
	data     []byte // prefix | subData
	regional []byte // prefix | subRegional

	mu       sync.Mutex
	lease    *pb.Lease
	prepared map[string]*pb.PreparedRecord
}

// Applied is the result of applying one command.
type Applied struct {
	// LeaseGranted is set for a lease command that took effect.
	LeaseGranted bool
	// Rejected is set for a prepare or one-phase commit evaluated under a lease
	// that is no longer current: it had no effect.
	Rejected bool
}

// NewStateMachine loads range `id`'s lease and prepared transactions from e.
// Damaged records wrap storage.ErrCorrupt.
func NewStateMachine(e *storage.Engine, id uint64) (*StateMachine, error) {
	prefix := binary.BigEndian.AppendUint64([]byte{storage.PrefixState}, id)
	sm := &StateMachine{e: e, prefix: prefix, data: append(append([]byte{}, prefix...), subData),
		regional: append(append([]byte{}, prefix...), subRegional)}
	if err := sm.load(); err != nil {
		return nil, fmt.Errorf("range %d: %w", id, err)
	}
	return sm, nil
}

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

// DataPrefix returns the key prefix of the range's MVCC data in the engine.
func (sm *StateMachine) DataPrefix() []byte { return sm.data }

// RegionalPrefix returns the key prefix of the range's local-epoch versions.
// Only a range in a region with a publisher stores them; elsewhere the data
// under DataPrefix already carries local epochs.
func (sm *StateMachine) RegionalPrefix() []byte { return sm.regional }

// Engine returns the engine holding the range's data.
func (sm *StateMachine) Engine() *storage.Engine { return sm.e }

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
		v, _ := proto.Marshal(x.Lease.GetLease())
		_ = b.Set(sm.sub(subLease, nil), v, nil)
		sm.lease = proto.Clone(x.Lease.GetLease()).(*pb.Lease)
		return Applied{LeaseGranted: true}
	case *pb.Command_Prepare:
		if x.Prepare.GetLeaseStart() != sm.lease.GetStart() {
			return Applied{Rejected: true}
		}
		rec := &pb.PreparedRecord{Txn: x.Prepare.GetTxn(), Writes: x.Prepare.GetWrites()}
		v, _ := proto.Marshal(rec)
		_ = b.Set(sm.sub(subPrepared, rec.GetTxn().GetId()), v, nil)
		sm.prepared[string(rec.GetTxn().GetId())] = rec
	case *pb.Command_Commit:
		rec, ok := sm.prepared[string(x.Commit.GetTxnId())]
		if !ok {
			return Applied{} // already resolved
		}
		sm.writeVersions(b, rec.GetWrites(), x.Commit.GetVersion(), x.Commit.GetRegionalVersion())
		_ = b.Delete(sm.sub(subPrepared, x.Commit.GetTxnId()), nil)
		delete(sm.prepared, string(x.Commit.GetTxnId()))
	case *pb.Command_Abort:
		_ = b.Delete(sm.sub(subPrepared, x.Abort.GetTxnId()), nil)
		delete(sm.prepared, string(x.Abort.GetTxnId()))
	case *pb.Command_OnePhase:
		if x.OnePhase.GetLeaseStart() != sm.lease.GetStart() {
			return Applied{Rejected: true}
		}
		sm.writeVersions(b, x.OnePhase.GetWrites(), x.OnePhase.GetVersion(), x.OnePhase.GetRegionalVersion())
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
		_ = b.Set(storage.EncodeMVCCKey(sm.data, w.GetKey(), ver), val, nil)
		if reg != (storage.VersionID{}) {
			_ = b.Set(storage.EncodeMVCCKey(sm.regional, w.GetKey(), reg), val, nil)
		}
	}
}

// Snapshot implements raftgroup.StateMachine: every key of the range's state,
// each key and value framed by storage.AppendRecord.
func (sm *StateMachine) Snapshot() ([]byte, error) {
	var out []byte
	err := sm.e.Scan(sm.prefix, storage.PrefixEnd(sm.prefix), func(k, v []byte) (bool, error) {
		out = storage.AppendRecord(storage.AppendRecord(out, k), v)
		return true, nil
	})
	return out, err
}

// Restore implements raftgroup.StateMachine.
func (sm *StateMachine) Restore(b *pebble.Batch, data []byte) error {
	if err := b.DeleteRange(sm.prefix, storage.PrefixEnd(sm.prefix), nil); err != nil {
		return err
	}
	for len(data) > 0 {
		k, rest, err := storage.NextRecord(data)
		if err != nil {
			return err
		}
		v, rest, err := storage.NextRecord(rest)
		if err != nil {
			return err
		}
		data = rest
		if len(k) < len(sm.prefix) || string(k[:len(sm.prefix)]) != string(sm.prefix) {
			return fmt.Errorf("%w: range snapshot key outside the range", storage.ErrCorrupt)
		}
		if err := b.Set(k, v, nil); err != nil {
			return err
		}
	}
	// Reload the in-memory view from what the batch now holds.
	sm.mu.Lock()
	defer sm.mu.Unlock()
	sm.lease, sm.prepared = &pb.Lease{}, map[string]*pb.PreparedRecord{}
	if v, closer, err := b.Get(sm.sub(subLease, nil)); err == nil {
		err = proto.Unmarshal(v, sm.lease)
		closer.Close()
		if err != nil {
			return fmt.Errorf("%w: lease in snapshot: %v", storage.ErrCorrupt, err)
		}
	}
	lo := sm.sub(subPrepared, nil)
	it, err := b.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: storage.PrefixEnd(lo)})
	if err != nil {
		return err
	}
	defer it.Close()
	for ok := it.First(); ok; ok = it.Next() {
		rec := &pb.PreparedRecord{}
		if err := proto.Unmarshal(it.Value(), rec); err != nil {
			return fmt.Errorf("%w: prepared record in snapshot: %v", storage.ErrCorrupt, err)
		}
		sm.prepared[string(rec.GetTxn().GetId())] = rec
	}
	return nil
}
