// Package epoch implements Terroir's epoch services. A region's local epoch service
// (paper §2.2, DESIGN.md §2, §3.1) is a Raft group holding one counter that its
// leader advances every local_epoch_interval. Replicas serve their applied value;
// a Reader turns those into linearizable, monotonic reads by requiring a majority
// of replicas to agree, and batches concurrent callers into one round of requests.
package epoch

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"

	"github.com/terroir-db/terroir/internal/storage"
)

// InitialEpoch is the epoch of a freshly created epoch group.
const InitialEpoch uint64 = 1

// Command opcodes in the epoch group's Raft log.
const (
	opAdvance byte = 1 // advance from the epoch that follows, if still current
	opNop     byte = 2 // no effect; used to measure Raft commit latency
	opPublish byte = 3 // raise to at least the epoch that follows (publishers)
)

// ErrBadCommand marks a log entry that does not decode as an epoch command.
var ErrBadCommand = errors.New("epoch: malformed command")

// EncodeAdvance returns the command that advances the epoch from `from` to from+1.
// It is conditional: applied when the epoch is no longer `from`, it does nothing,
// so a deposed or lagging leader can never advance twice.
func EncodeAdvance(from uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{opAdvance}, from)
}

// EncodePublish returns the command that raises a publisher's epoch to at least e.
func EncodePublish(e uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{opPublish}, e)
}

// EncodeNop returns a command that changes nothing.
func EncodeNop() []byte { return []byte{opNop} }

// DecodeCommand parses a command: its opcode and, for an advance, the epoch it
// advances from. Errors wrap ErrBadCommand.
func DecodeCommand(cmd []byte) (op byte, from uint64, err error) {
	if len(cmd) == 0 {
		return 0, 0, fmt.Errorf("%w: empty", ErrBadCommand)
	}
	switch cmd[0] {
	case opAdvance, opPublish:
		if len(cmd) != 9 {
			return 0, 0, fmt.Errorf("%w: command %d of %d bytes", ErrBadCommand, cmd[0], len(cmd))
		}
		return cmd[0], binary.BigEndian.Uint64(cmd[1:]), nil
	case opNop:
		if len(cmd) != 1 {
			return 0, 0, fmt.Errorf("%w: nop of %d bytes", ErrBadCommand, len(cmd))
		}
		return opNop, 0, nil
	}
	return 0, 0, fmt.Errorf("%w: opcode %d", ErrBadCommand, cmd[0])
}

// StateMachine is an epoch group's replicated counter (raftgroup.StateMachine):
// a local or global epoch (advanced) or a publisher's copy of the global epoch
// (published).
type StateMachine struct {
	key   []byte
	epoch atomic.Uint64

	// published is called (on the group's goroutine) after each publish applies.
	published func()
}

func stateKey(group uint64) []byte {
	return append(binary.BigEndian.AppendUint64([]byte{storage.PrefixState}, group), 'e')
}

// NewStateMachine loads group's epoch from e (InitialEpoch if none is stored).
// A damaged record wraps storage.ErrCorrupt.
func NewStateMachine(e *storage.Engine, group uint64) (*StateMachine, error) {
	sm := &StateMachine{key: stateKey(group)}
	v, err := e.Get(sm.key)
	if err != nil {
		return nil, err
	}
	ep, err := decodeEpoch(v)
	if err != nil {
		return nil, fmt.Errorf("epoch group %d: %w", group, err)
	}
	sm.epoch.Store(ep)
	return sm, nil
}

func decodeEpoch(v []byte) (uint64, error) {
	switch len(v) {
	case 0:
		return InitialEpoch, nil
	case 8:
		return binary.BigEndian.Uint64(v), nil
	}
	return 0, fmt.Errorf("%w: epoch record of %d bytes", storage.ErrCorrupt, len(v))
}

// Epoch returns the applied epoch. Safe from any goroutine.
func (sm *StateMachine) Epoch() uint64 { return sm.epoch.Load() }

// Apply implements raftgroup.StateMachine; the result is the epoch after the command.
// A command that does not decode is skipped (it cannot have been proposed by this
// package) and its result is the error.
func (sm *StateMachine) Apply(b *pebble.Batch, _ uint64, cmd []byte) any {
	op, from, err := DecodeCommand(cmd)
	if err != nil {
		return err
	}
	cur := sm.epoch.Load()
	switch {
	case op == opAdvance && from == cur:
		cur++
	case op == opPublish && from > cur:
		cur = from
	}
	if cur != sm.epoch.Load() {
		sm.epoch.Store(cur)
		_ = b.Set(sm.key, binary.BigEndian.AppendUint64(nil, cur), nil)
	}
	if op == opPublish && sm.published != nil {
		sm.published()
	}
	return cur
}

// Snapshot implements raftgroup.StateMachine.
func (sm *StateMachine) Snapshot() ([]byte, error) {
	return binary.BigEndian.AppendUint64(nil, sm.epoch.Load()), nil
}

// Restore implements raftgroup.StateMachine.
func (sm *StateMachine) Restore(b *pebble.Batch, data []byte) error {
	if len(data) != 8 {
		return fmt.Errorf("%w: epoch snapshot of %d bytes", storage.ErrCorrupt, len(data))
	}
	sm.epoch.Store(binary.BigEndian.Uint64(data))
	return b.Set(sm.key, data, nil)
}
