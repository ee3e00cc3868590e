// Package tick gives a node's periodic loops one phase (issue 17): a
// Ticker fires at the instants that are whole multiples of its period
// since the Unix epoch, so every loop of one period in a process — each
// Raft group's tick, each range's lease tick, each epoch group's advance
// tick — fires in the same instant. The runtime then wakes once per period
// for all of them instead of once per loop, and the Raft heartbeats they
// send leave together, so a peer's sender batches them into one write.
// On an idle cluster those wakeups are most of what a node does.
package tick

import "time"

// Ticker delivers ticks on C at the aligned instants of its period. Unlike
// time.Ticker it must be re-armed: after each receive from C, call Next.
// A tick the receiver was too late for is dropped, never delivered late in
// a burst: the next fires at the next aligned instant.
type Ticker struct {
	// C receives the time of each tick.
	C      <-chan time.Time
	timer  *time.Timer
	period time.Duration
}

// NewTicker returns a ticker of period d (d > 0; it panics otherwise, as
// time.NewTicker does) whose first tick is the next aligned instant.
func NewTicker(d time.Duration) *Ticker {
	if d <= 0 {
		panic("tick: non-positive period")
	}
	t := &Ticker{timer: time.NewTimer(untilNext(time.Now(), d)), period: d}
	t.C = t.timer.C
	return t
}

// Next arms the ticker for the next aligned instant; call it after each
// receive from C.
func (t *Ticker) Next() { t.timer.Reset(untilNext(time.Now(), t.period)) }

// Stop stops the ticker; no tick is delivered after it returns.
func (t *Ticker) Stop() { t.timer.Stop() }

// untilNext is how long from now to the next whole multiple of d since
// the Unix epoch: in (0, d]. Wall-clock steps only shift the phase.
func untilNext(now time.Time, d time.Duration) time.Duration {
	return d - time.Duration(now.UnixNano()%int64(d))
}
