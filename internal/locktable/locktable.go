// Package locktable is a range leader's two-phase-locking lock table (paper §2.3,
// DESIGN.md §3.4, §4.1): shared and exclusive locks on keys, and key-range locks
// that Scan takes so that phantoms are impossible.
//
// Deadlocks are prevented by wait-die on transaction priority (start order): a
// request that conflicts with a lock held — or awaited — by an older transaction
// dies at once with ErrWouldDie (the transaction restarts, keeping its priority);
// a request that conflicts only with younger transactions waits. Waits only ever
// go from older to younger, so no cycle can form, and because younger requests
// also yield to older waiters, a waiting writer is not starved by a stream of
// younger readers. Every wait is bounded by the caller's context.
//
// A transaction that has prepared requests no more locks, so it can wait for no
// one: a request that conflicts with a prepared transaction waits for it whatever
// their ages (MarkPrepared), which cannot close a cycle and spares the requester
// a restart while a commit is being released. Likewise a request from a
// transaction that holds no other lock and will take no other (Txn.Waits)
// waits for anyone: only younger such requests, queued behind it, wait for
// it, so it closes no cycle. When a waiter gives up, the Txn.Waits requests
// behind it look again (no release may come to wake them).
//
// Snapshot reads take no lock: WaitNoExclusive waits until no exclusive lock
// overlaps their span and never delays an acquisition (paper §5.2).
package locktable

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/google/btree"
)

// ErrWouldDie is returned when a request conflicts with an older transaction; the
// requester must abort and retry (wait-die). It is retryable.
var ErrWouldDie = errors.New("locktable: conflict with an older transaction")

// ErrWouldWait is returned by TryAcquire where Acquire would wait: another
// transaction holds or awaits a conflicting lock that the request may wait
// for (a younger one under wait-die, anyone for a Txn.Waits request).
// Nothing was taken or queued.
var ErrWouldWait = errors.New("locktable: the lock would have to be waited for")

// ErrInvalidSpan is returned for a range whose end sorts before its start.
var ErrInvalidSpan = errors.New("locktable: range end before start")

// Mode is a lock mode.
type Mode uint8

const (
	// Shared locks are taken by reads; they conflict only with Exclusive.
	Shared Mode = iota + 1
	// Exclusive locks are taken by writes; they conflict with every other lock.
	Exclusive
)

func (m Mode) String() string {
	switch m {
	case Shared:
		return "shared"
	case Exclusive:
		return "exclusive"
	}
	return fmt.Sprintf("mode(%d)", uint8(m))
}

// TxnID identifies a transaction.
type TxnID [16]byte

// Txn is a lock requester: its identity and its priority, which is its start
// order (smaller is older and wins conflicts).
type Txn struct {
	ID       TxnID
	Priority uint64
	// Waits marks a request from a transaction that holds no other lock
	// and will request no other (a single-key transaction sent whole): it
	// waits for any conflicting holder or older waiter instead of dying,
	// which cannot close a cycle: it holds nothing, and only younger Waits
	// requests queue behind it.
	Waits bool
}

// older reports whether a has precedence over b: a lower priority, ties broken by ID.
func older(a, b Txn) bool {
	if a.Priority != b.Priority {
		return a.Priority < b.Priority
	}
	return bytes.Compare(a.ID[:], b.ID[:]) < 0
}

// Span is a key ([Key]) when EndKey is nil, else the range [Key, EndKey).
type Span struct {
	Key, EndKey []byte
}

// Point returns the span of one key.
func Point(key []byte) Span { return Span{Key: key} }

func (s Span) isPoint() bool { return s.EndKey == nil }

// contains reports whether key is in s.
func (s Span) contains(key []byte) bool {
	if s.isPoint() {
		return bytes.Equal(s.Key, key)
	}
	return bytes.Compare(s.Key, key) <= 0 && bytes.Compare(key, s.EndKey) < 0
}

// overlaps reports whether two spans share a key.
func (s Span) overlaps(o Span) bool {
	switch {
	case s.isPoint():
		return o.contains(s.Key)
	case o.isPoint():
		return s.contains(o.Key)
	}
	return bytes.Compare(s.Key, o.EndKey) < 0 && bytes.Compare(o.Key, s.EndKey) < 0
}

