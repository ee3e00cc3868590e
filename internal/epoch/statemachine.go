// Package epoch implements Terroir's epoch services. A region's local epoch service
// (paper §2.2, DESIGN.md §2, §3.1) is a Raft group holding one counter that its
// leader advances every local_epoch_interval. Replicas serve their applied value;
// a Reader turns those into linearizable, monotonic reads by requiring a majority
// of replicas to agree, and batches concurrent callers into one round of requests.
package epoch

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

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

	// The global epoch service's excluded publisher groups, each with the
	// global epoch at which its exclusion applied; stored under key+'s' as
	// big-endian (group, since) pairs (key+'x', group IDs alone, in stores
	// written before the epochs were kept).
	mu       sync.Mutex
	excluded map[uint64]uint64

	// published is called (on the group's goroutine) after each publish applies.
	published func()
	// changed is when the epoch last changed here while live (unix ns; 0:
	// not since start, or last set by a snapshot).
	changed atomic.Int64
	// live, if set, tells a change the group makes now from one its log
	// replays after a restart; onChange gets the time since the previous
	// live change at each live change (the epoch advance interval metric).
	live     func() bool
	onChange func(interval time.Duration)

	// moved, if not nil, is closed at the next change of the epoch (and
	// replaced by the next WaitFor): what WaitFor waits on.
	waitMu sync.Mutex
	moved  chan struct{}
}

// WaitFor waits until the applied epoch reaches e, or ctx ends, and returns
// the applied epoch then (below e if ctx ended first). Safe from any
// goroutine; it costs the apply path nothing while no one waits.
func (sm *StateMachine) WaitFor(ctx context.Context, e uint64) uint64 {
	for {
		sm.waitMu.Lock()
		if sm.moved == nil {
			sm.moved = make(chan struct{})
		}
		moved := sm.moved
		sm.waitMu.Unlock()
		if cur := sm.epoch.Load(); cur >= e { // after taking moved: a change since is not missed
			return cur
		}
		select {
		case <-moved:
		case <-ctx.Done():
			return sm.epoch.Load()
		}
	}
}

// setEpoch makes e the applied epoch and wakes WaitFor's waiters.
func (sm *StateMachine) setEpoch(e uint64) {
	sm.epoch.Store(e)
	sm.waitMu.Lock()
	if sm.moved != nil {
		close(sm.moved)
		sm.moved = nil
	}
	sm.waitMu.Unlock()
}

// OnChange makes the replica time its epoch's changes: while live() holds
// (the replica has caught up with its group, so the change happens now
// rather than in the replay of its log), each change sets Changed and
// calls f, on the group's goroutine, with the time since the previous one
// (not for the first). Call before the group starts.
func (sm *StateMachine) OnChange(live func() bool, f func(interval time.Duration)) {
	sm.live, sm.onChange = live, f
}

// Changed returns when the applied epoch last changed here while live
// (OnChange); the zero time when it has not since this replica started or
// restored a snapshot.
func (sm *StateMachine) Changed() time.Time {
	if ns := sm.changed.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

func stateKey(group uint64) []byte {
	return append(binary.BigEndian.AppendUint64([]byte{storage.PrefixState}, group), 'e')
}

func (sm *StateMachine) excludedKey() []byte { return append(append([]byte{}, sm.key...), 's') }

// legacyExcludedKey held the excluded groups without their epochs.
func (sm *StateMachine) legacyExcludedKey() []byte { return append(append([]byte{}, sm.key...), 'x') }

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
	decode := decodeExclusions
	if x == nil {
		if x, err = e.Get(sm.legacyExcludedKey()); err != nil {
			return nil, err
		}
		decode = decodeLegacyGroups
	}
	if sm.excluded, err = decode(x); err != nil {
		return nil, fmt.Errorf("epoch group %d: %w", group, err)
	}
	return sm, nil
}

// decodeExclusions reads (group, since) pairs, 16 bytes each.
func decodeExclusions(v []byte) (map[uint64]uint64, error) {
	if len(v)%16 != 0 {
		return nil, fmt.Errorf("%w: excluded-publisher record of %d bytes", storage.ErrCorrupt, len(v))
	}
	out := map[uint64]uint64{}
	for ; len(v) > 0; v = v[16:] {
		out[binary.BigEndian.Uint64(v)] = binary.BigEndian.Uint64(v[8:])
	}
	return out, nil
}

