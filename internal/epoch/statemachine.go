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
	"slices"
	"sync"
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
	opExclude byte = 4 // remove the publisher group that follows from the set (global service)
	opInclude byte = 5 // add it back
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

// EncodeExclude returns the global epoch service's command that removes
// publisher group `group` from the set it waits for (DESIGN.md §7).
func EncodeExclude(group uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{opExclude}, group)
}

// EncodeInclude returns the command that adds publisher group `group` back.
func EncodeInclude(group uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{opInclude}, group)
}

// EncodeNop returns a command that changes nothing.
func EncodeNop() []byte { return []byte{opNop} }

// DecodeCommand parses a command: its opcode and its argument (the epoch an
// advance starts from or a publish raises to, or an excluded or included
// publisher group). Errors wrap ErrBadCommand.
func DecodeCommand(cmd []byte) (op byte, from uint64, err error) {
	if len(cmd) == 0 {
		return 0, 0, fmt.Errorf("%w: empty", ErrBadCommand)
	}
	switch cmd[0] {
	case opAdvance, opPublish, opExclude, opInclude:
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

	// The global epoch service's excluded publisher groups, stored under
	// key+'x' as big-endian group IDs.
	mu       sync.Mutex
	excluded map[uint64]bool

	// published is called (on the group's goroutine) after each publish applies.
	published func()
}

func stateKey(group uint64) []byte {
	return append(binary.BigEndian.AppendUint64([]byte{storage.PrefixState}, group), 'e')
}

func (sm *StateMachine) excludedKey() []byte { return append(append([]byte{}, sm.key...), 'x') }

// NewStateMachine loads group's epoch from e (InitialEpoch if none is stored)
// and, for the global epoch service, its excluded publishers. A damaged record
// wraps storage.ErrCorrupt.
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
	x, err := e.Get(sm.excludedKey())
	if err != nil {
		return nil, err
	}
	if sm.excluded, err = decodeGroups(x); err != nil {
		return nil, fmt.Errorf("epoch group %d: %w", group, err)
	}
	return sm, nil
}

func decodeGroups(v []byte) (map[uint64]bool, error) {
	if len(v)%8 != 0 {
		return nil, fmt.Errorf("%w: excluded-publisher record of %d bytes", storage.ErrCorrupt, len(v))
	}
	out := map[uint64]bool{}
	for ; len(v) > 0; v = v[8:] {
		out[binary.BigEndian.Uint64(v)] = true
	}
	return out, nil
}

func encodeGroups(groups map[uint64]bool) []byte {
	ids := make([]uint64, 0, len(groups))
	for g := range groups {
		ids = append(ids, g)
	}
	slices.Sort(ids)
	var out []byte
	for _, g := range ids {
		out = binary.BigEndian.AppendUint64(out, g)
	}
	return out
}

// ExcludedGroups returns the excluded publisher groups, ascending.
func (sm *StateMachine) ExcludedGroups() []uint64 {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	out := make([]uint64, 0, len(sm.excluded))
	for g := range sm.excluded {
		out = append(out, g)
	}
	slices.Sort(out)
	return out
}

// Excluded reports whether publisher group `group` is excluded from the
// global epoch service's set. Safe from any goroutine.
func (sm *StateMachine) Excluded(group uint64) bool {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	return sm.excluded[group]
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
	if op == opExclude || op == opInclude {
		sm.mu.Lock()
		if op == opExclude {
			sm.excluded[from] = true
		} else {
			delete(sm.excluded, from)
		}
		_ = b.Set(sm.excludedKey(), encodeGroups(sm.excluded), nil)
		sm.mu.Unlock()
	}
	return cur
}

// Snapshot implements raftgroup.StateMachine: the epoch, then the excluded
// publisher groups, 8 bytes each.
func (sm *StateMachine) Snapshot() ([]byte, error) {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	return append(binary.BigEndian.AppendUint64(nil, sm.epoch.Load()), encodeGroups(sm.excluded)...), nil
}

// Restore implements raftgroup.StateMachine.
func (sm *StateMachine) Restore(b *pebble.Batch, data []byte) error {
	if len(data) < 8 {
		return fmt.Errorf("%w: epoch snapshot of %d bytes", storage.ErrCorrupt, len(data))
	}
	excluded, err := decodeGroups(data[8:])
	if err != nil {
		return err
	}
	sm.mu.Lock()
	sm.excluded = excluded
	sm.mu.Unlock()
	sm.epoch.Store(binary.BigEndian.Uint64(data))
	if err := b.Set(sm.excludedKey(), data[8:], nil); err != nil {
		return err
	}
	return b.Set(sm.key, data[:8], nil)
}