func conflicts(a, b Mode) bool { return a == Exclusive || b == Exclusive }

type holder struct {
	txn  Txn
	mode Mode
}

// keyEntry holds the point locks of one key.
type keyEntry struct {
	key     string
	holders []holder
}

type rangeLock struct {
	span Span
	holder
}

type waiter struct {
	txn  Txn
	span Span
	mode Mode
	wake chan struct{} // closed when something overlapping is released
}

// Table is one leader's lock table. It is safe for concurrent use.
type Table struct {
	mu       sync.Mutex
	points   *btree.BTreeG[*keyEntry]
	ranges   []rangeLock
	byTxn    map[TxnID][]Span // what each transaction holds, for ReleaseAll
	waiters  map[*waiter]struct{}
	prepared map[TxnID]bool
}

// New returns an empty lock table.
func New() *Table {
	return &Table{
		points:   btree.NewG(32, func(a, b *keyEntry) bool { return a.key < b.key }),
		byTxn:    map[TxnID][]Span{},
		waiters:  map[*waiter]struct{}{},
		prepared: map[TxnID]bool{},
	}
}

// Acquire takes a lock of mode on span for txn, waiting (bounded by ctx) while a
// younger transaction holds a conflicting lock. It returns ErrWouldDie when an
// older transaction holds or awaits a conflicting lock, or ctx's error. A lock
// the transaction already holds in the same or a stronger mode is a no-op;
// Shared to Exclusive is an upgrade.
//
// An inverted range fails with ErrInvalidSpan; an empty range [k, k) locks nothing.
func (t *Table) Acquire(ctx context.Context, txn Txn, span Span, mode Mode) error {
	return t.acquire(ctx, txn, span, mode)
}

// TryAcquire is Acquire that never waits: where Acquire would wait, it
// returns ErrWouldWait, having taken and queued nothing. A caller that
// would wait bounded by contexts it must make can make them only then.
func (t *Table) TryAcquire(txn Txn, span Span, mode Mode) error {
	return t.acquire(nil, txn, span, mode)
}

// acquire is Acquire, or with a nil ctx TryAcquire.
func (t *Table) acquire(ctx context.Context, txn Txn, span Span, mode Mode) error {
	if !span.isPoint() {
		switch c := bytes.Compare(span.Key, span.EndKey); {
		case c > 0:
			return ErrInvalidSpan
		case c == 0:
			return nil
		}
	}
	span = cloneSpan(span)
	for parked := false; ; parked = true {
		t.mu.Lock()
		blockers, mustDie := t.conflicting(txn, span, mode)
		if mustDie {
			if parked {
				// It waited, so Txn.Waits requests may have queued behind
				// it; no release may come to wake them.
				t.wakeWaitsBehind(span)
			}
			t.mu.Unlock()
			return ErrWouldDie
		}
		if blockers == 0 {
			t.grant(txn, span, mode)
			t.mu.Unlock()
			return nil
		}
		if ctx == nil {
			t.mu.Unlock()
			return ErrWouldWait
		}
		if err := t.park(ctx, &waiter{txn: txn, span: span, mode: mode, wake: make(chan struct{})}); err != nil {
			return err
		}
	}
}

// wakeWaitsBehind wakes, with t.mu held, the Txn.Waits requests waiting on
// span: one that queued behind a waiter that gives up looks again.
func (t *Table) wakeWaitsBehind(span Span) {
	for o := range t.waiters {
		if o.txn.Waits && o.span.overlaps(span) {
			close(o.wake)
			delete(t.waiters, o)
		}
	}
}

// park registers w (called with t.mu held, which it releases) and waits,
// bounded by ctx, until something overlapping w's span is released.
func (t *Table) park(ctx context.Context, w *waiter) error {
	t.waiters[w] = struct{}{}
	t.mu.Unlock()
	select {
	case <-w.wake:
		return nil
	case <-ctx.Done():
		t.mu.Lock()
		delete(t.waiters, w)
		t.wakeWaitsBehind(w.span)
		t.mu.Unlock()
		return ctx.Err()
	}
}

