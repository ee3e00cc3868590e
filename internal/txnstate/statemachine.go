// Package txnstate is the transaction state store (paper §2.1, DESIGN.md §2,
// §4.4): one Raft group per region recording each transaction's authoritative
// outcome. A decision is conditional — the first of commit or abort recorded for a
// transaction wins and every later request gets that winner — so a coordinator
// committing and a participant aborting an orphaned transaction can never both
// succeed. Recording the commit is the transaction's commit point.
//
// Records do not stay forever (DESIGN.md §14): once every participant has
// applied the outcome a record is forgotten — at the coordinator's word
// when it told them all, or by the group leader's cleaner after a grace
// period. A participant that asks about a forgotten transaction holds no
// prepared record of it, unless a stale prepare recreated one, which
// aborting is right for. A coordinator whose commit arrives after an abort
// record was forgotten is refused by the forget watermark: see Record's
// local_epochs and abort_bound.
package txnstate

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"

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

// Sub-spaces of a group's state under storage.PrefixState/<group>.
const (
	subRecord    byte = 't' // records, by transaction ID
	subWatermark byte = 'w' // forget watermarks, by region
)

// StateMachine holds one group's records (raftgroup.StateMachine).
type StateMachine struct {
	e       *storage.Engine
	records []byte // the records' key prefix
	marks   []byte // the watermarks' key prefix

	mu         sync.Mutex
	watermarks map[string]uint64 // region → highest abort_bound forgotten
}

// NewStateMachine returns the state machine of txn-state group `group` on e.
// Errors: a stored watermark that does not decode (storage.ErrCorrupt).
func NewStateMachine(e *storage.Engine, group uint64) (*StateMachine, error) {
	base := binary.BigEndian.AppendUint64([]byte{storage.PrefixState}, group)
	sm := &StateMachine{e: e, records: append(append([]byte{}, base...), subRecord),
		marks: append(append([]byte{}, base...), subWatermark), watermarks: map[string]uint64{}}
	err := e.Scan(sm.marks, storage.PrefixEnd(sm.marks), func(k, v []byte) (bool, error) {
		if len(v) != 8 {
			return false, fmt.Errorf("%w: forget watermark of %d bytes", storage.ErrCorrupt, len(v))
		}
		sm.watermarks[string(k[len(sm.marks):])] = binary.BigEndian.Uint64(v)
		return true, nil
	})
	return sm, err
}

func (sm *StateMachine) key(txnID []byte) []byte {
	return append(append([]byte{}, sm.records...), txnID...)
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
	return decodeRecord(v)
}

func decodeRecord(v []byte) (*txnstatepb.Record, error) {
	rec := &txnstatepb.Record{}
	if err := proto.Unmarshal(v, rec); err != nil {
		return nil, fmt.Errorf("%w: transaction record: %v", storage.ErrCorrupt, err)
	}
	return rec, nil
}

// Records calls fn with every stored record, in transaction-ID order, until
// fn returns false (the cleaner's scan).
func (sm *StateMachine) Records(fn func(*txnstatepb.Record) bool) error {
	return sm.e.Scan(sm.records, storage.PrefixEnd(sm.records), func(_, v []byte) (bool, error) {
		rec, err := decodeRecord(v)
		if err != nil {
			return false, err
		}
		return fn(rec), nil
	})
}

// Watermarks returns a copy of the forget watermarks, by region.
func (sm *StateMachine) Watermarks() map[string]uint64 {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	return maps.Clone(sm.watermarks)
}

// EncodeDecide returns the command recording rec's outcome.
func EncodeDecide(rec *txnstatepb.Record) ([]byte, error) {
	return proto.Marshal(&txnstatepb.Command{Cmd: &txnstatepb.Command_Decide{Decide: rec}})
}

// EncodeForget returns the command forgetting the records of txnIDs.
func EncodeForget(txnIDs [][]byte) ([]byte, error) {
	return proto.Marshal(&txnstatepb.Command{Cmd: &txnstatepb.Command_Forget{Forget: &txnstatepb.Forget{TxnIds: txnIDs}}})
}

