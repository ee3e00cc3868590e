// Package txnstate is the transaction state store (paper §2.1, DESIGN.md §2,
// §4.4): one Raft group per region recording each transaction's authoritative
// outcome. A decision is conditional — the first of commit or abort recorded for a
// transaction wins and every later request gets that winner — so a coordinator
// committing and a participant aborting an orphaned transaction can never both
// succeed. Recording the commit is the transaction's commit point.
package txnstate

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
	"google.golang.org/protobuf/proto"

	"github.com/terroir-db/terroir/internal/storage"
	"github.com/terroir-db/terroir/internal/txnstate/txnstatepb"
)

// TxnIDLen is the length of a transaction ID in bytes.
const TxnIDLen = 16

// ErrBadRecord marks a decision or stored record that does not decode or is
// not a decision (an UNKNOWN outcome, a wrong-sized transaction ID).
var ErrBadRecord = errors.New("txnstate: malformed record")

// StateMachine holds one group's records (raftgroup.StateMachine).
type StateMachine struct {
	e      *storage.Engine
	prefix []byte
}

// NewStateMachine returns the state machine of txn-state group `group` on e.
func NewStateMachine(e *storage.Engine, group uint64) *StateMachine {
	prefix := append(binary.BigEndian.AppendUint64([]byte{storage.PrefixState}, group), 't')
	return &StateMachine{e: e, prefix: prefix}
}

func (sm *StateMachine) key(txnID []byte) []byte {
	return append(append([]byte{}, sm.prefix...), txnID...)
}

// validDecision checks a requested decision.
func validDecision(r *txnstatepb.Record) error {
	if len(r.GetTxnId()) != TxnIDLen {
		return fmt.Errorf("%w: transaction ID of %d bytes", ErrBadRecord, len(r.GetTxnId()))
	}
	if o := r.GetOutcome(); o != txnstatepb.Outcome_OUTCOME_COMMITTED && o != txnstatepb.Outcome_OUTCOME_ABORTED {
		return fmt.Errorf("%w: outcome %v is not a decision", ErrBadRecord, o)
	}
	return nil
}

// Get returns the stored record of txnID, or one with outcome UNKNOWN.
func (sm *StateMachine) Get(txnID []byte) (*txnstatepb.Record, error) {
	v, err := sm.e.Get(sm.key(txnID))
	if err != nil {
		return nil, err
	}
	if v == nil {
		return &txnstatepb.Record{TxnId: txnID, Outcome: txnstatepb.Outcome_OUTCOME_UNKNOWN}, nil
	}
	rec := &txnstatepb.Record{}
	if err := proto.Unmarshal(v, rec); err != nil {
		return nil, fmt.Errorf("%w: transaction record: %v", storage.ErrCorrupt, err)
	}
	return rec, nil
}

// Apply implements raftgroup.StateMachine. The command is a requested decision
// (a marshalled Record); the result is the winning *Record, or an error.
// Applies in one batch see each other's writes through `pending`.
func (sm *StateMachine) Apply(b *pebble.Batch, _ uint64, cmd []byte) any {
	want := &txnstatepb.Record{}
	if err := proto.Unmarshal(cmd, want); err != nil {
		return fmt.Errorf("%w: %v", ErrBadRecord, err)
	}
	if err := validDecision(want); err != nil {
		return err
	}
	// Earlier entries of this batch are not in the engine yet: read through the batch.
	v, closer, err := b.Get(sm.key(want.GetTxnId()))
	if err == nil {
		defer closer.Close()
		won := &txnstatepb.Record{}
		if err := proto.Unmarshal(v, won); err != nil {
			return fmt.Errorf("%w: transaction record: %v", storage.ErrCorrupt, err)
		}
		return won
	}
	if !errors.Is(err, pebble.ErrNotFound) {
		return err
	}
	_ = b.Set(sm.key(want.GetTxnId()), cmd, nil)
	return want
}

// Snapshot implements raftgroup.StateMachine: every marshalled record, framed
// by storage.AppendRecord.
func (sm *StateMachine) Snapshot() ([]byte, error) {
	var out []byte
	err := sm.e.Scan(sm.prefix, storage.PrefixEnd(sm.prefix), func(_, v []byte) (bool, error) {
		out = storage.AppendRecord(out, v)
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
		v, rest, err := storage.NextRecord(data)
		if err != nil {
			return err
		}
		data = rest
		rec := &txnstatepb.Record{}
		if err := proto.Unmarshal(v, rec); err != nil || validDecision(rec) != nil {
			return fmt.Errorf("%w: txn-state snapshot record", storage.ErrCorrupt)
		}
		if err := b.Set(sm.key(rec.GetTxnId()), v, nil); err != nil {
			return err
		}
	}
	return nil
}