// decodeLegacyGroups reads group IDs alone, 8 bytes each (since unknown: 0).
func decodeLegacyGroups(v []byte) (map[uint64]uint64, error) {
	if len(v)%8 != 0 {
		return nil, fmt.Errorf("%w: excluded-publisher record of %d bytes", storage.ErrCorrupt, len(v))
	}
	out := map[uint64]uint64{}
	for ; len(v) > 0; v = v[8:] {
		out[binary.BigEndian.Uint64(v)] = 0
	}
	return out, nil
}

func encodeExclusions(groups map[uint64]uint64) []byte {
	ids := make([]uint64, 0, len(groups))
	for g := range groups {
		ids = append(ids, g)
	}
	slices.Sort(ids)
	var out []byte
	for _, g := range ids {
		out = binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(out, g), groups[g])
	}
	return out
}

// ExcludedGroups returns the excluded publisher groups, ascending, and the
// global epoch since which each is excluded.
func (sm *StateMachine) ExcludedGroups() (groups, since []uint64) {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	for g := range sm.excluded {
		groups = append(groups, g)
	}
	slices.Sort(groups)
	for _, g := range groups {
		since = append(since, sm.excluded[g])
	}
	return groups, since
}

// Excluded reports whether publisher group `group` is excluded from the
// global epoch service's set. Safe from any goroutine.
func (sm *StateMachine) Excluded(group uint64) bool {
	_, ok := sm.ExcludedSince(group)
	return ok
}

// ExcludedSince returns the global epoch at which publisher group `group`
// was excluded (0 if excluded before the epochs were recorded), and whether
// it is excluded. Safe from any goroutine.
func (sm *StateMachine) ExcludedSince(group uint64) (uint64, bool) {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	since, ok := sm.excluded[group]
	return since, ok
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
		sm.setEpoch(cur)
		_ = b.Set(sm.key, binary.BigEndian.AppendUint64(nil, cur), nil)
		if sm.live == nil || sm.live() {
			now := time.Now().UnixNano()
			if prev := sm.changed.Swap(now); prev != 0 && sm.onChange != nil {
				sm.onChange(time.Duration(now - prev))
			}
		}
	}
	if op == opPublish && sm.published != nil {
		sm.published()
	}
	if op == opExclude || op == opInclude {
		sm.mu.Lock()
		if _, already := sm.excluded[from]; op == opExclude && !already {
			sm.excluded[from] = cur
		} else if op == opInclude {
			delete(sm.excluded, from)
		}
		_ = b.Set(sm.excludedKey(), encodeExclusions(sm.excluded), nil)
		_ = b.Delete(sm.legacyExcludedKey(), nil)
		sm.mu.Unlock()
	}
	return cur
}

// snapshotExclusionsMark follows the epoch in a snapshot whose exclusions
// are (group, since) pairs; without it (no group ID is 2^64-1) the rest is
// group IDs alone, as snapshots sent before the epochs were kept. This
// binary reads both formats; a binary from before it cannot read the new
// one, so upgrade every node of a global epoch group before it takes a
// snapshot (there is no cluster version gate yet), and do not downgrade.
const snapshotExclusionsMark = ^uint64(0)

// Snapshot implements raftgroup.StateMachine: the epoch, the mark, then the
// excluded publisher groups as (group, since) pairs, 8 bytes each number.
func (sm *StateMachine) Snapshot() ([]byte, error) {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	out := binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, sm.epoch.Load()), snapshotExclusionsMark)
	return append(out, encodeExclusions(sm.excluded)...), nil
}

// Restore implements raftgroup.StateMachine.
func (sm *StateMachine) Restore(b *pebble.Batch, data []byte) error {
	if len(data) < 8 {
		return fmt.Errorf("%w: epoch snapshot of %d bytes", storage.ErrCorrupt, len(data))
	}
	var excluded map[uint64]uint64
	var err error
	if len(data) >= 16 && binary.BigEndian.Uint64(data[8:]) == snapshotExclusionsMark {
		excluded, err = decodeExclusions(data[16:])
	} else {
		excluded, err = decodeLegacyGroups(data[8:])
	}
	if err != nil {
		return err
	}
	sm.mu.Lock()
	sm.excluded = excluded
	sm.mu.Unlock()
	sm.setEpoch(binary.BigEndian.Uint64(data))
	sm.changed.Store(0) // when the snapshot's epoch was reached is unknown here
	if err := b.Set(sm.excludedKey(), encodeExclusions(excluded), nil); err != nil {
		return err
	}
	if err := b.Delete(sm.legacyExcludedKey(), nil); err != nil {
		return err
	}
	return b.Set(sm.key, data[:8], nil)
}
