// Package tick gives a node's periodic loops one phase (issue 17): a
// Ticker fires at the instants that are whole multiples of its period
// since the Unix epoch, so every loop of one period in a process — each
// Raft group's tick, each range's lease tick, each epoch group's advance
// tick — fires in the same instant. The runtime then wakes once per period
// for all of them instead of once per loop, and the Raft heartbeats they
// send leave together, so a peer's sender batches them into one write.
// On an idle cluster those wakeups are most of what a node does. A ticker
// may be given a phase (NewTickerPhase): a node's Raft clocks tick at a
// phase of the node's own, so that two nodes' replicas of one group never
// time out in the same instant (raftgroup).
package tick

import "time"

// Ticker delivers ticks on C at the aligned instants of its period (shifted
// by its phase: NewTickerPhase). Unlike
// time.Ticker it must be re-armed: after each receive from C, call Next.
// A tick the receiver was too late for is dropped, never delivered late in
// a burst: the next fires at the next aligned instant.
type Ticker struct {
	// C receives the time of each tick.
	C      <-chan time.Time
	timer  *time.Timer
	period time.Duration
	phase  time.Duration
}

// NewTicker returns a ticker of period d (d > 0; it panics otherwise, as
// time.NewTicker does) whose first tick is the next aligned instant.
func NewTicker(d time.Duration) *Ticker { return NewTickerPhase(d, 0) }

// NewTickerPhase returns a ticker of period d whose ticks fall phase after
// the aligned instants, phase taken modulo d: the loops that share a phase
// still wake together, while loops that must not act in the same instant
// (the Raft clocks of two nodes' replicas of one group, whose election
// timeouts would otherwise end together) get different phases. It panics
// on d ≤ 0, as time.NewTicker does.
func NewTickerPhase(d, phase time.Duration) *Ticker {
	if d <= 0 {
		panic("tick: non-positive period")
	}
	phase %= d
	if phase < 0 {
		phase += d
	}
	t := &Ticker{timer: time.NewTimer(untilNext(time.Now().Add(-phase), d)), period: d, phase: phase}
	t.C = t.timer.C
	return t
}

// Next arms the ticker for the next aligned instant; call it after each
// receive from C.
func (t *Ticker) Next() { t.timer.Reset(untilNext(time.Now().Add(-t.phase), t.period)) }

// Stop stops the ticker; no tick is delivered after it returns.
func (t *Ticker) Stop() { t.timer.Stop() }

// untilNext is how long from now to the next whole multiple of d since
// the Unix epoch: in (0, d]. Wall-clock steps only shift the phase.
func untilNext(now time.Time, d time.Duration) time.Duration {
	return d - time.Duration(now.UnixNano()%int64(d))
}