// Apply implements raftgroup.StateMachine. A decide command's result is the
// winning *Record (an ABORTED one, not stored, for a commit the watermark
// refuses); a forget's is the number of records removed; a bad command's
// is an error. Applies in one batch see each other's writes through it.
func (sm *StateMachine) Apply(b *pebble.Batch, _ uint64, cmd []byte) any {
	c := &txnstatepb.Command{}
	if err := proto.Unmarshal(cmd, c); err != nil {
		return fmt.Errorf("%w: %v", ErrBadRecord, err)
	}
	switch x := c.Cmd.(type) {
	case *txnstatepb.Command_Decide:
		return sm.decide(b, x.Decide)
	case *txnstatepb.Command_Forget:
		return sm.forget(b, x.Forget.GetTxnIds())
	}
	return fmt.Errorf("%w: empty command", ErrBadRecord)
}

// stored returns the record of txnID as b sees it (nil if none).
func (sm *StateMachine) stored(b *pebble.Batch, txnID []byte) (*txnstatepb.Record, error) {
	v, closer, err := b.Get(sm.key(txnID))
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer closer.Close()
	return decodeRecord(v)
}

func (sm *StateMachine) decide(b *pebble.Batch, want *txnstatepb.Record) any {
	if err := validDecision(want); err != nil {
		return err
	}
	won, err := sm.stored(b, want.GetTxnId())
	if err != nil {
		return err
	}
	if won != nil {
		return won
	}
	if want.GetOutcome() == txnstatepb.Outcome_OUTCOME_COMMITTED {
		sm.mu.Lock()
		for region, l := range want.GetLocalEpochs() {
			if w, ok := sm.watermarks[region]; ok && l <= w {
				sm.mu.Unlock()
				// An abort record of this transaction may have been forgotten.
				slog.Info("refused a commit validated below the forget watermark", "txn", fmt.Sprintf("%x", want.GetTxnId()),
					"region", region, "local_epoch", l, "watermark", w)
				return &txnstatepb.Record{TxnId: want.GetTxnId(), Outcome: txnstatepb.Outcome_OUTCOME_ABORTED}
			}
		}
		sm.mu.Unlock()
	}
	v, err := proto.Marshal(want)
	if err != nil {
		return err
	}
	_ = b.Set(sm.key(want.GetTxnId()), v, nil)
	return want
}

func (sm *StateMachine) forget(b *pebble.Batch, ids [][]byte) any {
	n := 0
	for _, id := range ids {
		rec, err := sm.stored(b, id)
		if err != nil {
			return err
		}
		if rec == nil {
			continue
		}
		if rec.GetOutcome() == txnstatepb.Outcome_OUTCOME_ABORTED && rec.GetAbortRegion() == "" {
			continue // no bound to raise the watermark to: it stays
		}
		if r := rec.GetAbortRegion(); rec.GetOutcome() == txnstatepb.Outcome_OUTCOME_ABORTED {
			sm.raiseWatermark(b, r, rec.GetAbortBound())
		}
		_ = b.Delete(sm.key(id), nil)
		n++
	}
	return n
}

func (sm *StateMachine) raiseWatermark(b *pebble.Batch, region string, bound uint64) {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	if sm.watermarks[region] >= bound {
		return
	}
	sm.watermarks[region] = bound
	_ = b.Set(append(append([]byte{}, sm.marks...), region...), binary.BigEndian.AppendUint64(nil, bound), nil)
}

// Snapshot implements raftgroup.StateMachine: the marshalled watermarks,
// then every marshalled record, each framed by storage.AppendRecord.
func (sm *StateMachine) Snapshot() ([]byte, error) {
	w, err := proto.Marshal(&txnstatepb.Watermarks{LocalEpochs: sm.Watermarks()})
	if err != nil {
		return nil, err
	}
	out := storage.AppendRecord(nil, w)
	err = sm.e.Scan(sm.records, storage.PrefixEnd(sm.records), func(_, v []byte) (bool, error) {
		out = storage.AppendRecord(out, v)
		return true, nil
	})
	return out, err
}

// Restore implements raftgroup.StateMachine.
func (sm *StateMachine) Restore(b *pebble.Batch, data []byte) error {
	for _, p := range [][]byte{sm.records, sm.marks} {
		if err := b.DeleteRange(p, storage.PrefixEnd(p), nil); err != nil {
			return err
		}
	}
	v, data, err := storage.NextRecord(data)
	if err != nil {
		return err
	}
	w := &txnstatepb.Watermarks{}
	if err := proto.Unmarshal(v, w); err != nil {
		return fmt.Errorf("%w: txn-state snapshot watermarks", storage.ErrCorrupt)
	}
	sm.mu.Lock()
	sm.watermarks = map[string]uint64{}
	sm.mu.Unlock()
	for region, bound := range w.GetLocalEpochs() {
		sm.raiseWatermark(b, region, bound)
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