// conflicting returns whether the request must die (an older transaction holds
// or awaits a conflicting lock) and otherwise the younger holders it must wait for.
func (t *Table) conflicting(txn Txn, span Span, mode Mode) (blockers int, mustDie bool) {
	check := func(h holder) bool {
		if h.txn.ID == txn.ID || !conflicts(h.mode, mode) {
			return true
		}
		if older(h.txn, txn) && !t.prepared[h.txn.ID] && !txn.Waits {
			mustDie = true
			return false
		}
		blockers++
		return true
	}
	if span.isPoint() {
		if e, ok := t.points.Get(&keyEntry{key: string(span.Key)}); ok {
			for _, h := range e.holders {
				if !check(h) {
					return 0, true
				}
			}
		}
	} else {
		t.points.AscendRange(&keyEntry{key: string(span.Key)}, &keyEntry{key: string(span.EndKey)}, func(e *keyEntry) bool {
			for _, h := range e.holders {
				if !check(h) {
					return false
				}
			}
			return true
		})
		if mustDie {
			return 0, true
		}
	}
	for _, r := range t.ranges {
		if r.span.overlaps(span) && !check(r.holder) {
			return 0, true
		}
	}
	// Yield to older transactions already waiting for an overlapping lock.
	for w := range t.waiters {
		if w.txn.ID != txn.ID && conflicts(w.mode, mode) && older(w.txn, txn) && w.span.overlaps(span) {
			if !txn.Waits {
				return 0, true
			}
			blockers++ // behind it: woken by a release, or when it gives up
		}
	}
	return blockers, false
}

func (t *Table) grant(txn Txn, span Span, mode Mode) {
	if span.isPoint() {
		e, ok := t.points.Get(&keyEntry{key: string(span.Key)})
		if !ok {
			e = &keyEntry{key: string(span.Key)}
			t.points.ReplaceOrInsert(e)
		}
		for i, h := range e.holders {
			if h.txn.ID == txn.ID {
				e.holders[i].mode = max(h.mode, mode)
				return
			}
		}
		e.holders = append(e.holders, holder{txn, mode})
	} else {
		for i, r := range t.ranges {
			if r.txn.ID == txn.ID && bytes.Equal(r.span.Key, span.Key) && bytes.Equal(r.span.EndKey, span.EndKey) {
				t.ranges[i].mode = max(r.mode, mode)
				return
			}
		}
		t.ranges = append(t.ranges, rangeLock{span: span, holder: holder{txn, mode}})
	}
	t.byTxn[txn.ID] = append(t.byTxn[txn.ID], span)
}

// ReleaseAll releases every lock txn holds and wakes the waiters they blocked.
// Callers release only once the transaction's outcome is durable (DESIGN.md §3.4).
func (t *Table) ReleaseAll(txn TxnID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	spans := t.byTxn[txn]
	delete(t.byTxn, txn)
	delete(t.prepared, txn)
	if len(spans) == 0 {
		return
	}
	for _, s := range spans {
		if s.isPoint() {
			e, ok := t.points.Get(&keyEntry{key: string(s.Key)})
			if !ok {
				continue
			}
			kept := e.holders[:0]
			for _, h := range e.holders {
				if h.txn.ID != txn {
					kept = append(kept, h)
				}
			}
			e.holders = kept
			if len(kept) == 0 {
				t.points.Delete(e)
			}
		}
	}
	kept := t.ranges[:0]
	for _, r := range t.ranges {
		if r.txn.ID != txn {
			kept = append(kept, r)
		}
	}
	clear(t.ranges[len(kept):])
	t.ranges = kept
	for w := range t.waiters {
		for _, s := range spans {
			if w.span.overlaps(s) {
				close(w.wake)
				delete(t.waiters, w)
				break
			}
		}
	}
}

// MarkPrepared records that txn will request no more locks: conflicting
// requests wait for it instead of dying. It lasts until ReleaseAll.
func (t *Table) MarkPrepared(txn TxnID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.byTxn[txn]) > 0 {
		t.prepared[txn] = true
	}
}

// WaitNoExclusive waits, bounded by ctx, until none of the transactions that
// hold an exclusive lock overlapping span when it is called holds one any
// more. It takes no lock and never delays an acquisition; locks taken after
// the call are not waited for, so a stream of writers cannot starve it
// (snapshot reads, paper §5.2: a writer that locks after the read has begun
// commits at a later epoch than the snapshot's).
func (t *Table) WaitNoExclusive(ctx context.Context, span Span) error {
	span = cloneSpan(span)
	var waitFor map[TxnID]bool // the exclusive holders at the call
	for {
		t.mu.Lock()
		holders := t.holdersOverlapping(span)
		if waitFor == nil {
			waitFor = map[TxnID]bool{}
			for _, h := range holders {
				if h.mode == Exclusive {
					waitFor[h.txn.ID] = true
				}
			}
		}
		blocked := false
		for _, h := range holders {
			if h.mode == Exclusive && waitFor[h.txn.ID] {
				blocked = true
				break
			}
		}
		if !blocked {
			t.mu.Unlock()
			return nil
		}
		// A snapshot waiter has no transaction and the lowest precedence: it is
		// registered only to be woken, and Shared so that it blocks no one.
		if err := t.park(ctx, &waiter{txn: Txn{Priority: ^uint64(0), ID: TxnID{0xff}}, span: span, mode: Shared, wake: make(chan struct{})}); err != nil {
			return err
		}
	}
}

func (t *Table) holdersOverlapping(span Span) []holder {
	var out []holder
	if span.isPoint() {
		if e, ok := t.points.Get(&keyEntry{key: string(span.Key)}); ok {
			out = append(out, e.holders...)
		}
	} else {
		t.points.AscendRange(&keyEntry{key: string(span.Key)}, &keyEntry{key: string(span.EndKey)}, func(e *keyEntry) bool {
			out = append(out, e.holders...)
			return true
		})
	}
	for _, r := range t.ranges {
		if r.span.overlaps(span) {
			out = append(out, r.holder)
		}
	}
	return out
}

// Holds reports whether txn holds a lock of at least mode covering span exactly
// as acquired (a point lock on the key, or a range lock on the same range).
func (t *Table) Holds(txn TxnID, span Span, mode Mode) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, h := range t.holdersExact(span) {
		if h.txn.ID == txn && h.mode >= mode {
			return true
		}
	}
	return false
}

func (t *Table) holdersExact(span Span) []holder {
	if span.isPoint() {
		if e, ok := t.points.Get(&keyEntry{key: string(span.Key)}); ok {
			return e.holders
		}
		return nil
	}
	var out []holder
	for _, r := range t.ranges {
		if bytes.Equal(r.span.Key, span.Key) && bytes.Equal(r.span.EndKey, span.EndKey) {
			out = append(out, r.holder)
		}
	}
	return out
}

// SpansOf returns the spans txn holds locks on (copies).
func (t *Table) SpansOf(txn TxnID) []Span {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]Span, 0, len(t.byTxn[txn]))
	for _, s := range t.byTxn[txn] {
		out = append(out, cloneSpan(s))
	}
	return out
}

// Inside reports whether span s lies in [start, end) (a nil end: unbounded).
// A range lock to the end of the key space lies inside only an unbounded
// [start, end).
func (s Span) Inside(start, end []byte) bool {
	if bytes.Compare(s.Key, start) < 0 {
		return false
	}
	if end == nil {
		return true
	}
	if s.isPoint() {
		return bytes.Compare(s.Key, end) < 0
	}
	return bytes.Compare(s.EndKey, end) <= 0
}

// HeldBy returns how many distinct spans txn holds locks on.
func (t *Table) HeldBy(txn TxnID) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.byTxn[txn])
}

// Len returns the number of locks held (point holders plus range locks).
func (t *Table) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := len(t.ranges)
	t.points.Ascend(func(e *keyEntry) bool { n += len(e.holders); return true })
	return n
}

// Waiters returns the number of requests waiting.
func (t *Table) Waiters() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.waiters)
}

func cloneSpan(s Span) Span {
	out := Span{Key: append([]byte{}, s.Key...)}
	if s.EndKey != nil {
		out.EndKey = append([]byte{}, s.EndKey...)
	}
	return out
}
